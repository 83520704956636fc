"""``rdmakit bench --sweep``: WRITE throughput and round trips from 2 B to 8 MiB, and ``--plot``.

Sizes are the powers of two of ``perftest -a`` (2 B … ``--sweep-max``). At
each size, over RoCEv2/UDP with both ends polling (``--spin-us``):

- WRITE throughput (``depth_for(size)`` messages in flight) beside the
  flow-controlled raw UDP stream of the same datagrams, same direction;
- the WRITE round trip beside a raw ping of the same size (RoCE-sized
  datagrams out, 8 bytes back) with the same spin policy, and
  ``fi_pingpong -p tcp -e msg -S size`` where installed.

``--plot FILE.png`` draws both against size (matplotlib: the ``plot`` extra).
"""

import argparse
from typing import Any

from rdmakit.cli.bench_measure import Measure, MiB, c_median
from rdmakit.cli.bench_rows import Report, Row, sample
from rdmakit.cli.errors import CliError
from rdmakit.engine import WrOpcode

#: Messages per throughput run at most (fewer when ``--total`` runs out first).
SWEEP_MESSAGES = 1000
#: Bytes the pings of one size move at most (large sizes take fewer pings).
SWEEP_PING_BYTES = 64 * MiB


def sizes(largest: int = 8 * MiB) -> list[int]:
    """2, 4, 8, … up to ``largest`` (perftest ``-a``)."""
    out, s = [], 2
    while s <= largest:
        out.append(s)
        s *= 2
    return out


def human(size: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def sweep(m: Measure, args: argparse.Namespace, rep: Report) -> None:
    for size in sizes(int(args.sweep_max)):
        one_size(m, args, rep, size)


def one_size(m: Measure, args: argparse.Namespace, rep: Report, size: int) -> None:
    """The four rows of one size."""
    runs = int(args.runs)
    spin = float(args.spin_us) * 1e-6
    h = human(size)
    total = max(16, min(SWEEP_MESSAGES, int(args.total) * MiB // size)) * size
    pings = max(10, min(int(args.pings), SWEEP_PING_BYTES // size))

    def raw_bw() -> float:
        return m.raw_udp_out(size, total, spin) / 1e6

    def write_bw() -> float:
        return m.rdma_stream("roce-udp", WrOpcode.RDMA_WRITE, size, total, spin, total // 4) / 1e6

    def raw_rtt() -> float:
        return m.raw_ping(size, pings, spin) * 1e6

    def write_rtt() -> float:
        return m.rdma_rtt(WrOpcode.RDMA_WRITE, size, pings, spin) * 1e6

    raw = rep.add(Row(f"sweep_raw_bw:{size}", f"raw UDP stream, {h} messages", "MB/s", sample(raw_bw, runs)))
    rep.add(
        Row(f"sweep_bw:{size}", f"RDMA WRITE {h}, UDP", "MB/s", sample(write_bw, runs),
            baseline=raw.value, baseline_name=raw.name)
    )  # fmt: skip
    ping = rep.add(
        Row(f"sweep_raw_rtt:{size}", f"raw UDP ping, {h} out, 8 B back", "µs", sample(raw_rtt, runs))
    )
    fi = c_median(lambda: m.tools.fi_pingpong(size, pings), runs)
    rep.add(
        Row(f"sweep_rtt:{size}", f"RDMA WRITE {h} round trip, polling", "µs", sample(write_rtt, runs),
            baseline=ping.value, baseline_name=ping.name,
            c_baseline=None if fi is None else fi * 1e6, c_baseline_name=f"fi_pingpong -S {size}")
    )  # fmt: skip


def series(rows: list[Row], prefix: str, field: str = "value") -> list[tuple[int, float]]:
    """(size, figure) of the sweep rows whose key starts ``prefix:``, by size."""
    out = []
    for r in rows:
        kind, _, size = r.key.partition(":")
        if kind != prefix or not size.isdigit():
            continue
        v = getattr(r, field)
        if v is not None:
            out.append((int(size), float(v)))
    return sorted(out)


def require_matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise CliError("--plot needs matplotlib: pip install 'rdmakit[plot]'") from e
    return plt


def plot(rows: list[Row], path: str) -> None:
    """Throughput and round trip against size, rdmakit beside its baselines, to ``path``."""
    plt = require_matplotlib()
    fig, (bw, lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    throughput = (("sweep_bw", "value", "rdmakit WRITE, UDP"), ("sweep_raw_bw", "value", "raw UDP stream"))
    for ax, lines, unit in (
        (bw, throughput, "MB/s"),
        (
            lat,
            (
                ("sweep_rtt", "value", "rdmakit WRITE round trip"),
                ("sweep_raw_rtt", "value", "raw UDP ping, same spin"),
                ("sweep_rtt", "c_baseline", "fi_pingpong -p tcp -e msg"),
            ),
            "µs",
        ),
    ):
        for prefix, field, label in lines:
            pts = series(rows, prefix, field)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    bw.set_title("throughput")
    lat.set_title("round trip")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
