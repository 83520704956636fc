"""DOCA Comm Channel (``doca_comm_channel.h``; ``doca_comch`` since DOCA 2.5): host <-> DPU messages.

A control path beside the data path: the DMA Copy application negotiates
over it, and the host hands the DPU its export descriptor with it. The DPU
side listens on a service name (`CommChannelServer`); the host connects to
it (`CommChannel.connect`); each connection is a `CommChannel` on which both
sides send and receive messages of 1 to `max_msg_size` bytes, reliably and
in order. Without a BlueField the two sides are processes: the service name
is a Unix socket on one machine or TCP between two (``rdmakit.transport.comm``
has the naming rules), and over a Unix socket a message may carry file
descriptors (``SCM_RIGHTS``), which is how an exported memory region's pages
reach the other process.

Connecting, the client sends a hello naming the protocol version and its
`max_msg_size`; the server answers with the size both will use (the smaller).

Errors (`DocaError`):

- the peer closed its end or died: CONNECTION_RESET [peer], from `recv`
  and `send`; the channel then refuses everything with NOT_CONNECTED;
- the channel was closed here: NOT_CONNECTED [caller];
- nothing arrived within the timeout: TIME_OUT; `try_recv` returns None
  instead (``DOCA_ERROR_AGAIN``, as `WorkQ.progress_retrieve`);
- a message over `max_msg_size`: TOO_BIG [caller] on send; received, it
  breaks the protocol: the channel is closed and the error is the peer's;
- the service name is taken: IN_USE; malformed: INVALID_VALUE;
- the other side speaks another protocol or version: UNSUPPORTED_VERSION.
"""

import contextlib
import errno
import os
import struct
import time
from collections.abc import Sequence
from typing import Self

from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault, error_from_os
from rdmakit.transport.comm import (
    MAX_MSG_LIMIT,
    Listener,
    MessageSocket,
    ServiceAddress,
    connect,
    parse_service,
)

__all__ = [
    "COMCH_MAX_MSG_LIMIT",
    "COMCH_MAX_MSG_SIZE",
    "CommChannel",
    "CommChannelServer",
]

#: The default largest message (DOCA Comm Channel's default is about 4 KiB too).
COMCH_MAX_MSG_SIZE = 4080
#: The largest `max_msg_size` a channel accepts.
COMCH_MAX_MSG_LIMIT = MAX_MSG_LIMIT

_HELLO = struct.Struct(">12sHI")  # magic, version, max_msg_size
_MAGIC = b"RDMAKITCOMCH"
_VERSION = 1


def _service(spec: str) -> ServiceAddress:
    try:
        return parse_service(spec)
    except ValueError as exc:
        raise DocaError(DocaErrorCode.INVALID_VALUE, str(exc)) from None


def _check_max(max_msg_size: int) -> None:
    if not _HELLO.size <= max_msg_size <= COMCH_MAX_MSG_LIMIT:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE,
            f"max_msg_size {max_msg_size} is outside {_HELLO.size}..{COMCH_MAX_MSG_LIMIT}",
        )


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _parse_hello(data: bytes, who: str) -> int:
    if len(data) != _HELLO.size:
        raise DocaError(DocaErrorCode.UNSUPPORTED_VERSION, f"{who} does not speak the rdmakit comm channel")
    magic, version, size = _HELLO.unpack(data)
    if magic != _MAGIC:
        raise DocaError(DocaErrorCode.UNSUPPORTED_VERSION, f"{who} does not speak the rdmakit comm channel")
    if version != _VERSION:
        raise DocaError(DocaErrorCode.UNSUPPORTED_VERSION, f"{who} speaks comm channel version {version}")
    if not _HELLO.size <= size <= COMCH_MAX_MSG_LIMIT:
        raise DocaError(DocaErrorCode.INVALID_VALUE, f"{who} offered max_msg_size {size}", Fault.PEER)
    return int(size)


class CommChannel:
    """One connection of a comm channel (``doca_comch_connection``). Not thread-safe.

    Obtain one with `CommChannel.connect` (client) or `CommChannelServer.accept`.
    """

    def __init__(self, sock: MessageSocket, service: str, *, role: str) -> None:
        self._sock: MessageSocket | None = sock
        self._service = service
        self._role = role
        self._reset = False

    @classmethod
    def connect(
        cls, service: str, *, timeout: float | None = None, max_msg_size: int = COMCH_MAX_MSG_SIZE
    ) -> Self:
        """Connect to the server of `service`, waiting up to `timeout` seconds (None: forever) for it.

        The server may start later than the client: until it listens, the
        connection is retried. TIME_OUT when the time runs out.
        """
        _check_max(max_msg_size)
        address = _service(service)
        deadline = _deadline(timeout)
        try:
            sock = connect(address, max_msg_size=max_msg_size, timeout=timeout)
        except TimeoutError as exc:
            raise DocaError(
                DocaErrorCode.TIME_OUT, f"no comm channel server for {service!r} after {timeout:g} s"
            ) from exc
        except OSError as exc:
            raise error_from_os(exc, f"connecting to comm channel {service!r}") from exc
        channel = cls(sock, service, role="server")
        try:
            channel._send(_HELLO.pack(_MAGIC, _VERSION, max_msg_size), (), _left(deadline))
            data, fds = channel._recv(_left(deadline), "before its hello")
            _close_fds(fds)
            sock.max_msg_size = min(max_msg_size, _parse_hello(data, f"server of {service!r}"))
        except BaseException:
            channel.close()
            raise
        return channel

    # -- properties -------------------------------------------------------------------

    @property
    def service(self) -> str:
        return self._service

    @property
    def max_msg_size(self) -> int:
        """Largest message either side may send on this connection (agreed at connect)."""
        return self._live().max_msg_size

    @property
    def fd_passing(self) -> bool:
        """Whether messages can carry file descriptors (Unix sockets, i.e. one machine)."""
        return self._live().address.fd_passing

    @property
    def connected(self) -> bool:
        return self._sock is not None and not self._reset

    def fileno(self) -> int:
        """Readable when a message (or the peer's end) is waiting: for select/epoll/trio."""
        return self._live().fileno()

    @property
    def local_ip(self) -> str | None:
        """The address this end of a TCP channel uses (None over a Unix socket)."""
        return self._live().local_ip

    def _live(self) -> MessageSocket:
        if self._sock is None:
            raise DocaError(DocaErrorCode.NOT_CONNECTED, f"comm channel {self._service!r} is closed")
        if self._reset:
            raise DocaError(
                DocaErrorCode.NOT_CONNECTED, f"comm channel {self._service!r}: the {self._role} is gone"
            )
        return self._sock

    def _gone(self, exc: OSError | None, doing: str) -> DocaError:
        self._reset = True
        detail = f" ({exc.strerror})" if exc is not None and exc.strerror else ""
        return DocaError(
            DocaErrorCode.CONNECTION_RESET,
            f"comm channel {self._service!r}: the {self._role} closed the connection ({doing}){detail}",
            Fault.PEER,
        )

    # -- send ---------------------------------------------------------------------------

    def send(
        self, msg: bytes | bytearray | memoryview, *, fds: Sequence[int] = (), timeout: float | None = None
    ) -> None:
        """Send one message of 1 to `max_msg_size` bytes, with `fds` (duplicated into the peer).

        `fds` need a Unix-socket channel (NOT_SUPPORTED over TCP). Blocks
        while the peer's receive queue is full, up to `timeout` (TIME_OUT).
        """
        sock = self._live()
        size = len(msg)
        if not 0 < size <= sock.max_msg_size:
            code = DocaErrorCode.INVALID_VALUE if size == 0 else DocaErrorCode.TOO_BIG
            raise DocaError(code, f"message of {size} bytes; 1 to {sock.max_msg_size} allowed")
        if fds and not sock.address.fd_passing:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, "file descriptors travel only over a Unix-socket channel"
            )
        self._send(msg if isinstance(msg, bytes) else memoryview(msg), fds, timeout)

    def _send(self, msg: bytes | memoryview, fds: Sequence[int], timeout: float | None) -> None:
        sock = self._live()
        try:
            sock.send(msg, fds, timeout)
        except TimeoutError as exc:
            raise DocaError(
                DocaErrorCode.TIME_OUT, f"comm channel {self._service!r}: the {self._role} is not reading"
            ) from exc
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise self._gone(exc, "while sending") from exc
        except OSError as exc:
            raise error_from_os(exc, f"sending on comm channel {self._service!r}") from exc

    # -- receive -------------------------------------------------------------------------

    def recv(self, timeout: float | None = None) -> bytes:
        """The next message; waits up to `timeout` seconds (None: forever), then TIME_OUT.

        Descriptors that came with it are closed: use `recv_fds` to keep them.
        """
        data, fds = self.recv_fds(timeout)
        _close_fds(fds)
        return data

    def recv_fds(self, timeout: float | None = None) -> tuple[bytes, list[int]]:
        """The next message and the descriptors sent with it (now the caller's to close)."""
        return self._recv(timeout, "while waiting for a message")

    def try_recv(self) -> bytes | None:
        """The next message if one is waiting, else None (``DOCA_ERROR_AGAIN``); never blocks.

        Also how a busy side notices that the peer went away (CONNECTION_RESET).
        """
        got = self._recv_or_none(0.0, "")
        if got is None:
            return None
        data, fds = got
        _close_fds(fds)
        return data

    def _recv(self, timeout: float | None, doing: str) -> tuple[bytes, list[int]]:
        got = self._recv_or_none(timeout, doing)
        if got is None:
            raise DocaError(
                DocaErrorCode.TIME_OUT,
                f"comm channel {self._service!r}: nothing from the {self._role} after {timeout:g} s",
            )
        return got

    def _recv_or_none(self, timeout: float | None, doing: str) -> tuple[bytes, list[int]] | None:
        sock = self._live()
        try:
            return sock.recv(timeout)
        except ConnectionResetError as exc:
            raise self._gone(None, doing or "while receiving") from exc
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                self._reset = True
                raise DocaError(
                    DocaErrorCode.TOO_BIG, f"comm channel {self._service!r}: {exc.strerror}", Fault.PEER
                ) from exc
            raise error_from_os(exc, f"receiving on comm channel {self._service!r}") from exc

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close this end (the peer sees CONNECTION_RESET); idempotent."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._sock is None else "reset" if self._reset else "connected"
        return f"<CommChannel {self._service!r} {state}>"


class CommChannelServer:
    """The listening side of a comm channel (``doca_comch_server``); on a BlueField, the DPU."""

    def __init__(self, service: str, *, max_msg_size: int = COMCH_MAX_MSG_SIZE) -> None:
        _check_max(max_msg_size)
        self._service = service
        self._max = max_msg_size
        try:
            self._listener: Listener | None = Listener(_service(service), max_msg_size=max_msg_size)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise DocaError(
                    DocaErrorCode.IN_USE, f"comm channel service {service!r} already has a server"
                ) from exc
            raise error_from_os(exc, f"listening on comm channel {service!r}") from exc

    @property
    def service(self) -> str:
        """The service name as given (``tcp:HOST:0`` stays as given; see `address`)."""
        return self._service

    @property
    def address(self) -> str:
        """The bound address, e.g. ``tcp:127.0.0.1:41233``: what a client passes to `CommChannel.connect`."""
        listener = self._live()
        address = listener.address
        return str(address) if address.kind == "tcp" else self._service

    @property
    def max_msg_size(self) -> int:
        return self._max

    def _live(self) -> Listener:
        if self._listener is None:
            raise DocaError(DocaErrorCode.NOT_CONNECTED, f"comm channel server {self._service!r} is closed")
        return self._listener

    def fileno(self) -> int:
        """Readable when a client is waiting to be accepted."""
        return self._live().fileno()

    def accept(self, timeout: float | None = None) -> CommChannel:
        """The next client's connection, after the hello; TIME_OUT after `timeout` seconds (None: forever)."""
        listener = self._live()
        deadline = _deadline(timeout)
        try:
            sock = listener.accept(timeout)
        except OSError as exc:
            raise error_from_os(exc, f"accepting on comm channel {self._service!r}") from exc
        if sock is None:
            raise DocaError(
                DocaErrorCode.TIME_OUT,
                f"no client connected to comm channel {self._service!r} in {timeout:g} s",
            )
        channel = CommChannel(sock, self._service, role="client")
        try:
            data, fds = channel._recv(_left(deadline), "before its hello")
            _close_fds(fds)
            size = min(self._max, _parse_hello(data, f"client of {self._service!r}"))
            channel._send(_HELLO.pack(_MAGIC, _VERSION, size), (), _left(deadline))
            sock.max_msg_size = size
        except BaseException:
            channel.close()
            raise
        return channel

    def close(self) -> None:
        """Stop listening; accepted channels stay open. Idempotent."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._listener is None else "listening"
        return f"<CommChannelServer {self._service!r} {state}>"


def _close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
