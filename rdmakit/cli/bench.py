"""``rdmakit bench``: RDMA on the soft engine against raw sockets and C tools, like for like.

A child process (``rdmakit bench --serve``) plays the far side of every test;
the two talk JSON lines over the child's stdin/stdout. Every figure is the
median of ``--runs`` runs, printed with its spread (min–max), and every RDMA
figure beside the raw-socket baseline that does the same thing without RDMA:

- round trips of 8-byte operations with both ends polling (``--spin-us``:
  poll that long after the last event, then block in epoll) against a UDP
  ping-pong with the same spin policy; event-driven round trips (``--spin-us
  0`` on both ends) against a blocking ping-pong;
- READ, FETCH_ADD and CMP_SWP round trips against the WRITE round trip;
- 1 MiB WRITE over the TCP transport against a TCP stream with the
  transport's socket tuning (`rdmakit.transport.tuning`), warmed up and timed
  the same way: from the first send to the last byte acknowledged;
- 1 MiB WRITE and READ over RoCEv2/UDP at MTU 4096 against a flow-controlled
  GSO→GRO stream of RoCE-sized datagrams in the same direction, through the
  soft device's own socket setup;
- the polling WRITE round trip through the DOCA job and task APIs against the
  engine's, with the same far side, each run alternated with one of the
  engine's (`rdmakit.cli.bench_doca`).

Where installed, C tools run on the same two addresses as a second baseline
(`rdmakit.cli.bench_tools`): iperf3 for the TCP stream, fi_pingpong (libfabric,
``-p tcp -e msg``, same size) for the polling round trip, sockperf for the
blocking one. `rdmakit.cli.bench_rows.TARGETS` holds every target; ``--check``
fails the run when a median misses one, ``--json-out FILE`` writes the rows.
``--sweep`` measures sizes 2 B … 8 MiB (``--plot`` draws them) and ``--scale``
1 to 1024 connected QPs.
"""

import argparse
import ipaddress
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rdmakit.cli import bench_doca, bench_scale, bench_sweep
from rdmakit.cli.bench_measure import Measure, MiB, c_median
from rdmakit.cli.bench_peer import Child, serve
from rdmakit.cli.bench_rows import HEADER, Report, Row, failures, sample
from rdmakit.cli.bench_tools import CTools
from rdmakit.cli.errors import CliError
from rdmakit.cli.lifecycle import run
from rdmakit.cli.options import add_general_flags, float_in, int_in
from rdmakit.engine import WrOpcode
from rdmakit.transport import fastpath


def headline(m: Measure, args: argparse.Namespace, rep: Report) -> None:
    """The rows of a plain ``rdmakit bench``."""
    runs, pings = int(args.runs), int(args.pings)
    total = int(args.total) * MiB
    spin = float(args.spin_us) * 1e-6
    warm = min(8 * MiB, total)
    tools = m.tools

    def add(key: str, name: str, unit: str, fn: Callable[[], float], **kw: Any) -> Row:
        return rep.add(Row(key, name, unit, sample(fn, runs), **kw))

    # Throughput, MB/s.
    raw = add(
        "tcp_raw",
        "raw TCP stream, 1 MiB, transport's tuning",
        "MB/s",
        lambda: m.raw_tcp(MiB, total, warm) / 1e6,
    )
    iperf = c_median(lambda: tools.iperf3(total, MiB), runs)
    add(
        "tcp_write",
        "RDMA WRITE 1 MiB, TCP transport",
        "MB/s",
        lambda: m.rdma_stream("tcp", WrOpcode.RDMA_WRITE, MiB, total, spin, warm) / 1e6,
        baseline=raw.value,
        baseline_name=raw.name,
        c_baseline=None if iperf is None else iperf / 1e6,
        c_baseline_name="iperf3 -l 1M, one stream",
    )
    out = add(
        "udp_raw_out",
        "raw UDP GSO→GRO stream, 1 MiB, A→B",
        "MB/s",
        lambda: m.raw_udp_out(MiB, total, spin) / 1e6,
    )
    add(
        "udp_write",
        "RDMA WRITE 1 MiB, RoCEv2/UDP, MTU 4096",
        "MB/s",
        lambda: m.rdma_stream("roce-udp", WrOpcode.RDMA_WRITE, MiB, total, spin, warm) / 1e6,
        baseline=out.value,
        baseline_name=out.name,
    )
    inn = add(
        "udp_raw_in",
        "raw UDP GSO→GRO stream, 1 MiB, B→A",
        "MB/s",
        lambda: m.raw_udp_in(MiB, total, spin) / 1e6,
    )
    add(
        "udp_read",
        "RDMA READ 1 MiB, RoCEv2/UDP, MTU 4096",
        "MB/s",
        lambda: m.rdma_stream("roce-udp", WrOpcode.RDMA_READ, MiB, total, spin, warm) / 1e6,
        baseline=inn.value,
        baseline_name=inn.name,
    )

    # Round trips, µs: polling rows against the polling ping, event-driven against blocking.
    ping = add(
        "ping_poll",
        f"raw UDP ping 8 B, polling {args.spin_us:g} µs",
        "µs",
        lambda: m.raw_ping(8, pings, spin) * 1e6,
    )
    fi = c_median(lambda: tools.fi_pingpong(8, pings), runs)
    fi_us = None if fi is None else fi * 1e6

    def rtt(op: WrOpcode, compare_add: int = 0, swap: int = 0, s: float = spin) -> Callable[[], float]:
        return lambda: m.rdma_rtt(op, 8, pings, s, compare_add, swap) * 1e6

    common = {"baseline": ping.value, "baseline_name": ping.name}
    add(
        "rtt_write_poll",
        "RDMA WRITE 8 B round trip, polling",
        "µs",
        rtt(WrOpcode.RDMA_WRITE),
        c_baseline=fi_us,
        c_baseline_name="fi_pingpong -p tcp -e msg -S 8",
        **common,
    )
    add("rtt_read_poll", "RDMA READ 8 B round trip, polling", "µs", rtt(WrOpcode.RDMA_READ), **common)
    add(
        "rtt_fadd_poll",
        "ATOMIC FETCH_ADD 8 B round trip, polling",
        "µs",
        rtt(WrOpcode.ATOMIC_FETCH_AND_ADD, compare_add=1),
        **common,
    )
    add(
        "rtt_cswap_poll",
        "ATOMIC CMP_SWP 8 B round trip, polling",
        "µs",
        rtt(WrOpcode.ATOMIC_CMP_AND_SWP),
        **common,
    )
    block = add("ping_block", "raw UDP ping 8 B, blocking", "µs", lambda: m.raw_ping(8, pings, 0.0) * 1e6)
    sp = c_median(lambda: tools.sockperf(8), runs)
    add(
        "rtt_write_event",
        "RDMA WRITE 8 B round trip, event-driven",
        "µs",
        rtt(WrOpcode.RDMA_WRITE, s=0.0),
        baseline=block.value,
        baseline_name=block.name,
        c_baseline=None if sp is None else sp * 1e6,
        c_baseline_name="sockperf ping-pong -m 14 (its minimum), blocking",
    )

    # The DOCA layer: the same round trip and far side as the engine's row, this side through DOCA,
    # each run alternated with one of the engine's (`bench_doca.alternated`): the ratio that counts.
    eng, job, task = bench_doca.alternated(
        lambda: m.rdma_rtt(WrOpcode.RDMA_WRITE, 8, pings, spin), m.child, m.a, m.b, pings, spin, runs
    )
    us = [[x * 1e6 for x in xs] for xs in (eng, job, task)]
    alt = rep.add(Row("rtt_write_alt", "RDMA WRITE 8 B round trip, alternated with DOCA", "µs", us[0]))
    for key, name, xs in (
        ("doca_job_rtt", "DOCA job API: WRITE 8 B round trip, polling", us[1]),
        ("doca_task_rtt", "DOCA task API: the same", us[2]),
    ):
        rep.add(Row(key, name, "µs", xs, baseline=alt.value, baseline_name=alt.name))


def _bench(args: argparse.Namespace) -> int:
    if args.serve:
        return serve(sys.stdin, sys.stdout)
    if args.plot and not args.sweep:
        raise CliError("--plot draws a sweep: add --sweep")
    if args.plot:
        bench_sweep.require_matplotlib()
    quiet = args.json_out == "-"
    rep = Report(quiet)
    rep.say(f"rdmakit bench: {args.runs} runs each (median, min–max), {args.total} MiB per throughput run")
    rep.say(f"UDP data plane: {fastpath.describe()}; polling: {args.spin_us:g} µs before blocking")
    tools = CTools(args.ip_a, args.ip_b, rep.say, enabled=not args.no_c_baselines)
    child = Child()
    ok = False
    try:
        m = Measure(args.ip_a, args.ip_b, child, tools, int(args.window))
        rep.say(HEADER)
        if args.sweep:
            bench_sweep.sweep(m, args, rep)
        elif args.scale:
            bench_scale.scale(m, args, rep)
        else:
            headline(m, args, rep)
        ok = True
    finally:
        if ok:
            child.close()
        else:  # an error, Ctrl-C, SIGTERM or SIGHUP: the far side goes too, at once
            child.kill()
    rows = [r.as_json() for r in rep.rows.values()]
    if quiet:
        print(json.dumps(rows, indent=2))
    elif args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2) + "\n")
    if args.plot:
        bench_sweep.plot(list(rep.rows.values()), args.plot)
        rep.say(f"plot written to {args.plot}")
    missed = failures(list(rep.rows.values()))
    if args.check:
        for line in missed:
            print(f"target missed: {line}", file=sys.stderr)
        if missed:
            return 1
        rep.say("every target with a figure holds")
    return 0


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from None


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("bench", help="benchmark the soft engine against raw sockets and C tools (loopback)")
    add_general_flags(p)
    p.add_argument("--runs", type=int_in(1, 1000), default=5, help="runs per figure; the median is shown (5)")
    p.add_argument("--total", type=int_in(1, 1 << 20), default=256, help="MiB per throughput run (256)")
    p.add_argument("--pings", type=int_in(1, 10**8), default=2000, help="round trips per latency run (2000)")
    p.add_argument(
        "--window",
        type=int_in(1, 1 << 22),
        default=1024,
        help="requester window in PSNs, rdmakit to rdmakit (1024; rxe 128); the raw UDP stream's too",
    )
    p.add_argument(
        "--spin-us",
        type=float_in(0.0, 1e6),
        default=200.0,
        help="µs of polling after the last event before blocking, both ends and the raw ping (200)",
    )
    p.add_argument("--ip-a", type=_address, default="127.0.0.2", help="this side's loopback address")
    p.add_argument("--ip-b", type=_address, default="127.0.0.3", help="the far side's loopback address")
    p.add_argument("--check", action="store_true", help="exit 1 when a median misses its target")
    p.add_argument("--json-out", metavar="FILE", help="write the rows as JSON to FILE ('-': print only them)")
    p.add_argument("--no-c-baselines", action="store_true", help="skip iperf3, sockperf and fi_pingpong")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sweep", action="store_true", help="sizes 2 B … --sweep-max, powers of two")
    mode.add_argument("--scale", action="store_true", help="1 … 1024 connected QPs (--scale-qps)")
    p.add_argument(
        "--sweep-max",
        type=int_in(2, 1 << 30),
        default=8 * MiB,
        help="largest size of --sweep in bytes (8 MiB)",
    )
    p.add_argument("--plot", metavar="FILE.png", help="with --sweep: draw throughput and latency vs size")
    p.add_argument(
        "--scale-qps",
        type=bench_scale.qp_counts,
        default=bench_scale.DEFAULT_QPS,
        help="with --scale: QP counts, comma-separated (1,16,256,1024)",
    )
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=run(p, _bench))


__all__ = ["headline", "register"]
