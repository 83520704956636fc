"""Sockets of the comm channel: ordered, reliable messages between two processes.

This is the socket half of ``rdmakit.doca.comm_channel``; the DOCA object and
its error codes live there. A service name selects the socket:

- ``NAME`` (letters, digits and ``._-``, at most 80 characters): a Unix
  ``SOCK_SEQPACKET`` socket ``comch.NAME`` in this user's own directory,
  ``$XDG_RUNTIME_DIR/rdmakit`` or, without that variable,
  ``/tmp/rdmakit-<uid>`` (`runtime_dir`). The directory is created mode 0700
  and must be this user's and 0700 (lstat: not a symlink); otherwise
  EACCES naming its owner. Nobody else can create a name in it, so no other
  user can take a service name first (as anyone can in the abstract
  namespace, which has no permissions).
- ``unix:PATH``: the same at a path of the caller's choice.
- ``tcp:HOST:PORT`` (``tcp:[V6]:PORT``): a TCP stream, for two machines. A
  message travels as a 4-byte big-endian length and the bytes, and, once
  `MessageSocket.start_mac` is called, a MAC (``rdmakit.transport.comm_auth``).

A socket file left behind by a listener that died is replaced; a live
listener is EADDRINUSE, naming the user that holds it.

On Unix sockets each side checks the other's user (``SO_PEERCRED``): only
the same user or root is talked to. A server drops such a client and keeps
listening; a client gets EACCES naming the listener's user.

Message boundaries are kept either way (``SOCK_SEQPACKET`` natively), and
empty messages do not exist (on ``SOCK_SEQPACKET`` one would read as the
peer's end of stream). Unix sockets carry file descriptors along with a
message (``SCM_RIGHTS``); TCP cannot (EOPNOTSUPP).

Failures are ``OSError`` s: the peer's end of stream is ``ConnectionResetError``;
a wait that runs out returns None rather than raising (``accept``, ``recv``)
or raises ``TimeoutError`` (``connect``, ``send``).
"""

import array
import contextlib
import errno
import os
import re
import select
import socket
import stat
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rdmakit.transport.comm_auth import TAG_SIZE, MessageMac
from rdmakit.transport.user_files import user_name

__all__ = [
    "MAX_FDS",
    "MAX_MSG_LIMIT",
    "Listener",
    "MessageSocket",
    "ServiceAddress",
    "connect",
    "parse_service",
    "runtime_dir",
]

#: The largest message either socket kind carries (a ``SOCK_SEQPACKET``
#: message must fit the socket send buffer, about 200 KiB by default).
MAX_MSG_LIMIT = 64 * 1024
#: Most file descriptors one message carries.
MAX_FDS = 16

_NAME = re.compile(r"[A-Za-z0-9._-]{1,80}")
_LEN = struct.Struct(">I")
_RETRY_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ENOENT, errno.EAGAIN})
_FD_SIZE = array.array("i").itemsize


@dataclass(frozen=True, slots=True)
class ServiceAddress:
    """Where a service name points: a Unix socket file (named or given) or TCP."""

    kind: Literal["named", "unix", "tcp"]
    path: str = ""  # the socket file
    host: str = ""
    port: int = 0
    name: str = ""  # of a named service

    @property
    def fd_passing(self) -> bool:
        """Whether messages can carry file descriptors (Unix sockets only)."""
        return self.kind != "tcp"

    def sockaddr(self) -> str | tuple[str, int]:
        if self.kind == "tcp":
            return (self.host, self.port)
        return self.path

    def __str__(self) -> str:
        if self.kind == "named":
            return f"{self.name} ({self.path})"
        if self.kind == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp:{host}:{self.port}"


def parse_service(spec: str) -> ServiceAddress:
    """``NAME``, ``unix:PATH`` or ``tcp:HOST:PORT`` -> a `ServiceAddress`; ValueError if malformed."""
    if spec.startswith("unix:"):
        path = spec[5:]
        if not path or "\0" in path or len(path.encode()) > 107:  # sun_path is 108 bytes
            raise ValueError(f"bad Unix socket path in {spec!r}")
        return ServiceAddress("unix", path=path)
    if spec.startswith("tcp:"):
        host, sep, port = spec[4:].rpartition(":")
        host = host.strip("[]") if host.startswith("[") else host
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 0xFFFF:
            raise ValueError(f"expected tcp:HOST:PORT, got {spec!r}")
        return ServiceAddress("tcp", host=host, port=int(port))
    if not _NAME.fullmatch(spec):
        raise ValueError(
            f"service name {spec!r}: use 1 to 80 of A-Z a-z 0-9 . _ -, unix:PATH or tcp:HOST:PORT"
        )
    path = str(runtime_dir() / f"comch.{spec}")
    if len(path.encode()) > 107:
        raise ValueError(f"service name {spec!r}: the socket path {path} is too long for a Unix socket")
    return ServiceAddress("named", path=path, name=spec)


def runtime_dir() -> Path:
    """Where this user's named services live: ``$XDG_RUNTIME_DIR/rdmakit``, else ``/tmp/rdmakit-<uid>``."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "rdmakit"
    return Path(f"/tmp/rdmakit-{os.geteuid()}")


def _own_dir(path: Path, *, create: bool) -> None:
    """Check that `path` is this user's private directory (0700, not a symlink); create it if asked.

    PermissionError naming the owner when another user holds it; FileNotFoundError
    if it does not exist and `create` is false.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    st = os.lstat(path)
    owner = user_name(st.st_uid)
    if st.st_uid != os.geteuid():
        raise PermissionError(
            errno.EACCES,
            f"{path} belongs to {owner}, not to this user ({user_name(os.geteuid())}): another user "
            "created it first; it must be removed before this user's named services can live there",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(errno.EACCES, f"{path} is not a directory (owner {owner})")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise PermissionError(
            errno.EACCES,
            f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: it must be 0700 (chmod 700 {path})",
        )


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def _wait(fd: int, events: int, timeout: float | None) -> bool:
    """Whether `fd` became ready for `events` within `timeout` seconds (None: forever)."""
    poller = select.poll()
    poller.register(fd, events)
    ms = -1 if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return bool(poller.poll(ms))


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _peer_uid(sock: socket.socket) -> int:
    """The user id of a Unix socket's peer (``SO_PEERCRED``, as it was at connect or listen)."""
    _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(uid)


def _peer_trusted(sock: socket.socket) -> bool:
    """Whether a Unix socket's peer runs as our user or as root."""
    return _peer_uid(sock) in (os.geteuid(), 0)


def _ip(name: tuple[object, ...]) -> tuple[str, int]:
    """A socket address as (ip, port): IPv4-mapped IPv6 as IPv4, no scope id."""
    ip = str(name[0]).partition("%")[0]
    if ip.startswith("::ffff:") and "." in ip:
        ip = ip[7:]
    return ip, int(str(name[1]))


def _close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class MessageSocket:
    """One end of a connected channel: whole messages in, whole messages out.

    Blocking with timeouts; one thread at a time. `recv` returns
    ``(data, fds)``: the caller owns the received descriptors (close-on-exec).
    """

    def __init__(self, sock: socket.socket, address: ServiceAddress, max_msg_size: int) -> None:
        if not 0 < max_msg_size <= MAX_MSG_LIMIT:
            raise ValueError(f"max_msg_size must be in 1..{MAX_MSG_LIMIT}")
        sock.setblocking(False)
        self._sock = sock
        self._address = address
        self._max = max_msg_size
        self._rbuf = bytearray()  # TCP: bytes of the next frame(s) received so far
        self._eof = False
        self._mac: MessageMac | None = None

    def start_mac(self, mac: MessageMac) -> None:
        """From now on every message carries a MAC (TCP only): sent with it, checked on receipt."""
        if self._address.kind != "tcp":
            raise ValueError("MACs are for TCP channels")
        self._mac = mac

    @property
    def endpoints(self) -> tuple[tuple[str, int], tuple[str, int]]:
        """(local, peer) addresses of a TCP channel, as (ip, port)."""
        if self._address.kind != "tcp":
            raise OSError(errno.EOPNOTSUPP, "a Unix socket has no IP endpoints")
        return _ip(self._sock.getsockname()), _ip(self._sock.getpeername())

    @property
    def peer(self) -> str:
        """Who the peer is, for messages: ``IP:PORT``, or a local process's pid and user."""
        try:
            if self._address.kind == "tcp":
                ip, port = self.endpoints[1]
                return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
            pid, uid, _ = _UCRED.unpack(
                self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            )
        except OSError:
            return "an unknown peer"
        return f"pid {pid}, {user_name(uid)}"

    @property
    def address(self) -> ServiceAddress:
        return self._address

    @property
    def max_msg_size(self) -> int:
        return self._max

    @max_msg_size.setter
    def max_msg_size(self, value: int) -> None:
        if not 0 < value <= MAX_MSG_LIMIT:
            raise ValueError(f"max_msg_size must be in 1..{MAX_MSG_LIMIT}")
        self._max = value

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def local_ip(self) -> str | None:
        """The local IP address of a TCP channel (None for a Unix socket)."""
        if self._sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        ip = str(self._sock.getsockname()[0])
        return ip.removeprefix("::ffff:") if ip.startswith("::ffff:") and "." in ip else ip

    # -- send -----------------------------------------------------------------------

    def send(self, data: bytes | memoryview, fds: Sequence[int] = (), timeout: float | None = None) -> None:
        """Send one message (1..max_msg_size bytes) with `fds` (Unix only); TimeoutError if stuck."""
        size = len(data)
        if not 0 < size <= self._max:
            raise OSError(errno.EMSGSIZE, f"message of {size} bytes; 1 to {self._max} allowed")
        if fds and not self._address.fd_passing:
            raise OSError(errno.EOPNOTSUPP, "file descriptors travel only over Unix sockets")
        if len(fds) > MAX_FDS:
            raise OSError(errno.E2BIG, f"at most {MAX_FDS} descriptors per message")
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._address.kind == "tcp":
            tag = self._mac.seal(data) if self._mac is not None else b""
            self._send_all(memoryview(_LEN.pack(size + len(tag)) + bytes(data) + tag), deadline)
            return
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
        while True:
            try:
                self._sock.sendmsg([data], ancillary, socket.MSG_NOSIGNAL)
                return
            except BlockingIOError:
                if not _wait(self.fileno(), select.POLLOUT, _remaining(deadline)):
                    raise TimeoutError(errno.ETIMEDOUT, "peer is not reading the channel") from None

    def _send_all(self, view: memoryview, deadline: float | None) -> None:
        while view:
            try:
                sent = self._sock.send(view, socket.MSG_NOSIGNAL)
            except BlockingIOError:
                if not _wait(self.fileno(), select.POLLOUT, _remaining(deadline)):
                    raise TimeoutError(errno.ETIMEDOUT, "peer is not reading the channel") from None
                continue
            view = view[sent:]

    # -- receive ----------------------------------------------------------------------

    def recv(self, timeout: float | None = None) -> tuple[bytes, list[int]] | None:
        """The next message and its descriptors; None if none arrived within `timeout` (0: poll).

        ConnectionResetError when the peer has closed its end; EMSGSIZE (and
        the channel unusable) when it sent more than max_msg_size.
        """
        if self._eof:
            raise ConnectionResetError(errno.ECONNRESET, "peer closed the channel")
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._address.kind == "tcp":
            return self._recv_frame(deadline)
        return self._recv_packet(deadline)

    def _recv_packet(self, deadline: float | None) -> tuple[bytes, list[int]] | None:
        ancbuf = socket.CMSG_SPACE(MAX_FDS * _FD_SIZE)
        while True:
            try:
                data, ancdata, flags, _ = self._sock.recvmsg(self._max + 1, ancbuf, socket.MSG_CMSG_CLOEXEC)
                break
            except BlockingIOError:
                remaining = _remaining(deadline)
                if remaining == 0 or not _wait(self.fileno(), select.POLLIN, remaining):
                    return None
        fds: list[int] = []
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % _FD_SIZE
                fds.extend(array.array("i", payload[:usable]))
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(data) > self._max:
            _close_fds(fds)
            self._eof = True
            raise OSError(
                errno.EMSGSIZE, f"peer sent a message over {self._max} bytes or too many descriptors"
            )
        if not data:
            _close_fds(fds)
            self._eof = True
            raise ConnectionResetError(errno.ECONNRESET, "peer closed the channel")
        return data, fds

    def _recv_frame(self, deadline: float | None) -> tuple[bytes, list[int]] | None:
        while True:
            if len(self._rbuf) >= _LEN.size:
                (size,) = _LEN.unpack_from(self._rbuf)
                tag_size = TAG_SIZE if self._mac is not None else 0
                if not tag_size < size <= self._max + tag_size:
                    self._eof = True
                    raise OSError(
                        errno.EMSGSIZE, f"peer framed a message of {size - tag_size} bytes (1 to {self._max})"
                    )
                end = _LEN.size + size
                if len(self._rbuf) >= end:
                    data = bytes(self._rbuf[_LEN.size : end - tag_size])
                    tag = bytes(self._rbuf[end - tag_size : end])
                    del self._rbuf[:end]
                    if self._mac is not None and not self._mac.open(data, tag):
                        self._eof = True
                        raise OSError(
                            errno.EBADMSG,
                            "a message failed its MAC check (altered, injected, replayed or reordered)",
                        )
                    return data, []
            try:
                chunk = self._sock.recv(65536)
            except BlockingIOError:
                remaining = _remaining(deadline)
                if remaining == 0 or not _wait(self.fileno(), select.POLLIN, remaining):
                    return None
                continue
            if not chunk:
                self._eof = True
                raise ConnectionResetError(errno.ECONNRESET, "peer closed the channel")
            self._rbuf += chunk

    def close(self) -> None:
        """Close the socket (the peer then reads end of stream); idempotent."""
        self._sock.close()


class Listener:
    """A listening socket for a service; `accept` returns connected `MessageSocket` s."""

    def __init__(self, address: ServiceAddress, *, max_msg_size: int, backlog: int = 8) -> None:
        self._address = address
        self._max = max_msg_size
        self._unlink = False
        if address.kind == "tcp":
            family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
            sock = socket.create_server((address.host, address.port), family=family, backlog=backlog)
            port = sock.getsockname()[1]
            self._address = ServiceAddress("tcp", host=address.host, port=port)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            try:
                self._bind_unix(sock, address)
                sock.listen(backlog)
            except BaseException:
                sock.close()
                raise
        sock.setblocking(False)
        self._sock = sock

    def _bind_unix(self, sock: socket.socket, address: ServiceAddress) -> None:
        if address.kind == "named":
            _own_dir(Path(address.path).parent, create=True)
        try:
            sock.bind(address.path)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            # A socket file: a live listener owns it, or one that died left it behind.
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            try:
                probe.connect(address.path)
            except ConnectionRefusedError:
                os.unlink(address.path)
                sock.bind(address.path)
            else:
                holder = user_name(_peer_uid(probe))
                raise OSError(
                    errno.EADDRINUSE, f"{address} already has a listener, run by {holder}"
                ) from None
            finally:
                probe.close()
        self._unlink = True

    @property
    def address(self) -> ServiceAddress:
        """The bound address (for ``tcp:HOST:0``, with the port the kernel chose)."""
        return self._address

    def fileno(self) -> int:
        return self._sock.fileno()

    def accept(self, timeout: float | None = None) -> MessageSocket | None:
        """The next connection, or None if none came within `timeout` seconds (None: forever)."""
        while True:
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                if not _wait(self.fileno(), select.POLLIN, timeout):
                    return None
                continue
            if self._address.kind == "tcp":
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            elif not _peer_trusted(conn):
                conn.close()
                continue
            return MessageSocket(conn, self._address, self._max)

    def close(self) -> None:
        """Stop listening (and remove the socket file of ``unix:PATH``); idempotent."""
        if self._sock.fileno() >= 0 and self._unlink:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._address.path)
        self._unlink = False
        self._sock.close()


def connect(address: ServiceAddress, *, max_msg_size: int, timeout: float | None) -> MessageSocket:
    """Connect to `address`, waiting up to `timeout` seconds (None: forever) for a listener to appear.

    A missing or refusing listener is retried (so the two sides may start in
    any order); any other error is raised at once. TimeoutError at the end.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            return _connect_once(address, max_msg_size, _remaining(deadline))
        except OSError as exc:
            if exc.errno not in _RETRY_ERRNOS:
                raise
        remaining = _remaining(deadline)
        if remaining == 0:
            raise TimeoutError(errno.ETIMEDOUT, f"no listener at {address}")
        time.sleep(delay if remaining is None else min(delay, remaining))
        delay = min(delay * 2, 0.1)


def _connect_once(address: ServiceAddress, max_msg_size: int, timeout: float | None) -> MessageSocket:
    if address.kind == "tcp":
        sock = socket.create_connection(
            (address.host, address.port), timeout=None if timeout is None else max(timeout, 0.01)
        )
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return MessageSocket(sock, address, max_msg_size)
    if address.kind == "named":
        _own_dir(Path(address.path).parent, create=False)  # FileNotFoundError: no server yet
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.connect(address.path)
        if not _peer_trusted(sock):
            raise PermissionError(
                errno.EACCES,
                f"the listener at {address} runs as {user_name(_peer_uid(sock))}, not as this user or root",
            )
    except BaseException:
        sock.close()
        raise
    return MessageSocket(sock, address, max_msg_size)
