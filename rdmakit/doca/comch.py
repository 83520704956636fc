"""DOCA Comch (DOCA 2.5+, ``doca_comch.h``): the comm channel as a context on a progress engine.

A `ComchServer` (the DPU side) listens on a name; `ComchClient` s (the host)
connect to it. Both are contexts, driven as ``doca_comch.h`` and DOCA's
samples drive them::

    pe = PE()                                            # the device's engine
    server = ComchServer(dev, "svc")                     # doca_comch_server_create
    server.set_max_msg_size(4080); server.set_recv_queue_size(16)   # IDLE only
    pe.connect_ctx(server)
    server.task_send_set_conf(on_sent, on_send_error, 16)
    server.event_msg_recv_register(on_msg)               # (event, data, msg_len, connection)
    server.event_connection_status_changed_register(on_connect, on_disconnect)
    server.start()                                       # SUCCESS: RUNNING, listening
    client.start()                                       # IN_PROGRESS: STARTING until progress connects
    server.task_send_alloc_init(connection, b"hi").submit()
    while ...: pe.progress()                             # every callback runs in here

Underneath is ``rdmakit.doca.comm_channel``'s authenticated channel: a Unix
socket on one machine (the kernel names the peer; only the same user or root
is talked to), TCP between machines (both sides prove a shared secret, and
every message carries a MAC). Everything a peer sends is hostile input: a
connection is a `ComchConnection` only once its handshake succeeded (at most
16 handshakes at once, 5 s each, `cap_get_max_clients` connections); a
message over the agreed size, a bad MAC or a malformed hello ends that
connection alone. A progress call delivers at most ``recv_queue_size``
messages per connection, so one flooding peer cannot starve the others.

Lifecycle (``doca_ctx.h``, as in DOCA's sync_event and comch samples): a
server's ``start`` returns SUCCESS (RUNNING); a client's returns IN_PROGRESS
and it becomes RUNNING inside ``progress`` once the handshake is done (until
a server listens, it tries again at each progress). A client whose handshake
fails (the server refused it, a wrong secret) goes to IDLE inside ``progress``
and keeps the reason in `ComchClient.error`. ``stop`` closes the connections
(the peers see them end) and fails send tasks still queued with SHUTDOWN in
``progress``; with tasks allocated or in flight it returns IN_PROGRESS.

Where rdmakit differs, and why:

- a connection that ends is reported to a server by the disconnect callback;
  a client (``doca_comch.h`` 2.5 has no client connection event) sees its
  connection's ``error`` set, and its send tasks fail with NOT_CONNECTED;
- the device and representor are accepted and recorded, but the channel is a
  socket: ``name`` is a service name of ``rdmakit.transport.comm``;
- send tasks may carry file descriptors over a Unix socket (`ComchTaskSend`).
"""

import logging
import os
import time
from collections import deque
from collections.abc import Callable

from rdmakit.doca._comch_handshake import (
    MAX_MSG_LIMIT,
    PREAUTH_MAX,
    ClientHandshake,
    ServerHandshake,
    check_max,
    service_address,
    service_secret,
)
from rdmakit.doca.comch_tasks import (
    ComchConnection,
    ComchEventConnectionStatusChanged,
    ComchEventMsgRecv,
    ComchSendJob,
    ComchTaskSend,
)
from rdmakit.doca.comm_channel import (
    COMCH_HANDSHAKE_TIMEOUT,
    COMCH_MAX_MSG_SIZE,
    CommChannel,
    CommChannelServer,
)
from rdmakit.doca.ctx import Ctx, CtxState
from rdmakit.doca.device import Dev, DevInfo
from rdmakit.doca.errors import DocaError, DocaErrorCode, error_from_os
from rdmakit.doca.tasks import TaskCallback, set_task_conf
from rdmakit.transport.comm import connect

__all__ = [
    "COMCH_MAX_CLIENTS",
    "COMCH_MAX_NAME_LEN",
    "COMCH_MAX_RECV_QUEUE_SIZE",
    "COMCH_MAX_SEND_TASKS",
    "ComchClient",
    "ComchServer",
    "MsgRecvCallback",
]

log = logging.getLogger("rdmakit.comch")

#: Longest name, with its terminating NUL (``tcp:`` + a DNS name + a port fits).
COMCH_MAX_NAME_LEN = 270
#: Most messages a connection delivers per progress call.
COMCH_MAX_RECV_QUEUE_SIZE = 4096
#: Most connections a server holds at once (each a socket and a descriptor on the engine).
COMCH_MAX_CLIENTS = 256
#: Largest send task pool.
COMCH_MAX_SEND_TASKS = 65536
_DEFAULT_RECV_QUEUE_SIZE = 64
_TCP_SEND_STALL = 5.0  # seconds a TCP send may wait for a peer that does not read before it is dropped
_RETRY = 0.02  # seconds between a client's attempts while no server listens

#: ``doca_comch_event_msg_recv_cb_t``: (event, message, msg_len, connection).
MsgRecvCallback = Callable[[ComchEventMsgRecv, bytes, int, ComchConnection], None]
#: ``doca_comch_event_connection_status_changed_cb_t``: (event, connection, change_successful).
ConnectionCallback = Callable[[ComchEventConnectionStatusChanged, ComchConnection, int], None]


class _Comch(Ctx[ComchSendJob]):
    """What a comch server and client share: properties, send tasks, receive events."""

    comch_role: str  # "server" or "client"

    def __init__(
        self,
        dev: Dev,
        name: str,
        *,
        secret: bytes | None = None,
        secret_file: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name or len(name.encode()) >= COMCH_MAX_NAME_LEN:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"name {name!r}: 1 to {COMCH_MAX_NAME_LEN - 1} bytes"
            )
        self._address = service_address(name)
        super().__init__()
        self._name = name
        self._secret_arg = secret
        self._secret_file = secret_file
        self._max = COMCH_MAX_MSG_SIZE
        self._recv_queue_size = _DEFAULT_RECV_QUEUE_SIZE
        self._recv_cb: MsgRecvCallback | None = None
        self._conns: list[ComchConnection] = []
        self._outbox: deque[ComchSendJob] = deque()
        self.add_dev(dev)

    # -- capabilities (doca_comch_cap_*) -----------------------------------------------------

    @staticmethod
    def cap_get_max_name_len(devinfo: DevInfo) -> int:
        """``doca_comch_cap_get_max_name_len``: "including the terminating null byte"."""
        return COMCH_MAX_NAME_LEN

    @staticmethod
    def cap_get_max_msg_size(devinfo: DevInfo) -> int:
        """``doca_comch_cap_get_max_msg_size``: the largest message the sockets carry."""
        return MAX_MSG_LIMIT

    @staticmethod
    def cap_get_max_recv_queue_size(devinfo: DevInfo) -> int:
        """``doca_comch_cap_get_max_recv_queue_size``."""
        return COMCH_MAX_RECV_QUEUE_SIZE

    @staticmethod
    def cap_get_max_clients(devinfo: DevInfo) -> int:
        """``doca_comch_cap_get_max_clients``: connections one server holds."""
        return COMCH_MAX_CLIENTS

    @staticmethod
    def cap_get_max_send_tasks(devinfo: DevInfo) -> int:
        """``doca_comch_cap_get_max_send_tasks``."""
        return COMCH_MAX_SEND_TASKS

    # -- properties (IDLE only) -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def max_msg_size(self) -> int:
        return self._max

    def set_max_msg_size(self, size: int) -> None:
        """``doca_comch_*_set_max_msg_size``: INVALID_VALUE out of range, BAD_STATE unless IDLE."""
        self._require_idle("set_max_msg_size")
        check_max(size)
        self._max = size

    def get_max_msg_size(self) -> int:
        return self._max

    def set_recv_queue_size(self, size: int) -> None:
        """``doca_comch_*_set_recv_queue_size``: 1 to `cap_get_max_recv_queue_size`, IDLE only."""
        self._require_idle("set_recv_queue_size")
        if type(size) is not int or not 1 <= size <= COMCH_MAX_RECV_QUEUE_SIZE:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"recv queue size {size!r} is outside 1..{COMCH_MAX_RECV_QUEUE_SIZE}",
            )
        self._recv_queue_size = size

    def get_recv_queue_size(self) -> int:
        return self._recv_queue_size

    def get_device(self) -> Dev:
        """``doca_comch_*_get_device``."""
        return self._devs[0]

    def event_msg_recv_register(self, recv_event_cb: MsgRecvCallback) -> None:
        """``doca_comch_*_event_msg_recv_register``: "BAD_STATE - doca_comch context state is not idle"."""
        self._require_idle("event_msg_recv_register")
        if not callable(recv_event_cb):
            raise DocaError(DocaErrorCode.INVALID_VALUE, "the receive callback must be callable")
        self._recv_cb = recv_event_cb

    # -- send tasks -------------------------------------------------------------------------------

    def task_send_set_conf(
        self,
        task_completion_cb: TaskCallback[ComchTaskSend],
        task_error_cb: TaskCallback[ComchTaskSend],
        num_send_tasks: int,
    ) -> None:
        """``doca_comch_*_task_send_set_conf``: IDLE only; at most `cap_get_max_send_tasks`."""
        if type(num_send_tasks) is int and num_send_tasks > COMCH_MAX_SEND_TASKS:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"num_send_tasks {num_send_tasks} > {COMCH_MAX_SEND_TASKS}"
            )
        set_task_conf(self, ComchTaskSend, task_completion_cb, task_error_cb, num_send_tasks)

    def task_send_alloc_init(
        self,
        peer: ComchConnection,
        msg: bytes | bytearray | memoryview,
        user_data: object = None,
        *,
        fds: tuple[int, ...] = (),
    ) -> ComchTaskSend:
        """``doca_comch_*_task_send_alloc_init``: INVALID_VALUE for a foreign connection or a bad size."""
        return ComchTaskSend(self, peer, msg, user_data, fds)

    def _submit(self, job: ComchSendJob) -> None:
        if not job.connection.connected:
            why = job.connection.error.message if job.connection.error else "it was disconnected"
            self._complete(
                job, error=DocaError(DocaErrorCode.NOT_CONNECTED, f"{job.connection!r} has ended: {why}")
            )
            return
        self._outbox.append(job)

    def _cancel(self) -> None:
        self._outbox.clear()

    # -- progress ---------------------------------------------------------------------------------

    def _progress(self) -> bool:
        if self._state is CtxState.IDLE or self._closed:
            return False
        busy = self._advance()
        busy = self._send_queued() or busy
        for conn in list(self._conns):
            busy = self._receive(conn) or busy
        return busy

    def _advance(self) -> bool:
        """Accept or connect; True if anything happened."""
        return False

    def _send_queued(self) -> bool:
        busy = False
        while self._outbox:
            job = self._outbox[0]
            conn = job.connection
            if not conn.connected:
                self._outbox.popleft()
                self._complete(job, error=DocaError(DocaErrorCode.NOT_CONNECTED, f"{conn!r} has ended"))
                continue
            unix = conn.fd_passing
            try:
                conn.channel.send(job.msg, fds=job.fds, timeout=0.0 if unix else _TCP_SEND_STALL)
            except DocaError as exc:
                if unix and exc.code is DocaErrorCode.TIME_OUT:
                    break  # the peer's queue is full: the rest waits for the next progress
                self._outbox.popleft()
                self._lost(conn, exc)
                self._complete(job, error=exc)
                busy = True
                continue
            self._outbox.popleft()
            conn._count(0, len(job.msg))
            self._complete(job)
            busy = True
        return busy

    def _receive(self, conn: ComchConnection) -> bool:
        for n in range(self._recv_queue_size):
            try:
                got = conn.channel._recv_or_none(0.0, "")
            except DocaError as exc:
                self._lost(conn, exc)
                return True
            if got is None:
                return n > 0
            data, fds = got
            conn._count(2, len(data))
            event = ComchEventMsgRecv(fds)
            try:
                if self._recv_cb is not None:
                    self._recv_cb(event, data, len(data), conn)
                else:
                    log.debug(
                        "comch %r: no receive callback; a message of %d bytes dropped", self._name, len(data)
                    )
            finally:
                event._close()
        return True

    def _lost(self, conn: ComchConnection, error: DocaError, *, by_peer: bool = True) -> None:
        """`conn` ended: the peer left or broke the protocol, or this side disconnected it."""
        if conn.error is None:
            conn.error = error
        if conn in self._conns:
            self._conns.remove(conn)
            self._unwatch_fd(conn.fd)
        conn.channel.close()
        for job in [j for j in self._outbox if j.connection is conn]:
            self._outbox.remove(job)
            self._complete(job, error=DocaError(DocaErrorCode.NOT_CONNECTED, f"{conn!r} has ended"))
        if by_peer:
            self._on_lost(conn, error)

    def _on_lost(self, conn: ComchConnection, error: DocaError) -> None:
        """For the server: the disconnect callback."""

    def _add_conn(self, channel: CommChannel, peer: str) -> ComchConnection:
        conn = ComchConnection(self, channel, peer, self.comch_role)
        self._conns.append(conn)
        self._watch_fd(conn.fd)
        return conn

    def _drop_all(self, reason: str) -> None:
        for conn in list(self._conns):
            self._lost(conn, DocaError(DocaErrorCode.NOT_CONNECTED, reason), by_peer=False)

    def _secret(self) -> bytes | None:
        return service_secret(self._address, self._secret_arg, self._secret_file)


class ComchServer(_Comch):
    """``doca_comch_server``: listens on `name`; each client that completes the handshake is a connection."""

    comch_role = "server"  # its connections' get_server_ctx returns it

    def __init__(
        self,
        dev: Dev,
        name: str,
        repr: Dev | None = None,
        *,
        secret: bytes | None = None,
        secret_file: str | os.PathLike[str] | None = None,
        handshake_timeout: float = COMCH_HANDSHAKE_TIMEOUT,
    ) -> None:
        """``doca_comch_server_create(dev, repr, name)``."""
        super().__init__(dev, name, secret=secret, secret_file=secret_file)
        self._repr = repr
        self._handshake_timeout = handshake_timeout
        self._server: CommChannelServer | None = None
        self._handshakes: list[ServerHandshake[CommChannel]] = []
        self._connect_cb: ConnectionCallback | None = None
        self._disconnect_cb: ConnectionCallback | None = None

    @staticmethod
    def cap_server_is_supported(devinfo: DevInfo) -> None:
        """``doca_comch_cap_server_is_supported``: every device here can (the channel is a socket)."""

    def get_device_repr(self) -> Dev | None:
        """``doca_comch_server_get_device_repr``."""
        return self._repr

    @property
    def address(self) -> str:
        """rdmakit: the bound address while RUNNING (``tcp:HOST:0`` gets its port here)."""
        if self._server is None:
            raise DocaError(DocaErrorCode.BAD_STATE, f"comch server {self._name!r} is not listening")
        return self._server.address

    @property
    def connections(self) -> tuple[ComchConnection, ...]:
        return tuple(self._conns)

    def event_connection_status_changed_register(
        self, connect_event_cb: ConnectionCallback, disconnect_event_cb: ConnectionCallback
    ) -> None:
        """``doca_comch_server_event_connection_status_changed_register``; IDLE only."""
        self._require_idle("event_connection_status_changed_register")
        if not callable(connect_event_cb) or not callable(disconnect_event_cb):
            raise DocaError(DocaErrorCode.INVALID_VALUE, "the connection callbacks must be callable")
        self._connect_cb, self._disconnect_cb = connect_event_cb, disconnect_event_cb

    #: The DOCA 2.5 header's name of the same function.
    event_connection_register = event_connection_status_changed_register

    def disconnect(self, connection: ComchConnection) -> None:
        """``doca_comch_server_disconnect``: end `connection`; the peer sees it end ("notify the peer")."""
        if connection not in self._conns:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{connection!r} is not a connection of this server")
        self._lost(
            connection, DocaError(DocaErrorCode.NOT_CONNECTED, "disconnected by this server"), by_peer=False
        )

    def _start(self) -> bool:
        self._server = CommChannelServer(
            self._name,
            max_msg_size=self._max,
            secret=self._secret_arg,
            secret_file=self._secret_file,
            handshake_timeout=self._handshake_timeout,
        )
        self._watch_fd(self._server.fileno())
        return True

    def _advance(self) -> bool:
        server = self._server
        if server is None:
            return False
        busy = False
        while True:
            before = len(self._handshakes)
            channel = server.poll(self._handshakes, self._refuse)
            if channel is None:
                return busy or len(self._handshakes) != before
            busy = True
            if len(self._conns) >= COMCH_MAX_CLIENTS:
                log.warning(
                    "comch %r: refused a client: %d connections already", self._name, COMCH_MAX_CLIENTS
                )
                channel.close()
                continue
            peer = channel._live().peer
            conn = self._add_conn(channel, peer)
            log.info("comch %r: %s connected", self._name, peer)
            if self._connect_cb is not None:
                self._connect_cb(ComchEventConnectionStatusChanged(connected=True), conn, 1)

    def _refuse(self, hs: ServerHandshake[CommChannel], why: str) -> None:
        self._handshakes.remove(hs)
        hs.channel.close()
        log.warning("comch %r: refused the connection from %s: %s", self._name, hs.peer, why)

    def _on_lost(self, conn: ComchConnection, error: DocaError) -> None:
        log.info("comch %r: %s disconnected: %s", self._name, conn.peer, error.message)
        if self._disconnect_cb is not None:
            event = ComchEventConnectionStatusChanged(connected=False, reason=error.message)
            self._disconnect_cb(event, conn, 1)

    def _unlisten(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            self._unwatch_fd(server.fileno())
            server.close()
        for hs in self._handshakes:
            hs.channel.close()
        self._handshakes.clear()

    def _stop(self) -> None:
        self._unlisten()
        self._drop_all(f"comch server {self._name!r} stopped")
        self._flush("comch server stopped")

    def _close(self) -> None:
        self._unlisten()
        self._drop_all(f"comch server {self._name!r} destroyed")

    def __repr__(self) -> str:
        return f"<ComchServer {self._name!r} {self._state.name} connections={len(self._conns)}>"


class ComchClient(_Comch):
    """``doca_comch_client``: connects to the server of `name`; one connection."""

    comch_role = "client"  # its connection's get_client_ctx returns it

    def __init__(
        self,
        dev: Dev,
        name: str,
        *,
        secret: bytes | None = None,
        secret_file: str | os.PathLike[str] | None = None,
    ) -> None:
        """``doca_comch_client_create(dev, name)``."""
        super().__init__(dev, name, secret=secret, secret_file=secret_file)
        self._handshake: ClientHandshake[CommChannel] | None = None
        self._hs_fd = -1
        self._key: bytes | None = None
        self._conn: ComchConnection | None = None
        self._next_try = 0.0
        self.error: DocaError | None = None  # why the last start failed

    @staticmethod
    def cap_client_is_supported(devinfo: DevInfo) -> None:
        """``doca_comch_cap_client_is_supported``: every device here can (the channel is a socket)."""

    def get_connection(self) -> ComchConnection:
        """``doca_comch_client_get_connection``: "BAD_STATE - cc instance is not started"."""
        if self._conn is None or self._state is not CtxState.RUNNING:
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"comch client {self._name!r} is {self._state.name}, not connected"
            )
        return self._conn

    def _start(self) -> bool:
        self._key = self._secret()
        self.error = None
        self._conn = None
        self._next_try = 0.0
        return False  # STARTING until progress has done the handshake

    def _advance(self) -> bool:
        if self._state is not CtxState.STARTING:
            return False
        try:
            return self._connecting()
        except DocaError as exc:
            self._abandon()
            self.error = exc
            log.debug("comch client %r: %s", self._name, exc.message)  # kept in `error`
            self.stop()  # STARTING -> STOPPING -> IDLE, inside this progress
            return True

    def _connecting(self) -> bool:
        hs = self._handshake
        if hs is None:
            now = time.monotonic()
            if now < self._next_try:
                return False
            self._next_try = now + _RETRY
            try:
                sock = connect(self._address, max_msg_size=PREAUTH_MAX, timeout=0)
            except TimeoutError:
                return False  # nobody listens yet
            except OSError as exc:
                raise error_from_os(exc, f"connecting to comch server {self._name!r}") from exc
            channel = CommChannel(sock, self._name, role="server")
            hs = self._handshake = ClientHandshake(channel, sock, self._name, self._max, self._key)
            self._hs_fd = sock.fileno()
            self._watch_fd(self._hs_fd)
            hs.begin(_TCP_SEND_STALL)
        if not hs.step(0.0):
            return False
        self._handshake = None
        channel = hs.channel
        self._unwatch_fd(self._hs_fd)
        self._conn = self._add_conn(channel, channel._live().peer)
        self._connected()  # inside progress: RUNNING now, with its state callback
        return True

    def _abandon(self) -> None:
        hs, self._handshake = self._handshake, None
        if hs is not None:
            self._unwatch_fd(self._hs_fd)
            hs.channel.close()

    def _stop(self) -> None:
        self._abandon()
        self._drop_all(f"comch client {self._name!r} stopped")
        self._flush("comch client stopped")

    def _close(self) -> None:
        self._abandon()
        self._drop_all(f"comch client {self._name!r} destroyed")

    def __repr__(self) -> str:
        return f"<ComchClient {self._name!r} {self._state.name}>"
