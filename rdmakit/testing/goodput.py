"""Goodput across the routed bed, as a ratio to TCP (iperf3) on the same path in the same run.

    sudo python3 -m rdmakit.testing.goodput [--runs N] [--json-out FILE]

For each path of the matrix (``PATHS``) a fresh bed A – R – B
(:mod:`rdmakit.testing.netbed`) carries, in turn, one iperf3 TCP stream
from A to B (``-t`` seconds) and ``rdmakit perftest ib_write_bw`` and
``ib_read_bw`` with their defaults (65536-byte messages; the MTU from the
network). Each figure is the median of ``--runs`` runs; the ratio divides
rdmakit's median by iperf3's. iperf3's figure is its receiver's; perftest's
its ``BW average``, which both divide by 2^20, shown here in MB/s (10^6).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import sys
from dataclasses import asdict, dataclass

from .netbed import (
    GBIT_DEEP,
    GBIT_DEEP_SEGMENTING,
    GBIT_SHALLOW,
    SEGMENTING,
    BedSpec,
    NetBed,
    Side,
    unavailable,
)

#: name -> (what the path is, the bed, IP version)
PATHS: dict[str, tuple[str, BedSpec, int]] = {
    "gbit-deep": ("1 Gbit/s, deep buffer (tbf limit 4 MB), MTU 1500", BedSpec(shaping=GBIT_DEEP), 4),
    "gbit-deep-seg": ("the same, R segmenting (burst 64 KB)", BedSpec(shaping=GBIT_DEEP_SEGMENTING), 4),
    "gbit-shallow": ("1 Gbit/s, shallow buffer (64 KB), MTU 1500", BedSpec(shaping=GBIT_SHALLOW), 4),
    "gbit-deep-v6": ("the same deep path over IPv6", BedSpec(shaping=GBIT_DEEP), 6),
    "segmenting": ("R segments GSO batches (tbf 20 Gbit/s, burst 16 KB)", BedSpec(shaping=SEGMENTING), 4),
    "mtu1500": ("no shaping, MTU 1500", BedSpec(), 4),
    "mtu9000": ("no shaping, MTU 9000", BedSpec(mtu_a=9000, mtu_b=9000), 4),
}
TESTS = ("ib_write_bw", "ib_read_bw")
_BW_ROW = re.compile(r"^\s*65536\s+\d+\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s*$", re.M)
_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Row:
    path: str
    what: str
    test: str
    rdmakit_mbs: float | None  # MB/s (10^6 bytes), median; None: every run failed
    iperf3_mbs: float
    ratio: float | None
    failures: int
    note: str
    #: The host's 1-minute load average after the runs: rdmakit is a userspace
    #: data path, so on a shared host its figure falls with its CPU share.
    load: float


def _iperf3(bed: NetBed, version: int, seconds: int) -> float:
    """MB/s iperf3 moved from A to B (its receiver's figure)."""
    _server, client = bed.pair(
        ("b", ["iperf3", "-s", "-1", "-B", bed.addr("b", version)]),
        ("a", ["iperf3", "-J", "-t", str(seconds), "-c", bed.addr("b", version)]),
        timeout=seconds + 30,
    )
    if client.rc != 0:
        raise RuntimeError(f"iperf3 failed: {client.err.strip() or client.out[-500:]}")
    report = json.loads(client.out)
    return float(report["end"]["sum_received"]["bits_per_second"]) / 8e6


def _perftest(bed: NetBed, version: int, test: str) -> tuple[float | None, str]:
    """MB/s of one default perftest run (B serves, A is the client), or None and why not."""
    rk = [sys.executable, "-m", "rdmakit", "perftest", test]
    srv: tuple[Side, list[str]] = ("b", [*rk, "-d", bed.addr("b", version)])
    cli: tuple[Side, list[str]] = ("a", [*rk, "-d", bed.addr("a", version), bed.addr("b", version)])
    _server, client = bed.pair(srv, cli, delay=1.5, timeout=180)  # a loaded host starts servers slowly
    got = _BW_ROW.findall(client.out)
    if client.rc != 0 or not got:
        return None, (client.err.strip().splitlines() or [f"status {client.rc}"])[-1][:200]
    return float(got[0]) * _MIB / 1e6, ""


def measure(names: list[str], runs: int, seconds: int) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        what, spec, version = PATHS[name]
        with NetBed(spec) as bed:
            tcp = [_iperf3(bed, version, seconds) for _ in range(runs)]
            base = statistics.median(tcp)
            for test in TESTS:
                figures, notes = [], []
                for _ in range(runs):
                    mbs, why = _perftest(bed, version, test)
                    if mbs is None:
                        notes.append(why)
                    else:
                        figures.append(mbs)
                med = statistics.median(figures) if figures else None
                ratio = med / base if med is not None and base > 0 else None
                note = "; ".join(sorted(set(notes)))
                load = os.getloadavg()[0]
                rows.append(Row(name, what, test, med, base, ratio, len(notes), note, load))
                print(_line(rows[-1]), flush=True)
    return rows


def _line(r: Row) -> str:
    got = f"{r.rdmakit_mbs:8.1f}" if r.rdmakit_mbs is not None else "  failed"
    ratio = f"{r.ratio:5.2f}x" if r.ratio is not None else "    - "
    fail = f"  ({r.failures} failed: {r.note})" if r.failures else ""
    tcp = f"iperf3 {r.iperf3_mbs:8.1f} MB/s"
    return f"{r.path:<14} {r.test:<12} {got} MB/s  {tcp}  {ratio}  load {r.load:4.1f}{fail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m rdmakit.testing.goodput", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="runs per figure (3); the median is shown")
    p.add_argument("--seconds", type=int, default=5, help="iperf3 -t (5)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of: {', '.join(PATHS)}")
    p.add_argument("--json-out", help="write the rows as JSON to this file")
    a = p.parse_args(argv)
    names = [n for n in a.paths.split(",") if n]
    bad = [n for n in names if n not in PATHS]
    if bad or not 1 <= a.runs <= 20 or not 1 <= a.seconds <= 120:
        p.error(f"unknown path {bad[0]!r}" if bad else "--runs is 1..20 and --seconds 1..120")
    why = unavailable() or (None if shutil.which("iperf3") else "iperf3 is not installed")
    if why is not None:
        print(f"goodput: {why}", file=sys.stderr)
        return 1
    rows = measure(names, a.runs, a.seconds)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
