"""A resubmitted DOCA job, or task, allocates nothing per operation in the DOCA layer (never timed).

DOCA's job and task objects come from pools and are written again, not made,
per operation: the job's plan (its work request), the pending entry, the
success event and its result are kept and reused; the task is the same
object, its callback a bound method made once. What the engine below
allocates per operation (its work queue entry, the completion, packets) is
the engine's and is not counted here. `test_per_op_objects` counts the
DOCA objects made; this counts memory. Counted: the memory blocks allocated
while code of ``rdmakit/doca`` runs (`Allocations`), and the blocks the
DOCA layer holds after many operations against after few (``tracemalloc``).
"""

import tracemalloc
from collections.abc import Callable

import pytest

from rdmakit.testing.doca_rtt import Allocations, Far, doca_side, measure

DOCA = "/rdmakit/doca/"
#: Blocks per round trip allocated by DOCA code, at most. None is kept, made or replaced per
#: operation; what shows (about two) is the plan check's tuples and, since a post's WRITE leaves
#: in its post_send (native posting), the quiet pump's readiness poll (``SoftPump.progress``: the
#: driver's turn after the post has nothing to send, so the pump is quiet when the ACK comes and
#: ``poll(0)`` returns its (fd, events) tuple), whose blocks move between their free lists and
#: the allocator. Each way of allocating per operation tried on purpose added at least one (a new
#: success event, a ``with`` in the backend's poll, a loop's range object).
PER_OP = 2.5
ROUND_TRIPS = 400


@pytest.mark.parametrize("api", ["job", "task"])
def test_a_resubmitted_job_or_task_allocates_nothing_in_the_doca_layer(
    api: str, new_ip: Callable[[], str]
) -> None:
    far = Far(new_ip())
    try:
        with doca_side(far, new_ip(), api) as steps:
            measure(steps, 0, 0, warm=100)
            counter = Allocations(DOCA)
            per_op = counter.run(steps, ROUND_TRIPS)
            assert per_op <= PER_OP, (
                f"{per_op:.2f} blocks per {api} round trip allocated by the DOCA layer; by site: "
                f"{sorted(counter.sites.items(), key=lambda kv: -kv[1])[:5]}"
            )
            # Nothing kept either: what DOCA code allocated and still holds does not grow with the
            # number of operations.
            tracemalloc.start()
            try:
                measure(steps, 0, 0, warm=50)
                first = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f"*{DOCA}*")])
                measure(steps, 0, 0, warm=ROUND_TRIPS)
                then = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f"*{DOCA}*")])
            finally:
                tracemalloc.stop()
            grown = sum(d.count_diff for d in then.compare_to(first, "lineno") if d.count_diff > 0)
            assert grown <= 2, (
                f"the DOCA layer holds {grown} more blocks after {ROUND_TRIPS} more round trips"
            )
    finally:
        far.close()
