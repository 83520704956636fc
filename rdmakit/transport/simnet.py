"""A seeded, simulated RoCEv2 network in virtual time (like ``trio.testing``).

``SimNet`` carries packets between engine QPs attached at addresses. Each
packet goes through the real codec: ``encode`` plus the rxe ICRC over a
simulated IPv4/UDP header (fixed per-endpoint addresses, UDP 4791) on the way
out; faults are applied to those bytes; on delivery the ICRC is checked (a
mismatch is dropped and counted, as rxe does) and the bytes are decoded
(``WireError`` dropped and counted) before ``QueuePair.receive``.

Every random choice comes from one ``random.Random(seed)``, and ties in time
are broken by send order, so a seed replays exactly: ``trace`` records every
packet's fate and ``trace_digest()`` hashes it.

Faults (``Faults``): loss, duplication, reordering (an extra random delay),
fixed delay plus jitter, bit corruption, an optional link rate, and
partitions (all packets between two addresses, or all packets, dropped
between two times or until ``heal``). A link with a rate is a bottleneck
with a FIFO queue: ``queue_limit`` bytes of it at most (tail drop, as a
shallow switch buffer or tbf's ``limit``), and ECN marking as DCQCN
configures a switch (Zhu et al. 2015, §3.3: RED on the queue's length,
probability 0 below ``ecn_kmin``, rising to ``ecn_pmax`` at ``ecn_kmax``, 1
above). A packet marked CE is reported to the QP it reaches
(``congestion_experienced``), which owes its peer a CNP (``poll_cnp``); a
CNP (``rdmakit.wire.cnp``) goes to ``cnp_received`` (RoCEv2 Annex A17.9).

Usage::

    net = SimNet(seed, Faults(loss=0.01))
    net.attach("a", qp_a)          # qp_a.remote must be "b" (set at RTR)
    net.attach("b", qp_b)
    qp_a.post_send(...)
    assert net.run(until=lambda: len(cq_a) == n, max_time=1.0)
"""

import hashlib
import heapq
import math
import random
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, cast

from rdmakit.engine.congestion import PACKET_OVERHEAD
from rdmakit.engine.small_tx import POST_TABLE
from rdmakit.wire import (
    MIDDLE_OPCODES,
    ROCE_UDP_PORT,
    IcrcFlow,
    Packet,
    Train,
    WireError,
    decode,
    encode,
    icrc_ipv4,
    pack_icrc,
    unpack_icrc,
)
from rdmakit.wire.cnp import CNP_OPCODE, decode_cnp, encode_cnp

from .codec import ArmedOwner, SegmentCodec
from .small_ops import OFFERED, SmallQP, SmallTxQP, take_small

Address = Hashable
_SPORT = 0xC000
#: Steps at one instant of virtual time after which ``run`` declares a livelock.
_MAX_STALL = 1_000_000
#: ``take_small``'s answers, as ``stats`` counts them.
_TAKEN = {1: "small", 2: "small_resp", 3: "armed", 4: "armed_req", 5: "armed_read", 6: "armed_atomic"}


class SimQP(Protocol):
    """What the network needs of an engine QP (``rdmakit.engine.QueuePair`` fits)."""

    @property
    def qpn(self) -> int: ...
    @property
    def remote(self) -> object: ...
    @property
    def dest_qpn(self) -> int: ...
    def receive(self, pkt: Packet, now: float) -> None: ...
    def handle_timer(self, now: float) -> None: ...
    def get_timer(self) -> float | None: ...
    def poll_transmit(self, now: float, max_packets: int | None = None) -> list[Packet]: ...
    def congestion_experienced(self, now: float) -> None: ...
    def poll_cnp(self) -> bool: ...
    def cnp_received(self, now: float) -> None: ...


class PostQP(SimQP, Protocol):
    """A QP whose posts ring a doorbell (``SimNet(post=True)``)."""

    doorbell: Callable[[Any], None] | None
    poster: tuple[Callable[..., object], list[Any]] | None

    def tx_post(self, now: float) -> Packet | None: ...


class BulkSimQP(SimQP, Protocol):
    """A QP that also sends trains and takes runs (``SimNet(bulk=True)``)."""

    def poll_transmit_trains(self, now: float, max_packets: int | None = None) -> list[Packet | Train]: ...
    def rx_run(self, opcode: int) -> tuple[int, memoryview, int, int, int] | None: ...
    def rx_run_done(self, opcode: int, count: int, last_ackreq: int, now: float) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Faults:
    """Per-packet fault probabilities and delays (seconds)."""

    loss: float = 0.0
    duplicate: float = 0.0
    #: Probability of an extra uniform(0, reorder_delay) delay.
    reorder: float = 0.0
    reorder_delay: float = 50e-6
    delay: float = 10e-6
    #: Extra uniform(0, jitter) delay on every packet.
    jitter: float = 0.0
    #: Probability that one random bit of the datagram flips.
    corrupt: float = 0.0
    #: Link rate in bytes per second per direction; None for unlimited.
    rate: float | None = None
    #: With ``rate``: the bottleneck queue's size in bytes; a packet that finds it full is
    #: dropped ("queue_full"). None: unbounded.
    queue_limit: int | None = None
    #: With ``rate``: ECN marking on the queue's length in bytes (RED, DCQCN's Kmin, Kmax,
    #: Pmax). None: no marking.
    ecn_kmin: int | None = None
    ecn_kmax: int = 0
    ecn_pmax: float = 0.01


class TraceEvent(NamedTuple):
    time: float
    src: str
    dst: str
    size: int
    crc: int  # the packet's ICRC as sent: a digest of its bytes
    fate: str  # "sent", "lost", "partitioned", "dup", "corrupted", "delivered", "bad_icrc", ...


class _Partition:
    __slots__ = ("between", "end", "start")

    def __init__(self, start: float, end: float, between: frozenset[Address] | None) -> None:
        self.start = start
        self.end = end
        self.between = between


class SimNet:
    """The network: endpoints, attached QPs, an event heap and the virtual clock ``now``."""

    def __init__(
        self,
        seed: int,
        faults: Faults | None = None,
        *,
        trace: bool = True,
        bulk: bool = False,
        small: SegmentCodec | None = None,
        post: bool = False,
    ) -> None:
        """``bulk``: take the QPs' packets as trains and place in-order MIDDLE packets
        through ``rx_run``/``rx_run_done``, as the native UDP data plane does (the
        packets on the wire stay the same). ``small``: a segment codec whose
        ``small_request`` then checks and executes each one-packet request a QP's
        ``rx_small`` allows on the datagram's bytes (``rx_small_done``), and whose
        ``small_response`` checks each response ``rx_small_resp`` allows
        (``rx_small_resp_done``), as the UDP port does; and each QP whose whole work is
        one request sends it through ``tx_small``, as the UDP port does; and a codec
        that arms responders (``arm``) owns a QP's responder between messages, executes
        its in-order WRITE ONLY requests and holds their ACK, which leaves first when
        the QP is pumped; and a codec with a native completer (``arm_req``) retires
        in-order ACKs of SEND/WRITE WQEs; ``stats["small"]``, ``stats["small_resp"]``,
        ``stats["armed"]``, ``stats["armed_req"]`` and ``stats["small_tx"]`` count them. ``post``:
        a QP's doorbell sends its one fresh SEND or WRITE at once, as the UDP port's does under a
        driver (``UdpPort._post_now``): through the codec's ``post_small`` if it has one
        (``stats["post"]``), else through the engine's ``tx_post`` (``stats["post_py"]``); and
        with a codec's ``post_send``, the QP's later posts are ``post_send``'s whole effect in
        one native call when it takes them (``QueuePair.poster``, ``stats["post_send"]``)."""
        self.seed = seed
        self.post = post
        self.bulk = bulk
        self.small = small
        self._flows: dict[tuple[Address, Address], IcrcFlow] = {}
        self.rng = random.Random(seed)
        self.faults = faults or Faults()
        self.now = 0.0
        self.stats: Counter[str] = Counter()
        self.trace: list[TraceEvent] | None = [] if trace else None
        self._qps: list[tuple[Address, SimQP]] = []
        self._by_addr_qpn: dict[tuple[Address, int], SimQP] = {}
        self._ips: dict[Address, bytes] = {}
        self._heap: list[tuple[float, int, Address, Address, bytes, bool]] = []
        self._seq = 0
        self._partitions: list[_Partition] = []
        self._link_free: dict[tuple[Address, Address], float] = {}
        #: Per-direction fault overrides: (src, dst) -> Faults.
        self.link_faults: dict[tuple[Address, Address], Faults] = {}

    # -- topology --

    def _ip(self, address: Address) -> bytes:
        ip = self._ips.get(address)
        if ip is None:
            n = len(self._ips) + 1
            ip = self._ips[address] = bytes((10, 0, n >> 8 & 0xFF, n & 0xFF))
        return ip

    def attach(self, address: Address, qp: SimQP) -> None:
        """Attach ``qp`` at ``address``; packets for (address, qp.qpn) reach it."""
        key = (address, qp.qpn)
        if key in self._by_addr_qpn:
            raise ValueError(f"QPN {qp.qpn:#x} is already attached at {address!r}")
        self._ip(address)
        self._by_addr_qpn[key] = qp
        self._qps.append((address, qp))
        if self.post:
            cast(PostQP, qp).doorbell = lambda q: self._doorbell(address, cast(PostQP, q))
            if self.small is not None and self.small.post_send is not None:
                cast(PostQP, qp).poster = (self.small.post_send, self._post_ctx(address))

    def _doorbell(self, src: Address, qp: "PostQP") -> None:
        """A post on ``qp``: its one fresh SEND or WRITE leaves now (``post``, ``__init__``)."""
        dst = qp.remote
        post = self.small.post_small if self.small is not None else None
        if post is not None:
            flow = self._flow(src, dst)
            if qp.poster is not None:
                qp.poster[1][7][id(dst)] = (dst, None, flow.states, flow)  # for its next posts
            got = post(-1, None, False, flow.states, flow, qp, self.now, PACKET_OVERHEAD)
            if got is not None:
                assert isinstance(got, bytes)
                self.stats["post"] += 1
                self.send_bytes(src, dst, got)
            return
        one = qp.tx_post(self.now)
        if one is not None:
            self.stats["post_py"] += 1
            self.send(src, dst, one)

    def _post_ctx(self, src: Address) -> list[Any]:
        """Native ``post_send``'s context for the QPs at ``src`` (``_nativepostsend.c``): no
        socket, so each datagram comes back to ``after``, which sends it on the wire."""

        def after(qp: Any, datagram: bytes) -> None:
            self.stats["post_send"] += 1
            self.send_bytes(src, qp.remote, datagram)

        flows: dict[int, tuple[Address, None, dict[int, int], IcrcFlow]] = {}
        clock: Callable[[], float] = lambda: self.now  # noqa: E731 (the context's clock)
        return [-1, False, clock, PACKET_OVERHEAD, None, None, None, flows, None, None, after, POST_TABLE]

    def _flow(self, src: Address, dst: Address) -> IcrcFlow:
        flow = self._flows.get((src, dst))
        if flow is None:
            flow = IcrcFlow.ipv4(self._ip(src), self._ip(dst), _SPORT, ROCE_UDP_PORT)
            self._flows[(src, dst)] = flow
        return flow

    def detach(self, address: Address, qp: SimQP) -> None:
        self._by_addr_qpn.pop((address, qp.qpn), None)
        self._qps = [(a, q) for a, q in self._qps if q is not qp]

    def partition(
        self,
        start: float | None = None,
        end: float | None = None,
        between: tuple[Address, Address] | None = None,
    ) -> None:
        """Drop every packet sent in [start, end) between two addresses.

        Defaults: from now, forever, between all addresses.
        """
        self._partitions.append(
            _Partition(
                self.now if start is None else start,
                math.inf if end is None else end,
                None if between is None else frozenset(between),
            )
        )

    def heal(self) -> None:
        """End every partition now."""
        for p in self._partitions:
            p.end = min(p.end, self.now)

    def _partitioned(self, src: Address, dst: Address) -> bool:
        now = self.now
        for p in self._partitions:
            if p.start <= now < p.end and (p.between is None or (src in p.between and dst in p.between)):
                return True
        return False

    # -- packets --

    def _record(self, src: Address, dst: Address, size: int, crc: int, fate: str) -> None:
        self.stats[fate] += 1
        if self.trace is not None:
            self.trace.append(TraceEvent(self.now, str(src), str(dst), size, crc, fate))

    def send(self, src: Address, dst: Address, pkt: Packet) -> None:
        """Put one packet on the wire from ``src`` to ``dst`` (engines' output goes through here)."""
        body = encode(pkt)
        crc = icrc_ipv4(self._ip(src), self._ip(dst), _SPORT, ROCE_UDP_PORT, body)
        self.send_bytes(src, dst, body + pack_icrc(crc))

    def send_bytes(self, src: Address, dst: Address, datagram: bytes) -> None:
        """Put a raw datagram (BTH .. ICRC) on the wire, subject to faults."""
        f = self.link_faults.get((src, dst), self.faults)
        rng = self.rng
        crc = unpack_icrc(datagram) if len(datagram) >= 4 else 0
        size = len(datagram)
        self._record(src, dst, size, crc, "sent")
        if self._partitioned(src, dst):
            self._record(src, dst, size, crc, "partitioned")
            return
        if f.loss and rng.random() < f.loss:
            self._record(src, dst, size, crc, "lost")
            return
        copies = 2 if f.duplicate and rng.random() < f.duplicate else 1
        if copies == 2:
            self._record(src, dst, size, crc, "duplicated")
        depart = self.now
        ce = False
        if f.rate:
            link = (src, dst)
            free = self._link_free.get(link, 0.0)
            queued = max(free - depart, 0.0) * f.rate  # bytes ahead of this one
            if f.queue_limit is not None and queued + size > f.queue_limit:
                self._record(src, dst, size, crc, "queue_full")
                return
            if f.ecn_kmin is not None and queued > f.ecn_kmin:
                k0, k1 = f.ecn_kmin, max(f.ecn_kmax, f.ecn_kmin)
                p = 1.0 if queued >= k1 else f.ecn_pmax * (queued - k0) / (k1 - k0)
                ce = rng.random() < p
                if ce:
                    self._record(src, dst, size, crc, "ce_marked")
            depart = max(depart, free) + (size + 42) / f.rate
            self._link_free[link] = depart
        for _ in range(copies):
            data = datagram
            if f.corrupt and rng.random() < f.corrupt and data:
                bit = rng.randrange(len(data) * 8)
                b = bytearray(data)
                b[bit >> 3] ^= 1 << (bit & 7)
                data = bytes(b)
                self._record(src, dst, size, crc, "corrupted")
            t = depart + f.delay
            if f.jitter:
                t += rng.uniform(0.0, f.jitter)
            if f.reorder and rng.random() < f.reorder:
                t += rng.uniform(0.0, f.reorder_delay)
            self._seq += 1
            heapq.heappush(self._heap, (t, self._seq, src, dst, data, ce))

    def _deliver(self, src: Address, dst: Address, data: bytes, ce: bool = False) -> None:
        crc = unpack_icrc(data) if len(data) >= 4 else 0
        if len(data) < 16:
            self._record(src, dst, len(data), crc, "runt")
            return
        body = memoryview(data)[:-4]
        if icrc_ipv4(self._ip(src), self._ip(dst), _SPORT, ROCE_UDP_PORT, body) != crc:
            self._record(src, dst, len(data), crc, "bad_icrc")
            return
        if data[0] == CNP_OPCODE:
            self._deliver_cnp(src, dst, body, crc)
            return
        try:
            pkt = decode(body)
        except WireError:
            self._record(src, dst, len(data), crc, "undecodable")
            return
        qp = self._by_addr_qpn.get((dst, pkt.dest_qp))
        if qp is None:
            self._record(src, dst, len(data), crc, "no_qp")
            return
        self._record(src, dst, len(data), crc, "delivered")
        if ce:
            qp.congestion_experienced(self.now)
        if self.small is not None and pkt.opcode in OFFERED and self._small(qp, pkt.opcode, src, dst, data):
            return
        if self.bulk and pkt.opcode in MIDDLE_OPCODES and self._place(cast(BulkSimQP, qp), pkt):
            return
        qp.receive(pkt, self.now)

    def _deliver_cnp(self, src: Address, dst: Address, body: memoryview, crc: int) -> None:
        try:
            qpn = decode_cnp(body)
        except WireError:
            self._record(src, dst, len(body) + 4, crc, "undecodable")
            return
        qp = self._by_addr_qpn.get((dst, qpn))
        if qp is None:
            self._record(src, dst, len(body) + 4, crc, "no_qp")
            return
        self._record(src, dst, len(body) + 4, crc, "cnp")
        qp.cnp_received(self.now)

    def _place(self, qp: BulkSimQP, pkt: Packet) -> bool:
        """A run of one packet, as the native receiver checks and places it."""
        run = qp.rx_run(pkt.opcode)
        if run is None:
            return False
        psn, mem, off, _most, mtu = run
        plain = pkt._replace(ackreq=False, payload=b"") == Packet(pkt.opcode, pkt.dest_qp, psn)
        if not plain or len(pkt.payload) != mtu:
            return False
        mem[off : off + mtu] = pkt.payload
        qp.rx_run_done(pkt.opcode, 1, 0 if pkt.ackreq else -1, self.now)
        return True

    def _small(self, qp: SimQP, op: int, src: Address, dst: Address, data: bytes) -> bool:
        """A one-packet request or response, as the UDP port checks and takes it natively."""
        assert self.small is not None
        flow = self._flow(src, dst)
        took = take_small(self.small, cast(SmallQP, qp), op, data, 0, flow.states, flow, self.now)
        if took:
            self.stats[_TAKEN[took]] += 1
        return bool(took)

    def _pump(self) -> None:
        """Send everything every QP has ready now."""
        now = self.now
        for addr, qp in self._qps:
            # An armed responder's ACK goes first, as Responder.out's would (take_small), then
            # the READ responses it holds, when they may leave as they are (else poll_transmit
            # takes the lot back, disarming it).
            owner = cast("ArmedOwner | None", cast(SmallQP, qp).native) if self.small is not None else None
            ack = None
            reply: list[Packet] = []
            if owner is not None and (not owner.replying or cast(SmallQP, qp).reply_unpaced()):
                ack = owner.take_ack()
                if owner.replying:
                    reply = owner.take_reply()
                    cast(SmallQP, qp).reply_sent(len(reply) + (ack is not None), now)
            one = cast(SmallTxQP, qp).tx_small(now) if self.small is not None else None
            if one is not None:
                self.stats["small_tx"] += 1
                pkts = [one]
            elif self.bulk:
                pkts = []
                for it in cast(BulkSimQP, qp).poll_transmit_trains(now):
                    if isinstance(it, Train):
                        pkts += it.packets()
                    else:
                        pkts.append(it)
            else:
                pkts = qp.poll_transmit(now)
            if qp.poll_cnp():
                body = encode_cnp(qp.dest_qpn)
                crc = icrc_ipv4(self._ip(addr), self._ip(qp.remote), _SPORT, ROCE_UDP_PORT, body)
                self.send_bytes(addr, qp.remote, body + pack_icrc(crc))
            if ack is not None or reply:
                pkts[:0] = [ack, *reply] if ack is not None else reply
            if pkts:
                dst = qp.remote
                for pkt in pkts:
                    self.send(addr, dst, pkt)

    # -- time --

    def next_event_time(self) -> float | None:
        t = self._heap[0][0] if self._heap else None
        for _, qp in self._qps:
            d = qp.get_timer()
            if d is not None and (t is None or d < t):
                t = d
        return t

    def run(self, until: Callable[[], bool] | None = None, *, max_time: float = 60.0) -> bool:
        """Advance virtual time until ``until()`` holds or nothing is left to do.

        Returns True if ``until()`` holds (or, without ``until``, the network
        went idle) within ``max_time`` seconds of virtual time; False if time
        ran out first (``now`` is then ``start + max_time``).
        """
        deadline = self.now + max_time
        heap = self._heap
        stalled = 0
        while True:
            self._pump()
            if until is not None and until():
                return True
            t = self.next_event_time()
            if t is None:
                return until is None
            if t > deadline:
                self.now = deadline
                return False
            if t > self.now:
                self.now = t
                stalled = 0
            else:
                stalled += 1
                if stalled > _MAX_STALL:
                    raise RuntimeError(f"no progress in virtual time at t={self.now} (seed {self.seed})")
            now = self.now
            while heap and heap[0][0] <= now:
                _, _, src, dst, data, ce = heapq.heappop(heap)
                self._deliver(src, dst, data, ce)
            for _, qp in self._qps:
                d = qp.get_timer()
                if d is not None and d <= now:
                    qp.handle_timer(now)

    def trace_digest(self) -> str:
        """SHA-256 of the trace: equal digests, identical packet histories."""
        h = hashlib.sha256()
        for ev in self.trace or ():
            h.update(f"{ev.time!r} {ev.src} {ev.dst} {ev.size} {ev.crc} {ev.fate}\n".encode())
        return h.hexdigest()
