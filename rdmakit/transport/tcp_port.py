"""A soft device's TCP port: RC packets framed on the TCP link's streams.

Who may reach a QP and where its packets go are the link's business
(:mod:`rdmakit.transport.tcp`); the port binds the QPs to it: each connected
QP sends over its route, as much as the route's stream has room for, and
what the streams deliver goes to the QP it names, from its connected peer
only. Large WRITE payloads may be read straight into the target memory
(``bulk``, ``QueuePair.rx_place``).
"""

from rdmakit.engine import QpState, QueuePair
from rdmakit.wire import BTH_LEN, Opcode, Packet, WireError, decode, max_frame_body

from .port import DeviceCounters, PeerAddress
from .tcp import TcpLink
from .tcp_limits import Placed, Route

#: Largest path MTU the TCP transport negotiates (frames may exceed RoCE MTUs).
TCP_MTU = 1 << 20
#: Header length (BTH and RETH) of the WRITE requests whose payload the TCP reader may
#: receive straight into place (``QueuePair.rx_place``).
_WRITE_HEADER_LEN = {
    int(Opcode.RDMA_WRITE_FIRST): BTH_LEN + 16,
    int(Opcode.RDMA_WRITE_ONLY): BTH_LEN + 16,
    int(Opcode.RDMA_WRITE_MIDDLE): BTH_LEN,
    int(Opcode.RDMA_WRITE_LAST): BTH_LEN,
}


class TcpPort:
    """The TCP link of a device and the routes of its connected QPs."""

    def __init__(
        self, ip: str, port: int, qps: dict[int, QueuePair], counters: DeviceCounters, *, bulk: bool
    ) -> None:
        self.link = TcpLink(ip, port, counters)
        self.port = self.link.port
        self._qps = qps
        self.counters = counters
        if bulk:
            self.link.place = self._place
        #: Each connected QP's route (see ``connect``) and the longest frame it sends.
        self._routes: dict[int, tuple[Route, int]] = {}
        #: Why the transport failed a QP (its stream's fate), by QPN, for error messages.
        self._faults: dict[int, str] = {}

    # -- who may reach a QP, and where its packets go -----------------------------------
    def secret(self, qp: QueuePair, mtu: int) -> bytes:
        """The secret ``qp``'s connection descriptor carries: it opens a stream to ``qp``."""
        return self.link.issue(qp.qpn, mtu)

    def connect(self, qp: QueuePair, route: Route) -> None:
        """``qp`` is connected to the peer QP ``route`` names: send over it, and let only
        that peer device use ``qp``'s own secret."""
        old = self._routes.get(qp.qpn)
        self._routes[qp.qpn] = (route, max_frame_body(qp.attrs.path_mtu or TCP_MTU))
        if old is not None and old[0] != route:
            self.link.close_route(old[0])
        self.link.bind(qp.qpn, route.ip, route.port)

    def wake(self, qp: QueuePair) -> None:
        """Nothing to note: this port's transmit looks at every QP."""

    def sweep(self) -> None:
        """Nothing to do: this port's transmit looks at every QP."""

    def visited(self) -> list[QueuePair]:
        """Every QP: this port's transmit looks at all of them."""
        return list(self._qps.values())

    def forget(self, qp: QueuePair) -> None:
        self.link.revoke(qp.qpn)
        self._faults.pop(qp.qpn, None)
        old = self._routes.pop(qp.qpn, None)
        if old is not None:
            self.link.close_route(old[0])

    def fault(self, qpn: int) -> str | None:
        return self._faults.get(qpn)

    def deadline(self) -> float | None:
        return self.link.deadline()  # a preface timing out

    def wants_write(self) -> bool:
        return self.link.wants_write()

    def fileno(self) -> int:
        return self.link.fileno()

    def close(self) -> None:
        self.link.close()

    # -- receiving ----------------------------------------------------------------------
    def receive(self, now: float, readable: bool | None = None) -> bool:
        link = self.link
        c = self.counters
        busy = False
        for frames, src_ip, dead in link.poll(now, readable is not False):
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
                qp = self._deliver(pkt, src_ip, now)
                if qp is not None and type(body) is Placed and qp.may_transmit():
                    # The link reads on while large frames keep coming: what the QP
                    # answers (its ACK) leaves now, not after the whole turn.
                    self._send(qp, now)
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

    def _deliver(self, pkt: Packet, src_ip: str, now: float) -> QueuePair | None:
        """Hand ``pkt`` to the QP it names; that QP, or None if it was refused."""
        qp = self._qps.get(pkt.dest_qp)
        c = self.counters
        if qp is None:
            c.unknown_qp += 1
            return None
        remote = qp.remote
        if not isinstance(remote, PeerAddress) or remote.ip != src_ip:
            c.wrong_source += 1  # rxe check_addr(): only the connected peer's address
            return None
        qp.receive(pkt, now)
        return qp

    def _place(self, src_ip: str, head: memoryview, n: int) -> tuple[int, memoryview] | None:
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

    # -- sending ------------------------------------------------------------------------
    def transmit(self, now: float) -> bool:
        """Send what the QPs have, as much as each route's stream has room for (backpressure)."""
        busy = False
        for qp in self._qps.values():
            if qp.may_transmit() and self._send(qp, now):
                busy = True
        return busy

    def _send(self, qp: QueuePair, now: float) -> bool:
        """Send what ``qp`` has, as much as its route's stream has room for; True if any."""
        c = self.counters
        got = self._routes.get(qp.qpn)
        if got is None:
            n = len(qp.poll_transmit(now))  # not connected through this device: nowhere to go
            c.dropped_state += n
            return n > 0
        route, frame = got
        room = self.link.room(route)
        if room <= 0:
            c.tcp_held += 1
            return False
        pkts = qp.poll_transmit(now, max(1, room // frame))
        if not pkts:
            return False
        c.packets_out += len(pkts)
        self.link.send_packets(pkts, route)
        return True
