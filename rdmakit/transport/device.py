"""A soft RDMA device: one local address, one link (UDP 4791 or TCP), many QPs.

The device is the short pump loop around the sans-IO engine. ``progress(now)``
never blocks: it drains the link until it would block, feeds each packet to the
QP its BTH names, fires due timers, and sends what the QPs produced, in batches.
"""

import errno
import ipaddress
import os
import random
import socket
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Literal

from rdmakit.engine import CompletionQueue, EngineError, ProtectionDomain, QpCaps, QpState, QueuePair
from rdmakit.wire import (
    BTH_LEN,
    ICRC_LEN,
    MIDDLE_OPCODES,
    ROCE_UDP_PORT,
    IcrcFlow,
    Opcode,
    Packet,
    Payload,
    Train,
    WireError,
    crc32,
    decode,
    encode_headers,
    max_frame_body,
    unpack_icrc,
)
from rdmakit.wire.ident import IdentWindow, solve_ident_diff

from . import fastpath
from .tcp import SECRET_LEN, Placed, Route, TcpCounters, TcpLink
from .udp import GSO_MAX_BYTES, GSO_MAX_SEGMENTS, UdpLink

TransportName = Literal["roce-udp", "tcp"]
#: Largest path MTU the TCP transport negotiates (frames may exceed RoCE MTUs).
TCP_MTU = 1 << 20
#: Retransmit timeout exponent per transport: 4.096 µs × 2^n (IBTA §9.7.6.1.3).
#: 16 (268 ms) rather than hardware's usual 14: a Python pump starved of CPU
#: must not mistake its own delay for loss. TCP delivers reliably, so its timer
#: only has to notice a peer that stopped.
DEFAULT_TIMEOUT = {"roce-udp": 16, "tcp": 18}
#: GRO batches read per ``progress`` before the timers and transmit get a turn.
MAX_RX_BATCHES = 64
#: Idle ``progress`` calls between full scans of the QPs' deadlines (the
#: cached earliest deadline is refreshed after every busy call anyway).
_DEADLINE_RESCAN = 64
#: Receive state kept per source (address, port) at most; only sources that
#: passed the header checks (a QP connected to that address) get any.
MAX_RX_FLOWS = 256
#: Source addresses whose IPv4 IDs are followed (kernel senders) at most.
MAX_IDENT_PEERS = 256
#: Bad ICRCs in a row a source that uses our IPv4 IDs may send before the
#: solver is tried for it (a corrupted packet of ours is never "solved").
_OURS_STRIKES = 4

_BTH = struct.Struct(">BBHII")
_ICRC = struct.Struct("<I")
_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
_U24 = 0xFFFFFF
#: PadCnt (BTH byte 1 bits 5:4) for a payload length mod 4.
_PADCNT_BITS = (0x00, 0x30, 0x20, 0x10)
#: Packet fields se .. ieth of a MIDDLE packet as the engine makes them.
_PLAIN_MIDDLE = (False, False, 0xFFFF, False, False, None, None, None, None, None, None)
_MASK_BYTE4 = 0xFF000000
#: Header length (BTH and RETH) of the WRITE requests whose payload the TCP reader may
#: receive straight into place (``QueuePair.rx_place``).
_WRITE_HEADER_LEN = {
    int(Opcode.RDMA_WRITE_FIRST): BTH_LEN + 16,
    int(Opcode.RDMA_WRITE_ONLY): BTH_LEN + 16,
    int(Opcode.RDMA_WRITE_MIDDLE): BTH_LEN,
    int(Opcode.RDMA_WRITE_LAST): BTH_LEN,
}


@dataclass(frozen=True, slots=True)
class PeerAddress:
    """Where a QP's packets go: the peer device's address and port."""

    ip: str
    port: int


@dataclass(slots=True)
class DeviceCounters(TcpCounters):
    """What the device saw that the engine never did (like rxe's hw counters).

    The ``tcp_*`` counters (:class:`~rdmakit.transport.tcp.TcpCounters`) are the
    TCP transport's refusals, by kind; they stay 0 on UDP.
    """

    packets_in: int = 0
    packets_out: int = 0
    icrc_ok: int = 0
    #: Verified with the sender's own IPv4 ID (a kernel peer: predicted or solved).
    icrc_solved: int = 0
    bad_icrc: int = 0
    #: IPv4-ID solver runs, runs refused by the rate bound, IDs solved outside the window,
    #: and packets whose ICRC no IPv4 ID makes check (corrupted on the way, or forged).
    solver_runs: int = 0
    solver_limited: int = 0
    solved_out_of_window: int = 0
    icrc_unsolved: int = 0
    malformed: int = 0
    unknown_qp: int = 0
    wrong_source: int = 0
    dropped_state: int = 0
    backlog_max: int = 0
    #: Packets whose payload was received straight into the target memory (TCP).
    placed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _addr_bytes(ip: str) -> bytes:
    return socket.inet_pton(socket.AF_INET6 if ":" in ip else socket.AF_INET, ip)


class _RxFlow:
    """What the receiver keeps about one source (address, port) of a connected peer."""

    __slots__ = ("icrc", "kernel", "ours", "states")

    def __init__(self, icrc: IcrcFlow) -> None:
        self.icrc = icrc
        #: ``icrc.states`` (cleared in place, never replaced).
        self.states = icrc.states
        #: Its packets carried our IPv4 IDs: bad ICRCs it may still send unsolved.
        self.ours = 0
        #: Its packets carried a kernel's IPv4 IDs (followed per address).
        self.kernel = False


def gid_of(ip: str) -> str:
    """The RoCEv2 GID of an address: IPv4-mapped IPv6 for IPv4 (IBTA Annex A17.8)."""
    a = ipaddress.ip_address(ip)
    v6 = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + a.packed) if a.version == 4 else a
    p = v6.packed
    return ":".join(p[i : i + 2].hex() for i in range(0, 16, 2))


class SoftDevice:
    """A userspace RoCEv2 device bound to one local IP.

    ``transport="roce-udp"`` speaks RoCEv2 on UDP (port 4791 unless ``port`` says
    otherwise, for tests); ``transport="tcp"`` carries the same packets framed on
    TCP streams (the listener's port defaults to 4791 too).

    ``bulk`` (the default) moves messages in bulk where it can: on UDP, runs of
    MIDDLE packets through the native data plane (``fastpath``, when built);
    on TCP, large WRITE payloads read straight into the target memory.
    ``bulk=False`` goes packet by packet, with the same results.
    """

    def __init__(
        self,
        ip: str,
        *,
        transport: TransportName = "roce-udp",
        port: int = ROCE_UDP_PORT,
        rng: random.Random | None = None,
        gso: bool = True,
        verify_icrc: bool = True,
        bulk: bool = True,
    ) -> None:
        self.ip = str(ipaddress.ip_address(ip))
        self.transport: TransportName = transport
        # R_Keys, QPNs and PSNs must not be guessable: the OS CSPRNG unless a seeded source is injected.
        self.rng = rng if rng is not None else random.SystemRandom()
        self._local = _addr_bytes(self.ip)
        self._v6 = len(self._local) == 16
        self.gid = gid_of(self.ip)
        self.verify_icrc = verify_icrc
        self.counters = DeviceCounters()
        self.udp: UdpLink | None = None
        self.tcp: TcpLink | None = None
        if transport == "roce-udp":
            self.udp = UdpLink(self.ip, port, gso=gso)
            self.port = self.udp.port
        elif transport == "tcp":
            self.tcp = TcpLink(self.ip, port, self.counters)
            self.port = self.tcp.port
            if bulk:
                self.tcp.place = self._place_tcp
        else:
            raise ValueError(f"unknown transport {transport!r}")
        self.name = f"soft-{'udp' if transport == 'roce-udp' else 'tcp'}:{self.ip}"
        #: The native data plane (runs of MIDDLE packets in bulk), UDP only; None: pure Python.
        self._native = fastpath.native if bulk and self.udp is not None else None
        #: A run the last read ended inside: (QP, opcode, source ip, source port, ICRC flow).
        self._hot: tuple[QueuePair, int, str, int, IcrcFlow] | None = None
        self.pd = ProtectionDomain(self.rng)
        self._qps: dict[int, QueuePair] = {}
        self._backlog: list[tuple[list[Payload], int, int, tuple[str, int]]] = []
        #: Receive state per source (ip, port), at most ``MAX_RX_FLOWS`` (oldest dropped).
        self._rx_flows: dict[tuple[str, int], _RxFlow] = {}
        #: The IPv4 IDs of kernel senders per source ip, at most ``MAX_IDENT_PEERS``.
        self._idents: dict[str, IdentWindow] = {}
        #: ICRC header states per destination (ip, port).
        self._tx_flows: dict[tuple[str, int], IcrcFlow] = {}
        #: Earliest QP deadline as of the last busy ``progress`` (see ``_DEADLINE_RESCAN``).
        self._deadline: float | None = None
        self._idle = 0
        #: TCP: each connected QP's route (see ``connect_tcp``) and the longest frame it sends.
        self._routes: dict[int, tuple[Route, int]] = {}
        #: Why the transport failed a QP (its TCP stream's fate), by QPN, for error messages.
        self._faults: dict[int, str] = {}
        self.closed = False

    # -- resources -----------------------------------------------------------------
    @property
    def max_mtu(self) -> int:
        return TCP_MTU if self.transport == "tcp" else 4096

    def create_qp(
        self,
        *,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        caps: QpCaps | None = None,
        pd: ProtectionDomain | None = None,
    ) -> QueuePair:
        if self.closed:
            raise EngineError("BAD_STATE", "device is closed")
        qpn = 0
        while qpn < 2 or qpn in self._qps:  # QPN 0 and 1 are special (IBTA §3.5.3)
            qpn = self.rng.getrandbits(24)
        if caps is None:
            caps = QpCaps(large_mtu=self.transport == "tcp")
        qp = QueuePair(pd or self.pd, qpn=qpn, send_cq=send_cq, recv_cq=recv_cq, caps=caps, rng=self.rng)
        self._qps[qpn] = qp
        return qp

    def destroy_qp(self, qp: QueuePair) -> None:
        if self._qps.get(qp.qpn) is qp:
            del self._qps[qp.qpn]
            self._forget_tcp(qp)

    def reset_qp(self, qp: QueuePair) -> None:
        """Back to RESET (IBTA §10.3.1); on TCP the QP's secret is void, as is its descriptor."""
        qp.modify(QpState.RESET)
        if self._qps.get(qp.qpn) is qp:
            self._forget_tcp(qp)

    # -- TCP: who may reach a QP, and where its packets go (rdmakit.transport.tcp) ----
    def tcp_secret(self, qp: QueuePair, mtu: int) -> bytes:
        """The secret ``qp``'s connection descriptor carries: it opens a stream to ``qp``."""
        if self.tcp is None:
            raise EngineError("INVALID_VALUE", "only a tcp device issues connection secrets")
        return self.tcp.issue(qp.qpn, mtu)

    def connect_tcp(self, qp: QueuePair, route: Route) -> None:
        """``qp`` is connected to the peer QP ``route`` names: send over it, and let only
        that peer device use ``qp``'s own secret."""
        assert self.tcp is not None
        old = self._routes.get(qp.qpn)
        self._routes[qp.qpn] = (route, max_frame_body(qp.attrs.path_mtu or TCP_MTU))
        if old is not None and old[0] != route:
            self.tcp.close_route(old[0])
        self.tcp.bind(qp.qpn, route.ip, route.port)

    def _forget_tcp(self, qp: QueuePair) -> None:
        if self.tcp is None:
            return
        self.tcp.revoke(qp.qpn)
        self._faults.pop(qp.qpn, None)
        old = self._routes.pop(qp.qpn, None)
        if old is not None:
            self.tcp.close_route(old[0])

    def transport_fault(self, qpn: int) -> str | None:
        """Why the transport failed QP ``qpn``, when it did (a refused or reset TCP stream)."""
        return self._faults.get(qpn)

    @property
    def qps(self) -> Iterable[QueuePair]:
        return self._qps.values()

    def fileno(self) -> int:
        link = self.udp or self.tcp
        assert link is not None
        return link.fileno()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for qp in list(self._qps.values()):
            if qp.state is not QpState.RESET:
                qp.modify(QpState.ERR)
        self._qps.clear()
        if self.udp:
            self.udp.close()
        if self.tcp:
            self.tcp.close()

    def __enter__(self) -> "SoftDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pump --------------------------------------------------------------------
    def progress(self, now: float, readable: bool | None = None) -> bool:
        """Do all the work that is ready, without blocking. True if anything happened.

        ``readable`` is what the caller already knows about the link's socket
        (a driver that polled it); None makes the device look itself.
        """
        if self.closed:
            return False
        busy = self._receive(now, readable)
        d = self._deadline
        if d is not None and d <= now:
            busy = True
            for qp in self._qps.values():
                t = qp.get_timer()
                if t is not None and t <= now:
                    qp.handle_timer(now)
        if self._transmit(now):
            busy = True
        if busy:
            self._idle = 0
            self._deadline = self._scan_deadline()
        else:
            self._idle += 1
            if self._idle >= _DEADLINE_RESCAN:
                # Deadlines only move inside progress(), but a QP driven
                # directly by its owner must not be missed for long.
                self._idle = 0
                self._deadline = self._scan_deadline()
        return busy

    def _scan_deadline(self) -> float | None:
        best = self.tcp.deadline() if self.tcp is not None else None  # a preface timing out
        for qp in self._qps.values():
            t = qp.get_timer()
            if t is not None and (best is None or t < best):
                best = t
        return best

    def next_deadline(self) -> float | None:
        self._deadline = best = self._scan_deadline()
        return best

    def deadline_hint(self) -> float | None:
        """The earliest deadline as of the last busy ``progress`` (cheap; may be stale-early)."""
        return self._deadline

    def wants_write(self) -> bool:
        """True while sends wait for socket space (then wait for writability)."""
        if self.tcp is not None:
            return self.tcp.wants_write()
        return bool(self._backlog)

    def _deliver(self, pkt: Packet, src_ip: str, now: float) -> None:
        qp = self._qps.get(pkt.dest_qp)
        c = self.counters
        if qp is None:
            c.unknown_qp += 1
            return
        remote = qp.remote
        if not isinstance(remote, PeerAddress) or remote.ip != src_ip:
            c.wrong_source += 1  # rxe check_addr(): only the connected peer's address
            return
        qp.receive(pkt, now)

    def _receive(self, now: float, readable: bool | None = None) -> bool:
        if self.tcp is not None:
            return self._receive_tcp(now)
        link = self.udp
        assert link is not None
        if not (link.ready() if readable is None else readable):
            return False
        busy = False
        reads = 0
        while reads < MAX_RX_BATCHES:
            hot = self._hot
            if hot is not None:
                # The last read ended inside a run of MIDDLE packets: let the native
                # data plane read on while what arrives continues it.
                n = self._receive_hot(hot, now, MAX_RX_BATCHES - reads)
                if n >= 0:
                    if n == 0:
                        break
                    busy = True
                    reads += n
                    continue
            got = link.recv_raw()
            if got is None:
                break
            busy = True
            reads += 1
            nbytes, segsize, (src_ip, sport) = got
            if not segsize:
                continue  # a socket error (counted by the link)
            nsegs = (nbytes + segsize - 1) // segsize if nbytes else 1
            self.counters.packets_in += nsegs
            self._rx_batch(nbytes, segsize, src_ip, sport, 0, now)
            if not link.ready():
                break
        return busy

    def _receive_hot(self, hot: tuple[QueuePair, int, str, int, IcrcFlow], now: float, max_reads: int) -> int:
        """Reads done by the native run reader (0: nothing to read); -1: the run is over, read plainly."""
        qp, op, src_ip, sport, flow = hot
        fast, link = self._native, self.udp
        assert fast is not None
        assert link is not None
        run = qp.rx_run(op) if self._qps.get(qp.qpn) is qp else None
        r = qp.remote
        if run is None or type(r) is not PeerAddress or r.ip != src_ip:
            self._hot = None
            return -1
        psn, mem, off, most, mtu = run
        size = mtu + BTH_LEN + ICRC_LEN
        placed, last_ack, reads, datagrams, gro, err, pending = fast.recv_runs(
            link.fileno(), link.view, self._v6, (src_ip, sport), flow.seg_states(size, GSO_MAX_SEGMENTS),
            op, qp.qpn, psn, mtu, mem, off, most, max_reads,
        )  # fmt: skip
        c, lc = self.counters, link.counters
        c.packets_in += datagrams
        lc.datagrams_in += datagrams
        lc.gro_batches += gro
        if err:
            link.record_error(OSError(err, os.strerror(err)))
        if placed:
            qp.rx_run_done(op, placed, last_ack, now)
            c.icrc_ok += placed
        if pending is not None:
            self._hot = None
            nbytes, segsize, k, (ip, port) = pending
            self._rx_batch(nbytes, segsize, ip, port, k, now)
        elif placed >= most or not reads:
            self._hot = None  # the run is complete (or the socket is quiet): the plain reader decides
        return int(reads)

    def receive_datagram(self, data: Payload, src: tuple[str, int], now: float, segsize: int = 0) -> None:
        """Take ``data`` as if a read of the socket had returned it from ``src``.

        The receive path without the socket, for tests and benchmarks that
        feed it crafted input (``segsize``: a GRO batch of segments of that
        size; 0: one datagram). ``progress`` does the same with what it reads.
        """
        link = self.udp
        if link is None:
            raise EngineError("BAD_STATE", "receive_datagram: not a UDP device")
        n = len(data)
        view = link.view
        if n > len(view):
            raise EngineError("INVALID_VALUE", f"receive_datagram: {n} bytes, more than the buffer holds")
        view[:n] = data
        seg = segsize if 0 < segsize < n else max(n, 1)
        self.counters.packets_in += (n + seg - 1) // seg if n else 1
        self._rx_batch(n, seg, src[0], src[1], 0, now)

    def _rx_batch(self, nbytes: int, segsize: int, src_ip: str, sport: int, k: int, now: float) -> None:
        """Segments ``k`` .. of the datagrams in the link's buffer (see ``UdpLink.recv_raw``).

        In rxe's order (``rxe_rcv()``, rxe_recv.c): the cheap header checks
        first (``hdr_check()``: a QP of ours by that number, connected to the
        source's address; the opcode, TVer, pad and length as ``decode`` takes
        them), and the ICRC only for what passes them.
        """
        c = self.counters
        if not nbytes:
            c.malformed += 1
            return
        link = self.udp
        assert link is not None
        view = link.view
        verify, qps, fast = self.verify_icrc, self._qps, self._native
        unpack_bth, pack_bth, unpack_ic = _BTH.unpack_from, _BTH.pack, _ICRC.unpack_from
        rx: _RxFlow | None = None
        ours = False  # a segment checked with our IPv4 IDs
        pkt: Packet | None
        nsegs = (nbytes + segsize - 1) // segsize
        while k < nsegs:
            idx = k
            k += 1
            pos = idx * segsize
            seg = view[pos : min(pos + segsize, nbytes)]
            n = len(seg)
            if n < BTH_LEN + ICRC_LEN:
                c.malformed += 1
                continue
            end = n - ICRC_LEN
            op, b1, pkey, w1, w2 = unpack_bth(seg)
            qp = qps.get(w1 & _U24)
            if qp is None:
                c.unknown_qp += 1
                continue
            if type(r := qp.remote) is not PeerAddress or r.ip != src_ip:
                c.wrong_source += 1  # rxe check_addr(): only the connected peer's address
                continue
            if not verify:
                try:
                    pkt = decode(seg[:end])
                except WireError:
                    c.malformed += 1
                    continue
                qp.receive(pkt, now)
                continue
            if rx is None:
                rx = self._rx_flows.get((src_ip, sport))
                if rx is None:
                    rx = self._rx_flow(src_ip, sport)
            if fast is not None:
                if op in MIDDLE_OPCODES:
                    # A run of in-order MIDDLE packets: checked (header, then ICRC)
                    # and placed in one native call; the first that needs more stops it.
                    run = qp.rx_run(op)
                    if run is not None and n == run[4] + BTH_LEN + ICRC_LEN:
                        got_n, last_ack = fast.place_run(
                            view, nbytes, segsize, idx, rx.icrc.seg_states(n, nsegs), op, qp.qpn,
                            run[0], run[4], run[1], run[2], run[3],
                        )  # fmt: skip
                        if got_n:
                            qp.rx_run_done(op, got_n, last_ack, now)
                            c.icrc_ok += got_n
                            ours = True
                            k = idx + got_n
                            if k >= nsegs and got_n < run[3]:
                                self._hot = (qp, op, src_ip, sport, rx.icrc)
                            continue
                # One native call: the header checks, then the ICRC, then decode.
                got = fast.check_decode(seg, idx, rx.states, rx.icrc)
                if type(got) is Packet:
                    c.icrc_ok += 1
                    ours = True
                    qp.receive(got, now)
                    continue
                if not got:  # 0: the header is good, its ICRC does not check with IPv4 ID idx
                    pkt = self._other_ident(rx, seg, idx, src_ip, now)
                    if pkt is None:
                        c.bad_icrc += 1
                    else:
                        qp.receive(pkt, now)
                    continue
                # 1: the header checks failed; the Python codec says why.
            # BTH only, TVer 0, no pad, whole words: what decode takes for a MIDDLE.
            middle = op in MIDDLE_OPCODES and not b1 & 0x3F and not n & 3
            pkt = None
            if not middle:
                try:
                    pkt = decode(seg[:end])
                except WireError:
                    c.malformed += 1
                    continue
            # ICRC (Annex A17.3.3) of GSO segment idx: IPv4 ID idx, BTH byte 4 masked.
            st = rx.states.get(n | idx << 16)
            if st is None:
                st = rx.icrc.state(n, idx)
            ic = crc32(seg[BTH_LEN:end], crc32(pack_bth(op, b1, pkey, w1 | _MASK_BYTE4, w2), st))
            if ic == unpack_ic(seg, end)[0]:
                c.icrc_ok += 1
                ours = True
                if pkt is None:
                    if pkey & 0x7FFF == 0x7FFF and qp.receive_middle(
                        op, w2 & _U24, w2 >= 0x80000000, seg[BTH_LEN:end], now
                    ):
                        continue
                    pkt = decode(seg[:end])
            else:
                pkt = self._other_ident(rx, seg, idx, src_ip, now)
                if pkt is None:
                    c.bad_icrc += 1
                    continue
            qp.receive(pkt, now)
        if ours and rx is not None and not rx.kernel:
            rx.ours = _OURS_STRIKES

    def _rx_flow(self, src_ip: str, sport: int) -> _RxFlow:
        src = _addr_bytes(src_ip)
        if self._v6:
            icrc = IcrcFlow.ipv6(src, self._local, sport, self.port)
        else:
            icrc = IcrcFlow.ipv4(src, self._local, sport, self.port)
        flows = self._rx_flows
        if len(flows) >= MAX_RX_FLOWS:
            del flows[next(iter(flows))]  # the oldest: bounded, whatever the sources do
        rx = flows[(src_ip, sport)] = _RxFlow(icrc)
        return rx

    def _checked_with(self, rx: _RxFlow, seg: memoryview, ident: int) -> Packet | None:
        """The segment decoded if its ICRC checks with IPv4 ID ``ident`` (its header passed), else None."""
        fast = self._native
        if fast is not None:
            got = fast.check_decode(seg, ident, rx.states, rx.icrc)
            return got if type(got) is Packet else None
        end = len(seg) - ICRC_LEN
        if rx.icrc.icrc_seg(ident, seg[:end]) != unpack_icrc(seg):
            return None
        try:
            return decode(seg[:end])
        except WireError:
            return None

    def _other_ident(self, rx: _RxFlow, seg: memoryview, idx: int, src_ip: str, now: float) -> Packet | None:
        """Segment ``idx``'s ICRC does not check with IPv4 ID ``idx``: the IDs other senders use.

        An rdmakit sender without GSO uses ID 0. A kernel sender (rxe) counts
        its own: its next ID is tried, and the ID solved for (``IdentWindow``
        says when, and whether to believe it). Not for a source whose packets
        carried our IDs, unless its bad ICRCs go on.
        """
        if self._v6:
            return None  # IPv6 has no Identification
        c = self.counters
        if idx and not rx.kernel:
            pkt = self._checked_with(rx, seg, 0)
            if pkt is not None:
                c.icrc_ok += 1
                rx.ours = _OURS_STRIKES
                return pkt
        if rx.ours:
            rx.ours -= 1
            return None
        ids = self._idents.get(src_ip)
        if ids is None:
            ids = self._ident_window(src_ip, now)
        nxt = ids.next()
        if nxt is not None and nxt != idx:
            pkt = self._checked_with(rx, seg, nxt)
            if pkt is not None:
                ids.accept(nxt, now)
                rx.kernel = True
                c.icrc_solved += 1
                return pkt
        if not ids.may_solve(now):
            c.solver_limited += 1
            return None
        c.solver_runs += 1
        end = len(seg) - ICRC_LEN
        ident = solve_ident_diff(end, rx.icrc.icrc(seg[:end]) ^ unpack_icrc(seg))
        if ident is None:
            c.icrc_unsolved += 1
            return None
        if not ids.accept(ident, now):
            c.solved_out_of_window += 1
            return None
        pkt = self._checked_with(rx, seg, ident)
        if pkt is not None:
            rx.kernel = True
            c.icrc_solved += 1
        return pkt

    def _ident_window(self, src_ip: str, now: float) -> IdentWindow:
        idents = self._idents
        if len(idents) >= MAX_IDENT_PEERS:
            del idents[next(iter(idents))]
        ids = idents[src_ip] = IdentWindow(now)
        return ids

    def _receive_tcp(self, now: float) -> bool:
        link = self.tcp
        assert link is not None
        c = self.counters
        busy = False
        for frames, src_ip, dead in link.poll(now):
            busy = True
            for body in frames:
                c.packets_in += 1
                try:
                    if isinstance(body, Placed):
                        pkt = decode(body.header)._replace(payload=body.payload)
                        c.placed += 1
                    else:
                        pkt = decode(body)
                except WireError:
                    c.malformed += 1
                    continue
                self._deliver(pkt, src_ip, now)
            if dead is not None:
                # The stream over that route is gone: TCP already retried for us (or
                # the peer stopped reading).
                why = link.pop_failure(dead)
                for qpn, (route, _) in self._routes.items():
                    qp = self._qps.get(qpn)
                    if route == dead and qp is not None and qp.state is QpState.RTS:
                        self._faults[qpn] = why
                        qp.transport_error(now)
        return busy

    def _place_tcp(self, src_ip: str, head: memoryview, n: int) -> tuple[int, memoryview] | None:
        """Where the payload of a large frame from ``src_ip`` goes (``TcpLink.place``).

        ``head``: the first bytes of the frame body (``n`` bytes in all). Only
        a WRITE request without pad that its QP will take in order has a home.
        """
        op, b1 = head[0], head[1]
        hlen = _WRITE_HEADER_LEN.get(op)
        if hlen is None or b1 & 0x30 or len(head) < hlen:
            return None
        try:
            pkt = decode(head[:hlen])
        except WireError:
            return None
        qp = self._qps.get(pkt.dest_qp)
        r = qp.remote if qp is not None else None
        if qp is None or not isinstance(r, PeerAddress) or r.ip != src_ip:
            return None
        target = qp.rx_place(pkt, n - hlen)
        return None if target is None else (hlen, target)

    def _transmit(self, now: float) -> bool:
        if self.tcp is not None:
            return self._transmit_tcp(now)
        busy = False
        if self._backlog and not self._flush_backlog():
            return True
        trains = self._native is not None  # UDP only: TCP sends packets
        for qp in self._qps.values():
            if not qp.may_transmit():
                continue
            before = qp.stats.packets_out
            pkts = qp.poll_transmit_trains(now) if trains else qp.poll_transmit(now)
            if not pkts:
                continue
            busy = True
            n = qp.stats.packets_out - before  # packets, trains counted in full
            remote = qp.remote
            if not isinstance(remote, PeerAddress):
                self.counters.dropped_state += n
                continue
            self.counters.packets_out += n
            self._send_udp(pkts, remote)
        return busy

    def _transmit_tcp(self, now: float) -> bool:
        """Send what the QPs have, as much as each route's stream has room for (backpressure)."""
        link = self.tcp
        assert link is not None
        c = self.counters
        busy = False
        for qp in self._qps.values():
            if not qp.may_transmit():
                continue
            got = self._routes.get(qp.qpn)
            if got is None:
                n = len(qp.poll_transmit(now))  # not connected through this device: nowhere to go
                c.dropped_state += n
                busy = busy or n > 0
                continue
            route, frame = got
            room = link.room(route)
            if room <= 0:
                c.tcp_held += 1
                continue
            pkts = qp.poll_transmit(now, max(1, room // frame))
            if pkts:
                busy = True
                c.packets_out += len(pkts)
                link.send_packets(pkts, route)
        return busy

    def _flush_backlog(self) -> bool:
        link = self.udp
        assert link is not None
        while self._backlog:
            parts, seg, count, addr = self._backlog[0]
            sent = link.send_gso(parts, seg, count, addr) if count > 1 else link.send(parts, addr)
            if not sent:
                return False
            self._backlog.pop(0)
        return True

    def _send_udp(self, pkts: list[Packet] | list[Packet | Train], remote: PeerAddress) -> None:
        link = self.udp
        assert link is not None
        addr = (remote.ip, remote.port)
        flow = self._tx_flows.get(addr)
        if flow is None:
            flow = self._tx_flow(remote)
        fast = self._native
        if fast is not None and len(pkts) == 1 and type(pkt := pkts[0]) is Packet and not self._backlog:
            # A single packet (a small operation's request or response): one native call.
            err = fast.send_packet(link.fileno(), addr, self._v6, pkt, flow.states, flow)
            if err >= 0 and err not in _WOULD_BLOCK:
                lc = link.counters
                lc.datagrams_out += 1  # as UdpLink.send: a send error is a lost packet
                lc.sends += 1
                if err:
                    link.record_error(OSError(err, os.strerror(err)))
                return
            # -1 (the Python encoder says what is wrong) or a full socket (queued below)
        states = flow.states
        gso = link.gso
        parts: list[Payload] = []
        seg = count = total = 0
        send: Callable[[list[Payload], int, int], None] = self._send_or_queue(addr)
        pack_ic, pack_bth = _ICRC.pack, _BTH.pack
        for pkt in pkts:
            if type(pkt) is Train:
                if count:
                    send(parts, seg, count)
                    parts, seg, count, total = [], 0, 0, 0
                rest = self._send_train(pkt, flow, addr)
                if rest:
                    self._send_udp(rest, remote)
                continue
            assert type(pkt) is Packet
            op = pkt[0]
            pl = pkt[15]
            plen = len(pl)
            pad = _PADS[-plen & 3]
            if op in MIDDLE_OPCODES and pkt[4:15] == _PLAIN_MIDDLE and pkt[1] <= _U24 and pkt[2] <= _U24:
                # The bulk of a message: the BTH alone (IBTA §9.2), packed as
                # encode_headers() would (tests/transport prove them equal).
                w2 = pkt[2] | 0x80000000 if pkt[3] else pkt[2]
                b1 = _PADCNT_BITS[plen & 3]
                hdr = pack_bth(op, b1, 0xFFFF, pkt[1], w2)
                masked = pack_bth(op, b1, 0xFFFF, pkt[1] | _MASK_BYTE4, w2)
            else:
                hdr = encode_headers(pkt)
                m = bytearray(hdr)
                m[4] = 0xFF  # FECN, BECN, resv6 (Annex A17.3.3)
                masked = bytes(m)
            size = len(hdr) + plen + len(pad) + ICRC_LEN
            if count and (not gso or size > seg or count >= GSO_MAX_SEGMENTS or total + size > GSO_MAX_BYTES):
                send(parts, seg, count)
                parts, seg, count, total = [], 0, 0, 0
            # ICRC (Annex A17.3.3) of GSO segment `count`: the kernel gives it IPv4 ID `count`.
            st = states.get(size | count << 16)
            if st is None:
                st = flow.state(size, count)
            ic = crc32(masked, st)
            parts.append(hdr)
            if plen:
                ic = crc32(pl, ic)
                parts.append(pl)
            if pad:
                ic = crc32(pad, ic)
                parts.append(pad + pack_ic(ic))
            else:
                parts.append(pack_ic(ic))
            if count == 0:
                seg = size
            count += 1
            total += size
            if size < seg:  # a shorter datagram can only end a GSO batch
                send(parts, seg, count)
                parts, seg, count, total = [], 0, 0, 0
        if count:
            send(parts, seg, count)

    def _send_train(self, train: Train, flow: IcrcFlow, addr: tuple[str, int]) -> list[Packet]:
        """Send a run of MIDDLE packets natively; what could not be sent is returned as packets.

        Behind a backlog, or when the socket fills or refuses, the rest goes the
        per-packet way (which queues it in order, or counts the error).
        """
        link = self.udp
        fast = self._native
        assert link is not None
        if fast is None or self._backlog:
            return train.packets()
        size = BTH_LEN + train.mtu + ICRC_LEN
        gso = link.gso
        per = min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // size) if gso else 1
        total = train.npkts
        states = flow.seg_states(size, min(per, total))
        sent, err = fast.send_train(
            link.fileno(), addr, self._v6, gso, train.opcode, train.dest_qp, train.psn, total,
            train.payload, train.mtu, train.ack_first, train.ack_every, states,
        )  # fmt: skip
        lc = link.counters
        lc.datagrams_out += sent
        batches = (sent + per - 1) // per
        lc.sends += batches
        if gso:
            lc.gso_sends += batches
        if sent == total:
            return []
        if err in (errno.EAGAIN, errno.EWOULDBLOCK):
            lc.send_would_block += 1
        elif gso and err in (errno.EIO, errno.EINVAL, errno.EOPNOTSUPP):
            link.gso = False  # as UdpLink.send_gso: no GSO on this path, for good
        elif err:
            link.record_error(OSError(err, os.strerror(err)))
            return []  # a dead route loses the packets; the engine retransmits them
        return train.tail(sent).packets()

    def _tx_flow(self, remote: PeerAddress) -> IcrcFlow:
        dst = _addr_bytes(remote.ip)
        if self._v6:
            flow = IcrcFlow.ipv6(self._local, dst, self.port, remote.port)
        else:
            flow = IcrcFlow.ipv4(self._local, dst, self.port, remote.port)
        if len(self._tx_flows) >= 1024:
            self._tx_flows.clear()
        self._tx_flows[(remote.ip, remote.port)] = flow
        return flow

    def _send_or_queue(self, addr: tuple[str, int]) -> Callable[[list[Payload], int, int], None]:
        link = self.udp
        assert link is not None
        backlog = self._backlog

        def send(parts: list[Payload], seg: int, count: int) -> None:
            if not backlog:
                ok = link.send_gso(parts, seg, count, addr) if count > 1 else link.send(parts, addr)
                if ok:
                    return
            backlog.append((parts, seg, count, addr))
            self.counters.backlog_max = max(self.counters.backlog_max, len(backlog))

        return send


_WOULD_BLOCK = frozenset((errno.EAGAIN, errno.EWOULDBLOCK))


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """What one side of an RC connection tells the other (IBTA §12.7 REQ/REP fields).

    ``secret`` (TCP only, hex): what a stream to this QP must present
    (:mod:`rdmakit.transport.tcp`); whoever holds the endpoint holds it.
    """

    transport: TransportName
    gid: str
    ip: str
    port: int
    qpn: int
    psn: int
    mtu: int
    secret: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectOptions:
    """RTR/RTS attributes (IBTA §11.2.5.3).

    ``retry_cnt`` is 6, not 7: rxe (and this engine) never exhaust 7, and a peer
    that vanished must end in RETRY_EXC_ERR, not a hang. ``rnr_retry`` 7 waits
    for receives as long as it takes (IBTA §9.7.5.2.8), as perftest does.
    """

    access: int = 0xF
    max_rd_atomic: int = 16
    max_dest_rd_atomic: int = 16
    min_rnr_timer: int = 12
    timeout: int | None = None
    retry_cnt: int = 6
    rnr_retry: int = 7


def local_endpoint(dev: SoftDevice, qp: QueuePair, psn: int, mtu: int | None = None) -> Endpoint:
    """What the peer needs to connect to ``qp``; on TCP it carries ``qp``'s secret."""
    mtu = min(mtu or dev.max_mtu, dev.max_mtu)
    return Endpoint(
        transport=dev.transport,
        gid=dev.gid,
        ip=dev.ip,
        port=dev.port,
        qpn=qp.qpn,
        psn=psn,
        mtu=mtu,
        secret=dev.tcp_secret(qp, mtu).hex() if dev.tcp is not None else "",
    )


def init_qp(qp: QueuePair, access: int = 0xF) -> None:
    """RESET → INIT, after which receives may be posted (IBTA §10.3.1)."""
    qp.modify(QpState.INIT, port=1, pkey_index=0, access=access)


def connect_qp(
    dev: SoftDevice, qp: QueuePair, psn: int, peer: Endpoint, opts: ConnectOptions | None = None
) -> None:
    """Bring ``qp`` from RESET (or INIT) to RTS against ``peer``.

    An endpoint's ``psn`` is the PSN its first request carries (the IB CM
    "starting PSN", as ``ibv_rc_pingpong`` and perftest use it): this side sends
    from its own ``psn`` and expects the peer's.
    """
    o = opts or ConnectOptions()
    if peer.transport != dev.transport:
        raise EngineError("INVALID_VALUE", f"peer speaks {peer.transport}, this device {dev.transport}")
    route = _tcp_route(peer) if dev.tcp is not None else None
    mtu = min(peer.mtu, dev.max_mtu)
    if qp.state is QpState.RESET:
        init_qp(qp, o.access)
    qp.modify(
        QpState.RTR,
        path_mtu=mtu,
        dest_qpn=peer.qpn,
        rq_psn=peer.psn,
        max_dest_rd_atomic=o.max_dest_rd_atomic,
        min_rnr_timer=o.min_rnr_timer,
        remote=PeerAddress(peer.ip, peer.port),
    )
    qp.modify(
        QpState.RTS,
        timeout=DEFAULT_TIMEOUT[dev.transport] if o.timeout is None else o.timeout,
        retry_cnt=o.retry_cnt,
        rnr_retry=o.rnr_retry,
        sq_psn=psn,
        max_rd_atomic=o.max_rd_atomic,
    )
    if route is not None:
        dev.connect_tcp(qp, route)


def _tcp_route(peer: Endpoint) -> Route:
    try:
        ip = str(ipaddress.ip_address(peer.ip))
    except ValueError:
        raise EngineError("INVALID_VALUE", f"a tcp peer's ip {peer.ip[:64]!r} is not an IP address") from None
    try:
        secret = bytes.fromhex(peer.secret)
    except ValueError:
        secret = b""
    if len(secret) != SECRET_LEN:
        want = f"its {SECRET_LEN}-byte secret, as {2 * SECRET_LEN} hex digits"
        raise EngineError("INVALID_VALUE", f"a tcp peer's endpoint must carry {want}")
    return Route(ip, peer.port, peer.qpn, secret)
