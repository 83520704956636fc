"""A soft device's RoCE-UDP port: RoCEv2 datagrams on UDP port 4791 (Annex A17).

Receiving follows rxe's order (``rxe_rcv()``, rxe_recv.c): the cheap header
checks first, the ICRC only for what passes them, and the IPv4 IDs of other
senders (:mod:`rdmakit.transport.roce_sources`) only for a connected peer.
Sending batches datagrams for GSO, each segment with the ICRC of the IPv4 ID
the kernel gives it; what the socket does not take waits in a backlog, in
order. With the native data plane (``fastpath``), MIDDLE runs are sent and placed
in bulk, small operations' packets take one call each, posts too (``_post_now``).
"""

import errno
import os
import struct
from collections.abc import Callable
from typing import cast

from rdmakit.engine import EngineError, QueuePair, WcStatus
from rdmakit.wire import (
    BTH_LEN,
    ICRC_LEN,
    MIDDLE_OPCODES,
    IcrcFlow,
    Packet,
    Payload,
    Train,
    WireError,
    crc32,
    decode,
)
from rdmakit.wire.cnp import CNP_OPCODE
from rdmakit.wire.ud import GSI_QPN

from . import fastpath
from .cnp import check_cnp, cnp_datagram
from .codec import ArmedOwner, ArmedReqOwner, SegmentCodec
from .codec_py import headers
from .fastpath import PYTHON
from .gsi import Gsi
from .netmtu import too_big_message
from .port import DeviceCounters, PeerAddress, addr_bytes
from .roce_armed import AckRoutes, ArmedSends, HeldAcks
from .roce_sources import OURS_STRIKES, RxFlow, RxSources
from .roce_trains import TrainSends
from .small_ops import OFFERED, take_small
from .udp import CE, GSO_MAX_BYTES, GSO_MAX_SEGMENTS, WOULD_BLOCK, UdpLink

#: GRO batches read per ``progress`` before the timers and transmit get a turn.
MAX_RX_BATCHES = 64

_BTH = struct.Struct(">BBHII")
_ICRC = struct.Struct("<I")
_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
_U24 = 0xFFFFFF


class UdpPort(ArmedSends, TrainSends):
    """The UDP link of a device, its receive state per source and its send backlog."""

    def __init__(
        self,
        ip: str,
        port: int,
        qps: dict[int, QueuePair],
        counters: DeviceCounters,
        *,
        gso: bool,
        verify_icrc: bool,
        bulk: bool,
    ) -> None:
        self.link = UdpLink(ip, port, gso=gso)
        self.port = self.link.port
        self._fd = self.link.fileno()
        self._qps = qps
        self.counters = counters
        self.verify_icrc = verify_icrc
        self._local = addr_bytes(ip)
        self._v6 = len(self._local) == 16
        #: Runs of MIDDLE packets in bulk (``send_train``, ``place_run``); else packet by packet.
        self._runs = bulk
        self.sources = RxSources(ip, self.port, counters)
        #: The segment codec (``fastpath.CODEC``; the Python reference without ``bulk``).
        self.codec = fastpath.CODEC if bulk else PYTHON
        #: A run the last read ended inside: (QP, opcode, source ip, source port, ICRC flow).
        self._hot: tuple[QueuePair, int, str, int, IcrcFlow] | None = None
        self._backlog: list[tuple[list[Payload], int, int, tuple[str, int]]] = []
        #: ICRC header states per destination (ip, port).
        self._tx_flows: dict[tuple[str, int], IcrcFlow] = {}
        #: QP1: the connection manager's datagrams (``rdmakit.transport.gsi``), when attached.
        self.gsi: Gsi | None = None
        #: Why a QP was failed here: its datagrams did not fit the path (EMSGSIZE).
        self._faults: dict[int, str] = {}
        #: The QPs transmit visits, by QPN: a doorbell, a segment or a timer of theirs put them
        #: here; ``may_transmit`` saying nothing takes them out; ``sweep`` puts all back.
        self._active: dict[int, QueuePair] = {}
        #: Armed responders and requesters' native completers by QPN, each bound to the source
        #: of its requests or ACKs (``_bind``, ``_bind_req``).
        self._armed: dict[int, ArmedOwner] = {}
        self._armed_req: dict[int, ArmedReqOwner] = {}
        self._routes: AckRoutes = {}
        #: The QPs transmit looked at since ``visited`` was last called.
        self._visited: list[QueuePair] = []
        self._post_flows = {}

    @property
    def codec(self) -> SegmentCodec:
        return self._codec

    @codec.setter
    def codec(self, codec: SegmentCodec) -> None:
        self._codec = self.sources.codec = codec
        if self._post_ctx is not None:  # native posting's context is the old codec's
            self._post_ctx[2] = None
            self._post_ctx = None

    def forget(self, qp: QueuePair) -> None:
        qp.disarm()
        self._armed.pop(qp.qpn, None)
        self._armed_req.pop(qp.qpn, None)
        self._routes.pop(qp.qpn, None)
        self._faults.pop(qp.qpn, None)  # the receive state is per source, not per QP
        if self._active.get(qp.qpn) is qp:
            del self._active[qp.qpn]

    def wake(self, qp: QueuePair) -> None:
        if self.post_clock is None or not self._post_now(qp):
            self._active[qp.qpn] = qp

    def sweep(self) -> None:
        self._active.update(self._qps)

    def visited(self) -> list[QueuePair]:
        # Every QP a segment reached, a doorbell or timer woke is in the active set until
        # transmit looks at it; one still there (a backlog held transmit back) counts too.
        out = self._visited.copy()  # the list itself is native posting's (``_post_ctx``)
        self._visited.clear()
        if self._active:
            out.extend(self._active.values())
        return out

    def fault(self, qpn: int) -> str | None:
        return self._faults.get(qpn)

    def deadline(self) -> float | None:
        return None

    def wants_write(self) -> bool:
        """True while sends wait for socket space."""
        return bool(self._backlog)

    def fileno(self) -> int:
        return self.link.fileno()

    def close(self) -> None:
        self.link.close()

    # -- receiving ----------------------------------------------------------------------
    def receive(self, now: float, readable: bool | None = None) -> bool:
        link = self.link
        read, poll = self.codec.recv_raw, self.codec.poll_armed
        if read is None:
            if not (link.ready() if readable is None else readable):
                return False
        elif readable is False:
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
            if read is None:
                got = link.recv_raw()
                if got is None:
                    break
                nbytes, segsize, (src_ip, sport) = got
                ecn = link.last_ecn
            else:
                if (self._armed or self._armed_req) and poll is not None:
                    # The device poll for armed responders and requesters' completers: their
                    # WRITEs and ACKs taken in C, the first other read handed back as recv_raw's
                    # (a kernel sender's counted icrc_solved there).
                    solved = self.counters.icrc_solved
                    taken, raw = self._poll_armed(poll, now, MAX_RX_BATCHES - reads)
                    if taken:
                        busy = True
                        reads += taken
                        self.counters.packets_in += taken
                        self.counters.icrc_ok += taken - (self.counters.icrc_solved - solved)
                        link.counters.datagrams_in += taken
                else:
                    # One native read: an empty socket says so without a readiness check first.
                    raw = read(self._fd, link.view)
                if raw is None:
                    break
                busy = True
                reads += 1
                self._take_raw(raw, now)
                continue
            busy = True
            reads += 1
            if not segsize:
                continue  # a socket error (counted by the link)
            nsegs = (nbytes + segsize - 1) // segsize if nbytes else 1
            self.counters.packets_in += nsegs
            self._rx_batch(nbytes, segsize, src_ip, sport, 0, now, ecn == CE)
            if not link.ready():
                break
        return busy

    def _receive_hot(self, hot: tuple[QueuePair, int, str, int, IcrcFlow], now: float, max_reads: int) -> int:
        """Reads done by the native run reader (0: nothing to read); -1: the run is over, read plainly."""
        qp, op, src_ip, sport, flow = hot
        link = self.link
        recv_runs = self.codec.recv_runs
        assert recv_runs is not None
        run = qp.rx_run(op) if self._qps.get(qp.qpn) is qp else None
        r = qp.remote
        if run is None or type(r) is not PeerAddress or r.ip != src_ip:
            self._hot = None
            return -1
        self._active[qp.qpn] = qp  # what it places may be owed an ACK
        psn, mem, off, most, mtu = run
        size = mtu + BTH_LEN + ICRC_LEN
        placed, last_ack, reads, datagrams, gro, err, pending, ce = recv_runs(
            link.fileno(), link.view, self._v6, (src_ip, sport), flow.seg_states(size, GSO_MAX_SEGMENTS),
            op, qp.qpn, psn, mtu, mem, off, most, max_reads, flow.id_shifts(size),
        )  # fmt: skip
        c, lc = self.counters, link.counters
        c.packets_in += datagrams
        lc.datagrams_in += datagrams
        lc.gro_batches += gro
        if err:
            link.record_error(OSError(err, os.strerror(err)))
        if ce:
            lc.ce_reads += ce
            qp.congestion_experienced(now)
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
        link = self.link
        n = len(data)
        view = link.view
        if n > len(view):
            raise EngineError("INVALID_VALUE", f"receive_datagram: {n} bytes, more than the buffer holds")
        view[:n] = data
        seg = segsize if 0 < segsize < n else max(n, 1)
        self.counters.packets_in += (n + seg - 1) // seg if n else 1
        self._rx_batch(n, seg, src[0], src[1], 0, now)

    def _rx_batch(
        self, nbytes: int, segsize: int, src_ip: str, sport: int, k: int, now: float, ce: bool = False
    ) -> None:
        """Segments ``k`` .. of the datagrams in the link's buffer (see ``UdpLink.recv_raw``);
        ``ce``: their IP headers carried CE, which each QP they reach learns once.

        In rxe's order (``rxe_rcv()``, rxe_recv.c): the cheap header checks
        first (``hdr_check()``: a QP of ours by that number, connected to the
        source's address; the opcode, TVer, pad and length as ``decode`` takes
        them), and the ICRC only for what passes them.
        """
        c = self.counters
        if not nbytes:
            c.malformed += 1
            return
        link = self.link
        view = link.view
        verify, qps, codec, active = self.verify_icrc, self._qps, self.codec, self._active
        runs, hot = self._runs, self._runs and codec.recv_runs is not None
        small = runs and (codec.small_request is not None or codec.small_response is not None)
        unpack_bth = _BTH.unpack_from
        rx: RxFlow | None = None
        ce_qp: QueuePair | None = None
        ours = False  # a segment checked with our IPv4 IDs
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
            op, _b1, _pkey, w1, _w2 = unpack_bth(seg)
            qpn = w1 & _U24
            qp = qps.get(qpn)
            if qp is not None:
                active[qpn] = qp  # whatever this segment does, the QP may have an answer
            else:
                if w1 & _U24 == GSI_QPN and self.gsi is not None:
                    self.gsi.receive(seg, src_ip, sport, now)
                    continue
                c.unknown_qp += 1
                continue
            if type(r := qp.remote) is not PeerAddress or r.ip != src_ip:
                c.wrong_source += 1  # rxe check_addr(): only the connected peer's address
                continue
            if ce and qp is not ce_qp:
                ce_qp = qp
                qp.congestion_experienced(now)
            if op == CNP_OPCODE:
                if check_cnp(seg, src_ip, sport, self._local, self.port) is None:
                    c.malformed += 1
                else:
                    qp.cnp_received(now)
                continue
            if not verify:
                try:
                    pkt = decode(seg[: n - ICRC_LEN])
                except WireError:
                    c.malformed += 1
                    continue
                qp.receive(pkt, now)
                continue
            if rx is None:
                rx = self.sources.flows.get((src_ip, sport))
                if rx is None:
                    rx = self.sources.flow(src_ip, sport)
            if runs and op in MIDDLE_OPCODES and not rx.kernel:
                # A run of in-order MIDDLE packets: checked (header, then ICRC, with our IPv4
                # IDs: not a kernel's) and placed in one call; the first that needs more stops it.
                run = qp.rx_run(op)
                if run is not None and n == run[4] + BTH_LEN + ICRC_LEN:
                    got_n, last_ack = codec.place_run(
                        view, nbytes, segsize, idx, rx.icrc.seg_states(n, nsegs), op, qp.qpn,
                        run[0], run[4], run[1], run[2], run[3], rx.icrc.id_shifts(n),
                    )  # fmt: skip
                    if got_n:
                        qp.rx_run_done(op, got_n, last_ack, now)
                        c.icrc_ok += got_n
                        ours = True
                        k = idx + got_n
                        if hot and k >= nsegs and got_n < run[3]:
                            self._hot = (qp, op, src_ip, sport, rx.icrc)
                        continue
            # (A kernel sender's datagram: its ICRC checked with the IPv4 ID it most likely carries.)
            ident = idx if not rx.kernel else self.sources.kernel_ident(rx, src_ip)
            if (
                small
                and op in OFFERED
                and ident is not None
                and (took := take_small(codec, qp, op, seg, ident, rx.states, rx.icrc, now))
            ):
                # A one-packet request executed, a WRITE packet by an armed responder, or the
                # response that completes a send taken, in one call each (header, then ICRC,
                # then the engine's checks).
                if rx.kernel:
                    self.sources.kernel_ident_taken(src_ip, ident, now)
                else:
                    c.icrc_ok += 1
                    ours = True
                if took in (3, 5, 6) and self._armed.get(qpn) is not qp.native:
                    self._bind(qp, rx, src_ip, sport)
                elif took == 4 and self._armed_req.get(qpn) is not qp.req_native:
                    self._bind_req(qp, rx, src_ip, sport)
                continue
            # The header checks, then the ICRC (GSO segment idx: IPv4 ID idx, or another
            # below SEGMENT_IDS where the network split or merged batches), then decode.
            got = codec.check_decode(seg, idx, rx.states, rx.icrc)
            if type(got) is Packet:
                c.icrc_ok += 1
                ours = True
                qp.receive(got, now)
                continue
            if got and codec is not PYTHON:
                got = PYTHON.check_decode(seg, idx, rx.states, rx.icrc)  # the reference says why
                if type(got) is Packet:
                    c.icrc_ok += 1
                    ours = True
                    qp.receive(got, now)
                    continue
            if got:  # 1: the header is refused
                c.malformed += 1
                continue
            # 0: the header is good, its ICRC does not check with IPv4 ID idx
            other = self.sources.other_ident(rx, seg, idx, src_ip, now)
            if other is None:
                c.bad_icrc += 1
            else:
                qp.receive(other, now)
        if ours and rx is not None and not rx.kernel:
            rx.ours = OURS_STRIKES

    # -- sending ------------------------------------------------------------------------
    def transmit(self, now: float) -> bool:
        busy = False
        if self._backlog and not self._flush_backlog():
            return True
        active = self._active
        if not active:
            return False
        qps = self._qps
        trains = self._runs
        visited = self._visited
        acks: HeldAcks = {}  # sent together at the pass's end (``_send_acks``)
        many = len(active) > 1  # one QP's pass sends its ACK as it comes
        for qpn, qp in list(active.items()):
            if qps.get(qpn) is not qp:
                del active[qpn]
                continue
            if qp.poll_cnp() and isinstance(remote := qp.remote, PeerAddress):
                # Annex A17.9.3: the notification point's CNP for what arrived marked CE.
                self.link.send(
                    cnp_datagram(self._local, remote.ip, self.port, qp.dest_qpn), (remote.ip, remote.port)
                )
                busy = True
            owner = cast("ArmedOwner | None", qp.native)  # armed by take_small: the codec's own
            held = False  # its ACK, alone this pass, goes with others' (``_send_acks``)
            if owner is not None and owner.pending:
                held = many and not qp.may_transmit(False) and self._hold_ack(acks, qp, owner)
                busy |= held or self._send_ack(owner, qp, now)
            if held or not qp.may_transmit():
                del active[qpn]  # until its doorbell rings, a segment reaches it or its timer fires
                visited.append(qp)
                continue
            before = qp.stats.packets_out
            one = qp.tx_small(now) if trains else None  # the requester's common case (small_ops)
            if one is not None:
                pkts: list[Packet] | list[Packet | Train] = [one]
            else:
                pkts = qp.poll_transmit_trains(now) if trains else qp.poll_transmit(now)
            if not pkts:
                # Paced (its rate holds the next packet back): a new deadline, which the
                # device must see to wake for it (``SoftDevice.progress`` rescans when busy).
                busy |= not qp.may_transmit()
                continue
            busy = True
            n = qp.stats.packets_out - before  # packets, trains counted in full
            remote = qp.remote
            if not isinstance(remote, PeerAddress):
                self.counters.dropped_state += n
                continue
            self.counters.packets_out += n
            if many and trains and len(pkts) == 1 and self._hold_ack(acks, qp, pkts[0]):
                continue
            too_big = self.link.counters.errors_by_errno.get(errno.EMSGSIZE, 0)
            self._send_udp(pkts, remote)
            if self.link.counters.errors_by_errno.get(errno.EMSGSIZE, 0) != too_big:
                self._too_big(qp, remote)
        if acks:
            self._send_acks(acks, now)
        return busy

    def _too_big(self, qp: QueuePair, remote: PeerAddress) -> None:
        """The path refused a datagram of ``qp`` (EMSGSIZE: the route's MTU, or what path-MTU
        discovery learned from an ICMP error, is below it). A QP's path MTU cannot change
        in RTS (IBTA §11.2.5.3 sets it at RTR), so the QP fails at once, saying why, rather
        than resending what can never arrive."""
        mtu = qp.attrs.path_mtu or 0
        overhead = BTH_LEN + 20 + ICRC_LEN  # BTH, RETH and ImmDt at most, ICRC
        self._faults[qp.qpn] = too_big_message(remote.ip, mtu + overhead, mtu, self.link.ip)
        qp.fail_send(WcStatus.LOC_QP_OP_ERR)

    def _flush_backlog(self) -> bool:
        link = self.link
        while self._backlog:
            parts, seg, count, addr = self._backlog[0]
            sent = link.send_gso(parts, seg, count, addr) if count > 1 else link.send(parts, addr)
            if not sent:
                return False
            self._backlog.pop(0)
        return True

    def _send_udp(self, pkts: list[Packet] | list[Packet | Train], remote: PeerAddress) -> None:
        link = self.link
        addr = (remote.ip, remote.port)
        flow = self._tx_flows.get(addr)
        if flow is None:
            flow = self._tx_flow(remote)
        if self._runs and len(pkts) == 1 and type(pkt := pkts[0]) is Packet and not self._backlog:
            # A single packet (a small operation's request or response): one codec call.
            err = self.codec.send_packet(link.sock, addr, pkt, flow.states, flow)
            if err >= 0 and err not in WOULD_BLOCK:
                lc = link.counters
                lc.datagrams_out += 1  # as UdpLink.send: a send error is a lost packet
                lc.sends += 1
                if err:
                    link.record_error(OSError(err, os.strerror(err)))
                return
            # -1 (encode_headers says what is wrong) or a full socket (queued below)
        states = flow.states
        gso = link.gso
        parts: list[Payload] = []
        seg = count = total = 0
        send: Callable[[list[Payload], int, int], None] = self._send_or_queue(addr)
        pack_ic = _ICRC.pack
        took_next = False
        for j, pkt in enumerate(pkts):
            if took_next:  # the train before took it along
                took_next = False
                continue
            if type(pkt) is Train:
                if count:
                    send(parts, seg, count)
                    parts, seg, count, total = [], 0, 0, 0
                after = pkts[j + 1] if j + 1 < len(pkts) else None
                rest, took_next = self._send_train(pkt, flow, addr, after)
                if rest:
                    self._send_udp(rest, remote)
                continue
            assert type(pkt) is Packet
            pl = pkt[15]
            plen = len(pl)
            pad = _PADS[-plen & 3]
            hdr, masked = headers(pkt)
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

    def _send_or_queue(self, addr: tuple[str, int]) -> Callable[[list[Payload], int, int], None]:
        link = self.link
        backlog = self._backlog

        def send(parts: list[Payload], seg: int, count: int) -> None:
            if not backlog:
                ok = link.send_gso(parts, seg, count, addr) if count > 1 else link.send(parts, addr)
                if ok:
                    return
            backlog.append((parts, seg, count, addr))
            self.counters.backlog_max = max(self.counters.backlog_max, len(backlog))

        return send
