"""``rdmakit bench --scale``: 1, 16, 256 and 1024 connected QPs between the two processes.

For each QP count ``N`` (``--scale-qps``), each run opens a device at each
end, creates and connects ``N`` RC QPs on RoCEv2/UDP, then measures:

- the set-up rate: ``N`` over the seconds from the first request to every QP
  connected at both ends (QPs per second);
- resident memory per idle connected QP: how much each process's resident
  set grew while its ``N`` QPs were created and connected, over ``N``, on this
  side and on the far side (Python's allocator grows in steps: small ``N``
  gives a coarse figure);
- aggregate WRITE throughput: 64 KiB WRITEs posted to the QPs in turn, at
  most 64 in flight in all;
- the 8-byte WRITE round trip on one QP while the other ``N - 1`` keep
  WRITEs in flight (with ``N = 1``, an idle link).
"""

import argparse
import statistics

from rdmakit.cli.bench_measure import Measure
from rdmakit.cli.bench_peer import Requester
from rdmakit.cli.bench_rows import Report, Row
from rdmakit.engine import WrOpcode

DEFAULT_QPS = (1, 16, 256, 1024)
#: Bytes of each WRITE of the throughput and background traffic.
SCALE_MESSAGE = 64 << 10
#: WRITEs in flight over all QPs.
SCALE_IN_FLIGHT = 64
#: Round trips per run with the other QPs busy, at most.
SCALE_PINGS = 500
MAX_QPS = 4096


def qp_counts(text: str) -> tuple[int, ...]:
    """``1,16,256`` -> (1, 16, 256): each 1 … 4096."""
    try:
        counts = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of QP counts: {text!r}") from None
    if not counts or any(not 1 <= n <= MAX_QPS for n in counts):
        raise argparse.ArgumentTypeError(f"QP counts are 1 … {MAX_QPS}, comma-separated: {text!r}")
    return counts


def scale(m: Measure, args: argparse.Namespace, rep: Report) -> None:
    runs = int(args.runs)
    spin = float(args.spin_us) * 1e-6
    pings = max(10, min(int(args.pings), SCALE_PINGS))
    for n in args.scale_qps:
        total = max(int(args.total) << 20, n * SCALE_MESSAGE)
        setup: list[float] = []
        rss: list[float] = []
        peer_rss: list[float] = []
        bw: list[float] = []
        rtt: list[float] = []
        for _ in range(runs):
            r = Requester(m.child, "roce-udp", m.a, m.b, SCALE_MESSAGE, m.opts(spin), n=n)
            try:
                setup.append(n / r.setup_secs)
                rss.append(r.rss / n / 1024)
                peer_rss.append(r.peer_rss / n / 1024)
                bw.append(total / r.stream(WrOpcode.RDMA_WRITE, SCALE_MESSAGE, total, SCALE_IN_FLIGHT) / 1e6)
                got = r.loaded_round_trips(8, pings, SCALE_MESSAGE, SCALE_IN_FLIGHT)
                rtt.append(statistics.median(got) * 1e6)
            finally:
                r.close()
        busy = f"{n - 1} QPs busy" if n > 1 else "idle"
        rep.add(Row(f"scale_setup:{n}", f"connect {n} QPs, both ends", "QP/s", setup))
        rep.add(Row(f"scale_rss:{n}", f"RSS per idle connected QP, {n} QPs, here", "KiB", rss))
        rep.add(Row(f"scale_rss_peer:{n}", f"RSS per idle connected QP, {n} QPs, far side", "KiB", peer_rss))
        rep.add(Row(f"scale_bw:{n}", f"RDMA WRITE 64 KiB over {n} QPs, aggregate", "MB/s", bw))
        rep.add(Row(f"scale_rtt:{n}", f"RDMA WRITE 8 B round trip, {busy}", "µs", rtt))
