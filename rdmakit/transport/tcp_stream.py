"""One TCP stream's state, and the framing of what an authenticated stream reads.

A stream is outgoing (a :class:`~rdmakit.transport.tcp_limits.Route`) or
accepted (a :class:`Grant` once its preface authenticated it). ``read_frames``
cuts an accepted stream's bytes into frames (:mod:`rdmakit.wire.framing`),
checking each frame's length and destination QPN as soon as they are in, and
receives a large frame's payload straight into place when the placer gives it
a home.
"""

import errno
import os
import secrets
import socket
import struct
from collections import deque

from rdmakit.transport.tuning import direct_lowat, set_rcvlowat
from rdmakit.wire import BTH_LEN, FRAME_HEADER

from .tcp_limits import DIRECT_MIN, PREFACE_LEN, SECRET_LEN, Addr, Placed, Placer, Route, TcpCounters

_U32 = struct.Struct(">I")
_U24 = 0xFFFFFF
#: Bytes of a frame (length and BTH) up to and including the destination QPN.
_QPN_END = FRAME_HEADER.size + 8
#: Bytes of a frame's body that must be in before the placer is asked (all RC headers fit).
_PEEK = 64


class Direct:
    __slots__ = ("filled", "header", "lowat", "target")

    def __init__(self, header: bytes, target: memoryview, filled: int) -> None:
        self.header, self.target, self.filled = header, target, filled
        self.lowat = 1  # the socket's SO_RCVLOWAT


class Grant:
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
        self.stream: Stream | None = None


class Stream:
    __slots__ = (
        "buf", "dead", "direct", "end", "error", "grant", "large", "limit", "moved", "out", "peer",
        "pollout", "queued", "remote16", "route", "since", "sock", "start",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, route: Route | None, now: float, remote16: bytes = b"") -> None:
        self.sock = sock
        #: Outgoing: where it goes. None: accepted.
        self.route = route
        #: Accepted: the grant its preface opened, once authenticated.
        self.grant: Grant | None = None
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
        self.direct: Direct | None = None
        #: The last frame was a large one (the next may be too: read its header first).
        self.large = False


def failure(s: Stream, route: Route) -> str:
    where = f"{route.ip}:{route.port}"
    if s.error == errno.ECONNREFUSED:
        return f"connection refused by {where} (nothing listens there: has the peer exited?)"
    if s.error == errno.ETIMEDOUT:
        return f"the peer at {where} stopped reading"
    if s.error:
        return f"the connection to {where} failed: {os.strerror(s.error)}"
    return f"the peer at {where} closed the connection"


def read_direct(s: Stream, d: Direct) -> Placed | None:
    """Receive the rest of a frame straight into place; the frame once complete.

    Each read also takes up to ``_PEEK`` bytes beyond the frame into the
    stream's buffer (one ``recvmsg_into`` over both), so that the next frame's
    headers are in when this one completes and the next large frame needs no
    read of its own to be placed. A short read means the socket is drained:
    the reader stops there (readiness is level-triggered) instead of asking
    again for an ``EAGAIN``.
    """
    target = d.target
    sock = s.sock
    head = memoryview(s.buf)[s.end : s.end + 4 + _PEEK]  # (s.start == s.end: nothing else is kept)
    while d.filled < len(target):
        rest = len(target) - d.filled
        try:
            n = sock.recvmsg_into([target[d.filled :], head])[0]
        except (BlockingIOError, InterruptedError):
            n = -1
        except OSError:
            s.dead = True
            return None
        if n == 0:
            s.dead = True
            return None
        if n > rest:
            s.end += n - rest
            n = rest
        if n > 0:
            d.filled += n
        if n < rest:
            # Drained: wake the reader only once a good part of the rest is in
            # (one system call here saves many rounds of the pump meanwhile).
            low = direct_lowat(len(target) - d.filled)
            if low != d.lowat:
                _lowat(s, low)
                d.lowat = low
            return None
    if d.lowat != 1:
        _lowat(s, 1)
    s.direct = None
    return Placed(d.header, target)


def _lowat(s: Stream, n: int) -> None:
    set_rcvlowat(s.sock, n)


def read_frames(s: Stream, place: Placer | None, c: TcpCounters) -> list[memoryview | Placed]:
    """Read what is there of an authenticated stream and return the whole frames it completes.

    Frame bodies are views into the stream's buffer, so once one is
    parsed the buffer stays where it is until the next call. A large frame
    whose payload has a home (``place``, see ``TcpLink.place``) is read there instead; after one,
    the next read at a frame boundary takes only the header first, so that
    the following large frame can go straight into place too. Every frame's
    length and destination QPN are checked as soon as they are in.
    """
    frames: list[memoryview | Placed] = []
    d = s.direct
    if d is not None:
        done = read_direct(s, d)
        return frames if done is None else [done]
    g = s.grant
    assert g is not None
    qpn, limit = g.qpn, s.limit
    parsed = False  # frames of this call point into s.buf: it must not move
    drained = False
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
        if place is not None and _placeable(s):
            # Whether the payload has a home depends on the frames before it:
            # the engine sees those first, then the next call asks.
            if frames:
                break
            if _place(s, place):
                assert s.direct is not None
                done = read_direct(s, s.direct)
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
        if s.large and place is not None and s.end - s.start < 4 + _PEEK:
            # After a large frame, the next one's headers first (it may go straight into place).
            limit_read = min(limit_read, s.start + 4 + _PEEK - s.end)
        if drained:
            break  # the last read was short: the socket is empty (level-triggered, it wakes us)
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
        drained = n < limit_read
    return frames


def _placeable(s: Stream) -> bool:
    """A large frame is under way and enough of it is in to ask where it goes."""
    pos, end = s.start, s.end
    if end - pos < 4 + _PEEK:
        return False
    n = int(FRAME_HEADER.unpack_from(s.buf, pos)[0])
    return DIRECT_MIN <= n <= s.limit and end - pos - 4 < n


def _place(s: Stream, place: Placer) -> bool:
    """The large frame under way (``_placeable``): if its payload has a home, take
    what is here of it there and read the rest there too."""
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
    s.direct = Direct(bytes(view[pos + 4 : body]), target, have)
    s.start = s.end = 0  # nothing else is kept: the next frame's headers are read to the front
    s.large = True
    return True
