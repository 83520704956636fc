"""The two processes of ``rdmakit bench``: the far side (``--serve``) and the RDMA requester.

The far side reads JSON lines on its stdin and answers on its stdout: it
plays the sink, source or echo of a raw baseline, or an RDMA responder with
one or many QPs. Both sides pump their device through the synchronous
`Driver` with the same spin policy (``spin`` seconds of polling after the last
event, then epoll).
"""

import contextlib
import dataclasses
import gc
import json
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any, TextIO

from rdmakit.cli.errors import CliError
from rdmakit.engine import SGE, Access, CompletionQueue, QpCaps, SendWR, WcStatus, WrOpcode
from rdmakit.transport import baseline
from rdmakit.transport.connect import Endpoint, connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.transport.port import TransportName
from rdmakit.transport.udp import UdpLink

MiB = 1 << 20
EVERY = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


def rss_bytes() -> int:
    """This process's resident set (``/proc/self/statm``; 0 where there is none), after a collection
    (what earlier runs left for the collector must not count against the next)."""
    gc.collect()
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclasses.dataclass(frozen=True)
class Opts:
    #: Requester window in PSNs (rxe: 128).
    window: int = 128
    #: Seconds of idle polling before the driver blocks in epoll (0: event-driven).
    spin: float = 0.0


# -- the far side --------------------------------------------------------------------------


class Responder:
    """An RDMA responder: a device, ``n`` QPs on one CQ and target memory, progressed until stopped."""

    def __init__(self, transport: TransportName, ip: str, size: int, n: int = 1) -> None:
        self.dev = SoftDevice(ip, transport=transport, port=0)
        self.cq = CompletionQueue(1024)
        self.mem = bytearray(size)
        self.mr = self.dev.pd.register(self.mem, 0x4000_0000, EVERY)
        self.rss0 = rss_bytes()  # before the QPs: what they cost, connected, is what grows
        self.qps = [self.dev.create_qp(send_cq=self.cq, recv_cq=self.cq) for _ in range(n)]
        self.psns = [random.getrandbits(24) for _ in range(n)]

    def info(self) -> dict[str, Any]:
        pairs = zip(self.qps, self.psns, strict=True)
        eps = [dataclasses.asdict(local_endpoint(self.dev, q, p)) for q, p in pairs]
        return {"endpoints": eps, "addr": self.mr.addr, "rkey": self.mr.rkey}

    def connect(self, peers: list[dict[str, Any]]) -> int:
        """Connect every QP; returns how much this process's resident set grew for its QPs."""
        for qp, psn, peer in zip(self.qps, self.psns, peers, strict=True):
            connect_qp(self.dev, qp, psn, Endpoint(**peer))
        return rss_bytes() - self.rss0

    def serve(self, stop: threading.Event, spin: float) -> dict[str, int]:
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


def serve(inp: TextIO, out: TextIO) -> int:
    """The far side: one command per line until ``quit`` or the end of ``inp``."""

    def reply(**kw: Any) -> None:
        out.write(json.dumps(kw) + "\n")
        out.flush()

    for line in inp:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "tcp-sink":
                sink = baseline.TcpSink(cmd["ip"])
                reply(port=sink.port)
                got, secs = sink.serve(cmd["chunk"])
                reply(bytes=got, secs=secs)
            elif op == "udp-sink":
                link = UdpLink(cmd["ip"], 0)
                reply(port=link.port)
                try:
                    got, secs = baseline.udp_stream_recv(link, None, cmd["total"], cmd["ack"], cmd["spin"])
                finally:
                    link.close()
                reply(bytes=got, secs=secs)
            elif op == "udp-source":
                link = UdpLink(cmd["ip"], 0)
                reply(port=link.port)
                try:
                    secs = baseline.udp_stream_serve(link, cmd["seg"], cmd["window"], cmd["spin"])
                finally:
                    link.close()
                reply(secs=secs)
            elif op == "udp-echo":
                echo = baseline.UdpEcho(cmd["ip"])
                reply(port=echo.port)
                echo.serve(cmd["count"], cmd["size"], cmd["spin"])
                reply(done=True)
            elif op == "rdma":
                r = Responder(cmd["transport"], cmd["ip"], cmd["size"], cmd.get("n", 1))
                reply(**r.info())
                rss = r.connect(json.loads(inp.readline())["endpoints"])
                reply(rss=rss)
                reply(counters=r.serve(_stop_on_line(inp), cmd["spin"]))
            elif op == "quit":
                return 0
        except baseline.BaselineError as e:
            reply(error=str(e))
    return 0


# -- the measuring side --------------------------------------------------------------------


class Child:
    """The far side, a child process of the measuring side."""

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
        got = dict(json.loads(line))
        if "error" in got:
            raise CliError(f"the benchmark's far side: {got['error']}")
        return got

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


class Requester:
    """``n`` RC QPs on one device and one CQ, connected to a `Responder` in the child."""

    def __init__(
        self,
        child: Child,
        transport: TransportName,
        ip: str,
        peer_ip: str,
        size: int,
        opts: Opts,
        n: int = 1,
    ) -> None:
        self.child = child
        self.t0 = time.perf_counter()
        child.send(op="rdma", transport=transport, ip=peer_ip, size=size, spin=opts.spin, n=n)
        info = child.recv()
        self.remote_addr, self.rkey = info["addr"], info["rkey"]
        self.dev = SoftDevice(ip, transport=transport, port=0)
        self.driver = Driver()
        self.driver.add(self.dev)
        self.dev.post_with(self.driver.clock)  # a post's one WRITE leaves in its post_send
        self.spin = opts.spin
        self.cq = CompletionQueue(max(4096, 2 * n))
        # Between two rdmakit peers the window may exceed rxe's 128 PSNs: the
        # receiver's 32 MiB socket buffer holds it (verbs peers keep 128).
        caps = QpCaps(large_mtu=transport == "tcp", max_unacked_psns=opts.window)
        self.mem = bytearray(size)
        self.mr = self.dev.pd.register(self.mem, 0x1000_0000, Access.LOCAL_WRITE)
        rss0 = rss_bytes()
        self.qps = [self.dev.create_qp(send_cq=self.cq, recv_cq=self.cq, caps=caps) for _ in range(n)]
        self.qp = self.qps[0]
        psns = [random.getrandbits(24) for _ in range(n)]
        pairs = zip(self.qps, psns, strict=True)
        eps = [dataclasses.asdict(local_endpoint(self.dev, q, p)) for q, p in pairs]
        child.send(endpoints=eps)
        for qp, psn, peer in zip(self.qps, psns, info["endpoints"], strict=True):
            connect_qp(self.dev, qp, psn, Endpoint(**peer))
        #: Bytes the far side's resident set grew by for its QPs, connected.
        self.peer_rss: int = child.recv()["rss"]
        #: Seconds from the first request to every QP connected at both ends.
        self.setup_secs = time.perf_counter() - self.t0
        #: Bytes this side's resident set grew by for its QPs, connected.
        self.rss = rss_bytes() - rss0
        self.wr_id = 0

    def wr(self, opcode: WrOpcode, length: int, compare_add: int = 0, swap: int = 0) -> SendWR:
        self.wr_id += 1
        return SendWR(
            wr_id=self.wr_id, opcode=opcode, sg_list=(SGE(self.mr.addr, length, self.mr.lkey),),
            remote_addr=self.remote_addr, rkey=self.rkey, compare_add=compare_add, swap=swap,
        )  # fmt: skip

    def stream(self, opcode: WrOpcode, length: int, total: int, depth: int = 4) -> float:
        """Seconds to complete ``total`` bytes of ``length``-byte operations, ``depth`` in flight,
        spread over the QPs in turn (from the first post to the last completion)."""
        n = max(1, total // length)
        posted = done = 0
        qps, cq, run, spin = self.qps, self.cq, self.driver.run_until, self.spin
        nq = len(qps)

        def completed() -> bool:
            return len(cq) > 0

        t0 = time.perf_counter()
        while done < n:
            while posted < n and posted - done < depth:
                qps[posted % nq].post_send(self.wr(opcode, length))
                posted += 1
            if not run(completed, 10.0, spin):
                raise CliError(f"{opcode.name}: no completion within 10 s")
            for wc in cq.poll(64):
                if wc.status is not WcStatus.SUCCESS:
                    raise CliError(f"{opcode.name} failed: {wc.status.name}")
                done += 1
        return time.perf_counter() - t0

    def round_trips(
        self, opcode: WrOpcode, length: int, count: int, compare_add: int = 0, swap: int = 0
    ) -> list[float]:
        """Round-trip times on the first QP, one operation at a time."""
        qp, cq, run, spin = self.qp, self.cq, self.driver.run_until, self.spin

        def completed() -> bool:
            return len(cq) > 0

        out: list[float] = []
        for _ in range(count):
            wr = self.wr(opcode, length, compare_add, swap)
            t0 = time.perf_counter()
            qp.post_send(wr)
            if not run(completed, 10.0, spin):
                raise CliError(f"{opcode.name}: no completion within 10 s")
            wcs = cq.poll(1)
            out.append(time.perf_counter() - t0)
            if wcs[0].status is not WcStatus.SUCCESS:
                raise CliError(f"{opcode.name} failed: {wcs[0].status.name}")
        return out

    def loaded_round_trips(self, length: int, count: int, busy_len: int, busy_depth: int) -> list[float]:
        """8-byte-style round trips on the first QP while every other QP keeps WRITEs in flight."""
        qps, cq, run, spin = self.qps, self.cq, self.driver.run_until, self.spin
        busy = qps[1:]
        probe_ids: set[int] = set()
        in_flight = 0
        turn = 0
        out: list[float] = []
        t0 = 0.0
        waiting = False
        clock = time.perf_counter
        while len(out) < count:
            while busy and in_flight < busy_depth:
                busy[turn % len(busy)].post_send(self.wr(WrOpcode.RDMA_WRITE, busy_len))
                turn += 1
                in_flight += 1
            if not waiting:
                wr = self.wr(WrOpcode.RDMA_WRITE, length)
                probe_ids.add(wr.wr_id)
                t0 = clock()
                qps[0].post_send(wr)
                waiting = True
            if not run(lambda: len(cq) > 0, 10.0, spin):
                raise CliError("RDMA WRITE: no completion within 10 s")
            for wc in cq.poll(64):
                if wc.status is not WcStatus.SUCCESS:
                    raise CliError(f"RDMA WRITE failed: {wc.status.name}")
                if wc.wr_id in probe_ids:
                    probe_ids.discard(wc.wr_id)
                    out.append(clock() - t0)
                    waiting = False
                else:
                    in_flight -= 1
        while in_flight:  # let the busy QPs finish before the QPs go
            if not run(lambda: len(cq) > 0, 10.0, spin):
                break
            in_flight -= len(cq.poll(64))
        return out

    def close(self) -> dict[str, Any]:
        self.child.send(op="stop")
        counters = self.child.recv()["counters"]
        self.driver.close()
        self.dev.close()
        return dict(counters)
