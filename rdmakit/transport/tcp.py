"""The TCP transport: the same RC packets, framed on TCP streams, which only the
holder of a connection's secret may open.

Every packet travels as a frame (:mod:`rdmakit.wire.framing`): the streams are
checksummed and ordered, so no ICRC is sent. Streams are one-way: a device
sends on the streams it opened and receives on the ones it accepted. It reads
its outgoing streams only to notice the peer going away; a byte arriving there
breaks the protocol and closes the stream.

Grants, routes, and what a secret authorises
--------------------------------------------
A QP that hands out a connection descriptor issues a *grant* (``issue``): a
random secret of ``SECRET_LEN`` bytes from :mod:`secrets`, which the descriptor
carries with the QP's number and the largest MTU it accepts. A device that
connects one of its QPs to that descriptor sends over a *route*
(:class:`Route`: the peer's listener, the peer QPN and the secret). Each route
has its own stream, opened from the device's own IP: one per connected remote
QP, not one per peer device, so that each stream carries exactly one secret.
The stream starts with a fixed-size preface: the magic, the sender's listener
address and port, the QPN and the secret.

The listener authenticates a stream once its whole preface is in: the magic
must match, the address the preface claims must be the socket's real remote
address (``getpeername``), the QPN must name a grant of this device whose
secret matches (``hmac.compare_digest``), and, once the granting QP is
connected (``bind``), the claimed listener must be the peer device that QP was
connected to. **A stream's secret authorises frames addressed to the one QP
that issued it, from that one peer device, for as long as the grant stands**:
``revoke`` (the QP was destroyed or reset) closes its stream, and so does
``bind`` to another peer. A frame naming any other destination QPN closes the
stream. Whatever fails is closed and counted (:class:`TcpCounters`); nothing a
peer sends raises out of ``poll``.

What a connection costs
-----------------------
Before its preface: a ``PREFACE_LEN``-byte buffer and socket buffers the
kernel sizes by what is read (nothing is, beyond the preface). It is closed
after ``PREFACE_TIMEOUT`` seconds, and at most ``MAX_PENDING`` wait: a new one
closes the oldest. After it: a read buffer of ``READ_BUFFER`` bytes (at least
one frame of the grant's MTU, so it never grows), one stream per grant (a new
one replaces the old: the peer reconnected) and at most ``MAX_STREAMS`` in all.
A frame longer than the grant's MTU plus headers (``max_frame_body``) closes
the stream before anything is allocated for it.

Sending is backpressured: a route's stream queues at most ``MAX_QUEUED`` bytes
beyond what its socket took (``room``), and the device takes no packets from a
QP whose route has no room, so the queue never grows past ``MAX_QUEUED`` plus
one frame. A queue that has not moved for ``STALL_TIMEOUT`` seconds (its peer
stopped reading) closes the stream, and the QPs routed over it end in
RETRY_EXC_ERR, as on a link that lost everything.

All sockets sit behind one epoll descriptor, so a single ``fileno()`` tells an
event loop that something is ready.
"""

import contextlib
import errno
import hmac
import secrets
import select
import socket
from collections.abc import Iterator, Sequence

from rdmakit.transport.tuning import STREAM_SEND_BUFFER, tune_stream_sender
from rdmakit.wire import FRAME_HEADER, Packet, encode_headers, max_frame_body, pad_bytes

from .tcp_limits import (
    MAX_PENDING,
    MAX_QUEUED,
    MAX_STREAMS,
    PREFACE,
    PREFACE_LEN,
    PREFACE_MAGIC,
    PREFACE_TIMEOUT,
    READ_BUFFER,
    READ_TURN,
    SECRET_LEN,
    STALL_TIMEOUT,
    Placed,
    Placer,
    Route,
    TcpCounters,
    ip16,
    ip_str,
)
from .tcp_stream import Grant, Stream, failure, read_frames

_IOV_MAX = 512
#: Send buffer of outgoing streams (`rdmakit.transport.tuning`; the tests shrink it).
_BUF = STREAM_SEND_BUFFER


class TcpLink:
    """The TCP transport of one device: its listener, grants and streams (module docstring)."""

    def __init__(self, ip: str, port: int, counters: TcpCounters | None = None) -> None:
        self.ip = ip
        self.family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        ls = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # No SO_RCVBUF: accepted sockets keep the kernel's receive autotuning,
            # which grows a buffer only as it is read (never before the preface).
            ls.bind((ip, port))
            ls.listen(64)
            ls.setblocking(False)
        except OSError:
            ls.close()
            raise
        self.listener = ls
        self._lfd = ls.fileno()
        self.port: int = ls.getsockname()[1]
        self.counters = counters if counters is not None else TcpCounters()
        self._ep = select.epoll()
        self._ep.register(self._lfd, select.EPOLLIN)
        self._by_fd: dict[int, Stream] = {}
        self._out: dict[Route, Stream] = {}
        #: Why each route ``poll`` reported failed, until ``pop_failure`` takes it.
        self._why: dict[Route, str] = {}
        #: Accepted connections without a whole preface, oldest first.
        self._pending: dict[int, Stream] = {}
        self._grants: dict[int, Grant] = {}
        self._streams = 0  # authenticated incoming streams
        self._ip16 = ip16(ip)
        self._decoy = secrets.token_bytes(SECRET_LEN)  # compared against when no grant matches
        self._scratch = bytearray(256)
        #: Who says where a large frame's payload goes (``SoftDevice`` sets it); None: nowhere.
        self.place: Placer | None = None
        #: Frames received straight into place.
        self.placed_frames = 0

    def fileno(self) -> int:
        return self._ep.fileno()

    def close(self) -> None:
        for s in list(self._by_fd.values()):
            s.sock.close()
        self._by_fd.clear()
        self._out.clear()
        self._pending.clear()
        self.listener.close()
        self._ep.close()

    def wants_write(self) -> bool:
        return any(s.out for s in self._out.values())

    # -- grants ------------------------------------------------------------------------
    def issue(self, qpn: int, mtu: int) -> bytes:
        """The secret of QP ``qpn``'s grant (made on first use), offering path MTUs up to ``mtu``."""
        g = self._grants.get(qpn)
        if g is None:
            g = self._grants[qpn] = Grant(qpn, mtu)
        g.mtu = max(g.mtu, mtu)
        return g.secret

    def bind(self, qpn: int, ip: str, port: int) -> None:
        """QP ``qpn`` is connected to the peer device listening on ``(ip, port)``: only
        that device may use its secret (a stream from another is closed)."""
        g = self._grants.get(qpn)
        if g is None:
            return  # no descriptor was handed out: no stream can reach the QP
        g.peer = (ip16(ip), port)
        s = g.stream
        if s is not None and s.peer is not None and (ip16(s.peer[0]), s.peer[1]) != g.peer:
            self.counters.tcp_wrong_peer += 1
            self._drop(s)

    def revoke(self, qpn: int) -> None:
        """Forget QP ``qpn``'s grant (destroyed or reset) and close the stream it opened."""
        g = self._grants.pop(qpn, None)
        if g is not None and g.stream is not None:
            self._drop(g.stream)

    # -- sending -----------------------------------------------------------------------
    def room(self, route: Route) -> int:
        """Bytes ``route``'s stream may still queue (0 or less: hold packets back)."""
        s = self._out.get(route)
        return MAX_QUEUED if s is None else MAX_QUEUED - s.queued

    def queued(self, route: Route) -> int:
        """Bytes waiting in ``route``'s stream for room in its socket."""
        s = self._out.get(route)
        return 0 if s is None else s.queued

    def close_route(self, route: Route) -> None:
        """Close ``route``'s stream (its QP is gone), dropping what it still holds."""
        s = self._out.get(route)
        if s is not None:
            self._drop(s)

    def _stream_to(self, route: Route) -> Stream:
        s = self._out.get(route)
        if s is not None and not s.dead:
            return s
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        tune_stream_sender(sock, _BUF)
        sock.bind((self.ip, 0))  # the peer checks the stream comes from the address it claims
        sock.setblocking(False)
        err = sock.connect_ex((route.ip, route.port))
        s = Stream(sock, route, 0.0)
        if err not in (0, errno.EINPROGRESS):
            s.dead = True
            s.error = err
        s.out.append(memoryview(PREFACE.pack(PREFACE_MAGIC, self._ip16, self.port, route.qpn, route.secret)))
        s.queued = PREFACE_LEN
        s.moved = True
        self._out[route] = s
        self._by_fd[sock.fileno()] = s
        self._ep.register(sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
        s.pollout = True
        return s

    def send_packets(self, pkts: Sequence[Packet], route: Route) -> None:
        s = self._stream_to(route)
        out = s.out
        if not out:
            s.moved = True  # the stall clock starts when the queue does
        q = 0
        for pkt in pkts:
            hdr = encode_headers(pkt)
            pl = pkt.payload
            n = len(pl)
            pad = -n & 3
            out.append(memoryview(FRAME_HEADER.pack(len(hdr) + n + pad) + hdr))
            q += 4 + len(hdr) + n + pad
            if n:
                out.append(memoryview(pl).cast("B"))
                if pad:
                    out.append(memoryview(pad_bytes(n)))
        s.queued += q
        self._flush(s)

    def _flush(self, s: Stream) -> None:
        out = s.out
        while out and not s.dead:
            iov = [out[i] for i in range(min(len(out), _IOV_MAX))]
            try:
                sent = s.sock.sendmsg(iov)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                s.dead = True  # the queued packets are lost: poll() reports the peer
                s.error = e.errno or 0
                return
            if sent:
                s.moved = True
                s.queued -= sent
            while sent:
                head = out[0]
                if sent >= len(head):
                    sent -= len(head)
                    out.popleft()
                else:
                    out[0] = head[sent:]
                    sent = 0

    # -- receiving ---------------------------------------------------------------------
    def poll(
        self, now: float, ready: bool = True
    ) -> Iterator[tuple[list[memoryview | Placed], str, Route | None]]:
        """Yield ``(frame bodies, peer ip, failed route or None)`` for each ready stream.

        Frame bodies are views into the stream's buffer, valid until the next poll;
        the peer ip is the authenticated sender's. A route is reported failed when
        its stream could not be opened, died with data still queued, or stalled:
        the packets in it are lost for good. ``now`` times out prefaces and stalls.
        ``ready=False``: the caller's own poll found ``fileno()`` not readable, so
        no socket is looked at (no system call); the timeouts are still checked.
        """
        self._expire(now)
        for fd, ev in self._ep.poll(0) if ready else ():
            if fd == self._lfd:
                self._accept(now)
                continue
            s = self._by_fd.get(fd)
            if s is None:
                continue
            route = s.route
            if route is not None:
                if ev & select.EPOLLOUT:
                    self._flush(s)
                if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                    self._read_outgoing(s)
                if s.dead:
                    failed = bool(s.out) and self._out.get(route) is s
                    self._drop(s)
                    if failed:
                        self._why[route] = failure(s, route)
                        yield [], route.ip, route
                elif not s.out and s.pollout:
                    self._ep.modify(fd, select.EPOLLIN)
                    s.pollout = False
                continue
            if s.grant is None:
                self._read_preface(s)
                if s.grant is None:
                    if s.dead:
                        self._drop(s)
                    continue
            for _ in range(READ_TURN):
                frames = self._read(s)
                if frames and s.peer is not None:
                    yield frames, s.peer[0], None
                if s.dead:
                    self._drop(s)
                    break
                if not frames or type(frames[-1]) is not Placed or s.end == s.start:
                    break
                # A large frame just went into place, the caller took it, and the
                # read that completed it brought the next frame's headers: read on
                # in this readiness turn (nothing brought: the socket is drained).
        for s in list(self._out.values()):
            route = s.route
            assert route is not None
            if not s.dead and s.out:
                if s.moved:
                    s.moved = False
                    s.since = now
                elif now - s.since >= STALL_TIMEOUT:
                    self.counters.tcp_stalled += 1
                    s.dead = True
                    s.error = errno.ETIMEDOUT
            if s.dead:
                self._drop(s)
                self._why[route] = failure(s, route)
                yield [], route.ip, route
            elif s.out and not s.pollout:
                self._ep.modify(s.sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
                s.pollout = True

    def pop_failure(self, route: Route) -> str:
        """Why the stream over ``route`` that ``poll`` just reported failed, in words."""
        return self._why.pop(route, f"the connection to {route.ip}:{route.port} was lost")

    def deadline(self) -> float | None:
        """When the oldest connection without a preface times out (None: none waits)."""
        for s in self._pending.values():
            return s.since + PREFACE_TIMEOUT
        return None

    def _expire(self, now: float) -> None:
        pending = self._pending
        while pending:
            s = next(iter(pending.values()))
            if now - s.since < PREFACE_TIMEOUT:
                return
            self.counters.tcp_preface_timeout += 1
            self._drop(s)

    def _accept(self, now: float) -> None:
        while True:
            try:
                sock, addr = self.listener.accept()
            except OSError:
                return
            sock.setblocking(False)
            if len(self._pending) >= MAX_PENDING:
                self.counters.tcp_pending_dropped += 1
                self._drop(next(iter(self._pending.values())))
            try:
                remote16 = ip16(addr[0].partition("%")[0])  # (no IPv6 zone: it is not in a preface)
            except OSError:
                remote16 = b""  # matches no preface
            s = Stream(sock, None, now, remote16)
            fd = sock.fileno()
            self._by_fd[fd] = s
            self._pending[fd] = s
            self._ep.register(fd, select.EPOLLIN)
            # A peer sends its preface at once: take it now, before a flood of
            # others could push this connection out of the waiting room.
            self._read_preface(s)
            if s.dead:
                self._drop(s)

    def _read_preface(self, s: Stream) -> None:
        try:
            n = s.sock.recv_into(memoryview(s.buf)[s.end :])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            s.dead = True
            return
        if n == 0:
            s.dead = True
            return
        s.end += n
        if s.end == PREFACE_LEN:
            self._authenticate(s)

    def _authenticate(self, s: Stream) -> None:
        """The whole preface is in: open the stream to its grant, or close it (module docstring)."""
        magic, ip16, port, qpn, secret = PREFACE.unpack(s.buf)
        c = self.counters
        s.dead = True
        if magic != PREFACE_MAGIC:
            c.tcp_bad_preface += 1
            return
        if ip16 != s.remote16:
            c.tcp_spoofed += 1
            return
        g = self._grants.get(qpn)
        if not hmac.compare_digest(secret, self._decoy if g is None else g.secret) or g is None:
            c.tcp_bad_secret += 1
            return
        if g.peer is not None and g.peer != (ip16, port):
            c.tcp_wrong_peer += 1
            return
        old = g.stream
        if old is None and self._streams >= MAX_STREAMS:
            c.tcp_streams_refused += 1
            return
        if old is not None:
            self._drop(old)  # the peer reconnected: its old stream is over
        s.dead = False
        del self._pending[s.sock.fileno()]
        g.stream, s.grant = s, g
        self._streams += 1
        s.peer = (ip_str(ip16), port)
        s.limit = max_frame_body(g.mtu)
        s.buf = bytearray(max(READ_BUFFER, FRAME_HEADER.size + s.limit))
        s.start = s.end = 0

    def _drop(self, s: Stream) -> None:
        s.dead = True
        fd = s.sock.fileno()
        if fd >= 0:
            self._by_fd.pop(fd, None)
            self._pending.pop(fd, None)
            with contextlib.suppress(OSError):
                self._ep.unregister(fd)
        s.sock.close()
        route = s.route
        if route is not None and self._out.get(route) is s:
            del self._out[route]
        g = s.grant
        if g is not None and g.stream is s:
            g.stream = None
            self._streams -= 1

    def _read_outgoing(self, s: Stream) -> None:
        """An outgoing stream is readable: the peer went away, or broke the protocol."""
        try:
            n = s.sock.recv_into(self._scratch)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            s.dead = True
            s.error = e.errno or 0
            return
        if n:
            self.counters.tcp_unexpected_data += 1
        s.dead = True

    def _read(self, s: Stream) -> list[memoryview | Placed]:
        frames = read_frames(s, self.place, self.counters)
        if frames and type(frames[-1]) is Placed:  # (at most one per read, the last)
            self.placed_frames += 1
        return frames

    # -- accounting --------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Accepted connections still waiting for their preface."""
        return len(self._pending)

    @property
    def streams(self) -> int:
        """Authenticated incoming streams."""
        return self._streams

    def buffered(self) -> int:
        """Bytes of read buffers this link holds (what a peer can make it allocate)."""
        return sum(len(s.buf) for s in self._by_fd.values())
