"""The DOCA layer's own Python calls per 8-byte WRITE round trip, counted (never timed).

A DOCA job or task round trip is the engine's round trip plus what the DOCA
layer does on the way: ``doca_workq_submit`` / ``doca_task_submit`` write the
job's work-queue entry again (the plan kept on the job), ``doca_pe_progress`` /
``doca_workq_progress_retrieve`` run the device's pump and then poll the
context's queue pair straight into the job's event or the task's callback.
Each of those steps is a bounded number of calls of ``rdmakit/doca`` code,
whatever the engine below does; a per-operation lookup, closure, wrapper or
re-planning shows up here as more calls. The far side is a plain soft device
pumped by hand (``rdmakit.testing.doca_rtt``), so each stage runs once.
"""

from collections.abc import Callable

import pytest

from rdmakit.testing.doca_rtt import STAGES, Far, doca_side, measure

DOCA = "/rdmakit/doca/"
#: The DOCA layer's calls per stage, at most (submit, one pass, far side, complete, an idle turn).
BOUNDS = {
    # Submit: WorkQ.submit, Rdma._dispatch (it posts), plan_holds (the plan still fits) and the
    # backend's post_send (its ring empty after it: no flush, no state read). The pass after it:
    # PE.progress, SoftPump.progress and Rdma._progress (the backend's ring is empty: no poll).
    # Completing also runs the backend's poll, Rdma._on_completion, Buf.commit_append (the WRITE's
    # destination grows) and progress_retrieve; an idle turn is progress_retrieve and the pass.
    "job": (4, 3, 0, 8, 4),
    # The same through Task.submit; completing runs Task._deliver, Task._finish and the task's
    # callback (`rdmakit.doca.rtt`'s, the application's), then reads Task.error.
    "task": (4, 3, 0, 10, 3),
}


@pytest.mark.parametrize("api", ["job", "task"])
def test_the_doca_layer_makes_few_calls_per_round_trip(api: str, new_ip: Callable[[], str]) -> None:
    far = Far(new_ip())
    try:
        with doca_side(far, new_ip(), api) as steps:
            _, calls = measure(steps, 0, 20, warm=20, only=DOCA)
    finally:
        far.close()
    got = dict(zip(STAGES, calls, strict=True))
    over = {s: (got[s], b) for s, b in zip(STAGES, BOUNDS[api], strict=True) if got[s] > b}
    assert not over, f"DOCA calls per stage over the bound (got, bound): {over}"
