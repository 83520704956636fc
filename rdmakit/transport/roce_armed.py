"""The UDP port's part in armed responders and requesters' native completers (``docs/architecture.md``,
"Who owns a QP's state").

``UdpPort`` binds a responder that ``take_small`` just armed to the source of
the request that armed it (``_bind``), so that its device poll
(``poll_armed``) executes that source's next WRITEs natively, and sends the
ACK an armed responder holds in one native call where ``poll_transmit``
would have sent it (``_send_ack``). The ACKs a transmit pass holds for
several QPs to one peer leave together (``_hold_ack``, ``_send_acks``).
"""

import errno
import os
from collections.abc import Callable
from typing import Any, cast

from rdmakit.engine.congestion import PACKET_OVERHEAD
from rdmakit.engine.qp import QueuePair
from rdmakit.engine.small_tx import POST_TABLE
from rdmakit.wire import IcrcFlow, Opcode, Packet, Payload, Train

from .codec import ArmedOwner, ArmedReqOwner, LoopPort, PollArmed, PostSend, SegmentCodec, SendAcks
from .port import DeviceCounters, PeerAddress, addr_bytes
from .roce_sources import OURS_STRIKES, RxFlow, RxSources
from .udp import CE, WOULD_BLOCK, UdpLink

#: The ACKs a transmit pass holds, by destination: a Packet from ``poll_transmit``, or a QP
#: whose armed responder holds one.
HeldAcks = dict[PeerAddress, list[Packet | QueuePair]]
#: Where an armed responder's ACKs go, by QPN: ((ip, port), v6, ICRC states, ICRC flow).
AckRoutes = dict[int, tuple[tuple[str, int], bool, dict[int, int], IcrcFlow]]


class ArmedSends:
    """``UdpPort``'s armed-responder methods (its base class)."""

    link: UdpLink
    counters: DeviceCounters
    _fd: int
    _v6: bool
    _armed: dict[int, ArmedOwner]
    _armed_req: dict[int, ArmedReqOwner]
    _active: dict[int, QueuePair]
    _backlog: list[tuple[list[Payload], int, int, tuple[str, int]]]
    _visited: list[QueuePair]
    _codec: SegmentCodec
    #: The routes of the armed responders' ACKs, for the native wait (``loop_port``).
    _routes: AckRoutes
    _hot: object
    #: Segments of the datagrams in the link's buffer (``UdpPort._rx_batch``).
    _rx_batch: Callable[[int, int, str, int, int, float, bool], None]
    #: Native posting's context (``_nativepostsend.c``), shared by the port's QPs (their
    #: ``poster``), made on the first post that leaves natively.
    _post_ctx: list[Any] | None = None
    #: Native posting's flows, by the identity of the QP's ``remote`` (checked against it).
    _post_flows: dict[int, tuple[PeerAddress, tuple[str, int], dict[int, int], IcrcFlow]]
    _clock: Callable[[], float] | None = None
    _tx_flows: dict[tuple[str, int], IcrcFlow]
    _local: bytes
    port: int
    #: Fails a QP whose datagram the path refused (``UdpPort._too_big``).
    _too_big: Callable[[QueuePair, PeerAddress], None]
    sources: RxSources
    codec: SegmentCodec
    #: Send ``pkts`` in order to ``remote`` (``UdpPort._send_udp``).
    _send_udp: Callable[[list[Packet] | list[Packet | Train], PeerAddress], None]

    def _bind(self, qp: QueuePair, rx: RxFlow, src_ip: str, sport: int) -> None:
        """``qp``'s responder was just armed by a request from ``(src_ip, sport)``: the device
        poll (``poll_armed``) takes that source's next ones (a kernel sender's checked with the
        IPv4 ID it most likely used next, its ``IdentWindow`` followed, counted as solved)."""
        owner = cast(ArmedOwner, qp.native)
        ids = self.sources.idents.get(src_ip) if rx.kernel else None
        owner.bind((src_ip, sport), self._v6, rx.states, rx.icrc, rx, qp, ids, self.counters if ids else None)
        self._armed[qp.qpn] = owner
        remote = qp.remote
        if type(remote) is PeerAddress:
            addr = (remote.ip, remote.port)
            flow = self._tx_flows.get(addr) or self._tx_flow(remote)
            self._routes[qp.qpn] = (addr, self._v6, flow.states, flow)

    def _bind_req(self, qp: QueuePair, rx: RxFlow, src_ip: str, sport: int) -> None:
        """``qp``'s native completer just took an ACK from ``(src_ip, sport)``: the device poll
        takes that source's next ones."""
        owner = cast(ArmedReqOwner, qp.req_native)
        owner.bind((src_ip, sport), self._v6, rx.states, rx.icrc, rx)
        self._armed_req[qp.qpn] = owner

    def _poll_armed(
        self, poll: PollArmed, now: float, max_reads: int
    ) -> tuple[int, tuple[int, int, tuple[str, int], int, int] | None]:
        """The device poll (``poll_armed``): armed responders' WRITEs and completers' ACKs taken
        in C; then, before anything else reaches them, each QP whose completer took ACKs gets its
        log (``QueuePair.acks_taken``)."""
        touched: list[QueuePair] = []
        got = poll(
            self._fd, self.link.view, self._armed, self._active, OURS_STRIKES, max_reads,
            self._armed_req, now, touched,
        )  # fmt: skip
        for qp in touched:
            owner = qp.req_native
            assert owner is not None
            qp.acks_taken(owner.take())
        return got

    def loop_port(self) -> LoopPort | None:
        """This port's part in the native wait (``_nativeloop.c``), or None: its Python pass has
        work (a send backlog, an active QP, a run being read)."""
        if self._backlog or self._active or self._hot is not None:
            return None
        return (
            self._fd, self.link.view, self._armed, self._active, OURS_STRIKES, self._armed_req, [],
            self._routes, self._visited,
        )  # fmt: skip

    def loop_taken(self, taken: int, sent: int, solved: int) -> None:
        """The native wait took ``taken`` datagrams and sent ``sent`` armed ACKs here: counted as
        ``receive``'s armed poll and ``_send_ack`` count them (``solved``: ``icrc_solved`` before)."""
        c, lc = self.counters, self.link.counters
        c.packets_in += taken
        c.icrc_ok += taken - (c.icrc_solved - solved)
        lc.datagrams_in += taken
        c.packets_out += sent
        lc.datagrams_out += sent
        lc.sends += sent

    def loop_handback(
        self,
        touched: list[QueuePair],
        raw: tuple[int, int, tuple[str, int], int, int] | None,
        err: int,
        now: float,
    ) -> None:
        """What the native wait left to this port's Python pass, in ``receive``'s order: the logs of
        the completers that took ACKs, then the read it did not take; a send error of an ACK."""
        for qp in touched:
            owner = qp.req_native
            assert owner is not None
            qp.acks_taken(owner.take())
        if err and err not in WOULD_BLOCK:
            self.link.record_error(OSError(err, os.strerror(err)))
        if raw is not None:
            self._take_raw(raw, now)

    def _take_raw(self, raw: tuple[int, int, tuple[str, int], int, int], now: float) -> None:
        """A native read's answer (``recv_raw``; the datagram in the link's buffer): counted and received."""
        link = self.link
        nbytes, segsize, (src_ip, sport), err, ecn = raw
        if err:
            link.record_error(OSError(err, os.strerror(err)))
            return  # a socket error (counted by the link)
        link.count_read(nbytes, segsize)
        if ecn == CE:
            link.counters.ce_reads += 1
        nsegs = (nbytes + segsize - 1) // segsize if nbytes else 1
        self.counters.packets_in += nsegs
        self._rx_batch(nbytes, segsize, src_ip, sport, 0, now, ecn == CE)

    @property
    def post_clock(self) -> Callable[[], float] | None:
        """The clock of native posting (``_post_now``): the pump's, set by whoever pumps the
        device with it (``SoftDevice.post_with``); None: every post waits for ``transmit``."""
        return self._clock

    @post_clock.setter
    def post_clock(self, clock: Callable[[], float] | None) -> None:
        self._clock = clock
        if self._post_ctx is not None:
            self._post_ctx[2] = clock

    def _poster(self) -> "tuple[PostSend, list[Any]] | None":
        """``QueuePair.poster`` for this port's QPs: ``post_send`` in one native call."""
        post = self._codec.post_send
        if post is None:
            return None
        ctx = self._post_ctx
        if ctx is None:
            ctx = self._post_ctx = [
                self._fd, self._v6, self._clock, PACKET_OVERHEAD, self._active, self._backlog,
                self._visited, self._post_flows, self.counters, self.link.counters, self._posted, POST_TABLE,
            ]  # fmt: skip
        return post, ctx

    def _posted(self, qp: QueuePair, got: int | bytes) -> None:
        """A native post's datagram that did not simply leave: sendmsg's errno (a lost packet,
        as ``UdpLink.send`` counts it), or the datagram a full socket refused (queued, as
        ``_send_udp`` queues)."""
        self.counters.packets_out += 1
        remote = cast(PeerAddress, qp.remote)
        if not isinstance(got, int):
            self._backlog.append(([got], 0, 1, (remote.ip, remote.port)))
            return
        lc = self.link.counters
        lc.datagrams_out += 1
        lc.sends += 1
        if got:
            self.link.record_error(OSError(got, os.strerror(got)))
            if got == errno.EMSGSIZE:
                self._too_big(qp, remote)

    def _post_now(self, qp: QueuePair) -> bool:
        """``qp``'s doorbell rang: when its requester's whole work is one fresh SEND or WRITE of
        at most an MTU (``_nativepost.c``; ``tx_small``'s case), build and send it in one
        native call now, rather than at the next ``transmit``. True if it was taken (its effect
        on the requester is ``tx_small``'s; the deadline heap sees the QP through ``visited``).
        A QP already active has other work, which ``transmit`` keeps in order."""
        clock, post = self.post_clock, self._codec.post_small
        remote = qp.remote
        if clock is None or post is None or qp.qpn in self._active or self._backlog:
            return False
        if type(remote) is not PeerAddress:
            return False
        addr = (remote.ip, remote.port)
        flow = self._tx_flows.get(addr)
        if flow is None:
            flow = self._tx_flow(remote)
        poster = qp.poster
        if poster is None or poster[1] is not self._post_ctx:
            qp.poster = self._poster()  # its next posts: post_send's whole effect in one call
        got = post(self._fd, addr, self._v6, flow.states, flow, qp, clock(), PACKET_OVERHEAD)
        if got is None:
            return False
        self._visited.append(qp)  # its retransmit timer may have started
        if got == 0 and isinstance(got, int):
            self.counters.packets_out += 1
            lc = self.link.counters
            lc.datagrams_out += 1  # as UdpLink.send
            lc.sends += 1
        else:
            self._posted(qp, got)
        return True

    def _send_ack(self, owner: ArmedOwner, qp: QueuePair, now: float) -> bool:
        """Send the ACK ``qp``'s armed responder holds, and the READ responses behind it, in one
        native call (headers, ICRC, send), where ``poll_transmit`` would have sent them from
        ``Responder.out``; True if all left. A full socket, a backlog or responses that must wait
        for their pace leave them held, and the generic path takes them (``disarm``, then the
        backlog keeps the order)."""
        remote = qp.remote
        if type(remote) is not PeerAddress or self._backlog:
            return False
        addr = (remote.ip, remote.port)
        flow = self._tx_flows.get(addr)
        if flow is None:
            flow = self._tx_flow(remote)
        if owner.replying:
            if not qp.reply_unpaced():
                return False
            err, n = owner.send_reply(self._fd, addr, self._v6, flow.states, flow)
            if n:
                qp.reply_sent(n, now)
            left = not owner.pending
        else:
            err = owner.send_ack(self._fd, addr, self._v6, flow.states, flow)
            n = int(err >= 0 and err not in WOULD_BLOCK)
            left = bool(n)
        link = self.link
        lc = link.counters
        self.counters.packets_out += n
        lc.datagrams_out += n  # as UdpLink.send: a send error is a lost packet
        lc.sends += n
        if err > 0 and err not in WOULD_BLOCK:
            link.record_error(OSError(err, os.strerror(err)))
        return left

    def _tx_flow(self, remote: PeerAddress) -> IcrcFlow:
        """The ICRC flow of sends to ``remote``, kept for the next (at most 1,024 remotes)."""
        dst = addr_bytes(remote.ip)
        if self._v6:
            flow = IcrcFlow.ipv6(self._local, dst, self.port, remote.port)
        else:
            flow = IcrcFlow.ipv4(self._local, dst, self.port, remote.port)
        if len(self._tx_flows) >= 1024:
            self._tx_flows.clear()
            self._post_flows.clear()
        self._tx_flows[(remote.ip, remote.port)] = flow
        self._post_flows[id(remote)] = (remote, (remote.ip, remote.port), flow.states, flow)
        return flow

    def _hold_ack(self, acks: HeldAcks, qp: QueuePair, ack: "Packet | Train | ArmedOwner") -> bool:
        """Hold ``qp``'s ACK (a Packet, or the one its armed responder holds) until the end of
        the transmit pass (``_send_acks``). The caller has checked that it is all ``qp`` sends
        in this pass, so no response or NAK of ``qp`` overtakes it or is overtaken by it.
        False: not an ACK, or it must go now (a backlog keeps the order)."""
        remote = qp.remote
        if type(remote) is not PeerAddress or self._backlog:
            return False
        if type(ack) is Packet:
            if ack.opcode != Opcode.ACKNOWLEDGE:
                return False
            acks.setdefault(remote, []).append(ack)
        elif type(ack) is Train or cast(ArmedOwner, ack).replying:
            return False  # READ responses behind it: ``_send_ack`` sends them in order
        else:
            acks.setdefault(remote, []).append(qp)
        return True

    def _send_acks(self, acks: HeldAcks, now: float) -> None:
        """Send the ACKs a transmit pass held, before it returns: each QP owes its peer its own
        ACK, and those of several QPs to one peer leave as GSO batches (so they arrive as GRO
        reads), not one system call each. A single armed ACK keeps its one native call."""
        for remote, held in acks.items():
            armed = [h for h in held if isinstance(h, QueuePair)]
            if len(armed) > 1 and self.codec.send_acks is not None:
                self._send_armed_acks(self.codec.send_acks, armed, remote, now)
            else:
                for qp in armed:
                    if not self._send_ack(cast(ArmedOwner, qp.native), qp, now):
                        self._send_generic(qp, remote, now)
            if len(armed) < len(held):
                self._send_udp([h for h in held if not isinstance(h, QueuePair)], remote)

    def _send_armed_acks(
        self, send: SendAcks, armed: list[QueuePair], remote: PeerAddress, now: float
    ) -> None:
        addr = (remote.ip, remote.port)
        flow = self._tx_flows.get(addr)
        if flow is None:
            flow = self._tx_flow(remote)
        link = self.link
        owners = [cast(ArmedOwner, qp.native) for qp in armed]
        sent, sends, err = send(self._fd, addr, self._v6, link.gso, flow.states, flow, owners)
        self.counters.packets_out += sent
        lc = link.counters
        lc.datagrams_out += sent  # as UdpLink.send: a send error is a lost packet
        lc.sends += sends
        if link.gso:
            lc.gso_sends += sends
        if err in WOULD_BLOCK:
            lc.send_would_block += 1
        elif link.gso and err in (errno.EIO, errno.EINVAL, errno.EOPNOTSUPP):
            link.gso = False  # as UdpLink.send_gso: no GSO on this path, for good
        elif err:
            link.record_error(OSError(err, os.strerror(err)))
        for qp, owner in zip(armed, owners, strict=True):
            if owner.pending:  # refused: the generic path takes it and queues it, in order
                self._send_generic(qp, remote, now)

    def _send_generic(self, qp: QueuePair, remote: PeerAddress, now: float) -> None:
        """The ACK ``qp``'s armed responder still holds, the generic way (``disarm``; a full
        socket queues it in the backlog, in order)."""
        before = qp.stats.packets_out
        pkts = qp.poll_transmit_trains(now)
        self.counters.packets_out += qp.stats.packets_out - before
        self._send_udp(pkts, remote)
