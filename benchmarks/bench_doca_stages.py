"""Where the time and the Python calls of a DOCA 8-byte WRITE round trip go, beside the engine's (not a test).

Run: ``python benchmarks/bench_doca_stages.py [--count N] [--calls N] [--cprofile API]``

The far side is a plain soft device in this same thread, pumped by hand, so
no scheduler or polling loop is timed (``rdmakit.testing.doca_rtt``). This
side makes the WRITE three ways: the engine's QP and `Driver` (what ``rdmakit
bench``'s engine row does), a DOCA `Rdma` context through ``WorkQ.submit`` and
``progress_retrieve`` (the job API), and through ``doca_task_submit`` and
``doca_pe_progress`` (the task API). Each stage is timed with
``perf_counter_ns``; the median of each over ``--count`` round trips is
printed with the Python function calls the stage made, in all and in the DOCA
layer's own code (``sys.setprofile``, over ``--calls`` further round trips):

- submit: ``post_send``, ``WorkQ.submit`` or ``Task.submit``;
- requester: one pass of its pump (a soft device posts natively: the request
  left in the submit; otherwise this pass sends it);
- the far side: receive, place the 8 bytes, send the ACK;
- complete: progress until the completion is polled, the event retrieved or
  the callback ran;
- idle: one more progress with nothing to do (what every turn of a polling
  loop costs while it waits).

``--cprofile engine|job|task`` prints the 25 functions with the most own time
over the round trips instead.
"""

import argparse
import cProfile
import pstats
import time
from contextlib import AbstractContextManager

from rdmakit.testing.doca_rtt import STAGES, Far, Steps, _run, doca_side, engine_side, measure

DOCA = "/rdmakit/doca/"


def side(name: str, far: Far, ip: str) -> AbstractContextManager[Steps]:
    return engine_side(far, ip) if name == "engine" else doca_side(far, ip, name)


def profile(name: str, count: int, ip_a: str, ip_b: str) -> None:
    far = Far(ip_b)
    try:
        with side(name, far, ip_a) as steps:
            measure(steps, 300, 0)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(count):
                _run(steps, [[] for _ in STAGES], time.perf_counter_ns)
            prof.disable()
    finally:
        far.close()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=3000, help="round trips timed (3000)")
    ap.add_argument("--calls", type=int, default=50, help="round trips whose calls are counted (50)")
    ap.add_argument("--ip-a", default="127.203.0.1", help="this side's loopback address")
    ap.add_argument("--ip-b", default="127.203.0.2", help="the far side's loopback address")
    ap.add_argument("--cprofile", choices=("engine", "job", "task"), help="profile one API instead")
    a = ap.parse_args()
    if a.cprofile:
        profile(a.cprofile, a.count, a.ip_a, a.ip_b)
        return
    rows: dict[str, tuple[list[float], list[float], list[float]]] = {}
    for name in ("engine", "job", "task"):
        far = Far(a.ip_b)
        try:
            with side(name, far, a.ip_a) as steps:
                us, calls = measure(steps, a.count, a.calls)
                _, own = measure(steps, 0, a.calls, warm=0, only=DOCA)
                rows[name] = (us, calls, own)
        finally:
            far.close()
    print(f"8-byte WRITE round trip, one thread, {a.count} round trips:")
    print("median µs per stage (Python calls in all, those of the DOCA layer)")
    print(f"  {'stage':30s}" + "".join(f"{n:>24s}" for n in rows))
    for k, stage in enumerate(STAGES):
        cells = "".join(f"{rows[n][0][k]:10.2f} ({rows[n][1][k]:4.0f}, {rows[n][2][k]:3.0f})" for n in rows)
        print(f"  {stage:30s}{cells}")
    busy = range(len(STAGES) - 1)
    total = "".join(
        f"{sum(rows[n][0][k] for k in busy):10.2f} ({sum(rows[n][1][k] for k in busy):4.0f}, "
        f"{sum(rows[n][2][k] for k in busy):3.0f})"
        for n in rows
    )
    print(f"  {'round trip (no idle turn)':30s}{total}")


if __name__ == "__main__":
    main()
