"""Raw-socket baselines for ``rdmakit bench``: the same traffic without RDMA, measured the same way.

Each baseline has two halves, run in two processes, and copies the RDMA run
it is compared with in everything but the RDMA:

- the TCP stream sends 1 MiB messages through a socket tuned as the TCP
  transport's streams are (`rdmakit.transport.tuning`), reads each message
  straight into a message-sized buffer, warms up on the same connection, and
  is timed from the first send to the receiver's acknowledgement of the last
  byte (an RDMA WRITE: first post to last completion);
- the UDP stream goes through a `UdpLink` (the soft device's socket: its
  buffers, GSO and GRO) as datagrams of the RoCE packet size, with flow
  control: at most ``window`` bytes unacknowledged, the receiver acknowledging
  every ``ack_every`` bytes. It is timed at whichever end the RDMA run is timed
  at: from the first datagram to the last acknowledgement when the measuring
  side sends (WRITE), from its request to the last byte when it receives (READ);
- the ping sends ``size`` bytes and waits for an 8-byte answer, with the
  spin policy of the RDMA run it is compared with: poll for ``spin`` seconds
  after the last event, then block (0: block at once, event-driven).
"""

import select
import socket
import struct
import time
from typing import Any

from .tuning import direct_lowat, set_rcvlowat, tune_stream_sender
from .udp import SOL_UDP, UDP_SEGMENT, UdpLink

_U64 = struct.Struct("!Q")
#: Largest GSO batch: 64 segments and 64 KiB in all (UDP_MAX_SEGMENTS, the IP length).
_GSO_SEGMENTS = 64
_GSO_BYTES = 65507
#: Seconds without progress after which a raw baseline counts its datagrams as lost.
STALL = 2.0


class BaselineError(RuntimeError):
    """A raw baseline could not finish (a datagram lost, the peer gone)."""


def _family(ip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def free_port(ip: str) -> int:
    """A port number nothing is bound to on ``ip`` now (for a tool that wants one given)."""
    with socket.socket(_family(ip), socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


# -- waiting with a spin policy ------------------------------------------------------------


def recv_spin(
    sock: socket.socket, buf: bytearray | memoryview, spin: float, timeout: float = STALL
) -> tuple[int, Any]:
    """``recvfrom_into`` on a non-blocking socket: poll for ``spin`` seconds, then block.

    The policy of the synchronous driver (`rdmakit.transport.driver.Driver`),
    so that a baseline pays the same wake-ups as the RDMA run beside it.
    Raises `BaselineError` after ``timeout`` seconds without a datagram.
    """
    clock = time.perf_counter
    spin_end = clock() + spin if spin > 0 else 0.0
    deadline = 0.0
    poller: select.poll | None = None
    while True:
        try:
            return sock.recvfrom_into(buf)
        except BlockingIOError:
            pass
        now = clock()
        if now < spin_end:
            continue
        if poller is None:
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            deadline = now + timeout
        left = deadline - now
        if left <= 0:
            raise BaselineError(f"no datagram within {timeout:g} s (one was lost)")
        poller.poll(left * 1000)


def _gso_cmsg(seg: int) -> list[tuple[int, int, bytes]]:
    return [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", seg))]


def send_datagrams(link: UdpLink, dest: tuple[str, int], seg: int, nbytes: int, payload: bytes) -> int:
    """Send ``nbytes`` as ``seg``-byte datagrams (the last may be shorter), GSO batches if it can.

    ``payload`` is a buffer of at least one batch. Returns the datagrams sent.
    """
    sock = link.sock
    sent = count = 0
    per_batch = max(1, min(_GSO_SEGMENTS, _GSO_BYTES // seg)) * seg
    view = memoryview(payload)
    while sent < nbytes:
        n = min(per_batch, nbytes - sent)
        try:
            if link.gso and n > seg:
                sock.sendmsg([view[:n]], _gso_cmsg(seg), 0, dest)
                count += -(-n // seg)
            else:
                n = min(n, seg)
                sock.sendto(view[:n], dest)
                count += 1
        except BlockingIOError:
            select.select([], [sock], [], STALL)
            continue
        sent += n
    return count


# -- the TCP stream ------------------------------------------------------------------------


class TcpSink:
    """Accepts one stream and reads it message by message straight into place (the far end)."""

    def __init__(self, ip: str) -> None:
        s = socket.socket(_family(ip), socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ip, 0))
        s.listen(1)
        self.listener = s
        self.port: int = s.getsockname()[1]

    def serve(self, chunk: int) -> tuple[int, float]:
        """Read the warm-up and the timed part; returns the timed bytes and the receiver's seconds."""
        try:
            conn, _ = self.listener.accept()
        finally:
            self.listener.close()
        with conn:
            warm, total = struct.unpack("!QQ", conn.recv(16, socket.MSG_WAITALL))
            target = memoryview(bytearray(chunk))
            _read_messages(conn, target, warm)
            conn.sendall(b"w")
            t0 = time.perf_counter()
            got = _read_messages(conn, target, total)
            dt = time.perf_counter() - t0
            conn.sendall(b"k")
        return got, dt


#: Longest a raw-stream read sleeps without readiness (as a pump wakes for its timers).
_READ_WAKE = 0.001


def _read_messages(conn: socket.socket, target: memoryview, total: int) -> int:
    """Read ``total`` bytes as messages of ``len(target)`` bytes, each straight into ``target``.

    As the TCP transport reads: non-blocking, woken by readiness at the
    ``SO_RCVLOWAT`` mark or by a short timeout (the transport's pump wakes for
    its timers), since a reader that blocks until the mark can wait forever
    once the kernel has clamped the window near it.
    """
    got = 0
    lowat = 1
    conn.setblocking(False)
    try:
        while got < total:
            want = min(len(target), total - got)
            filled = 0
            while filled < want:
                low = direct_lowat(want - filled)
                if low != lowat:
                    set_rcvlowat(conn, low)
                    lowat = low
                try:
                    n = conn.recv_into(target[filled:want])
                except BlockingIOError:
                    select.select([conn], [], [], _READ_WAKE)
                    continue
                if n == 0:
                    return got + filled
                filled += n
            got += filled
    finally:
        if lowat != 1:
            set_rcvlowat(conn, 1)
        conn.setblocking(True)
    return got


def tcp_source(src_ip: str, ip: str, port: int, chunk: int, total: int, warm: int) -> float:
    """Send ``warm`` then ``total`` bytes in ``chunk``-byte messages; seconds from the first
    timed send until the sink acknowledged the last byte."""
    data = memoryview(bytes(chunk))
    with socket.socket(_family(ip), socket.SOCK_STREAM) as s:
        tune_stream_sender(s)
        s.bind((src_ip, 0))
        s.connect((ip, port))
        s.sendall(struct.pack("!QQ", warm, total))
        _send_messages(s, data, warm)
        s.recv(1)
        t0 = time.perf_counter()
        _send_messages(s, data, total)
        if s.recv(1) != b"k":
            raise BaselineError("the TCP sink closed the stream early")
        return time.perf_counter() - t0


def _send_messages(s: socket.socket, data: memoryview, total: int) -> None:
    sent = 0
    while sent < total:
        n = min(len(data), total - sent)
        s.sendall(data[:n])
        sent += n


# -- the UDP stream, flow-controlled -------------------------------------------------------


def udp_stream_send(
    link: UdpLink,
    dest: tuple[str, int],
    seg: int,
    total: int,
    window: int,
    spin: float,
) -> float:
    """Stream ``total`` bytes of ``seg``-byte datagrams to a `udp_stream_recv`, at most
    ``window`` bytes unacknowledged; seconds from the first datagram to the last acknowledgement."""
    window = max(window, seg)
    payload = bytes(max(1, min(_GSO_SEGMENTS, _GSO_BYTES // seg)) * seg)
    ack = bytearray(64)
    sent = acked = 0
    sock = link.sock
    t0 = time.perf_counter()
    while acked < total:
        room = min(total - sent, window - (sent - acked))
        if room > 0:
            # Whole datagrams only: a short one mid-stream would change the count.
            room = room if sent + room == total else room - room % seg
            if room > 0:
                send_datagrams(link, dest, seg, room, payload)
                sent += room
        while True:  # drain the acknowledgements that are in; wait when the window is shut
            try:
                n, _ = sock.recvfrom_into(ack)
            except BlockingIOError:
                if sent - acked < window and sent < total:
                    break
                n, _ = recv_spin(sock, ack, spin)
            if n >= 8:
                acked = max(acked, _U64.unpack_from(ack)[0])
            if acked >= total:
                break
    return time.perf_counter() - t0


def udp_stream_recv(
    link: UdpLink, source: tuple[str, int] | None, total: int, ack_every: int, spin: float
) -> tuple[int, float]:
    """Receive ``total`` bytes from a `udp_stream_send`, acknowledging every ``ack_every`` bytes.

    With ``source`` (the measuring side receives: READ), first ask ``source``
    for the stream; the seconds run from that request to the last byte. Without
    it, from the first datagram to the last. Returns (bytes, seconds).
    """
    sock = link.sock
    buf = bytearray(1 << 20)
    got = 0
    next_ack = ack_every
    t0 = time.perf_counter()
    peer: Any = source
    if source is not None:
        sock.sendto(_U64.pack(total), source)
    while got < total:
        n, addr = recv_spin(sock, buf, spin)
        if not got and source is None:
            t0 = time.perf_counter()
            peer = addr
        got += n
        if got >= next_ack or got >= total:
            sock.sendto(_U64.pack(got), peer)
            next_ack = got + ack_every
    return got, time.perf_counter() - t0


def udp_stream_serve(link: UdpLink, seg: int, window: int, spin: float) -> float:
    """The far end of a READ-direction stream: wait for the request, then `udp_stream_send`."""
    req = bytearray(64)
    _n, addr = recv_spin(link.sock, req, 0.0, timeout=60.0)
    (total,) = _U64.unpack_from(req)
    return udp_stream_send(link, addr, seg, total, window, spin)


# -- the ping ------------------------------------------------------------------------------


class UdpEcho:
    """Answers each ``size``-byte message with 8 bytes, ``count`` times (the ping's far end)."""

    def __init__(self, ip: str) -> None:
        self.link = UdpLink(ip, 0)
        self.port: int = self.link.port

    def serve(self, count: int, size: int, spin: float) -> None:
        buf = bytearray(1 << 20)
        s = self.link.sock
        answer = bytes(8)
        try:
            for _ in range(count):
                got = 0
                while True:
                    n, addr = recv_spin(s, buf, spin, timeout=60.0 if not got else STALL)
                    got += n
                    if got >= size:
                        break
                s.sendto(answer, addr)
        finally:
            self.link.close()


def udp_ping(
    ip: str, dest: tuple[str, int], count: int, size: int, spin: float, seg: int = 4096
) -> list[float]:
    """Round-trip times of ``count`` pings: ``size`` bytes out (``seg``-byte datagrams), 8 back."""
    link = UdpLink(ip, 0)
    payload = bytes(max(1, min(_GSO_SEGMENTS, _GSO_BYTES // seg)) * seg)
    buf = bytearray(64)
    out: list[float] = []
    clock = time.perf_counter
    s = link.sock
    try:
        for _ in range(count):
            t0 = clock()
            if size <= seg:
                s.sendto(payload[: max(size, 1)], dest)
            else:
                send_datagrams(link, dest, seg, size, payload)
            recv_spin(s, buf, spin)
            out.append(clock() - t0)
    finally:
        link.close()
    return out
