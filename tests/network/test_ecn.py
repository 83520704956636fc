"""ECN on a real path (RoCEv2 Annex A17.9): R's bottleneck marks CE with RED, B's responder
answers with CNPs, and A's requester lowers its rate (DCQCN), across the routed bed.

R shapes to 1 Gbit/s (tbf, 64 KB) with a RED child that marks ECN-capable packets
(``tc qdisc ... red ... ecn``) from 16 KB queued. rdmakit sends ECT(0) on every
datagram, so RED marks rather than drops; the CNPs (BTH opcode 0x81) that come back are
counted on A's link by tcpdump; R's counters say how many packets were marked and
dropped. Needs root, ``sch_red`` and tcpdump (skipped with the reason otherwise).
"""

import re
import shutil
import signal
import sys

import pytest

from rdmakit.testing.netbed import GBIT_ECN, GBIT_SHALLOW, HUNG, BedSpec, NetBed, red_unavailable

WHY_NOT = red_unavailable() or (None if shutil.which("tcpdump") else "tcpdump is not installed")
pytestmark = [pytest.mark.netns, pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")]

RDMAKIT = [sys.executable, "-m", "rdmakit"]
#: What R's RED says it did (``tc -s qdisc``: "marked N early M pdrop P other O").
RED_STATS = re.compile(r"marked (\d+) early (\d+) pdrop (\d+)")
DROPPED = re.compile(r"dropped (\d+)")
BW_ROW = re.compile(r"^\s*65536\s+\d+\s+[\d.]+\s+([\d.]+)", re.M)


def _write_bw(bed: NetBed) -> tuple[float, int]:
    """One default ``ib_write_bw`` from A to B: its MB/s and the CNPs A's link carried."""
    # Annex A17.9.3: a CNP is a RoCEv2 packet to port 4791 whose BTH opcode is 0x81.
    cnps = bed.popen("a", ["tcpdump", "-i", "ra", "-n", "-q", "-l", "udp dst port 4791 and udp[8] = 0x81"])
    perf = [*RDMAKIT, "perftest", "ib_write_bw"]
    _server, client = bed.pair(
        ("b", [*perf, "-d", bed.addr("b")]), ("a", [*perf, "-d", bed.addr("a"), bed.addr("b")]), delay=1.5
    )
    cnps.send_signal(signal.SIGINT)
    out, _err = cnps.communicate(timeout=30)
    assert client.rc != HUNG, f"ib_write_bw stalled: {client.err[-2000:]}"
    assert client.rc == 0, f"ib_write_bw failed ({client.rc}): {client.err[-2000:]}"
    got = BW_ROW.findall(client.out)
    assert got, client.out
    return float(got[0]), sum(1 for line in out.splitlines() if "UDP" in line)


def _r_counters(bed: NetBed) -> str:
    return bed.sh(["tc", "-s", "qdisc", "show", "dev", "rb"], "r")


def test_ce_marks_bring_cnps_and_fewer_losses_than_tail_drop() -> None:
    with NetBed(BedSpec(shaping=GBIT_ECN)) as bed:
        mbs, cnps = _write_bw(bed)
        stats = _r_counters(bed)
    red = RED_STATS.search(stats)
    assert red is not None, stats
    marked, early, pdrop = (int(x) for x in red.groups())
    print(f"RED: {mbs:.1f} MB/s, {marked} marked, {early} early drops, {pdrop} drops, {cnps} CNPs")
    assert marked > 0  # R marked CE on what rdmakit sent as ECT(0)
    assert cnps > 0  # B answered them with CNPs (one per QP per 50 µs at most)
    with NetBed(BedSpec(shaping=GBIT_SHALLOW)) as bed:
        tail_mbs, tail_cnps = _write_bw(bed)
        stats = _r_counters(bed)
    tail = DROPPED.search(stats)
    assert tail is not None, stats
    tail_drops = int(tail.group(1))
    print(f"tail drop: {tail_mbs:.1f} MB/s, {tail_drops} drops, {tail_cnps} CNPs")
    assert tail_cnps == 0  # no marks, no CNPs
    # DCQCN's rate keeps the queue below RED's limit: fewer packets lost than at the same
    # 64 KB queue that only drops.
    assert early + pdrop < tail_drops
