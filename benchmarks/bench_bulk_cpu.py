"""CPU seconds per GiB of the 1 MiB streams of ``rdmakit bench``, both processes, beside raw (not a test).

Run: ``python benchmarks/bench_bulk_cpu.py [--rounds N] [--mib M] [--spin-us S] [--ip-a A] [--ip-b B]``

Throughput on a shared or small machine is mostly what the scheduler gives
the two processes; the CPU time each spends per GiB is steadier. This runs
the bench's own measurements (`rdmakit.cli.bench_measure.Measure`: the same
far side, socket setup, window and timing) and reads the user and system time
of this process (``os.times``) and of the far side (``/proc/PID/stat``) around
each stream. With ``--spin-us 0`` (the default) both ends block instead of
polling, so the figures are work, not waiting. Rows alternate, ``--rounds``
times; each figure is the median over the rounds.
"""

import argparse
import os
import statistics
from collections.abc import Callable

from rdmakit.cli.bench_measure import Measure, MiB
from rdmakit.cli.bench_peer import Child
from rdmakit.cli.bench_tools import CTools
from rdmakit.engine import WrOpcode


def _child_cpu(pid: int) -> tuple[float, float]:
    """User and system seconds of process `pid` so far (``/proc/PID/stat`` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=1024, help="MiB per stream (1024)")
    ap.add_argument("--spin-us", type=float, default=0.0, help="polling before blocking, both ends (0)")
    ap.add_argument("--ip-a", default="127.0.0.2")
    ap.add_argument("--ip-b", default="127.0.0.3")
    args = ap.parse_args()
    total, spin = args.mib * MiB, args.spin_us * 1e-6
    child = Child()
    m = Measure(args.ip_a, args.ip_b, child, CTools(args.ip_a, args.ip_b, print, enabled=False), 1024)
    rows: dict[str, Callable[[], float]] = {
        "raw TCP stream": lambda: m.raw_tcp(MiB, total, 0),
        "WRITE, TCP transport": lambda: m.rdma_stream("tcp", WrOpcode.RDMA_WRITE, MiB, total, spin, 0),
        "raw UDP GSO->GRO, A->B": lambda: m.raw_udp_out(MiB, total, spin),
        "WRITE, RoCEv2/UDP": lambda: m.rdma_stream("roce-udp", WrOpcode.RDMA_WRITE, MiB, total, spin, 0),
        "raw UDP GSO->GRO, B->A": lambda: m.raw_udp_in(MiB, total, spin),
        "READ, RoCEv2/UDP": lambda: m.rdma_stream("roce-udp", WrOpcode.RDMA_READ, MiB, total, spin, 0),
    }
    got: dict[str, list[tuple[float, float, float, float, float]]] = {name: [] for name in rows}
    gib = total / (1 << 30)
    try:
        for _ in range(args.rounds):
            for name, run in rows.items():
                t0, c0 = os.times(), _child_cpu(child.proc.pid)
                rate = run()
                t1, c1 = os.times(), _child_cpu(child.proc.pid)
                got[name].append(
                    (
                        rate / 1e6,
                        (t1.user - t0.user) / gib,
                        (t1.system - t0.system) / gib,
                        (c1[0] - c0[0]) / gib,
                        (c1[1] - c0[1]) / gib,
                    )
                )
    finally:
        child.close()
    print(f"{args.mib} MiB per stream, spin {args.spin_us:g} µs, median of {args.rounds}; s per GiB")
    print(f"{'stream':26s} {'MB/s':>8s} {'A user':>7s} {'A sys':>7s} {'B user':>7s} {'B sys':>7s}")
    for name, runs in got.items():
        med = [statistics.median(r[i] for r in runs) for i in range(5)]
        print(f"{name:26s} {med[0]:8.0f} {med[1]:7.3f} {med[2]:7.3f} {med[3]:7.3f} {med[4]:7.3f}")


if __name__ == "__main__":
    main()
