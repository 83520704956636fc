"""One figure at a time for ``rdmakit bench``: each RDMA measurement and its like-for-like raw one.

Every method is one run (its own connection, stream or ping series) and
returns one number: bytes per second for streams, the median round trip in
seconds for pings and round trips. Streams are timed from the first send (or
request) to the last completion, acknowledgement or byte, as the docstring of
`rdmakit.transport.baseline` details.
"""

import statistics
from collections.abc import Callable

from rdmakit.cli.bench_peer import Child, Opts, Requester
from rdmakit.cli.bench_tools import CTools
from rdmakit.engine import WrOpcode
from rdmakit.transport import baseline
from rdmakit.transport.port import TransportName
from rdmakit.transport.udp import UdpLink

MiB = 1 << 20
#: The path MTU of the UDP runs (RoCE's largest).
MTU = 4096
#: Round trips before the timed ones (caches, the window, the first wake-ups).
WARM_PINGS = 100


def roce_segment(size: int) -> int:
    """The datagram size of a ``size``-byte WRITE on RoCEv2 at MTU 4096: BTH, RETH on a
    single-packet message, payload, ICRC (a MIDDLE packet of a larger one: BTH, 4096, ICRC)."""
    if size > MTU:
        return 12 + MTU + 4
    return 12 + 16 + size + 4


def payload_per_segment(size: int) -> int:
    return min(size, MTU)


def depth_for(size: int) -> int:
    """Messages in flight in a stream: 4 of 1 MiB, up to 128 (perftest's tx depth) when small."""
    return max(4, min(128, (4 * MiB) // max(size, 1)))


class Measure:
    """The measuring side of one ``rdmakit bench`` run: addresses, the far side and the C tools."""

    def __init__(self, a: str, b: str, child: Child, tools: CTools, window: int) -> None:
        self.a, self.b, self.child, self.tools, self.window = a, b, child, tools, window

    def opts(self, spin: float) -> Opts:
        return Opts(window=self.window, spin=spin)

    # -- raw ------------------------------------------------------------------------------

    def raw_tcp(self, chunk: int, total: int, warm: int) -> float:
        """A stream tuned as the TCP transport's, ``chunk``-byte messages, after ``warm`` bytes."""
        c = self.child
        c.send(op="tcp-sink", ip=self.b, chunk=chunk)
        port = c.recv()["port"]
        secs = baseline.tcp_source(self.a, self.b, port, chunk, total, warm)
        c.recv()
        return total / secs

    def _raw_window(self, size: int) -> int:
        """The raw stream's window in wire bytes: what the RDMA requester may have in flight."""
        seg = roce_segment(size)
        per_msg = -(-size // MTU) * seg
        return min(self.window * seg, depth_for(size) * per_msg)

    def raw_udp_out(self, size: int, total: int, spin: float) -> float:
        """Payload bytes per second of a flow-controlled GSO→GRO stream from here to the far side."""
        seg, pay = roce_segment(size), payload_per_segment(size)
        wire = max(1, total // pay) * seg
        window = self._raw_window(size)
        c = self.child
        c.send(op="udp-sink", ip=self.b, total=wire, ack=max(seg, window // 4), spin=spin)
        port = c.recv()["port"]
        link = UdpLink(self.a, 0)
        try:
            secs = baseline.udp_stream_send(link, (self.b, port), seg, wire, window, spin)
        finally:
            link.close()
        c.recv()
        return wire // seg * pay / secs

    def raw_udp_in(self, size: int, total: int, spin: float) -> float:
        """The same stream from the far side to here, timed from the request to the last byte."""
        seg, pay = roce_segment(size), payload_per_segment(size)
        wire = max(1, total // pay) * seg
        window = self._raw_window(size)
        c = self.child
        c.send(op="udp-source", ip=self.b, seg=seg, window=window, spin=spin)
        port = c.recv()["port"]
        link = UdpLink(self.a, 0)
        try:
            got, secs = baseline.udp_stream_recv(link, (self.b, port), wire, max(seg, window // 4), spin)
        finally:
            link.close()
        c.recv()
        return got // seg * pay / secs

    def raw_ping(self, size: int, count: int, spin: float) -> float:
        """Median round trip of ``size`` bytes out (RoCE-sized datagrams) and 8 back."""
        c = self.child
        c.send(op="udp-echo", ip=self.b, count=count + WARM_PINGS, size=size, spin=spin)
        port = c.recv()["port"]
        rtts = baseline.udp_ping(self.a, (self.b, port), count + WARM_PINGS, size, spin, MTU)
        c.recv()
        return float(statistics.median(rtts[WARM_PINGS:]))

    # -- RDMA -----------------------------------------------------------------------------

    def rdma_stream(
        self, transport: TransportName, opcode: WrOpcode, size: int, total: int, spin: float, warm: int
    ) -> float:
        """Bytes per second of ``size``-byte operations, ``depth_for(size)`` in flight, after a warm-up."""
        r = Requester(self.child, transport, self.a, self.b, size, self.opts(spin))
        try:
            depth = depth_for(size)
            if warm:
                r.stream(opcode, size, warm, depth)
            n = max(1, total // size)
            return n * size / r.stream(opcode, size, n * size, depth)
        finally:
            r.close()

    def rdma_rtt(
        self, opcode: WrOpcode, size: int, count: int, spin: float, compare_add: int = 0, swap: int = 0
    ) -> float:
        r = Requester(self.child, "roce-udp", self.a, self.b, max(size, 8), self.opts(spin))
        try:
            r.round_trips(opcode, size, WARM_PINGS, compare_add, swap)
            return float(statistics.median(r.round_trips(opcode, size, count, compare_add, swap)))
        finally:
            r.close()


def c_median(fn: Callable[[], float | None], runs: int) -> float | None:
    """The median of a C tool's runs (None if it gave no figure)."""
    got = []
    for _ in range(runs):
        v = fn()
        if v is None:
            return None
        got.append(v)
    return float(statistics.median(got)) if got else None
