"""``rdmakit bench``: RDMA on the soft engine against raw sockets, in one run.

A child process (``rdmakit bench --serve``) plays the far side of every test;
the two talk JSON lines over the child's stdin/stdout. Each figure is the
median of ``--runs`` runs, and each RDMA figure is printed with its ratio to
the raw-socket baseline measured in the same run:

- RDMA WRITE of 1 MiB messages over the TCP transport vs. a blocking TCP
  stream of 1 MiB ``sendall``/``recv_into`` (target ≥ 0.9);
- RDMA WRITE over RoCEv2/UDP at MTU 4096 vs. raw UDP GSO→GRO with the same
  datagram size (target ≥ 0.5);
- 8-byte RDMA WRITE round trips through the synchronous driver vs. a blocking
  UDP ping-pong (target ≤ 1.5);
- RDMA READ throughput and 8-byte atomic latency, alongside; the WRITE round
  trip also against a ping-pong that busy-polls both ends (the software's
  own cost, without the wake-ups a blocking socket pays), and again in
  event-driven mode.

Both sides pump their device through the synchronous :class:`Driver`: they
poll for ``--spin-us`` after the last event, then block in epoll (on a few
shared cores a spinning process takes the CPU its peer needs). The polling
must outlast the peer's turn-around (25–60 µs of Python per side here), or
every round trip also pays two wake-ups from idle; the event-driven row
(``--spin-us 0`` on both sides) shows that cost. The RDMA
requester's window is ``--window`` PSNs (rxe's 128 is what a kernel peer
expects; between two rdmakit peers the receiver's socket buffer holds more).
"""

import argparse
import contextlib
import dataclasses
import ipaddress
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from rdmakit.cli import bench_doca
from rdmakit.cli.common import CliError, add_general_flags, float_in, int_in, run
from rdmakit.engine import SGE, Access, CompletionQueue, QpCaps, SendWR, WcStatus, WrOpcode
from rdmakit.transport import baseline, fastpath
from rdmakit.transport.device import Endpoint, SoftDevice, TransportName, connect_qp, local_endpoint
from rdmakit.transport.driver import Driver
from rdmakit.transport.udp import UdpLink

MiB = 1 << 20
#: A RoCEv2 WRITE MIDDLE packet at MTU 4096: BTH + payload + ICRC.
UDP_SEGMENT_SIZE = 12 + 4096 + 4


# -- the far side --------------------------------------------------------------------------


class _Responder:
    """An RDMA responder: a device, a QP and target memory, progressed until stopped."""

    def __init__(self, transport: TransportName, ip: str, size: int) -> None:
        self.dev = SoftDevice(ip, transport=transport, port=0)
        self.cq = CompletionQueue(1024)
        self.qp = self.dev.create_qp(send_cq=self.cq, recv_cq=self.cq)
        self.mem = bytearray(size)
        every = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
        self.mr = self.dev.pd.register(self.mem, 0x4000_0000, every)
        self.psn = random.getrandbits(24)

    def info(self) -> dict[str, Any]:
        ep = local_endpoint(self.dev, self.qp, self.psn)
        return {"endpoint": dataclasses.asdict(ep), "addr": self.mr.addr, "rkey": self.mr.rkey}

    def serve(self, peer: dict[str, Any], stop: threading.Event, spin: float) -> dict[str, int]:
        connect_qp(self.dev, self.qp, self.psn, Endpoint(**peer))
        with Driver() as driver:
            driver.add(self.dev)
            while not stop.is_set():
                driver.run_until(stop.is_set, 0.05, spin)
        counters = self.dev.counters.as_dict()
        self.dev.close()
        return counters


def _stop_on_line(inp: TextIO) -> threading.Event:
    """An event set when the next line arrives: the pump polls it, never waits on stdin."""
    stop = threading.Event()

    def wait() -> None:
        inp.readline()
        stop.set()

    threading.Thread(target=wait, daemon=True).start()
    return stop


def _serve(inp: TextIO, out: TextIO) -> int:
    def reply(**kw: Any) -> None:
        out.write(json.dumps(kw) + "\n")
        out.flush()

    for line in inp:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "tcp-sink":
            sink = baseline.TcpSink(cmd["ip"])
            reply(port=sink.port)
            got, secs = sink.serve(cmd["chunk"])
            reply(bytes=got, secs=secs)
        elif op == "udp-sink":
            link = UdpLink(cmd["ip"], 0)
            reply(port=link.port)
            got, secs = baseline.udp_gro_sink(link, cmd["expect"])
            link.close()
            reply(bytes=got, secs=secs)
        elif op == "udp-echo":
            echo = baseline.UdpEcho(cmd["ip"])
            reply(port=echo.port)
            echo.serve(cmd["count"], bool(cmd.get("poll", False)))
            reply(done=True)
        elif op == "rdma":
            r = _Responder(cmd["transport"], cmd["ip"], cmd["size"])
            reply(**r.info())
            peer = json.loads(inp.readline())["endpoint"]
            reply(counters=r.serve(peer, _stop_on_line(inp), cmd["spin"]))
        elif op == "quit":
            return 0
    return 0


# -- the measuring side --------------------------------------------------------------------


class _Child:
    def __init__(self) -> None:
        # -P: a folder named rdmakit in the current directory must not shadow the package.
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "rdmakit", "bench", "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )  # fmt: skip

    def send(self, **kw: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(kw) + "\n")
        self.proc.stdin.flush()

    def recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise CliError("the benchmark's far side exited")
        return dict(json.loads(line))

    def close(self) -> None:
        try:
            self.send(op="quit")
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()

    def kill(self) -> None:
        """Stop the far side now (the measuring side is leaving on an error or a signal)."""
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class _Requester:
    def __init__(
        self, child: _Child, transport: TransportName, ip: str, peer_ip: str, size: int, opts: "_Opts"
    ) -> None:
        self.child = child
        child.send(op="rdma", transport=transport, ip=peer_ip, size=size, spin=opts.spin)
        info = child.recv()
        self.remote_addr, self.rkey = info["addr"], info["rkey"]
        self.dev = SoftDevice(ip, transport=transport, port=0)
        self.driver = Driver()
        self.driver.add(self.dev)
        self.spin = opts.spin
        self.cq = CompletionQueue(4096)
        # Between two rdmakit peers the window may exceed rxe's 128 PSNs: the
        # receiver's 32 MiB socket buffer holds it (verbs peers keep 128).
        self.qp = self.dev.create_qp(
            send_cq=self.cq,
            recv_cq=self.cq,
            caps=QpCaps(large_mtu=transport == "tcp", max_unacked_psns=opts.window),
        )
        self.mem = bytearray(size)
        self.mr = self.dev.pd.register(self.mem, 0x1000_0000, Access.LOCAL_WRITE)
        psn = random.getrandbits(24)
        child.send(endpoint=dataclasses.asdict(local_endpoint(self.dev, self.qp, psn)))
        connect_qp(self.dev, self.qp, psn, Endpoint(**info["endpoint"]))
        self.wr_id = 0

    def _wr(self, opcode: WrOpcode, length: int, compare_add: int = 0, swap: int = 0) -> SendWR:
        self.wr_id += 1
        return SendWR(
            wr_id=self.wr_id, opcode=opcode, sg_list=(SGE(self.mr.addr, length, self.mr.lkey),),
            remote_addr=self.remote_addr, rkey=self.rkey, compare_add=compare_add, swap=swap,
        )  # fmt: skip

    def stream(self, opcode: WrOpcode, length: int, total: int, depth: int = 4) -> float:
        """Seconds to complete ``total`` bytes of ``length``-byte operations, ``depth`` in flight."""
        n = max(1, total // length)
        posted = done = 0
        qp, cq, run, spin = self.qp, self.cq, self.driver.run_until, self.spin

        def completed() -> bool:
            return len(cq) > 0

        t0 = time.perf_counter()
        while done < n:
            while posted < n and posted - done < depth:
                qp.post_send(self._wr(opcode, length))
                posted += 1
            run(completed, 10.0, spin)
            for wc in cq.poll(16):
                if wc.status is not WcStatus.SUCCESS:
                    raise CliError(f"{opcode.name} failed: {wc.status.name}")
                done += 1
        return time.perf_counter() - t0

    def round_trips(
        self, opcode: WrOpcode, length: int, count: int, compare_add: int = 0, swap: int = 0
    ) -> list[float]:
        qp, cq, run, spin = self.qp, self.cq, self.driver.run_until, self.spin

        def completed() -> bool:
            return len(cq) > 0

        out: list[float] = []
        for _ in range(count):
            wr = self._wr(opcode, length, compare_add, swap)
            t0 = time.perf_counter()
            qp.post_send(wr)
            if not run(completed, 10.0, spin):
                raise CliError(f"{opcode.name}: no completion within 10 s")
            wcs = cq.poll(1)
            out.append(time.perf_counter() - t0)
            if wcs[0].status is not WcStatus.SUCCESS:
                raise CliError(f"{opcode.name} failed: {wcs[0].status.name}")
        return out

    def close(self) -> dict[str, Any]:
        self.child.send(op="stop")
        counters = self.child.recv()["counters"]
        self.driver.close()
        self.dev.close()
        return dict(counters)


@dataclasses.dataclass(frozen=True)
class _Opts:
    #: Requester window in PSNs (rxe: 128).
    window: int = 128
    #: Seconds of idle polling before the driver blocks in epoll.
    spin: float = 0.0


@dataclasses.dataclass
class Row:
    name: str
    value: float
    unit: str
    baseline: float | None = None
    target: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or not self.baseline:
            return None
        return self.value / self.baseline


def _median(fn: Callable[[], float], runs: int) -> float:
    return float(statistics.median(fn() for _ in range(runs)))


def _measure(args: argparse.Namespace, emit: Callable[[Row], None]) -> None:
    a, b = args.ip_a, args.ip_b
    total = int(args.total) * MiB
    runs = int(args.runs)
    opts = _Opts(window=int(args.window), spin=float(args.spin_us) * 1e-6)
    child = _Child()
    ok = False
    try:

        def raw_tcp() -> float:
            child.send(op="tcp-sink", ip=b, chunk=MiB)
            port = child.recv()["port"]
            secs = baseline.tcp_source(b, port, MiB, total)
            res = child.recv()
            return float(res["bytes"]) / secs

        def raw_udp() -> float:
            child.send(op="udp-sink", ip=b, expect=total)
            port = child.recv()["port"]
            baseline.udp_gso_source(a, (b, port), UDP_SEGMENT_SIZE, total)
            res = child.recv()
            return float(res["bytes"]) / float(res["secs"])

        def rdma_stream(transport: TransportName, opcode: WrOpcode) -> Callable[[], float]:
            def measure() -> float:
                r = _Requester(child, transport, a, b, MiB, opts)
                try:
                    r.stream(opcode, MiB, 8 * MiB)  # warm-up: caches, buffers, window
                    return total / r.stream(opcode, MiB, total)
                finally:
                    r.close()

            return measure

        tcp_base = _median(raw_tcp, runs)
        emit(Row("raw TCP stream, 1 MiB sendall/recv_into", tcp_base / 1e6, "MB/s"))
        v = _median(rdma_stream("tcp", WrOpcode.RDMA_WRITE), runs)
        emit(Row("RDMA WRITE 1 MiB, TCP transport", v / 1e6, "MB/s", tcp_base / 1e6, "≥ 0.9"))

        udp_base = _median(raw_udp, runs)
        emit(Row(f"raw UDP GSO→GRO, {UDP_SEGMENT_SIZE}-byte datagrams", udp_base / 1e6, "MB/s"))
        v = _median(rdma_stream("roce-udp", WrOpcode.RDMA_WRITE), runs)
        emit(Row("RDMA WRITE 1 MiB, RoCEv2/UDP, MTU 4096", v / 1e6, "MB/s", udp_base / 1e6, "≥ 0.5"))
        v = _median(rdma_stream("roce-udp", WrOpcode.RDMA_READ), runs)
        emit(Row("RDMA READ 1 MiB, RoCEv2/UDP, MTU 4096", v / 1e6, "MB/s", udp_base / 1e6))

        n = args.pings

        def raw_ping(poll: bool) -> Callable[[], float]:
            def measure() -> float:
                child.send(op="udp-echo", ip=b, count=n, poll=poll)
                port = child.recv()["port"]
                rtts = baseline.udp_ping(a, (b, port), n, 8, poll)
                child.recv()
                return statistics.median(rtts)

            return measure

        ping = _median(raw_ping(False), runs)
        emit(Row("raw UDP ping-pong, 8 bytes, round trip", ping * 1e6, "µs"))
        polled = _median(raw_ping(True), runs)
        emit(Row("raw UDP ping-pong, busy-polling both ends", polled * 1e6, "µs"))

        def rdma_rtt(
            opcode: WrOpcode, compare_add: int = 0, swap: int = 0, how: _Opts = opts
        ) -> Callable[[], float]:
            def measure() -> float:
                r = _Requester(child, "roce-udp", a, b, MiB, how)
                try:
                    r.round_trips(opcode, 8, 100, compare_add, swap)
                    return statistics.median(r.round_trips(opcode, 8, n, compare_add, swap))
                finally:
                    r.close()

            return measure

        v = _median(rdma_rtt(WrOpcode.RDMA_WRITE), runs)
        emit(Row("RDMA WRITE 8 bytes, round trip (sync driver)", v * 1e6, "µs", ping * 1e6, "≤ 1.5"))
        emit(Row("  the same against the busy-polling ping", v * 1e6, "µs", polled * 1e6))
        v = _median(rdma_rtt(WrOpcode.RDMA_READ), runs)
        emit(Row("RDMA READ 8 bytes, round trip", v * 1e6, "µs", ping * 1e6))
        v = _median(rdma_rtt(WrOpcode.ATOMIC_FETCH_AND_ADD, compare_add=1), runs)
        emit(Row("ATOMIC FETCH_ADD 8 bytes, round trip", v * 1e6, "µs", ping * 1e6))
        v = _median(rdma_rtt(WrOpcode.ATOMIC_CMP_AND_SWP, compare_add=0, swap=0), runs)
        emit(Row("ATOMIC CMP_SWP 8 bytes, round trip", v * 1e6, "µs", ping * 1e6))
        v = _median(rdma_rtt(WrOpcode.RDMA_WRITE, how=dataclasses.replace(opts, spin=0.0)), runs)
        emit(Row("RDMA WRITE 8 bytes, round trip (event-driven)", v * 1e6, "µs", ping * 1e6))
        ok = True
    finally:
        if ok:
            child.close()
        else:  # an error, Ctrl-C, SIGTERM or SIGHUP: the far side goes too, at once
            child.kill()


def _measure_doca_apis(args: argparse.Namespace, rows: list[Row], emit: Callable[[Row], None]) -> None:
    """The 8-byte WRITE round trip through the DOCA job API, then the task API (ratio to the job API)."""
    ping = next(r.value for r in rows if r.name == "raw UDP ping-pong, 8 bytes, round trip")
    n, runs = int(args.pings), int(args.runs)
    job = _median(lambda: bench_doca.write_round_trip("job", args.ip_a, args.ip_b, n), runs) * 1e6
    emit(Row("DOCA job API: RDMA WRITE 8 bytes, round trip", job, "µs", ping))
    task = _median(lambda: bench_doca.write_round_trip("task", args.ip_a, args.ip_b, n), runs) * 1e6
    emit(Row("DOCA task API: the same, against the job API", task, "µs", job))


def _bench(args: argparse.Namespace) -> int:
    if args.serve:
        return _serve(sys.stdin, sys.stdout)
    rows: list[Row] = []

    def emit(row: Row) -> None:
        rows.append(row)
        if args.json_out:
            return
        ratio = f"{row.ratio:6.2f}" if row.ratio is not None else "      "
        print(f"{row.name:<48} {row.value:10.1f} {row.unit:<5} {ratio}  {row.target}".rstrip(), flush=True)

    if not args.json_out:
        print(f"rdmakit bench: {args.runs} runs each (median), {args.total} MiB per throughput run")
        print(f"UDP data plane: {fastpath.describe()}")
        print(f"{'test':<48} {'value':>10} {'unit':<5} {'ratio':>6}  target")
    _measure(args, emit)
    _measure_doca_apis(args, rows, emit)
    if args.json_out:
        print(json.dumps([dataclasses.asdict(r) | {"ratio": r.ratio} for r in rows], indent=2))
    return 0


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from None


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("bench", help="benchmark the soft engine against raw sockets (loopback)")
    add_general_flags(p)
    p.add_argument("--runs", type=int_in(1, 1000), default=3, help="runs per figure; the median is shown (3)")
    p.add_argument("--total", type=int_in(1, 1 << 20), default=256, help="MiB per throughput run (256)")
    p.add_argument("--pings", type=int_in(1, 10**8), default=2000, help="round trips per latency run (2000)")
    p.add_argument(
        "--window",
        type=int_in(1, 1 << 22),
        default=1024,
        help="requester window in PSNs, rdmakit to rdmakit (1024; rxe 128)",
    )
    p.add_argument(
        "--spin-us",
        type=float_in(0.0, 1e6),
        default=200.0,
        help="µs of idle polling before blocking in epoll (200; 0: event-driven only)",
    )
    p.add_argument("--ip-a", type=_address, default="127.0.0.2", help="this side's loopback address")
    p.add_argument("--ip-b", type=_address, default="127.0.0.3", help="the far side's loopback address")
    p.add_argument("--json-out", action="store_true", help="print the figures as JSON")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=run(p, _bench))
