"""A soft RDMA device: one local address, one port (RoCE-UDP or TCP), many QPs.

The device is the short pump loop around the sans-IO engine. ``progress(now)``
never blocks: the port drains its link until it would block and feeds each
packet to the QP its BTH names (:mod:`rdmakit.transport.roce_udp`,
:mod:`rdmakit.transport.tcp_port`), due timers fire, and the port sends what
the QPs produced. Connection set-up is :mod:`rdmakit.transport.connect`.
"""

import ipaddress
import random
import threading
import time
from collections.abc import Callable, Iterable

from rdmakit.engine import (
    CompletionQueue,
    EngineError,
    ProtectionDomain,
    QpCaps,
    QpState,
    QueuePair,
    SharedReceiveQueue,
)
from rdmakit.engine.cm import CmEndpoint
from rdmakit.wire import ROCE_UDP_PORT, Payload

from .codec import LoopPort
from .deadlines import DeadlineHeap
from .gsi import Gsi
from .netmtu import port_mtu
from .port import DeviceCounters, Port, TransportName
from .roce_udp import UdpPort
from .tcp import TcpLink
from .tcp_limits import Route
from .tcp_port import TCP_MTU, TcpPort
from .udp import UdpLink

#: Idle ``progress`` calls between full scans of the QPs' deadlines and sweeps of the
#: port's active set: the safety net for QPs driven directly by their owner (a QP the
#: device touches has its deadline noted anyway, see ``deadlines``).
_DEADLINE_RESCAN = 64


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
        self.gid = gid_of(self.ip)
        self.counters = DeviceCounters()
        #: Held by whoever touches the device's state from several threads (its pump, its QPs'
        #: work requests and completions, memory registration): the engine is not thread-safe.
        self.lock = threading.RLock()
        self._qps: dict[int, QueuePair] = {}
        #: The RoCE-UDP port and its link, or the TCP port and its link: one of the two.
        self.udp_port: UdpPort | None = None
        self.tcp_port: TcpPort | None = None
        self.udp: UdpLink | None = None
        self.tcp: TcpLink | None = None
        self._port: Port
        if transport == "roce-udp":
            self._port = self.udp_port = UdpPort(
                self.ip, port, self._qps, self.counters, gso=gso, verify_icrc=verify_icrc, bulk=bulk
            )
            self.udp = self.udp_port.link
        elif transport == "tcp":
            self._port = self.tcp_port = TcpPort(self.ip, port, self._qps, self.counters, bulk=bulk)
            self.tcp = self.tcp_port.link
        else:
            raise ValueError(f"unknown transport {transport!r}")
        self.port = self._port.port
        #: The active MTU: on UDP the largest IB MTU the interface holding ``ip`` carries
        #: (``netmtu.port_mtu``, as rxe's ``rxe_set_mtu()``); on TCP any frame size.
        self.active_mtu = TCP_MTU if transport == "tcp" else port_mtu(self.ip)
        self.name = f"soft-{'udp' if transport == 'roce-udp' else 'tcp'}:{self.ip}"
        self.pd = ProtectionDomain(self.rng)
        #: The QPs' deadlines (``deadlines``): a poll looks only at the QPs whose timer is due.
        self._timers = DeadlineHeap()
        #: Earliest deadline (QPs, port, CM) as of the last busy ``progress``.
        self._deadline: float | None = None
        self._idle = 0
        self.closed = False
        #: QP1 and its connection manager, once `attach_cm` made them (RoCE-UDP only).
        self.gsi: Gsi | None = None

    # -- resources -----------------------------------------------------------------
    @property
    def max_mtu(self) -> int:
        return self.active_mtu

    def create_qp(
        self,
        *,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        caps: QpCaps | None = None,
        pd: ProtectionDomain | None = None,
        srq: SharedReceiveQueue | None = None,
    ) -> QueuePair:
        if self.closed:
            raise EngineError("BAD_STATE", "device is closed")
        qpn = 0
        while qpn < 2 or qpn in self._qps:  # QPN 0 and 1 are special (IBTA §3.5.3)
            qpn = self.rng.getrandbits(24)
        if caps is None:
            tcp = self.transport == "tcp"
            caps = QpCaps(large_mtu=tcp, congestion_control=not tcp)  # TCP controls its own
        qp = QueuePair(
            pd or self.pd, qpn=qpn, send_cq=send_cq, recv_cq=recv_cq, caps=caps, rng=self.rng, srq=srq
        )
        self._qps[qpn] = qp
        qp.doorbell = self._port.wake  # the port's transmit visits only QPs with work
        return qp

    def destroy_qp(self, qp: QueuePair) -> None:
        if qp.srq is not None:
            qp.srq.detach(qp)
        if self._qps.get(qp.qpn) is qp:
            del self._qps[qp.qpn]
            self._port.forget(qp)
            self._timers.forget(qp)

    def reset_qp(self, qp: QueuePair) -> None:
        """Back to RESET (IBTA §10.3.1); on TCP the QP's secret is void, as is its descriptor."""
        qp.modify(QpState.RESET)
        if self._qps.get(qp.qpn) is qp:
            self._port.forget(qp)
            self._timers.forget(qp)

    # -- TCP: who may reach a QP, and where its packets go (rdmakit.transport.tcp) ----
    def tcp_secret(self, qp: QueuePair, mtu: int) -> bytes:
        """The secret ``qp``'s connection descriptor carries: it opens a stream to ``qp``."""
        if self.tcp_port is None:
            raise EngineError("INVALID_VALUE", "only a tcp device issues connection secrets")
        return self.tcp_port.secret(qp, mtu)

    def connect_tcp(self, qp: QueuePair, route: Route) -> None:
        """``qp`` is connected to the peer QP ``route`` names: send over it, and let only
        that peer device use ``qp``'s own secret."""
        assert self.tcp_port is not None
        self.tcp_port.connect(qp, route)

    def transport_fault(self, qpn: int) -> str | None:
        """Why the transport failed QP ``qpn``, when it did (a refused or reset TCP stream, a
        datagram too big for the path)."""
        return self._port.fault(qpn)

    def attach_cm(self, cm: CmEndpoint) -> Gsi:
        """Give the device a QP1 served by `cm` (IBTA §13.5: the GSI); `progress` drives it."""
        if self.udp_port is None:
            raise EngineError("INVALID_VALUE", "the connection manager needs a RoCE-UDP device (QP1 is UD)")
        if self.gsi is not None:
            raise EngineError("BAD_STATE", "the device's QP1 already has a connection manager")
        self.gsi = self.udp_port.gsi = Gsi(self.udp_port.link, self.ip, cm)
        return self.gsi

    @property
    def qps(self) -> Iterable[QueuePair]:
        return self._qps.values()

    def post_with(self, clock: Callable[[], float] | None) -> None:
        """Send a QP's one fresh SEND or WRITE in the ``post_send`` that queued it, at ``clock()``
        (the pump's own clock, e.g. its ``Driver``'s), natively (``UdpPort._post_now``); None (the
        default): every post waits for ``progress``."""
        if self.udp_port is not None:
            self.udp_port.post_clock = clock

    def fileno(self) -> int:
        return self._port.fileno()

    def loop_port(self) -> LoopPort | None:
        """The device's part in the native wait (``Driver.run_until``, ``_nativeloop.c``), or None:
        a TCP device, a closed one, or a pass with work in Python (``UdpPort.loop_port``)."""
        if self.closed or self.udp_port is None:
            return None
        return self.udp_port.loop_port()

    def close(self, now: float | None = None) -> None:
        """Close the device; its connected CM connections send their DREQ first (``now``: the
        pump's clock, ``time.monotonic()`` by default)."""
        if self.closed:
            return
        self.closed = True
        if self.gsi is not None:
            self.gsi.close(time.monotonic() if now is None else now)
        for qp in list(self._qps.values()):
            if qp.state is not QpState.RESET:
                qp.modify(QpState.ERR)
        self._port.close()

    def __enter__(self) -> "SoftDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def receive_datagram(self, data: Payload, src: tuple[str, int], now: float, segsize: int = 0) -> None:
        """Take ``data`` as if a read of the UDP socket had returned it from ``src``
        (``UdpPort.receive_datagram``: tests and benchmarks feed crafted input)."""
        if self.udp_port is None:
            raise EngineError("BAD_STATE", "receive_datagram: not a UDP device")
        self.udp_port.receive_datagram(data, src, now, segsize)

    # -- the pump --------------------------------------------------------------------
    def progress(self, now: float, readable: bool | None = None, received: bool = False) -> bool:
        """Do all the work that is ready, without blocking. True if anything happened.

        ``readable`` is what the caller already knows about the link's socket
        (a driver that polled it); None makes the device look itself.
        ``received``: the native wait already received for this pass (``loop_port``).
        """
        if self.closed:
            return False
        port = self._port
        busy = port.receive(now, readable) or received
        d = self._deadline
        due = d is not None and d <= now
        if due:
            busy = True
            for qp in self._timers.due(now):
                t = qp.get_timer()
                if t is not None and t <= now:
                    qp.handle_timer(now)
                    port.wake(qp)
                else:
                    self._timers.note(qp)  # its deadline moved later since it was noted
        gsi = self.gsi
        if gsi is not None:
            if due:  # the CM's deadlines are in the cached earliest one too
                gsi.handle_timer(now)
            if gsi.transmit(now):
                busy = True
        if port.transmit(now):
            busy = True
        if self._note_visited() or busy:
            self._deadline = self._earliest()
        if busy:
            self._idle = 0
        else:
            self._idle += 1
            if self._idle >= _DEADLINE_RESCAN:
                # Deadlines only move inside progress(), but a QP driven
                # directly by its owner must not be missed for long.
                self._idle = 0
                self._timers.rebuild(self._qps.values())
                self._deadline = self._earliest()
                port.sweep()
        return busy

    def _note_visited(self) -> bool:
        """Note the deadlines of the QPs the port visited (theirs may have moved); True if any."""
        visited = self._port.visited()
        note = self._timers.note
        for qp in visited:
            note(qp)
        return bool(visited)

    def _earliest(self) -> float | None:
        """The earliest deadline of the QPs (as noted), the port and the CM."""
        timers = self._timers
        best = self._port.deadline()
        if self.gsi is not None and (t := self.gsi.deadline()) is not None and (best is None or t < best):
            best = t
        t = timers.earliest()
        if t is not None and (best is None or t < best):
            best = t
        return best

    def next_deadline(self) -> float | None:
        self._note_visited()
        self._deadline = best = self._earliest()
        return best

    def deadline_hint(self) -> float | None:
        """The earliest deadline as of the last busy ``progress`` (cheap; may be stale-early)."""
        return self._deadline

    def wants_write(self) -> bool:
        """True while sends wait for socket space (then wait for writability)."""
        return self._port.wants_write()
