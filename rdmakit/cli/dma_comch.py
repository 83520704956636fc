"""DMA Copy's control path on ``doca_comch``: a server or client context driven by the device's engine.

DOCA's DMA Copy application (2.5+) talks over a ``doca_comch_server`` on the
DPU and a ``doca_comch_client`` on the host, both on the progress engine of
the DMA device (``-p``). `ComchEndpoint` is that context and the one
connection the copy uses, with the calls the conversation needs (send a
message and wait for its task's completion, wait for the next message, look
without waiting), each of which runs the engine, so every callback runs
inside ``progress`` as DOCA requires.

The DPU's server talks to its first connection only: a later client is
disconnected at once (logged), and only the first connection's messages
reach the conversation, so nobody else can speak in the host's name.
"""

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Self

from rdmakit.doca import (
    ComchClient,
    ComchConnection,
    ComchEventConnectionStatusChanged,
    ComchEventMsgRecv,
    ComchServer,
    ComchTaskSend,
    CtxState,
    Dev,
    DocaError,
    DocaErrorCode,
)
from rdmakit.transport.driver import wait_readable

log = logging.getLogger("rdmakit.dma")

_NAP = 0.05  # seconds an idle wait sleeps on the engine's handle before it looks again
_STOP_GRACE = 2.0  # seconds a closing endpoint gives its context to reach IDLE


class ComchEndpoint:
    """One side of the copy's comm channel: a started comch context and its connection."""

    def __init__(self, ctx: ComchServer | ComchClient, role: str) -> None:
        self._ctx = ctx
        self._role = role  # the peer: "server" (the DPU) or "client" (the host)
        self._pe = ctx.get_device().pe
        self._inbox: deque[tuple[bytes, list[int]]] = deque()
        self._conn: ComchConnection | None = None
        self._done: list[ComchTaskSend] = []
        ctx.task_send_set_conf(self._sent, self._sent, 1)
        ctx.event_msg_recv_register(self._received)

    @classmethod
    def connect(
        cls, dev: Dev, service: str, *, timeout: float, secret_file: str | os.PathLike[str] | None
    ) -> Self:
        """The host's side: a client connected to the DPU's server within `timeout` (TIME_OUT)."""
        client = ComchClient(dev, service, secret_file=secret_file)
        try:
            dev.pe.connect_ctx(client)
            end = cls(client, "server")
            client.start()
            end._until(lambda: client.state is not CtxState.STARTING, timeout, "")
            if client.state is not CtxState.RUNNING:
                assert client.error is not None
                raise client.error
            end._conn = client.get_connection()
        except DocaError as exc:
            client.close()
            if exc.code is DocaErrorCode.TIME_OUT:
                raise DocaError(
                    DocaErrorCode.TIME_OUT, f"no comm channel server for {service!r} after {timeout:g} s"
                ) from None
            raise
        except BaseException:
            client.close()
            raise
        return end

    @classmethod
    def accept(
        cls, dev: Dev, service: str, *, timeout: float, secret_file: str | os.PathLike[str] | None
    ) -> Self:
        """The DPU's side: a server whose first client connected within `timeout` (TIME_OUT)."""
        server = ComchServer(dev, service, secret_file=secret_file)
        try:
            dev.pe.connect_ctx(server)
            end = cls(server, "client")
            server.event_connection_status_changed_register(end._connected, end._disconnected)
            server.start()
            end._until(
                lambda: end._conn is not None,
                timeout,
                f"no client connected to comm channel {service!r} in {timeout:g} s",
            )
        except BaseException:
            server.close()
            raise
        return end

    # -- callbacks (inside progress) -------------------------------------------------------------

    def _connected(self, event: ComchEventConnectionStatusChanged, conn: ComchConnection, ok: int) -> None:
        if self._conn is None:
            self._conn = conn
            return
        log.warning(
            "comm channel %r: %s connected while the copy runs: disconnected", self.service, conn.peer
        )
        assert isinstance(self._ctx, ComchServer)
        self._ctx.disconnect(conn)

    def _disconnected(self, event: ComchEventConnectionStatusChanged, conn: ComchConnection, ok: int) -> None:
        log.debug("comm channel %r: %s disconnected: %s", self.service, conn.peer, event.reason)

    def _received(self, event: ComchEventMsgRecv, data: bytes, msg_len: int, conn: ComchConnection) -> None:
        if self._conn is None and isinstance(self._ctx, ComchClient):
            self._conn = conn  # a client has one connection; the server may speak in the handshake's progress
        if conn is not self._conn:
            return  # not the peer of the copy (the server has disconnected it)
        self._inbox.append((data, event.take_fds()))

    def _sent(self, task: ComchTaskSend, task_ud: object, ctx_ud: object) -> None:
        self._done.append(task)

    # -- what the conversation uses --------------------------------------------------------------

    @property
    def service(self) -> str:
        return self._ctx.name

    @property
    def fd_passing(self) -> bool:
        return self._live().fd_passing

    @property
    def local_ip(self) -> str | None:
        return self._live().local_ip

    def _live(self) -> ComchConnection:
        conn = self._conn
        if conn is None:
            raise DocaError(DocaErrorCode.NOT_CONNECTED, f"comm channel {self.service!r} has no connection")
        if conn.error is not None:
            raise conn.error  # CONNECTION_RESET when the peer went away
        return conn

    def send(self, msg: bytes, *, fds: tuple[int, ...] = (), timeout: float | None = None) -> None:
        """Send `msg` (with `fds`) and wait for its task to complete: raises why it failed."""
        conn = self._live()
        task = self._ctx.task_send_alloc_init(conn, msg, fds=fds)
        try:
            task.submit()
        except BaseException:
            task.free()
            raise
        self._until(
            lambda: task in self._done,
            timeout,
            f"comm channel {self.service!r}: the {self._role} is not reading",
        )
        self._done.remove(task)
        status, error = task.get_status(), task.error
        task.free()
        if status is not DocaErrorCode.SUCCESS:
            self._live()  # the connection's own reason first (the peer went away)
            assert error is not None
            raise error

    def recv_fds(self, timeout: float | None) -> tuple[bytes, list[int]]:
        """The next message and its descriptors (the caller's to close); TIME_OUT after `timeout`."""
        self._until(
            self._has_message,
            timeout,
            f"comm channel {self.service!r}: nothing from the {self._role} after {timeout:g} s",
        )
        return self._inbox.popleft()

    def _has_message(self) -> bool:
        if self._inbox:
            return True
        self._live()  # the peer went away: CONNECTION_RESET
        return False

    def recv(self, timeout: float | None) -> bytes:
        data, fds = self.recv_fds(timeout)
        for fd in fds:
            os.close(fd)
        return data

    def try_recv(self) -> bytes | None:
        """The next message if one came (descriptors closed), else None; CONNECTION_RESET if the peer left."""
        self._pe.progress()
        if self._inbox:
            data, fds = self._inbox.popleft()
            for fd in fds:
                os.close(fd)
            return data
        self._live()
        return None

    def _until(self, cond: Callable[[], bool], timeout: float | None, what: str) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not cond():
            if self._pe.progress():
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise DocaError(DocaErrorCode.TIME_OUT, what)
            wait_readable(self._pe.fileno(), _NAP if left is None else min(left, _NAP))

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the context through progress (the peer sees the connection end), then destroy it."""
        ctx = self._ctx
        if ctx.closed:
            return
        try:
            if ctx.state is not CtxState.IDLE and ctx.stop() is DocaErrorCode.IN_PROGRESS:
                # Progress can finish what is in flight, not free a task its holder still has (a
                # frame of an interrupted traceback): once only such tasks are left, close halts it.
                self._until(self._stopped, _STOP_GRACE, "comch context stopping")
        except DocaError as exc:
            log.debug("comm channel %r: %s", self.service, exc)
        finally:
            for _, fds in self._inbox:
                for fd in fds:
                    os.close(fd)
            self._inbox.clear()
            ctx.close()

    def _stopped(self) -> bool:
        """IDLE, or nothing in flight: only tasks their holder still has (close halts those)."""
        return self._ctx.state is CtxState.IDLE or not self._ctx.num_inflight

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
