"""Connect by address: the connection-manager API of DOCA RDMA (DOCA 2.7+, ``doca_rdma.h``).

Instead of swapping descriptors (`Rdma.export`/`Rdma.connect`), a started
`Rdma` context can listen on a port or connect to an address, through its
device's RDMA CM (``BackendDevice.cm``)::

    rdma.set_connection_state_callbacks(on_request, on_established, on_failure, on_disconnect)
    rdma.set_max_num_connections(3)                # up to 3 connections (1 by default)
    rdma.start()                                   # STARTING
    rdma.start_listen_to_port(7174)                # server: on_request(conn, ctx_user_data)
    conn.accept(b"private data")                   #   ... in on_request: doca_rdma_connection_accept
    rdma.connect_to_addr(RdmaAddr("10.0.0.2", 7174))   # client, once per connection
    # on_established(conn, ctx_user_data): the context is RUNNING, jobs and tasks run
    rdma.task_send_allocate_init(buf, rdma_connection=conn)   # on one connection

=============================================  ===================================================
DOCA                                           here
=============================================  ===================================================
``doca_rdma_set_connection_state_callbacks``   `RdmaCmApi.set_connection_state_callbacks` (IDLE)
``doca_rdma_set_max_num_connections``          `RdmaCmApi.set_max_num_connections` (IDLE)
``doca_rdma_start_listen_to_port``             `RdmaCmApi.start_listen_to_port` (started)
``doca_rdma_stop_listen_to_port``              `RdmaCmApi.stop_listen_to_port`
``doca_rdma_addr_create``                      `RdmaAddr` (IPv4 or IPv6 address and port)
``doca_rdma_connect_to_addr``                  `RdmaCmApi.connect_to_addr` (started)
``doca_rdma_cap_get_max_num_connections``      `RdmaCmApi.cap_get_max_num_connections`
``doca_rdma_connection_*``                     `RdmaConnection` (``rdmakit.doca.rdma_conns``)
=============================================  ===================================================

Callbacks are ``request_cb(connection, ctx_user_data)`` and
``cb(connection, connection_user_data, ctx_user_data)`` for the others, and run inside the
context's progress only (``WorkQ.progress_retrieve`` or ``PE.progress``),
never from another thread. A context holds at most ``max_num_connections``
open connections (requested, connecting or established), each with its own
RC queue pair: a request beyond them is rejected (REJ, consumer reject)
before the request callback, and `connect_to_addr` beyond them is FULL.
Listening and connecting go on while the context is RUNNING, so connections
can be added until the limit; the context is RUNNING from the first
established one. A context connected by descriptor connects no further.

A connection that fails (a REJ, or no answer within
`set_connection_timeout`) calls the failure callback; a context with no
established connection stays in STARTING, the cause in `Rdma.error` and in
the connection's ``error``. A disconnect, from either side, moves that
connection's queue pair to ERROR, which flushes its outstanding jobs and
tasks only, and calls the disconnect callback; the other connections go on.
Stopping the context disconnects every connection (without callbacks).

Jobs and tasks name their connection (``connection=``,
``rdma_connection=``); without one, a context with exactly one open
connection uses it, one with none uses the queue pair made at ``start``,
and one with several refuses the job (INVALID_VALUE). A job on a closed
connection is NOT_CONNECTED; one other than a receive on a connection not
yet established is BAD_STATE.
"""

import ipaddress
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rdmakit.doca.backend import BackendCm, BackendQP, CmEvent, CmEventKind, JobType
from rdmakit.doca.ctx import CtxState
from rdmakit.doca.device import Dev, DevInfo
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.rdma_conns import MAX_NUM_CONNECTIONS, RdmaConnection
from rdmakit.doca.sync_event_remote import RdmaRemoteNetTaskApi
from rdmakit.engine.states import QpState

__all__ = ["ConnectionCallback", "ConnectionRequestCallback", "RdmaAddr"]  # RdmaCmApi: a base of Rdma

#: ``doca_rdma_connection_request_cb_t``: (connection, ctx user data).
ConnectionRequestCallback = Callable[[RdmaConnection, object], None]
#: ``doca_rdma_connection_{established,failure,disconnection}_cb_t``: (connection, connection user
#: data, ctx user data); the connection's is what `connect_to_addr` or `set_user_data` gave it.
ConnectionCallback = Callable[[RdmaConnection, object, object], None]
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
    """The connection-manager half of `Rdma`: its connections and their queue pairs."""

    _qp: BackendQP | None
    _error: DocaError | None

    def __init__(self) -> None:
        super().__init__()
        self._cm_callbacks: (
            tuple[ConnectionRequestCallback, ConnectionCallback, ConnectionCallback, ConnectionCallback]
            | None
        ) = None
        self._cm_timeout = DEFAULT_CONNECTION_TIMEOUT
        self._cm_events: deque[CmEvent] = deque()
        self._cm_hub: _Hub | None = None
        self._cm_ports: set[int] = set()
        self._cm_max = 1
        self._cm_conns: dict[int, RdmaConnection] = {}  # open connections by CM handle, oldest first
        self._cm_primary: RdmaConnection | None = None  # the open connection on the QP made at start
        self._cm_retired: list[RdmaConnection] = []  # closed, their queue pairs not drained yet
        self._by_descriptor = False  # connected with Rdma.connect

    # -- configuration --------------------------------------------------------------------------

    @staticmethod
    def cap_get_max_num_connections(devinfo: DevInfo) -> int:
        """The most connections a context on `devinfo` may hold (``doca_rdma_cap_get_max_num_connections``).

        NOT_SUPPORTED unless the device runs RDMA.
        """
        if not devinfo.is_job_supported(JobType.RDMA_SEND):
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{devinfo.name} does not run RDMA", Fault.SYSTEM)
        return MAX_NUM_CONNECTIONS

    def set_max_num_connections(self, max_num_connections: int) -> None:
        """``doca_rdma_set_max_num_connections``: 1 to the device's capability; IDLE only."""
        self._require_idle("set_max_num_connections")
        limit = MAX_NUM_CONNECTIONS
        if self._devs:
            limit = self.cap_get_max_num_connections(self._devs[0].info)
        n = max_num_connections
        if type(n) is not int or not 1 <= n <= limit:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"max_num_connections {n!r} is not an integer in [1, {limit}]"
            )
        self._cm_max = n

    def get_max_num_connections(self) -> int:
        """``doca_rdma_get_max_num_connections``."""
        return self._cm_max

    @property
    def max_num_connections(self) -> int:
        return self._cm_max

    def set_connection_state_callbacks(
        self,
        request_cb: ConnectionRequestCallback,
        established_cb: ConnectionCallback,
        failure_cb: ConnectionCallback,
        disconnect_cb: ConnectionCallback,
    ) -> None:
        """``doca_rdma_set_connection_state_callbacks``; IDLE only.

        ``request_cb(connection, ctx_user_data)``; the others
        ``cb(connection, connection_user_data, ctx_user_data)`` (the
        connection-aware ``doca_rdma.h``).
        """
        self._require_idle("set_connection_state_callbacks")
        if not all(callable(cb) for cb in (request_cb, established_cb, failure_cb, disconnect_cb)):
            raise DocaError(DocaErrorCode.INVALID_VALUE, "the four connection callbacks must be callable")
        self._cm_callbacks = (request_cb, established_cb, failure_cb, disconnect_cb)

    def set_connection_timeout(self, seconds: float) -> None:
        """How long `connect_to_addr` waits for the connection before failing it (10 s); IDLE only."""
        self._require_idle("set_connection_timeout")
        if not isinstance(seconds, int | float) or not 0 < seconds <= 3600:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"timeout {seconds!r} is not in (0, 3600] seconds")
        self._cm_timeout = float(seconds)

    def _cm_ready(self, what: str) -> _Hub:
        self._check_not_closed()
        if self._state not in (CtxState.STARTING, CtxState.RUNNING) or self._qp is None:
            raise DocaError(DocaErrorCode.BAD_STATE, f"{what} needs a started context")
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
        """The context's oldest open connection (requested, connecting or established), if any."""
        return next(iter(self._cm_conns.values()), None)

    @property
    def connections(self) -> tuple[RdmaConnection, ...]:
        """The open connections, oldest first."""
        return tuple(self._cm_conns.values())

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
        """``doca_rdma_connect_to_addr``: a new connection, on a queue pair of its own.

        The established or failure callback follows. FULL when the context
        already holds ``max_num_connections`` open connections.
        """
        hub = self._cm_ready("connect_to_addr")
        if not isinstance(addr, RdmaAddr):
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{addr!r} is not an RdmaAddr")
        self._cm_check_room()
        ip = ipaddress.ip_address(addr.address)
        conn = RdmaConnection(self, self, -1, self._cm_free_id(), (str(ip), addr.port), b"")
        qp = self._cm_give_qp(conn)
        try:
            handle = hub.cm.connect(qp, ip, addr.port, b"", self._cm_timeout)
        except BaseException:
            self._cm_take_back_qp(conn)
            raise
        conn._handle = handle
        conn._state = "connecting"
        conn.set_user_data(user_data)
        self._cm_conns[handle] = conn
        hub.by_conn[handle] = self
        return conn

    def _cm_check_room(self) -> None:
        if len(self._cm_conns) >= self._cm_max:
            raise DocaError(
                DocaErrorCode.FULL,
                f"the context holds {len(self._cm_conns)} open connections, its max_num_connections "
                f"({self._cm_max}); disconnect one or set_max_num_connections before start",
                Fault.CALLER,
            )

    def _cm_free_id(self) -> int:
        taken = {c._id for c in self._cm_conns.values()}
        return next(i for i in range(len(taken) + 1) if i not in taken)

    # -- queue pairs ---------------------------------------------------------------------------

    def _new_qp(self) -> BackendQP:
        """For `Rdma`: a queue pair like the one made at start, in INIT."""
        raise NotImplementedError

    def _cm_give_qp(self, conn: RdmaConnection) -> BackendQP:
        """The queue pair made at start while no connection has used it, else a new one."""
        qp = self._qp
        if self._cm_primary is None and qp is not None and qp.state is QpState.INIT:
            self._cm_primary = conn
        else:
            qp = self._new_qp()
        conn._qp = qp
        return qp

    def _cm_take_back_qp(self, conn: RdmaConnection) -> None:
        qp, conn._qp = conn._qp, None
        if conn is self._cm_primary:
            self._cm_primary = None
        elif qp is not None:
            qp.close()

    def _cm_lanes(self) -> Sequence[BackendQP]:
        """Every queue pair whose completions the context collects: the start one first."""
        if not self._cm_conns and not self._cm_retired:  # by descriptor, or none yet: each progress
            return () if self._qp is None else (self._qp,)
        lanes = [] if self._qp is None else [self._qp]
        for conn in (*self._cm_conns.values(), *self._cm_retired):
            if conn._qp is not None and conn._qp is not self._qp:
                lanes.append(conn._qp)
        return lanes

    def _cm_drop_drained(self, busy: Iterable[BackendQP]) -> None:
        """Close the queue pairs of closed connections that no job in flight uses any more."""
        used = {id(qp) for qp in busy}
        keep: list[RdmaConnection] = []
        for conn in self._cm_retired:
            qp = conn._qp
            if qp is not None and id(qp) in used:
                keep.append(conn)
            elif qp is not None:
                conn._qp = None
                qp.close()
        self._cm_retired = keep

    def _cm_close_qps(self) -> None:
        """On stop and close: the queue pairs of every connection but the one made at start."""
        for conn in (*self._cm_conns.values(), *self._cm_retired):
            qp, conn._qp = conn._qp, None
            if qp is not None and qp is not self._qp:
                qp.close()
        self._cm_retired.clear()
        self._cm_primary = None

    def _cm_conn_of(self, qp: BackendQP) -> RdmaConnection | None:
        """The connection whose queue pair `qp` is; None for the start one connected by descriptor."""
        for conn in (*self._cm_conns.values(), *self._cm_retired):
            if conn._qp is qp:
                return conn
        return None

    def _cm_route(self, conn: object, receive: bool) -> tuple[BackendQP | None, RdmaConnection | None]:
        """The queue pair (and connection) a job on `conn` (None: the only one) goes to."""
        if conn is None:
            if not self._cm_conns:  # connected by descriptor (or not yet): the start queue pair
                return self._qp, None
            if len(self._cm_conns) > 1:
                raise DocaError(
                    DocaErrorCode.INVALID_VALUE,
                    f"the context has {len(self._cm_conns)} connections: name the one to use "
                    "(connection= of the job, rdma_connection= of the task)",
                    Fault.CALLER,
                )
            only = self.connection
            if only is None or only._qp is None:
                return self._qp, None
            conn = only
        if not isinstance(conn, RdmaConnection) or conn._ctx is not self:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{conn!r} is not a connection of this context")
        if conn._state == "closed" or conn._qp is None:
            if conn._state == "requested":
                raise DocaError(DocaErrorCode.BAD_STATE, f"{conn!r} is requested: accept it first")
            raise DocaError(DocaErrorCode.NOT_CONNECTED, f"{conn!r} is closed", Fault.PEER)
        if not receive and conn._state != "established":
            raise DocaError(DocaErrorCode.BAD_STATE, f"{conn!r} is not established yet")
        return conn._qp, conn

    # -- what RdmaConnection asks for ------------------------------------------------------------

    def _cm_accept(self, conn: RdmaConnection, private_data: bytes) -> None:
        hub = self._cm_ready("accept")
        qp = self._cm_give_qp(conn)
        try:
            hub.cm.accept(conn._handle, qp, private_data)
        except BaseException:
            self._cm_take_back_qp(conn)
            raise

    def _cm_reject(self, conn: RdmaConnection, private_data: bytes) -> None:
        if self._cm_hub is not None:
            self._cm_hub.cm.reject(conn._handle, private_data)
            self._cm_forget(conn, flush=False)

    def _cm_disconnect(self, conn: RdmaConnection) -> None:
        if conn._handle < 0:  # by export/connect: no CM to tell; the peer sees its QP fail
            self._cm_forget(conn, flush=True)
        elif self._cm_hub is not None:
            self._cm_hub.cm.disconnect(conn._handle)

    def _cm_forget(self, conn: RdmaConnection, *, flush: bool) -> None:
        """`conn` is closed: its queue pair goes to ERROR (if `flush`) and is retired."""
        conn._state = "closed"
        self._cm_conns.pop(conn._handle, None)
        if self._cm_hub is not None:
            self._cm_hub.by_conn.pop(conn._handle, None)
        qp = conn._qp
        if qp is None:
            return
        if flush:
            qp.to_error()  # IBTA §10.3.1: its outstanding work completes flushed
        if conn is self._cm_primary:
            self._cm_primary = None  # the start QP stays the context's; INIT again only after a stop
        elif flush:
            self._cm_retired.append(conn)
        else:
            self._cm_take_back_qp(conn)

    def _cm_release(self) -> None:
        """On stop or close: no more listening; every open connection is disconnected."""
        for port in list(self._cm_ports):
            self.stop_listen_to_port(port)
        for conn in list(self._cm_conns.values()):
            if conn._handle < 0:
                pass  # by export/connect
            elif conn._state == "requested" and self._cm_hub is not None:
                self._cm_hub.cm.reject(conn._handle, b"")
            else:
                conn.disconnect()
            self._cm_forget(conn, flush=True)
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
            started = self._state in (CtxState.STARTING, CtxState.RUNNING)
            if not started or len(self._cm_conns) >= self._cm_max:
                self._cm_hub.cm.reject(ev.conn, b"")  # max_num_connections reached
                return
            new = RdmaConnection(self, self, ev.conn, self._cm_free_id(), peer, ev.private_data)
            self._cm_conns[ev.conn] = new
            self._cm_hub.by_conn[ev.conn] = self
            request_cb(new, ud)
            return
        conn = self._cm_conns.get(ev.conn)
        if conn is None:
            return  # a connection this context already let go of
        if ev.kind is CmEventKind.ESTABLISHED:
            conn._state = "established"
            if ev.private_data:
                conn.private_data = ev.private_data
            if self._state is CtxState.STARTING:
                self._connected()
            established_cb(conn, conn.get_user_data(), ud)
        elif ev.kind in (CmEventKind.REJECTED, CmEventKind.UNREACHABLE):
            code = (
                DocaErrorCode.CONNECTION_ABORTED
                if ev.kind is CmEventKind.REJECTED
                else DocaErrorCode.TIME_OUT
            )
            self._error = conn._error = DocaError(
                code, f"connection to {conn.peer[0]}:{conn.peer[1]} failed: {ev.detail}", Fault.PEER
            )
            self._cm_forget(conn, flush=conn is not self._cm_primary)
            failure_cb(conn, conn.get_user_data(), ud)
        elif ev.kind is CmEventKind.DISCONNECTED:
            self._error = conn._error = DocaError(
                DocaErrorCode.CONNECTION_RESET,
                f"connection {conn._id} to {conn.peer[0]}:{conn.peer[1]} was disconnected",
                Fault.PEER,
            )
            self._cm_forget(conn, flush=True)
            disconnect_cb(conn, conn.get_user_data(), ud)
