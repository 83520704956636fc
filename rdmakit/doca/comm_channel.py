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

Connecting, the client sends a hello naming the protocol version, its
`max_msg_size` and a fresh nonce; the server answers with its own and the
size both will use (the smaller). On a Unix socket the kernel has told each
side who the other is (only the same user or root is talked to). On
``tcp:`` both sides then prove that they know a shared secret
(``rdmakit.transport.comm_auth``: HMAC-SHA256 challenge-response, the
server first, so a client never talks to an impostor), and every later
message carries a MAC with a sequence number. The secret is the `secret`
given, else the `secret_file`, else ``RDMAKIT_COMCH_SECRET`` (hex), else the
user's default key file (``~/.config/rdmakit/comch.key``, made on first use:
two programs of one user on one machine just work; between machines, copy
it).

A server keeps accepting until its timeout: a connection that does not
complete the handshake within `handshake_timeout` seconds (5), or fails it,
is closed (and logged) while other connections' handshakes go on; until a
client has proved itself it may send only a hello-sized message.

Errors (`DocaError`):

- the peer closed its end or died: CONNECTION_RESET [peer], from `recv`
  and `send`; the channel then refuses everything with NOT_CONNECTED;
- the channel was closed here: NOT_CONNECTED [caller];
- nothing arrived within the timeout: TIME_OUT; `try_recv` returns None
  instead (``DOCA_ERROR_AGAIN``, as `WorkQ.progress_retrieve`); a server's
  TIME_OUT names the connections it refused meanwhile;
- a message over `max_msg_size`: TOO_BIG [caller] on send; received, it
  breaks the protocol: the channel is closed and the error is the peer's;
- the service name is taken: IN_USE, naming the user who holds it;
  malformed: INVALID_VALUE; this user's service directory is another
  user's or open to others: NOT_PERMITTED, naming it and its owner;
- the other side speaks another protocol or version: UNSUPPORTED_VERSION;
- ``tcp:`` peer that cannot prove it knows the secret, or a message whose
  MAC is wrong: AUTHENTICATION [peer]; no usable secret: NOT_FOUND (no
  file), NOT_PERMITTED (a file others may read, or another user's),
  INVALID_VALUE (not hex, too short).
"""

import contextlib
import errno
import logging
import os
import select
import time
from collections.abc import Callable, Sequence
from typing import Any, Self

from rdmakit.doca._comch_handshake import (
    PREAUTH_MAX,
    ClientHandshake,
    ServerHandshake,
    check_max,
    service_address,
    service_secret,
)
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault, error_from_os
from rdmakit.transport.comm import MAX_MSG_LIMIT, Listener, MessageSocket, connect

__all__ = [
    "COMCH_MAX_MSG_LIMIT",
    "COMCH_MAX_MSG_SIZE",
    "CommChannel",
    "CommChannelServer",
]

log = logging.getLogger("rdmakit.comch")

#: The default largest message (DOCA Comm Channel's default is about 4 KiB too).
COMCH_MAX_MSG_SIZE = 4080
#: The largest `max_msg_size` a channel accepts.
COMCH_MAX_MSG_LIMIT = MAX_MSG_LIMIT
#: Seconds a server gives a new connection to complete the handshake.
COMCH_HANDSHAKE_TIMEOUT = 5.0

_MAX_PENDING = 16  # connections in the handshake at once; a new one pushes out the oldest


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


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
        cls,
        service: str,
        *,
        timeout: float | None = None,
        max_msg_size: int = COMCH_MAX_MSG_SIZE,
        secret: bytes | None = None,
        secret_file: str | os.PathLike[str] | None = None,
    ) -> Self:
        """Connect to the server of `service`, waiting up to `timeout` seconds (None: forever) for it.

        The server may start later than the client: until it listens, the
        connection is retried. TIME_OUT when the time runs out. Over ``tcp:``
        the server must prove that it knows the secret (AUTHENTICATION).
        """
        check_max(max_msg_size)
        address = service_address(service)
        key = service_secret(address, secret, secret_file)
        deadline = _deadline(timeout)
        try:
            sock = connect(address, max_msg_size=PREAUTH_MAX, timeout=timeout)
        except TimeoutError as exc:
            raise DocaError(
                DocaErrorCode.TIME_OUT, f"no comm channel server for {service!r} after {timeout:g} s"
            ) from exc
        except OSError as exc:
            raise error_from_os(exc, f"connecting to comm channel {service!r}") from exc
        channel = cls(sock, service, role="server")
        try:
            handshake = ClientHandshake(channel, sock, service, max_msg_size, key)
            handshake.begin(_left(deadline))
            channel._handshake_done(handshake, deadline)
        except BaseException:
            channel.close()
            raise
        return channel

    def _handshake_done(self, handshake: "ClientHandshake[Any]", deadline: float | None) -> None:
        """Wait for the server's answer until `deadline` (TIME_OUT, as a silent server)."""
        left = _left(deadline)
        if not handshake.step(left):
            raise DocaError(
                DocaErrorCode.TIME_OUT,
                f"comm channel {self._service!r}: nothing from the server after {left:g} s",
            )

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
            if exc.errno == errno.EBADMSG:
                self._reset = True
                raise DocaError(
                    DocaErrorCode.AUTHENTICATION,
                    f"comm channel {self._service!r}: {exc.strerror}",
                    Fault.PEER,
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

    def __init__(
        self,
        service: str,
        *,
        max_msg_size: int = COMCH_MAX_MSG_SIZE,
        secret: bytes | None = None,
        secret_file: str | os.PathLike[str] | None = None,
        handshake_timeout: float = COMCH_HANDSHAKE_TIMEOUT,
    ) -> None:
        check_max(max_msg_size)
        if not handshake_timeout > 0:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"handshake_timeout {handshake_timeout} is not positive"
            )
        self._service = service
        self._max = max_msg_size
        self._handshake_timeout = handshake_timeout
        address = service_address(service)
        self._secret = service_secret(address, secret, secret_file)
        try:
            self._listener: Listener | None = Listener(address, max_msg_size=max_msg_size)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                detail = exc.strerror if address.kind != "tcp" else "the address is in use"
                raise DocaError(
                    DocaErrorCode.IN_USE, f"comm channel service {service!r} already has a server: {detail}"
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

    def poll(
        self,
        pending: list[ServerHandshake[CommChannel]],
        refuse: Callable[[ServerHandshake[CommChannel], str], None],
    ) -> CommChannel | None:
        """One round that never blocks: take new connections into `pending`, advance their handshakes.

        Returns the first client that is in, or None. A handshake that fails
        or runs out of time goes to `refuse(handshake, why)`, which must take it
        out of `pending` and close it; so does the oldest one when more than
        16 are in the handshake at once.
        """
        listener = self._live()
        while True:
            try:
                sock = listener.accept(0)
            except OSError as exc:
                raise error_from_os(exc, f"accepting on comm channel {self._service!r}") from exc
            if sock is None:
                break
            if len(pending) >= _MAX_PENDING:
                refuse(pending[0], "too many connections in the handshake")
            chan = CommChannel(sock, self._service, role="client")
            deadline = time.monotonic() + self._handshake_timeout
            pending.append(ServerHandshake(chan, sock, self._service, self._max, self._secret, deadline))
        now = time.monotonic()
        for hs in list(pending):
            try:
                if hs.step(now):
                    pending.remove(hs)
                    return hs.channel
            except DocaError as exc:
                refuse(hs, exc.message)
        for hs in list(pending):
            if hs.deadline <= now:
                refuse(hs, f"no handshake within {self._handshake_timeout:g} s")
        return None

    def accept(self, timeout: float | None = None) -> CommChannel:
        """The next client that completes the handshake; TIME_OUT after `timeout` seconds (None: forever).

        Connections that fail the handshake, or do not finish it within
        `handshake_timeout`, are closed and logged; the others go on meanwhile.
        """
        listener = self._live()
        deadline = _deadline(timeout)
        pending: list[ServerHandshake[CommChannel]] = []
        refused: list[str] = []

        def refuse(hs: ServerHandshake[CommChannel], why: str) -> None:
            pending.remove(hs)
            hs.channel.close()
            refused.append(why)
            log.warning("comm channel %r: refused the connection from %s: %s", self._service, hs.peer, why)

        try:
            while True:
                chan = self.poll(pending, refuse)
                if chan is not None:
                    return chan
                now = time.monotonic()
                left = _left(deadline)
                if left == 0:
                    summary = ""
                    if refused:
                        summary = f" (refused {len(refused)} connection(s); the last: {refused[-1]})"
                    raise DocaError(
                        DocaErrorCode.TIME_OUT,
                        f"no client connected to comm channel {self._service!r} in {timeout:g} s{summary}",
                    )
                wait = min([left if left is not None else 3600.0, *(hs.deadline - now for hs in pending)])
                poller = select.poll()
                for fd in (listener.fileno(), *(hs.fileno() for hs in pending)):
                    poller.register(fd, select.POLLIN)
                poller.poll(max(0, int(wait * 1000 + 0.999)))
        finally:
            for hs in pending:
                hs.channel.close()

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
