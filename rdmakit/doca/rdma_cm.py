"""Connect by address: the connection-manager API of DOCA RDMA (DOCA 2.7+, ``doca_rdma.h``).

Instead of swapping descriptors (`Rdma.export`/`Rdma.connect`), a started
`Rdma` context can listen on a port or connect to an address, through its
device's RDMA CM (``BackendDevice.cm``)::

    rdma.set_connection_state_callbacks(on_request, on_established, on_failure, on_disconnect)
    rdma.start()                                   # STARTING
    rdma.start_listen_to_port(7174)                # server: on_request(conn, ctx_user_data)
    conn.accept(b"private data")                   #   ... in on_request: doca_rdma_connection_accept
    rdma.connect_to_addr(RdmaAddr("10.0.0.2", 7174))   # client
    # on_established(conn, ctx_user_data): the context is RUNNING, jobs and tasks run

=========================================  ===================================================
DOCA                                       here
=========================================  ===================================================
``doca_rdma_set_connection_state_callbacks``  `RdmaCmApi.set_connection_state_callbacks` (IDLE)
``doca_rdma_start_listen_to_port``         `RdmaCmApi.start_listen_to_port` (STARTING)
``doca_rdma_stop_listen_to_port``          `RdmaCmApi.stop_listen_to_port`
``doca_rdma_addr_create``                  `RdmaAddr` (IPv4 or IPv6 address and port)
``doca_rdma_connect_to_addr``              `RdmaCmApi.connect_to_addr` (STARTING)
``doca_rdma_connection_accept/reject``     `RdmaConnection.accept` / `RdmaConnection.reject`
``doca_rdma_connection_disconnect``        `RdmaConnection.disconnect`
``doca_rdma_connection_{get,set}_user_data``  `RdmaConnection.get_user_data` / ``set_user_data``
=========================================  ===================================================

Callbacks are ``cb(connection, ctx_user_data)`` and run inside the
context's progress only (``WorkQ.progress_retrieve`` or ``PE.progress``),
never from another thread. A context is one RC connection: while it has one
(requested, accepted or established), further requests are rejected. A
connection that fails (a REJ, or no answer within `set_connection_timeout`)
calls the failure callback and leaves the context in STARTING with the
cause in `Rdma.error`; stop and start it to try again. A disconnect, from
either side, flushes the outstanding jobs and calls the disconnect callback.
"""

import ipaddress
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rdmakit.doca.backend import BackendCm, BackendQP, CmEvent, CmEventKind
from rdmakit.doca.ctx import CtxState
from rdmakit.doca.device import Dev
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.sync_event_remote import RdmaRemoteNetTaskApi

__all__ = ["ConnectionCallback", "RdmaAddr", "RdmaConnection"]  # RdmaCmApi: a base of Rdma

#: ``doca_rdma_connection_*_cb_t``: (connection, ctx user data).
ConnectionCallback = Callable[["RdmaConnection", object], None]
DEFAULT_CONNECTION_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class RdmaAddr:
    """``doca_rdma_addr``: where `connect_to_addr` goes (``doca_rdma_addr_create``)."""

    address: str
    port: int

    def __post_init__(self) -> None:
        try:
            ipaddress.ip_address(self.address)
        except ValueError:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{self.address!r} is not an IP address") from None
        if type(self.port) is not int or not 0 < self.port <= 0xFFFF:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"port {self.port!r} is not a port number")


class RdmaConnection:
    """``doca_rdma_connection``: one connection of an `Rdma` context."""

    __slots__ = ("_handle", "_rdma", "_state", "_user_data", "peer", "private_data")

    def __init__(self, rdma: "RdmaCmApi", handle: int, peer: tuple[str, int], private_data: bytes) -> None:
        self._rdma, self._handle = rdma, handle
        self.peer = peer  # the peer's address and port
        self.private_data = private_data  # what the peer's REQ (or REP) carried for the user
        self._user_data: object = None
        self._state = "requested"  # requested, connecting, established, closed

    @property
    def rdma(self) -> "RdmaCmApi":
        return self._rdma

    @property
    def state(self) -> str:
        return self._state

    def get_user_data(self) -> object:
        return self._user_data

    def set_user_data(self, user_data: object) -> None:
        self._user_data = user_data

    def accept(self, private_data: bytes = b"") -> None:
        """Accept a requested connection (``doca_rdma_connection_accept``): the REP leaves."""
        if self._state != "requested":
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"accept: the connection is {self._state}, not requested"
            )
        self._rdma._cm_accept(self, bytes(private_data))
        self._state = "connecting"

    def reject(self, private_data: bytes = b"") -> None:
        """Refuse a requested connection (``doca_rdma_connection_reject``): REJ, consumer defined."""
        if self._state != "requested":
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"reject: the connection is {self._state}, not requested"
            )
        self._state = "closed"
        self._rdma._cm_reject(self, bytes(private_data))

    def disconnect(self) -> None:
        """``doca_rdma_connection_disconnect``: DREQ; the disconnect callback follows in progress."""
        if self._state in ("connecting", "established"):
            self._rdma._cm_disconnect(self)

    def __repr__(self) -> str:
        return f"<RdmaConnection {self._state} peer={self.peer[0]}:{self.peer[1]}>"


class _Hub:
    """One device CM's events, routed to the contexts that own each connection or port."""

    def __init__(self, cm: BackendCm) -> None:
        self.cm = cm
        self.by_conn: dict[int, RdmaCmApi] = {}
        self.by_port: dict[int, RdmaCmApi] = {}

    def pump(self) -> None:
        for ev in self.cm.poll_events():
            owner = self.by_port.get(ev.local_port) if ev.kind is CmEventKind.CONNECT_REQUEST else None
            if owner is None:
                owner = self.by_conn.get(ev.conn)
            if owner is not None:
                owner._cm_events.append(ev)
            elif ev.kind is CmEventKind.CONNECT_REQUEST:
                self.cm.reject(ev.conn, b"")  # the listener went away meanwhile


_hubs: "weakref.WeakKeyDictionary[object, _Hub]" = weakref.WeakKeyDictionary()


def _hub(cm: BackendCm) -> _Hub:
    hub = _hubs.get(cm)
    if hub is None:
        hub = _hubs[cm] = _Hub(cm)
    return hub


class RdmaCmApi(RdmaRemoteNetTaskApi):
    """The connection-manager half of `Rdma`."""

    _qp: BackendQP | None
    _error: DocaError | None

    def __init__(self) -> None:
        super().__init__()
        self._cm_callbacks: tuple[ConnectionCallback, ...] | None = None
        self._cm_timeout = DEFAULT_CONNECTION_TIMEOUT
        self._cm_events: deque[CmEvent] = deque()
        self._cm_hub: _Hub | None = None
        self._cm_ports: set[int] = set()
        self._cm_conn: RdmaConnection | None = None

    # -- configuration --------------------------------------------------------------------------

    def set_connection_state_callbacks(
        self,
        request_cb: ConnectionCallback,
        established_cb: ConnectionCallback,
        failure_cb: ConnectionCallback,
        disconnect_cb: ConnectionCallback,
    ) -> None:
        """``doca_rdma_set_connection_state_callbacks``; IDLE only."""
        self._require_idle("set_connection_state_callbacks")
        cbs = (request_cb, established_cb, failure_cb, disconnect_cb)
        if not all(callable(cb) for cb in cbs):
            raise DocaError(DocaErrorCode.INVALID_VALUE, "the four connection callbacks must be callable")
        self._cm_callbacks = cbs

    def set_connection_timeout(self, seconds: float) -> None:
        """How long `connect_to_addr` waits for the connection before failing it (10 s); IDLE only."""
        self._require_idle("set_connection_timeout")
        if not isinstance(seconds, int | float) or not 0 < seconds <= 3600:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"timeout {seconds!r} is not in (0, 3600] seconds")
        self._cm_timeout = float(seconds)

    def _cm_ready(self, what: str) -> _Hub:
        self._check_not_closed()
        if self._state is not CtxState.STARTING or self._qp is None:
            raise DocaError(DocaErrorCode.BAD_STATE, f"{what} needs a started, unconnected context")
        if self._cm_callbacks is None:
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"{what}: set_connection_state_callbacks first", Fault.CALLER
            )
        if self._cm_hub is None:
            dev: Dev = self._devs[0]  # started: it has its device
            self._cm_hub = _hub(dev.backend.cm())
        return self._cm_hub

    @property
    def connection(self) -> RdmaConnection | None:
        """The context's connection (requested, connecting or established), if any."""
        return self._cm_conn

    # -- listening and connecting ---------------------------------------------------------------

    def start_listen_to_port(self, port: int) -> None:
        """``doca_rdma_start_listen_to_port``: connection requests for `port` reach the request callback."""
        hub = self._cm_ready("start_listen_to_port")
        if port in hub.by_port:
            raise DocaError(DocaErrorCode.IN_USE, f"port {port} already has a listener on this device")
        hub.cm.listen(port)
        hub.by_port[port] = self
        self._cm_ports.add(port)

    def stop_listen_to_port(self, port: int) -> None:
        """``doca_rdma_stop_listen_to_port``."""
        hub = self._cm_hub
        if hub is not None and port in self._cm_ports:
            self._cm_ports.discard(port)
            hub.by_port.pop(port, None)
            hub.cm.stop_listen(port)

    def connect_to_addr(self, addr: RdmaAddr, user_data: object = None) -> RdmaConnection:
        """``doca_rdma_connect_to_addr``: send a request; the established or failure callback follows."""
        hub = self._cm_ready("connect_to_addr")
        if self._cm_conn is not None:
            raise DocaError(DocaErrorCode.IN_USE, "this context already has a connection")
        assert self._qp is not None
        ip = ipaddress.ip_address(addr.address)
        handle = hub.cm.connect(self._qp, ip, addr.port, b"", self._cm_timeout)
        conn = RdmaConnection(self, handle, (str(ip), addr.port), b"")
        conn._state = "connecting"
        conn.set_user_data(user_data)
        self._cm_conn = conn
        hub.by_conn[handle] = self
        return conn

    # -- what RdmaConnection asks for ------------------------------------------------------------

    def _cm_accept(self, conn: RdmaConnection, private_data: bytes) -> None:
        hub = self._cm_ready("accept")
        assert self._qp is not None
        hub.cm.accept(conn._handle, self._qp, private_data)

    def _cm_reject(self, conn: RdmaConnection, private_data: bytes) -> None:
        if self._cm_hub is not None:
            self._cm_hub.cm.reject(conn._handle, private_data)
            self._cm_forget(conn)

    def _cm_disconnect(self, conn: RdmaConnection) -> None:
        if self._cm_hub is not None:
            self._cm_hub.cm.disconnect(conn._handle)

    def _cm_forget(self, conn: RdmaConnection) -> None:
        conn._state = "closed"
        if self._cm_conn is conn:
            self._cm_conn = None
        if self._cm_hub is not None:
            self._cm_hub.by_conn.pop(conn._handle, None)

    def _cm_release(self) -> None:
        """On stop or close: no more listening; an open connection is disconnected."""
        for port in list(self._cm_ports):
            self.stop_listen_to_port(port)
        conn = self._cm_conn
        if conn is not None:
            conn.disconnect()
            self._cm_forget(conn)
        self._cm_events.clear()

    # -- events, inside progress ---------------------------------------------------------------------

    def _cm_progress(self) -> bool:
        hub = self._cm_hub
        if hub is None:
            return False
        hub.pump()
        busy = bool(self._cm_events)
        while self._cm_events:
            self._cm_event(self._cm_events.popleft())
        return busy

    def _cm_event(self, ev: CmEvent) -> None:
        assert self._cm_callbacks is not None
        assert self._cm_hub is not None
        request_cb, established_cb, failure_cb, disconnect_cb = self._cm_callbacks
        ud = self._user_data
        if ev.kind is CmEventKind.CONNECT_REQUEST:
            peer = (str(ev.peer[0]), ev.peer[1]) if ev.peer is not None else ("", 0)
            if self._cm_conn is not None or self._state is not CtxState.STARTING:
                self._cm_hub.cm.reject(ev.conn, b"")  # one connection per context
                return
            new = self._cm_conn = RdmaConnection(self, ev.conn, peer, ev.private_data)
            self._cm_hub.by_conn[ev.conn] = self
            request_cb(new, ud)
            return
        conn = self._cm_conn
        if conn is None or conn._handle != ev.conn:
            return  # a connection this context already let go of
        if ev.kind is CmEventKind.ESTABLISHED:
            conn._state = "established"
            if ev.private_data:
                conn.private_data = ev.private_data
            if self._state is CtxState.STARTING:
                self._connected()
            established_cb(conn, ud)
        elif ev.kind in (CmEventKind.REJECTED, CmEventKind.UNREACHABLE):
            code = (
                DocaErrorCode.CONNECTION_ABORTED
                if ev.kind is CmEventKind.REJECTED
                else DocaErrorCode.TIME_OUT
            )
            self._error = DocaError(
                code, f"connection to {conn.peer[0]}:{conn.peer[1]} failed: {ev.detail}", Fault.PEER
            )
            self._cm_forget(conn)
            failure_cb(conn, ud)
        elif ev.kind is CmEventKind.DISCONNECTED:
            self._error = DocaError(
                DocaErrorCode.CONNECTION_RESET, "the connection was disconnected", Fault.PEER
            )
            self._cm_forget(conn)
            if self._qp is not None:
                self._qp.to_error()
            disconnect_cb(conn, ud)
