"""The UDP port's part in armed responders and requesters' native completers (``docs/architecture.md``,
"Who owns a QP's state").

``UdpPort`` binds a responder that ``take_small`` just armed to the source of
the request that armed it (``_bind``), so that its device poll
(``poll_armed``) executes that source's next WRITEs natively, and sends the
ACK an armed responder holds in one native call where ``poll_transmit``
would have sent it (``_send_ack``).
"""

import errno
import os
from collections.abc import Callable
from typing import cast

from rdmakit.engine.congestion import PACKET_OVERHEAD
from rdmakit.engine.qp import QueuePair
from rdmakit.wire import IcrcFlow, Payload

from .codec import ArmedOwner, ArmedReqOwner, PollArmed, SegmentCodec
from .port import DeviceCounters, PeerAddress
from .roce_sources import OURS_STRIKES, RxFlow, RxSources
from .udp import WOULD_BLOCK, UdpLink


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
    #: The clock of native posting (``_post_now``): the pump's, set by whoever pumps the device
    #: with it (``SoftDevice.post_with``); None: every post waits for ``transmit``.
    post_clock: Callable[[], float] | None = None
    _tx_flows: dict[tuple[str, int], IcrcFlow]
    #: The ICRC flow of sends to ``remote`` (``UdpPort._tx_flow``).
    _tx_flow: Callable[[PeerAddress], IcrcFlow]
    #: Fails a QP whose datagram the path refused (``UdpPort._too_big``).
    _too_big: Callable[[QueuePair, PeerAddress], None]
    sources: RxSources

    def _bind(self, qp: QueuePair, rx: RxFlow, src_ip: str, sport: int) -> None:
        """``qp``'s responder was just armed by a request from ``(src_ip, sport)``: the device
        poll (``poll_armed``) takes that source's next ones (a kernel sender's checked with the
        IPv4 ID it most likely used next, its ``IdentWindow`` followed, counted as solved)."""
        owner = cast(ArmedOwner, qp.native)
        ids = self.sources.idents.get(src_ip) if rx.kernel else None
        owner.bind((src_ip, sport), self._v6, rx.states, rx.icrc, rx, qp, ids, self.counters if ids else None)
        self._armed[qp.qpn] = owner

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
        got = post(self._fd, addr, self._v6, flow.states, flow, qp, clock(), PACKET_OVERHEAD)
        if got is None:
            return False
        self.counters.packets_out += 1
        self._visited.append(qp)  # its retransmit timer may have started
        if not isinstance(got, int):  # the socket is full: queued, as _send_udp queues
            self._backlog.append(([got], 0, 1, addr))
            return True
        lc = self.link.counters
        lc.datagrams_out += 1  # as UdpLink.send: a send error is a lost packet
        lc.sends += 1
        if got:
            self.link.record_error(OSError(got, os.strerror(got)))
            if got == errno.EMSGSIZE:
                self._too_big(qp, remote)
        return True

    def _send_ack(self, owner: ArmedOwner, qp: QueuePair) -> bool:
        """Send the ACK ``qp``'s armed responder holds, in one native call (headers, ICRC,
        send), where ``poll_transmit`` would have sent it from ``Responder.out``; True if
        it left. A full socket or a backlog leaves it held, and the generic path takes it
        (``disarm``, then the backlog keeps the order)."""
        remote = qp.remote
        if type(remote) is not PeerAddress or self._backlog:
            return False
        addr = (remote.ip, remote.port)
        flow = self._tx_flows.get(addr)
        if flow is None:
            flow = self._tx_flow(remote)
        link = self.link
        err = owner.send_ack(self._fd, addr, self._v6, flow.states, flow)
        if err < 0 or err in WOULD_BLOCK:
            return False
        self.counters.packets_out += 1
        lc = link.counters
        lc.datagrams_out += 1  # as UdpLink.send: a send error is a lost packet
        lc.sends += 1
        if err:
            link.record_error(OSError(err, os.strerror(err)))
        return True
