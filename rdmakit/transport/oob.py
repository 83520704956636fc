"""A TCP stream for fixed-length out-of-band exchanges (perftest, ``ibv_rc_pingpong``).

The C tools exchange fixed-size messages over one TCP connection: each side
``write()`` s a whole message and ``read()`` s exactly the size it expects
(``perftest_communication.c``, ``rc_pingpong.c``). `OobStream` does the same
with bounds: every connect, accept and read has a deadline, a read returns
exactly the number of bytes asked for or raises `OobError`, and each message
goes out in one ``send`` (the C readers do a single ``read()``).
"""

import contextlib
import select
import socket
import time
from collections.abc import Callable

__all__ = ["OobError", "OobStream"]


class OobError(Exception):
    """The out-of-band connection failed, timed out or was closed early (one line)."""

    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class OobStream:
    """One connected TCP socket; use `connect` or `accept` to make one."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self._sock = sock
        self.peer = peer
        #: The peer's address as the socket sees it (the route to it is the data path's too).
        self.peer_ip = str(sock.getpeername()[0]).removeprefix("::ffff:")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @classmethod
    def connect(cls, host: str, port: int, timeout: float, *, wait: bool = True) -> "OobStream":
        """Connect to `host`:`port`, retrying while refused until `timeout` (the server may start
        later); without `wait`, a refusal ends it at once, as the C tools' single ``connect()``."""
        deadline = time.monotonic() + timeout
        last: OSError | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                detail = f": {last.strerror or last}" if last is not None else ""
                raise OobError(f"cannot connect to {host}:{port} within {timeout:g} s{detail}", timeout=True)
            try:
                sock = socket.create_connection((host, port), timeout=left)
            except (ConnectionRefusedError, TimeoutError) as e:
                if not wait and isinstance(e, ConnectionRefusedError):
                    raise OobError(
                        f"Couldn't connect to {host}:{port}: {e.strerror or e} "
                        "(no server listens there: start the server first)"
                    ) from e
                last = e
                time.sleep(min(0.05, max(left, 0)))
                continue
            except socket.gaierror as e:
                raise OobError(f"cannot resolve {host}: {e.strerror}") from e
            except OSError as e:
                raise OobError(f"cannot connect to {host}:{port}: {e.strerror or e}") from e
            return cls(sock, f"{host}:{port}")

    @classmethod
    def accept(cls, port: int, timeout: float, bind: str = "") -> "OobStream":
        """Listen on `port` (all addresses unless `bind`) and accept one connection within `timeout`."""
        # Without `bind`, one dual-stack socket: IPv6 clients and IPv4 ones (as ::ffff:a.b.c.d).
        family = socket.AF_INET6 if ":" in bind or (not bind and socket.has_ipv6) else socket.AF_INET
        try:
            listener = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # IPv6 switched off in this kernel
            family = socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and not bind:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                listener.bind((bind, port))
            except OSError as e:
                raise OobError(f"cannot listen on port {port}: {e.strerror or e}") from e
            listener.listen(1)
            listener.settimeout(timeout)
            try:
                sock, addr = listener.accept()
            except TimeoutError as e:
                raise OobError(
                    f"no client connected to port {port} within {timeout:g} s", timeout=True
                ) from e
        finally:
            listener.close()
        host = str(addr[0])
        if host.startswith("::ffff:") and "." in host:
            host = host[7:]  # an IPv4 client on the dual-stack socket
        return cls(sock, f"{host}:{addr[1]}")

    def send(self, data: bytes) -> None:
        """Send one whole message."""
        try:
            self._sock.settimeout(30.0)
            self._sock.sendall(data)
        except TimeoutError as e:
            raise OobError(f"{self.peer}: send timed out", timeout=True) from e
        except OSError as e:
            raise OobError(f"{self.peer}: send failed: {e.strerror or e}") from e

    def recv_exact(
        self,
        n: int,
        timeout: float,
        what: str,
        service: Callable[[], object] | None = None,
        service_fd: int = -1,
    ) -> bytes:
        """Exactly `n` bytes (`what` names them in errors) within `timeout` seconds.

        While it waits, `service` is called whenever `service_fd` is readable
        (and at least every 10 ms): a soft RoCE device keeps answering its
        peer while its program waits for the out-of-band peer.
        """
        buf = bytearray()
        deadline = time.monotonic() + timeout
        fds = [self._sock.fileno()] + ([service_fd] if service_fd >= 0 else [])
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OobError(f"{self.peer}: timed out after {timeout:g} s waiting for {what}", timeout=True)
            if service is not None:
                service()
                ready, _, _ = select.select(fds, [], [], min(left, 0.01))
                if self._sock.fileno() not in ready:
                    continue
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(n - len(buf))
            except TimeoutError:
                continue
            except OSError as e:
                raise OobError(f"{self.peer}: reading {what} failed: {e.strerror or e}") from e
            if not chunk:
                got = f" after {len(buf)} of {n} bytes" if buf else ""
                raise OobError(f"{self.peer}: the peer closed the connection while sending {what}{got}")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> "OobStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
