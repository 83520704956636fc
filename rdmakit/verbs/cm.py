"""The verbs backend's connection manager: librdmacm's ``rdma_cm`` for QPs the caller created.

The QPs are `VerbsQP` s of the device (``VerbsDevice.create_qp``), never
``rdma_create_qp`` ones: librdmacm's user-managed-QP flow
(``rdma_connect(3)``, ``rdma_accept(3)``, ``rdma_establish(3)``). Their
number goes in the REQ/REP (``rdma_conn_param.qp_num``) and every transition
takes the attributes the kernel's CM computed (``rdma_init_qp_attr``), as
librdmacm does for its own QPs; the RC timers (`VerbsQP.options`: local ACK
timeout, retry counts, RNR timer) are the QP's own::

    active:  rdma_resolve_addr → ADDR_RESOLVED → rdma_resolve_route → ROUTE_RESOLVED
             → rdma_connect (REQ) → CONNECT_RESPONSE (REP) → QP RTR, RTS → rdma_establish (RTU)
    passive: rdma_listen → CONNECT_REQUEST (REQ) → accept: QP RTR, RTS → rdma_accept (REP)
             → ESTABLISHED (RTU)

Events are read by `VerbsCm.poll` only, from one event channel whose
descriptor (`VerbsCm.fileno`) is non-blocking (``rdma_create_event_channel(3)``);
each is copied out and acknowledged at once, so ``rdma_destroy_id`` never
waits. What a peer sends is checked: private data no longer than the TCP
port space allows (56 bytes in a REQ, 196 in a REP, 148 in a REJ), a REJ
reason within the IBTA's 16 bits. ``rdmakit.verbs.rdmacm`` says why the
calls go to librdmacm through ``ctypes`` rather than ``pyverbs.cmid``.
"""

import ctypes
import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import Any

from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.qp import QPAttr

from rdmakit.engine.cm_events import CmEvent, CmEventKind
from rdmakit.engine.states import QpState
from rdmakit.verbs import rdmacm as C
from rdmakit.verbs.attrs import QpAttrMask, gid_text
from rdmakit.verbs.device import VerbsDevice, VerbsQP
from rdmakit.verbs.errors import ErrorCode, VerbsError, code_for_errno
from rdmakit.verbs.rdmacm import CmEventType as T
from rdmakit.wire.cm import MAX_ACCEPT_PRIVATE, MAX_CONNECT_PRIVATE, MAX_REJECT_PRIVATE

__all__ = ["MAX_ACCEPT_PRIVATE", "MAX_CONNECT_PRIVATE", "VerbsCm"]

log = logging.getLogger("rdmakit.verbs")

LISTEN_BACKLOG = 64
#: How long a DREQ may go unanswered before the connection is dropped anyway (seconds).
DISCONNECT_WAIT = 10.0
_REASONS = {8: "no listener on that port (REJ: invalid service ID)", 28: "the peer rejected the connection"}
_ATTRS = (
    (QpAttrMask.ACCESS_FLAGS, "qp_access_flags"), (QpAttrMask.PKEY_INDEX, "pkey_index"),
    (QpAttrMask.PORT, "port_num"), (QpAttrMask.QKEY, "qkey"), (QpAttrMask.PATH_MTU, "path_mtu"),
    (QpAttrMask.TIMEOUT, "timeout"), (QpAttrMask.RETRY_CNT, "retry_cnt"),
    (QpAttrMask.RNR_RETRY, "rnr_retry"), (QpAttrMask.RQ_PSN, "rq_psn"), (QpAttrMask.SQ_PSN, "sq_psn"),
    (QpAttrMask.MAX_QP_RD_ATOMIC, "max_rd_atomic"), (QpAttrMask.MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic"),
    (QpAttrMask.MIN_RNR_TIMER, "min_rnr_timer"), (QpAttrMask.DEST_QPN, "dest_qp_num"),
)  # fmt: skip
_KNOWN = QpAttrMask.STATE | QpAttrMask.AV
for _bit, _ in _ATTRS:
    _KNOWN |= _bit


@dataclass(slots=True, eq=False)
class _Conn:
    handle: int
    cm_id: int  # struct rdma_cm_id *
    active: bool
    state: str  # addr, route, connecting, requested, accepting, established, disconnecting
    peer: tuple[IPv4Address | IPv6Address, int] | None = None
    qp: VerbsQP | None = None
    deadline: float | None = None
    private: bytes = b""
    local_port: int = 0
    resp_res: int = 0  # passive: the REQ's initiator depth, what we answer as responder
    init_depth: int = 0  # passive: the REQ's responder resources


@dataclass(frozen=True, slots=True)
class _Event:
    kind: int
    status: int
    cm_id: int
    listen_id: int
    private: bytes
    resp_res: int
    init_depth: int


def _errno_error(what: str, err: int) -> VerbsError:
    code: ErrorCode
    code, fault = code_for_errno(err)
    if err == errno.EADDRINUSE:
        code, fault = "IN_USE", "caller"
    elif err == errno.EADDRNOTAVAIL:
        code, fault = "NOT_FOUND", "caller"
    return VerbsError(code, f"{what}: {os.strerror(err) if err else 'failed'}", fault, err or None)


def _port(port: int) -> int:
    if type(port) is not int or not 0 < port <= 0xFFFF:
        raise VerbsError("INVALID_VALUE", f"port {port!r} is not a port number")
    return port


def _private(data: bytes, limit: int, what: str) -> bytes:
    data = bytes(data)
    if len(data) > limit:
        raise VerbsError("INVALID_VALUE", f"{what} private data is at most {limit} bytes, not {len(data)}")
    return data


def _ms(seconds: float) -> int:
    return max(1, min(int(seconds * 1000), 1 << 30))


def _ah(a: C.IbvAhAttr) -> Any:
    if not a.is_global:
        return AHAttr(dlid=a.dlid, sl=a.sl, src_path_bits=a.src_path_bits, static_rate=a.static_rate,
                      port_num=a.port_num)  # fmt: skip
    g = a.grh
    route = GlobalRoute(
        dgid=GID(gid_text(IPv6Address(bytes(g.dgid.raw)))), flow_label=g.flow_label,
        sgid_index=g.sgid_index, hop_limit=g.hop_limit, traffic_class=g.traffic_class,
    )  # fmt: skip
    return AHAttr(dlid=a.dlid, sl=a.sl, src_path_bits=a.src_path_bits, static_rate=a.static_rate,
                  is_global=1, port_num=a.port_num, gr=route)  # fmt: skip


def qp_attr(attr: C.IbvQpAttr, mask: int, current: QpState) -> tuple[Any, int]:
    """A pyverbs ``QPAttr`` with the fields `mask` names copied from `attr`, and the mask to modify with."""
    known = mask & int(_KNOWN)
    if mask != known:
        log.debug("rdma_init_qp_attr named attributes %#x this backend does not set", mask & ~known)
    pv = QPAttr(qp_state=attr.qp_state, cur_qp_state=int(current))
    for bit, name in _ATTRS:
        if known & bit:
            setattr(pv, name, getattr(attr, name))
    if known & QpAttrMask.AV:
        pv.ah_attr = _ah(attr.ah_attr)
    return pv, known


class VerbsCm:
    """The connection manager of one `VerbsDevice`: its listeners and connections, by handle.

    Listening and connecting use the device's own address (its RoCE v2 GID's
    IPv4 or IPv6 address), so librdmacm binds every ID to this device.
    """

    def __init__(self, dev: VerbsDevice, *, clock: Callable[[], float] = time.monotonic) -> None:
        try:
            self._lib = C.load()
        except OSError as e:
            raise VerbsError("NOT_SUPPORTED", f"librdmacm is not installed: {e}", "system") from e
        self.dev = dev
        self.ip: IPv4Address | IPv6Address = dev.gid.ipv4_mapped or dev.gid
        self._clock = clock
        channel = self._lib.rdma_create_event_channel()
        if not channel:
            raise _errno_error("rdma_create_event_channel", ctypes.get_errno())
        self._channel = channel
        self._fd = int(channel.contents.fd)
        fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._listeners: dict[int, int] = {}  # port -> cm_id
        self._ports: dict[int, int] = {}  # listening cm_id -> port
        self._conns: dict[int, _Conn] = {}  # handle -> connection
        self._by_id: dict[int, _Conn] = {}  # cm_id -> connection
        self._next = 1
        self._queued: list[CmEvent] = []
        self._closed = False

    # -- plumbing -------------------------------------------------------------------------------
    def fileno(self) -> int:
        """The event channel's descriptor: readable when `poll` has events to read."""
        return self._fd

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise _errno_error(what, ctypes.get_errno())

    def _check_open(self) -> None:
        if self._closed:
            raise VerbsError("BAD_STATE", f"{self.dev.name}'s connection manager is closed")

    def _create_id(self) -> int:
        out = ctypes.c_void_p()
        self._check(self._lib.rdma_create_id(self._channel, ctypes.byref(out), None, C.RDMA_PS_TCP),
                    "rdma_create_id")  # fmt: skip
        assert out.value is not None
        return out.value

    def _add(self, cm_id: int, **kw: Any) -> _Conn:
        conn = _Conn(self._next, cm_id, **kw)
        self._next += 1
        self._conns[conn.handle] = conn
        self._by_id[cm_id] = conn
        return conn

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.handle, None)
        if self._by_id.pop(conn.cm_id, None) is not None and self._lib.rdma_destroy_id(conn.cm_id):
            log.debug("rdma_destroy_id: %s", os.strerror(ctypes.get_errno()))

    def _flush(self, conn: _Conn) -> None:
        if conn.qp is not None:
            try:
                conn.qp.to_error()
            except VerbsError as e:  # closed by its owner meanwhile
                log.debug("QP of connection %d: %s", conn.handle, e)

    def _conn_param(self, qp: VerbsQP, data: bytes, resp_res: int, init_depth: int) -> tuple[Any, Any]:
        o = qp.options
        buf = ctypes.create_string_buffer(data, len(data)) if data else None
        param = C.RdmaConnParam(
            private_data=ctypes.cast(buf, ctypes.c_void_p) if buf is not None else None,
            private_data_len=len(data), responder_resources=resp_res, initiator_depth=init_depth,
            flow_control=1, retry_count=min(o.retry_cnt, 7), rnr_retry_count=min(o.rnr_retry, 7),
            qp_num=qp.qpn,
        )  # fmt: skip
        return param, buf

    def _transition(self, conn: _Conn, qp: VerbsQP, to: QpState, **override: int) -> None:
        """Move `qp` to `to` with the CM's attributes (``rdma_init_qp_attr``), the QP's timers over them."""
        attr, mask = C.IbvQpAttr(), ctypes.c_int()
        attr.qp_state = int(to)
        self._check(self._lib.rdma_init_qp_attr(conn.cm_id, ctypes.byref(attr), ctypes.byref(mask)),
                    f"rdma_init_qp_attr({to.name})")  # fmt: skip
        o = qp.options
        if to is QpState.RTR:
            override.setdefault("min_rnr_timer", o.min_rnr_timer)
        elif to is QpState.RTS:
            override.update(timeout=o.timeout, retry_cnt=o.retry_cnt, rnr_retry=o.rnr_retry)
        for name, value in override.items():
            setattr(attr, name, value)
        frm = qp.state
        pv, known = qp_attr(attr, mask.value, frm)
        qp.modify_with(pv, known, f"{frm.name} -> {to.name}, rdma_init_qp_attr")

    # -- listening ------------------------------------------------------------------------------
    def listen(self, port: int) -> None:
        """``rdma_bind_addr`` to the device's address and `port`, then ``rdma_listen``."""
        self._check_open()
        if _port(port) in self._listeners:
            raise VerbsError("IN_USE", f"{self.dev.name} already listens on port {port}")
        cm_id = self._create_id()
        try:
            self._check(self._lib.rdma_bind_addr(cm_id, C.sockaddr(self.ip, port)),
                        f"rdma_bind_addr({self.ip} port {port})")  # fmt: skip
            self._check(self._lib.rdma_listen(cm_id, LISTEN_BACKLOG), "rdma_listen")
        except VerbsError:
            self._lib.rdma_destroy_id(cm_id)
            raise
        self._listeners[port] = cm_id
        self._ports[cm_id] = port

    def stop_listen(self, port: int) -> None:
        """Destroy the listening ID of `port`; idempotent. Its accepted connections stay."""
        cm_id = self._listeners.pop(port, None)
        if cm_id is not None:
            del self._ports[cm_id]
            self._lib.rdma_destroy_id(cm_id)

    # -- the active side ------------------------------------------------------------------------
    def connect(
        self, qp: VerbsQP, addr: IPv4Address | IPv6Address, port: int, private_data: bytes, timeout: float
    ) -> int:
        """Start connecting `qp` (RESET or INIT) to `addr`:`port`; the handle of the connection.

        ESTABLISHED, REJECTED or UNREACHABLE follows from `poll`; UNREACHABLE
        too when `timeout` seconds pass first.
        """
        self._check_open()
        data = _private(private_data, MAX_CONNECT_PRIVATE, "connect")
        _port(port)
        qp.init()
        if (state := qp.state) is not QpState.INIT:
            raise VerbsError("BAD_STATE", f"connect needs a QP in RESET or INIT, not {state.name}")
        cm_id = self._create_id()
        src = C.sockaddr(self.ip, 0) if self.ip.version == addr.version else None
        rc = self._lib.rdma_resolve_addr(cm_id, src, C.sockaddr(addr, port), _ms(timeout))
        if rc:
            err = _errno_error(f"rdma_resolve_addr({addr})", ctypes.get_errno())
            self._lib.rdma_destroy_id(cm_id)
            raise err
        conn = self._add(cm_id, active=True, state="addr", peer=(addr, port), qp=qp, private=data)
        conn.deadline = self._clock() + timeout
        return conn.handle

    def _addr_resolved(self, conn: _Conn) -> None:
        cm_id = C.RdmaCmId.from_address(conn.cm_id)
        name = C.device_name(cm_id)
        if name != self.dev.name or cm_id.port_num != self.dev.port:
            raise VerbsError("NOT_FOUND", f"the route to {conn.peer} leaves through {name} port "
                             f"{cm_id.port_num}, not {self.dev.name} port {self.dev.port}")  # fmt: skip
        remaining = (conn.deadline or 0.0) - self._clock()
        self._check(self._lib.rdma_resolve_route(conn.cm_id, _ms(remaining)), "rdma_resolve_route")
        conn.state = "route"

    def _route_resolved(self, conn: _Conn) -> None:
        qp = conn.qp
        assert qp is not None
        o, caps = qp.options, self.dev.caps
        resp_res = min(o.max_dest_rd_atomic, caps.max_qp_rd_atom, 0xFE)
        init_depth = min(o.max_rd_atomic, caps.max_qp_init_rd_atom, 0xFE)
        param, keep = self._conn_param(qp, conn.private, resp_res, init_depth)
        self._check(self._lib.rdma_connect(conn.cm_id, ctypes.byref(param)), "rdma_connect")
        del keep
        conn.state = "connecting"

    def _connect_response(self, conn: _Conn, ev: _Event) -> CmEvent:
        if len(ev.private) > MAX_ACCEPT_PRIVATE:
            raise VerbsError("INVALID_VALUE", f"the REP carries {len(ev.private)} bytes of private data, "
                             f"more than {MAX_ACCEPT_PRIVATE}", "peer")  # fmt: skip
        qp = conn.qp
        assert qp is not None
        self._transition(conn, qp, QpState.RTR)
        self._transition(conn, qp, QpState.RTS)
        self._check(self._lib.rdma_establish(conn.cm_id), "rdma_establish")
        conn.state, conn.deadline = "established", None
        return self._notice(CmEventKind.ESTABLISHED, conn, private_data=ev.private)

    # -- the passive side -----------------------------------------------------------------------
    def accept(self, conn_handle: int, qp: VerbsQP, private_data: bytes) -> None:
        """Bring `qp` to RTS towards the requester and send the REP (``rdma_accept``)."""
        self._check_open()
        data = _private(private_data, MAX_ACCEPT_PRIVATE, "accept")
        conn = self._conns.get(conn_handle)
        if conn is None or conn.state != "requested":
            state = "unknown" if conn is None else conn.state
            raise VerbsError("BAD_STATE", f"connection {conn_handle} is {state}, not requested")
        o, caps = qp.options, self.dev.caps
        resp_res = min(conn.resp_res, o.max_dest_rd_atomic, caps.max_qp_rd_atom)
        init_depth = min(conn.init_depth, o.max_rd_atomic, caps.max_qp_init_rd_atom)
        qp.init()
        conn.qp = qp
        try:
            self._transition(conn, qp, QpState.RTR, max_dest_rd_atomic=resp_res)
            self._transition(conn, qp, QpState.RTS, max_rd_atomic=init_depth)
            param, keep = self._conn_param(qp, data, resp_res, init_depth)
            self._check(self._lib.rdma_accept(conn.cm_id, ctypes.byref(param)), "rdma_accept")
            del keep
        except VerbsError:
            self._flush(conn)
            self._lib.rdma_reject(conn.cm_id, None, 0)
            self._drop(conn)
            raise
        conn.state = "accepting"

    def reject(self, conn_handle: int, private_data: bytes) -> None:
        """Answer a CONNECT_REQUEST with a REJ (consumer reject, reason 28); forget the connection."""
        data = _private(private_data, MAX_REJECT_PRIVATE, "reject")
        conn = self._conns.get(conn_handle)
        if conn is None or conn.state != "requested":
            raise VerbsError("BAD_STATE", f"connection {conn_handle} is not a pending request")
        buf = ctypes.create_string_buffer(data, len(data)) if data else None
        rc = self._lib.rdma_reject(conn.cm_id, buf, len(data))
        err = ctypes.get_errno()
        self._drop(conn)
        if rc:
            raise _errno_error("rdma_reject", err)

    def disconnect(self, conn_handle: int) -> None:
        """DREQ (``rdma_disconnect``) and the QP to ERR; DISCONNECTED follows. Idempotent.

        A request not yet answered is rejected instead; a connection not yet
        established is dropped and reported DISCONNECTED at once.
        """
        conn = self._conns.get(conn_handle)
        if conn is None or conn.state == "disconnecting":
            return
        if conn.state == "requested":
            self._lib.rdma_reject(conn.cm_id, None, 0)
            self._drop(conn)
            return
        self._flush(conn)
        if conn.state == "established" and self._lib.rdma_disconnect(conn.cm_id) == 0:
            conn.state, conn.deadline = "disconnecting", self._clock() + DISCONNECT_WAIT
            return
        self._drop(conn)
        self._queued.append(self._notice(CmEventKind.DISCONNECTED, conn, detail="disconnected locally"))

    # -- events ---------------------------------------------------------------------------------
    def _notice(self, kind: CmEventKind, conn: _Conn, **kw: Any) -> CmEvent:
        return CmEvent(kind=kind, conn=conn.handle, peer=conn.peer, local_port=conn.local_port, **kw)

    def _read(self) -> _Event | None:
        evp = ctypes.POINTER(C.RdmaCmEvent)()
        if self._lib.rdma_get_cm_event(self._channel, ctypes.byref(evp)):
            err = ctypes.get_errno()
            if err not in (errno.EAGAIN, errno.EWOULDBLOCK):
                log.warning("%s: rdma_get_cm_event: %s", self.dev.name, os.strerror(err))
            return None
        e = evp.contents
        n = e.conn.private_data_len if e.conn.private_data else 0
        ev = _Event(
            kind=e.event, status=e.status, cm_id=e.id or 0, listen_id=e.listen_id or 0,
            private=ctypes.string_at(e.conn.private_data, n) if n else b"",
            resp_res=e.conn.responder_resources, init_depth=e.conn.initiator_depth,
        )  # fmt: skip
        self._lib.rdma_ack_cm_event(evp)
        return ev

    def _request(self, ev: _Event) -> CmEvent | None:
        port = self._ports.get(ev.listen_id)
        if port is None or len(ev.private) > MAX_CONNECT_PRIVATE:
            log.debug("%s: refused a REQ (listener %s, %d bytes of private data)",
                      self.dev.name, port, len(ev.private))  # fmt: skip
            self._lib.rdma_reject(ev.cm_id, None, 0)
            self._lib.rdma_destroy_id(ev.cm_id)
            return None
        peer = C.sockaddr_ip(bytes(C.RdmaCmId.from_address(ev.cm_id).route.addr.dst))
        conn = self._add(ev.cm_id, active=False, state="requested", peer=peer, local_port=port,
                         resp_res=ev.resp_res, init_depth=ev.init_depth)  # fmt: skip
        return self._notice(CmEventKind.CONNECT_REQUEST, conn, private_data=ev.private)

    def _fail(self, conn: _Conn, kind: CmEventKind, detail: str, **kw: Any) -> CmEvent:
        if conn.state in ("accepting", "established", "disconnecting"):
            self._flush(conn)
        self._drop(conn)
        return self._notice(kind, conn, detail=detail, **kw)

    def _event(self, ev: _Event) -> CmEvent | None:
        if ev.kind == T.CONNECT_REQUEST:
            return self._request(ev)
        conn = self._by_id.get(ev.cm_id)
        if conn is None:
            return None  # a listener's, or an ID already dropped
        try:
            kind = T(ev.kind)
        except ValueError:
            return None
        try:
            if kind is T.ADDR_RESOLVED and conn.state == "addr":
                self._addr_resolved(conn)
            elif kind is T.ROUTE_RESOLVED and conn.state == "route":
                self._route_resolved(conn)
            elif kind is T.CONNECT_RESPONSE and conn.state == "connecting":
                return self._connect_response(conn, ev)
            elif kind is T.ESTABLISHED and conn.state in ("accepting", "connecting"):
                conn.state, conn.deadline = "established", None
                data = ev.private if conn.active else b""
                return self._notice(CmEventKind.ESTABLISHED, conn, private_data=data)
            elif kind is T.REJECTED:
                reason = ev.status if 0 < ev.status <= 0xFFFF else None
                detail = _REASONS.get(reason or 0, f"REJ reason {reason}")
                data = ev.private if len(ev.private) <= MAX_REJECT_PRIVATE else b""
                return self._fail(conn, CmEventKind.REJECTED, detail, reason=reason, private_data=data)
            elif kind in (T.ADDR_ERROR, T.ROUTE_ERROR, T.CONNECT_ERROR, T.UNREACHABLE):
                why = os.strerror(-ev.status) if ev.status < 0 else f"status {ev.status}"
                return self._fail(conn, CmEventKind.UNREACHABLE, f"{kind.name}: {why}")
            elif kind in (T.DISCONNECTED, T.DEVICE_REMOVAL):
                if conn.state in ("accepting", "established"):
                    self._lib.rdma_disconnect(conn.cm_id)  # the DREP to the peer's DREQ
                gone = conn.state in ("accepting", "established", "disconnecting")
                out = CmEventKind.DISCONNECTED if gone else CmEventKind.UNREACHABLE
                return self._fail(conn, out, kind.name.lower().replace("_", " "))
        except VerbsError as e:
            return self._fail(conn, CmEventKind.UNREACHABLE, str(e))
        return None

    def _expired(self, now: float) -> list[CmEvent]:
        out: list[CmEvent] = []
        for conn in list(self._conns.values()):
            if conn.deadline is None or now <= conn.deadline:
                continue
            if conn.state == "disconnecting":
                out.append(self._fail(conn, CmEventKind.DISCONNECTED, "no DREP from the peer"))
            else:
                out.append(self._fail(conn, CmEventKind.UNREACHABLE, "connection timed out"))
        return out

    def poll(self) -> list[CmEvent]:
        """Events since the last call, oldest first; never blocks."""
        if self._closed:
            return []
        out, self._queued = self._queued, []
        out += self._expired(self._clock())
        while (ev := self._read()) is not None:
            notice = self._event(ev)
            if notice is not None:
                out.append(notice)
        return out

    def close(self) -> None:
        """Drop every connection (a DREQ or REJ goes to each peer) and listener; idempotent."""
        if self._closed:
            return
        self._closed = True
        for conn in list(self._conns.values()):
            self._drop(conn)
        for port in list(self._listeners):
            self.stop_listen(port)
        self._lib.rdma_destroy_event_channel(self._channel)

    def __repr__(self) -> str:
        return f"<VerbsCm {self.dev.name} {self.ip} {len(self._conns)} connections>"
