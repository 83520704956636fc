"""The TCP transport: the same RC packets, framed on TCP streams.

Each device listens on ``(ip, port)``. To send to a peer device it opens one
stream to the peer's listener (from its own IP) and opens it with a preface
naming its own listener, so the receiver knows which device is talking. Every
packet then travels as a frame (:mod:`rdmakit.wire.framing`): the streams are
checksummed and ordered, so no ICRC is sent. Streams are one-way in use (a
device sends on the stream it opened and receives on the ones it accepted);
each side still reads its outgoing stream to notice the peer going away.

All sockets sit behind one epoll descriptor, so a single ``fileno()`` tells an
event loop that something is ready.
"""

import contextlib
import errno
import select
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from rdmakit.wire import FRAME_HEADER, MAX_FRAME, Packet, encode_headers, pad_bytes

PREFACE_MAGIC = b"RDMAKIT\x01"
_PREFACE = struct.Struct(">8s16sH")
_IOV_MAX = 512
_READ_CHUNK = 4 << 20
_BUF = 32 << 20

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
#: Most bytes a direct read waits for before the stream counts as readable (SO_RCVLOWAT).
_LOWAT_MAX = 256 << 10


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


class _Stream:
    __slots__ = ("addr", "buf", "dead", "direct", "end", "large", "out", "peer", "sock", "start")

    def __init__(self, sock: socket.socket, peer: Addr | None) -> None:
        self.sock = sock
        self.peer = peer  # the remote device (its listener), once known
        self.out: deque[memoryview] = deque()
        self.buf = bytearray(_READ_CHUNK)
        self.start = 0
        self.end = 0
        self.dead = False
        #: The frame being received straight into place, if any.
        self.direct: _Direct | None = None
        #: The last frame was a large one (the next may be too: read its header first).
        self.large = False


class TcpLink:
    def __init__(self, ip: str, port: int) -> None:
        self.ip = ip
        self.family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        ls = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # Accepted streams inherit the buffer: sizing it after accept would
            # shrink a window the peer was already offered (TCP then drops data).
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUF)
            ls.bind((ip, port))
            ls.listen(64)
            ls.setblocking(False)
        except OSError:
            ls.close()
            raise
        self.listener = ls
        self.port: int = ls.getsockname()[1]
        self._ep = select.epoll()
        self._ep.register(ls.fileno(), select.EPOLLIN)
        self._by_fd: dict[int, _Stream] = {}
        self._out: dict[Addr, _Stream] = {}
        self._preface = _PREFACE.pack(PREFACE_MAGIC, _ip16(ip), self.port)
        self.bad_prefaces = 0
        self.bad_frames = 0
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
        self.listener.close()
        self._ep.close()

    def wants_write(self) -> bool:
        return any(s.out for s in self._out.values())

    # -- sending -----------------------------------------------------------------------
    def _stream_to(self, addr: Addr) -> _Stream:
        s = self._out.get(addr)
        if s is not None and not s.dead:
            return s
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, _BUF)
        sock.bind((self.ip, 0))  # the peer checks packets come from our GID's address
        sock.setblocking(False)
        err = sock.connect_ex(addr)
        s = _Stream(sock, addr)
        if err not in (0, errno.EINPROGRESS):
            s.dead = True
        s.out.append(memoryview(self._preface))
        self._out[addr] = s
        self._by_fd[sock.fileno()] = s
        self._ep.register(sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
        return s

    def send_packets(self, pkts: Sequence[Packet], addr: Addr) -> None:
        s = self._stream_to(addr)
        out = s.out
        for pkt in pkts:
            hdr = encode_headers(pkt)
            pl = pkt.payload
            n = len(pl)
            out.append(memoryview(FRAME_HEADER.pack(len(hdr) + n + (-n & 3)) + hdr))
            if n:
                out.append(memoryview(pl).cast("B"))
                if n & 3:
                    out.append(memoryview(pad_bytes(n)))
        self._flush(s)

    def _flush(self, s: _Stream) -> None:
        out = s.out
        while out and not s.dead:
            iov = [out[i] for i in range(min(len(out), _IOV_MAX))]
            try:
                sent = s.sock.sendmsg(iov)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                s.dead = True  # the queued packets are lost: poll() reports the peer
                return
            while sent:
                head = out[0]
                if sent >= len(head):
                    sent -= len(head)
                    out.popleft()
                else:
                    out[0] = head[sent:]
                    sent = 0

    # -- receiving ---------------------------------------------------------------------
    def poll(self) -> Iterator[tuple[list[memoryview | Placed], str, Addr | None]]:
        """Yield ``(frame bodies, peer ip, failed peer or None)`` for each ready stream.

        Frame bodies are views into the stream's buffer, valid until the next poll.
        A peer is reported failed when a stream we send on could not be opened or
        died with data still queued: the packets in it are lost for good.
        """
        for fd, ev in self._ep.poll(0):
            if fd == self.listener.fileno():
                self._accept()
                continue
            s = self._by_fd.get(fd)
            if s is None:
                continue
            if ev & select.EPOLLOUT:
                self._flush(s)
            if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                frames = self._read(s)
                if frames and s.peer is not None:
                    yield frames, s.peer[0], None
            if s.dead:
                failed = bool(s.out) and s.peer is not None and self._out.get(s.peer) is s
                self._drop(s)
                if failed and s.peer is not None:
                    yield [], s.peer[0], s.peer
            elif not s.out and ev & select.EPOLLOUT:
                self._ep.modify(fd, select.EPOLLIN)
        for s in list(self._out.values()):
            if s.dead:
                self._drop(s)
                if s.peer is not None:
                    yield [], s.peer[0], s.peer
            elif s.out:
                self._ep.modify(s.sock.fileno(), select.EPOLLIN | select.EPOLLOUT)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s = _Stream(sock, None)
            self._by_fd[sock.fileno()] = s
            self._ep.register(sock.fileno(), select.EPOLLIN)

    def _drop(self, s: _Stream) -> None:
        fd = s.sock.fileno()
        if fd >= 0:
            self._by_fd.pop(fd, None)
            with contextlib.suppress(OSError):
                self._ep.unregister(fd)
        s.sock.close()
        if s.peer is not None and self._out.get(s.peer) is s:
            del self._out[s.peer]

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
                low = min(len(target) - d.filled, _LOWAT_MAX)
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
        with contextlib.suppress(OSError):
            s.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)

    def _read(self, s: _Stream) -> list[memoryview | Placed]:
        """Read what is there and return the whole frames it completes.

        Frame bodies are views into the stream's buffer, so once one is
        parsed the buffer stays where it is until the next call. A large frame
        whose payload has a home (``place``) is read there instead; after one,
        the next read at a frame boundary takes only the header first, so that
        the following large frame can go straight into place too.
        """
        frames: list[memoryview | Placed] = []
        d = s.direct
        if d is not None:
            done = self._read_direct(s, d)
            return frames if done is None else [done]
        parsed = False  # frames of this call point into s.buf: it must not move
        buf = s.buf
        while not s.dead:
            if s.peer is None and s.end - s.start >= _PREFACE.size:
                magic, ip16, port = _PREFACE.unpack_from(buf, s.start)
                if magic != PREFACE_MAGIC:
                    self.bad_prefaces += 1
                    s.dead = True
                    break
                s.peer = (_ip_str(ip16), port)
                s.start += _PREFACE.size
            if s.peer is not None:
                pos, end = s.start, s.end
                view = memoryview(buf)
                while end - pos >= 4:
                    (n,) = FRAME_HEADER.unpack_from(buf, pos)
                    if not 12 <= n <= MAX_FRAME:
                        s.dead = True  # garbage on the stream: nothing after it can be trusted
                        self.bad_frames += 1
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
            if s.peer is not None and s.end - s.start >= 4:
                need = 4 + min(FRAME_HEADER.unpack_from(buf, s.start)[0], MAX_FRAME)
            if s.start + need > len(buf) or s.end == len(buf):
                # The frame under way does not fit where it is: move it to the front
                # (or grow), unless frames of this call still sit in front of it.
                if parsed:
                    break
                rest = s.end - s.start
                if need > len(buf):
                    grown = bytearray(need)
                    grown[:rest] = buf[s.start : s.end]
                    s.buf = buf = grown
                elif s.start:
                    buf[:rest] = buf[s.start : s.end]
                else:
                    break  # not reached: a buffer full from the front holds whole frames, parsed above
                s.start, s.end = 0, rest
            limit = len(buf) - s.end
            if s.large and s.start == s.end and self.place is not None:
                limit = min(limit, 4 + _PEEK)  # a frame boundary after a large frame: header first
            try:
                n = s.sock.recv_into(memoryview(buf)[s.end : s.end + limit])
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
        if self.place is None or s.peer is None or end - pos < 4 + _PEEK:
            return False
        n = int(FRAME_HEADER.unpack_from(s.buf, pos)[0])
        return DIRECT_MIN <= n <= MAX_FRAME and end - pos - 4 < n

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
