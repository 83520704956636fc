"""The UDP port's part in armed responders and requesters' native completers (``docs/architecture.md``,
"Who owns a QP's state").

``UdpPort`` binds a responder that ``take_small`` just armed to the source of
the request that armed it (``_bind``), so that its device poll
(``poll_armed``) executes that source's next WRITEs natively, and sends the
ACK an armed responder holds in one native call where ``poll_transmit``
would have sent it (``_send_ack``).
"""

import os
from collections.abc import Callable, Sequence
from typing import cast

from rdmakit.engine.qp import QueuePair
from rdmakit.wire import IcrcFlow

from .codec import ArmedOwner, ArmedReqOwner, PollArmed
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
    _backlog: Sequence[object]
    _tx_flows: dict[tuple[str, int], IcrcFlow]
    #: The ICRC flow of sends to ``remote`` (``UdpPort._tx_flow``).
    _tx_flow: Callable[[PeerAddress], IcrcFlow]
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
