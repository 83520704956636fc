"""``rdma_cm`` over a soft RoCE-UDP device: connect by IP address and port.

The layer of librdmacm and the kernel's ``cma.c`` over the IB CM
(``rdmakit.engine.cm``), for RC queue pairs in the TCP port space:

- a listener on port P takes REQs for service ID ``0x0106 << 16 | P``;
- a REQ's private data starts with the 36-byte ``cma_hdr`` (source and
  destination address, source port), then at most 56 bytes of the user's;
  a REP's private data is the user's alone (at most 196 bytes);
- the ordering of ``cma.c``: the passive side moves its QP to RTR and RTS
  before sending the REP and reports ESTABLISHED on the RTU; the active side,
  on the REP, moves its QP to RTR then RTS, then sends the RTU;
- each side's "starting PSN" is the PSN it expects to receive; the peer
  sends from it (``cm.c``: ``rq_psn`` from its own, ``sq_psn`` from the
  peer's);
- a REQ's initiator depth bounds the passive side's ``max_dest_rd_atomic``
  and its responder resources the passive side's ``max_rd_atomic``.

`RdmaCm.poll_event` returns `CmaEvent` s named as ``enum rdma_cm_event_type``
(CONNECT_REQUEST, ESTABLISHED, REJECTED, UNREACHABLE, DISCONNECTED), after
doing the QP transitions each implies. A REQ whose ``cma_hdr`` does not name
this device's address is refused (REJ invalid service ID), as is one whose
header is malformed. Ports: REQs go to the peer's RoCE port, which is this
device's own (4791 on a real network).
"""

import ipaddress
import random
import socket
from collections import deque
from dataclasses import dataclass
from enum import Enum

from rdmakit.engine import EngineError, QpState, QueuePair
from rdmakit.engine.cm import CmConnParams, CmEndpoint, CmEventKind, CmState
from rdmakit.wire import ROCE_UDP_PORT, WireError
from rdmakit.wire.cm import (
    CMA_HDR_LEN,
    MAX_ACCEPT_PRIVATE,
    MAX_CONNECT_PRIVATE,
    CmaHeader,
    CmMad,
    PortSpace,
    RejReason,
    service_id,
)

from .connect import ConnectOptions, Endpoint, connect_qp, init_qp
from .device import SoftDevice, gid_of
from .netmtu import route_mtu

__all__ = ["MAX_ACCEPT_PRIVATE", "MAX_CONNECT_PRIVATE", "CmaEvent", "CmaEventKind", "RdmaCm"]

_MTUS = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
_MTU_CODE = {v: k for k, v in _MTUS.items()}


class CmaEventKind(Enum):
    CONNECT_REQUEST = "CONNECT_REQUEST"
    ESTABLISHED = "ESTABLISHED"
    REJECTED = "REJECTED"
    UNREACHABLE = "UNREACHABLE"
    DISCONNECTED = "DISCONNECTED"


@dataclass(frozen=True, slots=True)
class CmaEvent:
    kind: CmaEventKind
    conn: int  # the connection's handle (its local communication ID)
    peer_ip: str
    peer_port: int = 0  # CONNECT_REQUEST: the source port in the cma_hdr
    listen_port: int = 0  # CONNECT_REQUEST: the port the REQ asked for
    private_data: bytes = b""  # the user's: after the cma_hdr of a REQ
    reason: int | None = None  # REJECTED: the REJ reason (8: no listener)
    peer_guid: int = 0  # CONNECT_REQUEST: the requester's CA GUID (the REQ's Local CA GUID)


@dataclass(slots=True)
class _Conn:
    qp: QueuePair | None
    peer_ip: str
    psn: int  # our starting PSN: what we expect to receive
    req: CmMad | None = None  # passive: the REQ
    private: bytes = b""  # active: the REP's private data, for ESTABLISHED
    options: ConnectOptions | None = None  # active: the QP's RTR/RTS attributes
    mtu: int = 1024  # active: the path MTU the REQ proposed


def route_source(dst: str) -> str:
    """The local address the kernel routes `dst` from (``rdma_resolve_addr`` without ``-I``).

    A UDP socket is connected, which sends nothing, and asked for its name.
    """
    ip = ipaddress.ip_address(dst)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((str(ip), ROCE_UDP_PORT))
        except OSError as e:
            raise EngineError("INVALID_VALUE", f"no route to {ip}: {e.strerror or e}") from None
        return str(s.getsockname()[0])


def _gid(ip: str) -> int:
    return int(ipaddress.IPv6Address(gid_of(ip)))


class RdmaCm:
    """Connections by address on one soft device (its QP1 and CM endpoint)."""

    def __init__(
        self,
        dev: SoftDevice,
        *,
        rng: random.Random | None = None,
        timeout_exponent: int = 18,
        max_retries: int = 8,
        timewait: float = 1.0,
        options: ConnectOptions | None = None,
        mtu: int | None = None,
    ) -> None:
        """`mtu`: the path MTU a REQ proposes (both sides use the REQ's, as ``cma.c`` does);
        the device's largest by default, 1024 for a peer behind a 1500-byte link."""
        self.dev = dev
        self.mtu = min(mtu or dev.max_mtu, dev.max_mtu)
        if self.mtu not in _MTU_CODE:
            raise EngineError("INVALID_VALUE", f"path MTU {mtu} is not an IB MTU (256 … 4096)")
        self.rng = rng if rng is not None else random.SystemRandom()
        self.options = options or ConnectOptions()
        self.cm = CmEndpoint(
            rng=self.rng,
            ca_guid=self.rng.getrandbits(64),
            timeout_exponent=timeout_exponent,
            max_retries=max_retries,
            timewait=timewait,
        )
        dev.attach_cm(self.cm)
        self._conns: dict[int, _Conn] = {}
        self._events: deque[CmaEvent] = deque()
        self._ports: set[int] = set()
        self._awaiting_rtu: dict[int, int] = {}  # passive handle -> its QP's packets_in at accept

    # -- listening --------------------------------------------------------------------------------

    def listen(self, port: int) -> None:
        """Take connection requests for `port` (``rdma_listen``)."""
        self.cm.listen(service_id(PortSpace.TCP, port))
        self._ports.add(port)

    def unlisten(self, port: int) -> None:
        self.cm.unlisten(service_id(PortSpace.TCP, port))
        self._ports.discard(port)

    # -- the active side --------------------------------------------------------------------------

    def _params(
        self, qp: QueuePair, psn: int, peer_ip: str, private: bytes, mtu: int, o: ConnectOptions
    ) -> CmConnParams:
        return CmConnParams(
            qpn=qp.qpn,
            starting_psn=psn,
            responder_resources=min(o.max_dest_rd_atomic, 255),
            initiator_depth=min(o.max_rd_atomic, 255),
            retry_count=o.retry_cnt,
            rnr_retry_count=o.rnr_retry,
            path_mtu=_MTU_CODE.get(mtu, 3),
            local_ack_timeout=o.timeout if o.timeout is not None else 16,
            local_gid=_gid(self.dev.ip),
            remote_gid=_gid(peer_ip),
            private_data=private,
        )

    def connect(
        self,
        ip: str,
        port: int,
        qp: QueuePair,
        now: float,
        *,
        private_data: bytes = b"",
        options: ConnectOptions | None = None,
    ) -> int:
        """Send a REQ for `ip`:`port` (``rdma_connect``); `qp` is in RESET or INIT. Returns the handle.

        `options` are `qp`'s RTR/RTS attributes (the device's by default); the REQ's path MTU is
        the largest that fits the route to `ip` (``netmtu.route_mtu``, as ``cma.c`` asks
        ``iboe_get_mtu``), at most the `RdmaCm`'s and the device's."""
        if len(private_data) > MAX_CONNECT_PRIVATE:
            raise EngineError("INVALID_VALUE", f"connect private data is at most {MAX_CONNECT_PRIVATE} bytes")
        peer_ip = str(ipaddress.ip_address(ip))
        opts = options or self.options
        if qp.state is QpState.RESET:
            init_qp(qp, opts.access)
        hdr = CmaHeader(
            ipaddress.ip_address(self.dev.ip), ipaddress.ip_address(peer_ip), self.rng.randrange(32768, 61000)
        ).encode()
        psn = self.rng.getrandbits(24)
        mtu = route_mtu(peer_ip, min(self.mtu, self.dev.max_mtu), self.dev.ip)
        params = self._params(qp, psn, peer_ip, hdr + private_data, mtu, opts)
        handle = self.cm.connect(peer_ip, service_id(PortSpace.TCP, port), params, now)
        self._conns[handle] = _Conn(qp, peer_ip, psn, options=opts, mtu=mtu)
        return handle

    # -- the passive side -------------------------------------------------------------------------

    def accept(
        self,
        conn: int,
        qp: QueuePair,
        now: float,
        *,
        private_data: bytes = b"",
        options: ConnectOptions | None = None,
    ) -> None:
        """Answer a CONNECT_REQUEST (``rdma_accept``): `qp` goes to RTS, then the REP leaves.

        `options` are `qp`'s RTR/RTS attributes (the device's by default), bounded by the REQ's."""
        c = self._conns.get(conn)
        if c is None or c.req is None or c.qp is not None:
            raise EngineError("INVALID_VALUE", f"connection {conn:#x} has no pending request")
        if len(private_data) > MAX_ACCEPT_PRIVATE:
            raise EngineError("INVALID_VALUE", f"accept private data is at most {MAX_ACCEPT_PRIVATE} bytes")
        req = c.req
        mtu = min(_MTUS.get(req["path_mtu"], 1024), self.dev.max_mtu)  # the REQ's path MTU
        o = options or self.options
        opts = ConnectOptions(
            access=o.access,
            max_rd_atomic=max(1, min(o.max_rd_atomic, req["responder_resources"] or 1)),
            max_dest_rd_atomic=max(1, min(o.max_dest_rd_atomic, req["initiator_depth"] or 1)),
            min_rnr_timer=o.min_rnr_timer,
            timeout=o.timeout,
            retry_cnt=min(o.retry_cnt, req["retry_count"]),
            rnr_retry=req["rnr_retry_count"],
        )
        self._connect_qp(
            qp, c.peer_ip, req["local_qpn"], sq_psn=req["starting_psn"], rq_psn=c.psn, mtu=mtu, opts=opts
        )
        c.qp = qp
        params = self._params(qp, c.psn, c.peer_ip, private_data, mtu, opts)
        params.responder_resources, params.initiator_depth = opts.max_dest_rd_atomic, opts.max_rd_atomic
        self.cm.accept(conn, params, now)
        self._awaiting_rtu[conn] = qp.stats.packets_in

    def _check_comm_est(self) -> None:
        """A passive QP that received a packet before the RTU is connected (IBTA §12.9.7.2,
        ``IB_EVENT_COMM_EST``): the RTU was lost, or is late."""
        for conn, seen in list(self._awaiting_rtu.items()):
            c = self._conns.get(conn)
            if c is None or c.qp is None or self.cm.state(conn) is not CmState.REP_SENT:
                del self._awaiting_rtu[conn]
            elif c.qp.stats.packets_in > seen:
                del self._awaiting_rtu[conn]
                self.cm.establish(conn)

    def reject(self, conn: int, now: float, *, private_data: bytes = b"") -> None:
        """Refuse a CONNECT_REQUEST (``rdma_reject``: REJ reason 28, consumer defined)."""
        self.cm.reject(conn, now, private_data=private_data)
        self._conns.pop(conn, None)

    def disconnect(self, conn: int, now: float) -> None:
        """Send a DREQ (``rdma_disconnect``); the QP goes to ERROR at once."""
        c = self._conns.get(conn)
        if c is not None and c.qp is not None and c.qp.state is not QpState.RESET:
            c.qp.modify(QpState.ERR)
        self.cm.disconnect(conn, now)

    def _connect_qp(
        self,
        qp: QueuePair,
        ip: str,
        dest_qpn: int,
        *,
        sq_psn: int,
        rq_psn: int,
        mtu: int,
        opts: ConnectOptions,
    ) -> None:
        # connect_qp's endpoint PSN is the one the peer starts sending from: our receive PSN here.
        peer = Endpoint(
            transport="roce-udp", gid="", ip=ip, port=self.dev.port, qpn=dest_qpn, psn=rq_psn, mtu=mtu
        )
        connect_qp(self.dev, qp, sq_psn, peer, opts)

    # -- events -----------------------------------------------------------------------------------

    def poll_event(self, now: float) -> CmaEvent | None:
        """The next connection event, after the QP transitions it implies."""
        if self._awaiting_rtu:
            self._check_comm_est()
        while not self._events:
            ev = self.cm.next_event()
            if ev is None:
                return None
            self._handle(ev.kind, ev.comm_id, str(ev.peer), ev.mad, ev.reason, now)
        return self._events.popleft()

    def _handle(
        self, kind: CmEventKind, handle: int, peer: str, mad: CmMad | None, reason: int | None, now: float
    ) -> None:
        c = self._conns.get(handle)
        emit = self._events.append
        if kind is CmEventKind.REQ_RECEIVED:
            assert mad is not None
            self._on_request(handle, peer, mad, now)
        elif kind is CmEventKind.REP_RECEIVED:
            try:
                if mad is None or c is None or c.qp is None:
                    raise EngineError("BAD_STATE", "a REP for a connection without a QP")
                self._connect_qp(
                    c.qp, peer, mad["local_qpn"], sq_psn=mad["starting_psn"], rq_psn=c.psn, mtu=c.mtu,
                    opts=c.options or self.options,
                )  # fmt: skip
            except EngineError:
                self.cm.reject(handle, now, reason=RejReason.NO_QP)
                self._conns.pop(handle, None)
                emit(CmaEvent(CmaEventKind.UNREACHABLE, handle, peer))
                return
            c.private = mad.private_data  # rdma_cm hands the REP's private data over with ESTABLISHED
            self.cm.send_rtu(handle, now)  # the endpoint reports ESTABLISHED next
        elif kind is CmEventKind.ESTABLISHED:
            emit(CmaEvent(CmaEventKind.ESTABLISHED, handle, peer, private_data=c.private if c else b""))
        elif kind is CmEventKind.REJECTED:
            self._conns.pop(handle, None)
            emit(CmaEvent(CmaEventKind.REJECTED, handle, peer, private_data=_private(mad), reason=reason))
        elif kind is CmEventKind.TIMEOUT:
            self._conns.pop(handle, None)
            emit(CmaEvent(CmaEventKind.UNREACHABLE, handle, peer, reason=reason))
        elif kind is CmEventKind.DISCONNECTED:
            if c is not None and c.qp is not None and c.qp.state not in (QpState.RESET, QpState.ERR):
                c.qp.modify(QpState.ERR)
            self._conns.pop(handle, None)
            emit(CmaEvent(CmaEventKind.DISCONNECTED, handle, peer))

    def _on_request(self, handle: int, peer: str, req: CmMad, now: float) -> None:
        if self.cm.state(handle) not in (CmState.REQ_RCVD, CmState.MRA_REQ_SENT):
            return  # expired before anyone looked: the requester has given up
        try:
            hdr = CmaHeader.decode(req.private_data)
        except WireError:
            self.cm.reject(handle, now, reason=RejReason.INVALID_SERVICE_ID)
            return
        if str(hdr.dst) != self.dev.ip or str(hdr.src) != peer:
            self.cm.reject(handle, now, reason=RejReason.INVALID_SERVICE_ID)
            return
        self._conns[handle] = _Conn(None, peer, self.rng.getrandbits(24), req)
        self._events.append(
            CmaEvent(
                CmaEventKind.CONNECT_REQUEST,
                handle,
                peer,
                peer_port=hdr.src_port,
                listen_port=req["service_id"] & 0xFFFF,
                private_data=req.private_data[CMA_HDR_LEN:],
                peer_guid=req["local_ca_guid"],
            )
        )

    def deadline(self) -> float | None:
        return self.cm.get_timer()


def _private(mad: CmMad | None) -> bytes:
    return mad.private_data if mad is not None else b""
