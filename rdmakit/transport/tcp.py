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
import os
import secrets
import select
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from rdmakit.transport.tuning import STREAM_SEND_BUFFER, direct_lowat, set_rcvlowat, tune_stream_sender
from rdmakit.wire import BTH_LEN, FRAME_HEADER, Packet, encode_headers, max_frame_body, pad_bytes

PREFACE_MAGIC = b"RDMAKIT\x02"
#: Bytes of a connection secret (128 bits, as RFC 4086 §8 asks of a key).
SECRET_LEN = 16
#: The magic, the sender's listener (its address as 16 bytes, IPv4-mapped for IPv4,
#: and its port), the QPN the stream is for, and that QP's secret.
_PREFACE = struct.Struct(f">8s16sHI{SECRET_LEN}s")
PREFACE_LEN = _PREFACE.size
#: Seconds an accepted connection may take to send its whole preface.
PREFACE_TIMEOUT = 5.0
#: Connections waiting for their preface; one more closes the oldest.
MAX_PENDING = 64
#: Authenticated incoming streams; one more is refused.
MAX_STREAMS = 1024
#: Bytes an outgoing stream queues beyond its socket before the device holds packets back.
MAX_QUEUED = 16 << 20
#: Seconds an outgoing stream's queue may stand still before its peer counts as gone.
STALL_TIMEOUT = 10.0
#: The read buffer of an authenticated stream.
READ_BUFFER = 4 << 20
_IOV_MAX = 512
#: Send buffer of outgoing streams (`rdmakit.transport.tuning`; the tests shrink it).
_BUF = STREAM_SEND_BUFFER
_U32 = struct.Struct(">I")
_U24 = 0xFFFFFF
#: Bytes of a frame (length and BTH) up to and including the destination QPN.
_QPN_END = FRAME_HEADER.size + 8

Addr = tuple[str, int]


def _ip16(ip: str) -> bytes:
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    b = socket.inet_pton(fam, ip)
    return b if len(b) == 16 else b"\0" * 10 + b"\xff\xff" + b


def _ip_str(b: bytes) -> str:
    if b[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, b[12:])
    return socket.inet_ntop(socket.AF_INET6, b)


#: Frames at least this long may be received straight into place (see ``TcpLink.place``).
DIRECT_MIN = 64 << 10
#: Bytes of a frame's body that must be in before the placer is asked (all RC headers fit).
_PEEK = 64


@dataclass(slots=True)
class TcpCounters:
    """Streams the TCP link refused or closed, by reason (``SoftDevice`` counts them too)."""

    #: A preface without the magic.
    tcp_bad_preface: int = 0
    #: A preface claiming an address other than the socket's remote address.
    tcp_spoofed: int = 0
    #: A preface naming no grant of this device, or with the wrong secret.
    tcp_bad_secret: int = 0
    #: A preface from a peer device other than the one the granting QP is connected to.
    tcp_wrong_peer: int = 0
    #: Connections without a whole preface after ``PREFACE_TIMEOUT``.
    tcp_preface_timeout: int = 0
    #: Waiting connections closed to make room for a new one (``MAX_PENDING``).
    tcp_pending_dropped: int = 0
    #: Authenticated streams refused (``MAX_STREAMS``).
    tcp_streams_refused: int = 0
    #: Frames whose length is outside [BTH, the grant's MTU plus headers].
    tcp_bad_length: int = 0
    #: Frames for a QP the stream's secret does not open.
    tcp_unauthorised: int = 0
    #: Bytes from the far end of an outgoing stream.
    tcp_unexpected_data: int = 0
    #: Outgoing streams whose peer stopped reading (``STALL_TIMEOUT``).
    tcp_stalled: int = 0
    #: Transmit rounds in which a QP's packets waited for room in its stream (backpressure).
    tcp_held: int = 0


class Route(NamedTuple):
    """Where an outgoing stream goes: the peer device's listener, the peer QP, and the
    secret that QP's connection descriptor carried."""

    ip: str
    port: int
    qpn: int
    secret: bytes


class Placed(NamedTuple):
    """A frame whose payload was received straight into place: its headers, and the payload."""

    header: bytes
    payload: memoryview


#: ``place(peer ip, the first bytes of a frame body, body length)``: None, or the header
#: length and the buffer that takes the rest of the body (see ``SoftDevice``).
Placer = Callable[[str, memoryview, int], "tuple[int, memoryview] | None"]


class _Direct:
    __slots__ = ("filled", "header", "lowat", "target")

    def __init__(self, header: bytes, target: memoryview, filled: int) -> None:
        self.header, self.target, self.filled = header, target, filled
        self.lowat = 1  # the socket's SO_RCVLOWAT


class _Grant:
    """A QP's secret and what it opens (see the module docstring)."""

    __slots__ = ("mtu", "peer", "qpn", "secret", "stream")

    def __init__(self, qpn: int, mtu: int) -> None:
        self.qpn = qpn
        self.secret = secrets.token_bytes(SECRET_LEN)
        #: The largest MTU the QP's descriptors offered: no valid frame is longer.
        self.mtu = mtu
        #: The peer device (16-byte address, port) once the QP is connected; None: any.
        self.peer: tuple[bytes, int] | None = None
        #: The authenticated stream that presented the secret, if one is open.
        self.stream: _Stream | None = None


class _Stream:
    __slots__ = (
        "buf", "dead", "direct", "end", "error", "grant", "large", "limit", "moved", "out", "peer",
        "pollout", "queued", "remote16", "route", "since", "sock", "start",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, route: Route | None, now: float, remote16: bytes = b"") -> None:
        self.sock = sock
        #: Outgoing: where it goes. None: accepted.
        self.route = route
        #: Accepted: the grant its preface opened, once authenticated.
        self.grant: _Grant | None = None
        #: The remote device (its listener): the route's, or an authenticated preface's.
        self.peer: Addr | None = (route.ip, route.port) if route is not None else None
        #: Accepted: the socket's real remote address (16 bytes, as in the preface).
        self.remote16 = remote16
        #: Accepted: when. Outgoing: when the queue last moved (see ``STALL_TIMEOUT``).
        self.since = now
        self.moved = False
        self.out: deque[memoryview] = deque()
        self.queued = 0  # bytes in ``out``
        self.pollout = False  # registered for EPOLLOUT
        #: Accepted: the preface until it is in, then the read buffer.
        self.buf = bytearray(PREFACE_LEN if route is None else 0)
        self.start = 0
        self.end = 0
        self.limit = 0  # the longest frame body the grant allows
        self.dead = False
        #: Outgoing: the errno that ended the stream (ECONNREFUSED …), 0 if none was seen.
        self.error = 0
        #: The frame being received straight into place, if any.
        self.direct: _Direct | None = None
        #: The last frame was a large one (the next may be too: read its header first).
        self.large = False


def _failure(s: _Stream, route: Route) -> str:
    where = f"{route.ip}:{route.port}"
    if s.error == errno.ECONNREFUSED:
        return f"connection refused by {where} (nothing listens there: has the peer exited?)"
    if s.error == errno.ETIMEDOUT:
        return f"the peer at {where} stopped reading"
    if s.error:
        return f"the connection to {where} failed: {os.strerror(s.error)}"
    return f"the peer at {where} closed the connection"


class TcpLink:
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
        self._by_fd: dict[int, _Stream] = {}
        self._out: dict[Route, _Stream] = {}
        #: Why each route ``poll`` reported failed, until ``pop_failure`` takes it.
        self._why: dict[Route, str] = {}
        #: Accepted connections without a whole preface, oldest first.
        self._pending: dict[int, _Stream] = {}
        self._grants: dict[int, _Grant] = {}
        self._streams = 0  # authenticated incoming streams
        self._ip16 = _ip16(ip)
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
            g = self._grants[qpn] = _Grant(qpn, mtu)
        g.mtu = max(g.mtu, mtu)
        return g.secret

    def bind(self, qpn: int, ip: str, port: int) -> None:
        """QP ``qpn`` is connected to the peer device listening on ``(ip, port)``: only
        that device may use its secret (a stream from another is closed)."""
        g = self._grants.get(qpn)
        if g is None:
            return  # no descriptor was handed out: no stream can reach the QP
        g.peer = (_ip16(ip), port)
        s = g.stream
        if s is not None and s.peer is not None and (_ip16(s.peer[0]), s.peer[1]) != g.peer:
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

    def _stream_to(self, route: Route) -> _Stream:
        s = self._out.get(route)
        if s is not None and not s.dead:
            return s
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        tune_stream_sender(sock, _BUF)
        sock.bind((self.ip, 0))  # the peer checks the stream comes from the address it claims
        sock.setblocking(False)
        err = sock.connect_ex((route.ip, route.port))
        s = _Stream(sock, route, 0.0)
        if err not in (0, errno.EINPROGRESS):
            s.dead = True
            s.error = err
        s.out.append(memoryview(_PREFACE.pack(PREFACE_MAGIC, self._ip16, self.port, route.qpn, route.secret)))
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

    def _flush(self, s: _Stream) -> None:
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
    def poll(self, now: float) -> Iterator[tuple[list[memoryview | Placed], str, Route | None]]:
        """Yield ``(frame bodies, peer ip, failed route or None)`` for each ready stream.

        Frame bodies are views into the stream's buffer, valid until the next poll;
        the peer ip is the authenticated sender's. A route is reported failed when
        its stream could not be opened, died with data still queued, or stalled:
        the packets in it are lost for good. ``now`` times out prefaces and stalls.
        """
        self._expire(now)
        for fd, ev in self._ep.poll(0):
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
                        self._why[route] = _failure(s, route)
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
            frames = self._read(s)
            if frames and s.peer is not None:
                yield frames, s.peer[0], None
            if s.dead:
                self._drop(s)
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
                self._why[route] = _failure(s, route)
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
                remote16 = _ip16(addr[0].partition("%")[0])  # (no IPv6 zone: it is not in a preface)
            except OSError:
                remote16 = b""  # matches no preface
            s = _Stream(sock, None, now, remote16)
            fd = sock.fileno()
            self._by_fd[fd] = s
            self._pending[fd] = s
            self._ep.register(fd, select.EPOLLIN)
            # A peer sends its preface at once: take it now, before a flood of
            # others could push this connection out of the waiting room.
            self._read_preface(s)
            if s.dead:
                self._drop(s)

    def _read_preface(self, s: _Stream) -> None:
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

    def _authenticate(self, s: _Stream) -> None:
        """The whole preface is in: open the stream to its grant, or close it (module docstring)."""
        magic, ip16, port, qpn, secret = _PREFACE.unpack(s.buf)
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
        s.peer = (_ip_str(ip16), port)
        s.limit = max_frame_body(g.mtu)
        s.buf = bytearray(max(READ_BUFFER, FRAME_HEADER.size + s.limit))
        s.start = s.end = 0

    def _drop(self, s: _Stream) -> None:
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

    def _read_outgoing(self, s: _Stream) -> None:
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

    def _read_direct(self, s: _Stream, d: _Direct) -> Placed | None:
        """Receive the rest of a frame straight into place; the frame once complete."""
        target = d.target
        sock = s.sock
        while d.filled < len(target):
            try:
                n = sock.recv_into(target[d.filled :])
            except (BlockingIOError, InterruptedError):
                # Wake the reader only once a good part of the rest is in (one
                # system call here saves many rounds of the pump meanwhile).
                low = direct_lowat(len(target) - d.filled)
                if low != d.lowat:
                    self._lowat(s, low)
                    d.lowat = low
                return None
            except OSError:
                s.dead = True
                return None
            if n == 0:
                s.dead = True
                return None
            d.filled += n
        if d.lowat != 1:
            self._lowat(s, 1)
        s.direct = None
        self.placed_frames += 1
        return Placed(d.header, target)

    @staticmethod
    def _lowat(s: _Stream, n: int) -> None:
        set_rcvlowat(s.sock, n)

    def _read(self, s: _Stream) -> list[memoryview | Placed]:
        """Read what is there of an authenticated stream and return the whole frames it completes.

        Frame bodies are views into the stream's buffer, so once one is
        parsed the buffer stays where it is until the next call. A large frame
        whose payload has a home (``place``) is read there instead; after one,
        the next read at a frame boundary takes only the header first, so that
        the following large frame can go straight into place too. Every frame's
        length and destination QPN are checked as soon as they are in.
        """
        frames: list[memoryview | Placed] = []
        d = s.direct
        if d is not None:
            done = self._read_direct(s, d)
            return frames if done is None else [done]
        g = s.grant
        assert g is not None
        qpn, limit = g.qpn, s.limit
        c = self.counters
        parsed = False  # frames of this call point into s.buf: it must not move
        buf = s.buf
        while not s.dead:
            pos, end = s.start, s.end
            view = memoryview(buf)
            while end - pos >= 4:
                (n,) = FRAME_HEADER.unpack_from(buf, pos)
                if not BTH_LEN <= n <= limit:
                    s.dead = True  # garbage on the stream: nothing after it can be trusted
                    c.tcp_bad_length += 1
                    break
                if end - pos < _QPN_END:
                    break
                if _U32.unpack_from(buf, pos + 8)[0] & _U24 != qpn:
                    s.dead = True
                    c.tcp_unauthorised += 1
                    break
                if end - pos - 4 < n:
                    break
                frames.append(view[pos + 4 : pos + 4 + n])
                parsed = True
                s.large = n >= DIRECT_MIN
                pos += 4 + n
            s.start = pos
            if s.dead:
                break
            if self._placeable(s):
                # Whether the payload has a home depends on the frames before it:
                # the engine sees those first, then the next call asks.
                if frames:
                    break
                if self._place(s):
                    assert s.direct is not None
                    done = self._read_direct(s, s.direct)
                    if done is not None:
                        frames.append(done)
                    break
            if s.start == s.end and not parsed:
                s.start = s.end = 0  # nothing kept: start over at the front, for free
            need = 0
            if s.end - s.start >= 4:
                need = 4 + FRAME_HEADER.unpack_from(buf, s.start)[0]  # checked: fits the buffer
            if s.start + need > len(buf) or s.end == len(buf):
                # The frame under way does not fit where it is: move it to the front,
                # unless frames of this call still sit in front of it.
                if parsed or not s.start:
                    break  # (not s.start: a buffer full from the front holds whole frames, parsed above)
                rest = s.end - s.start
                buf[:rest] = buf[s.start : s.end]
                s.start, s.end = 0, rest
            limit_read = len(buf) - s.end
            if s.large and s.start == s.end and self.place is not None:
                limit_read = min(limit_read, 4 + _PEEK)  # a frame boundary after a large frame: header first
            try:
                n = s.sock.recv_into(memoryview(buf)[s.end : s.end + limit_read])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                s.dead = True
                break
            if n == 0:
                s.dead = True
                break
            s.end += n
        return frames

    def _placeable(self, s: _Stream) -> bool:
        """A large frame is under way and enough of it is in to ask where it goes."""
        pos, end = s.start, s.end
        if self.place is None or end - pos < 4 + _PEEK:
            return False
        n = int(FRAME_HEADER.unpack_from(s.buf, pos)[0])
        return DIRECT_MIN <= n <= s.limit and end - pos - 4 < n

    def _place(self, s: _Stream) -> bool:
        """The large frame under way (``_placeable``): if its payload has a home, take
        what is here of it there and read the rest there too."""
        place = self.place
        assert place is not None
        assert s.peer is not None
        pos, end = s.start, s.end
        (n,) = FRAME_HEADER.unpack_from(s.buf, pos)
        view = memoryview(s.buf)
        got = place(s.peer[0], view[pos + 4 : end], n)
        if got is None or len(got[1]) != n - got[0]:
            return False
        hlen, target = got
        body = pos + 4 + hlen
        have = end - body
        target[:have] = view[body:end]
        s.direct = _Direct(bytes(view[pos + 4 : body]), target, have)
        s.start = s.end
        s.large = True
        return True

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
