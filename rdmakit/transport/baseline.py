"""Raw-socket baselines for the benchmarks: what the machine does without RDMA.

Each baseline has a server half and a client half, run in two processes by
``rdmakit bench``, and measures the same traffic shape as the RDMA run it is
compared with: a 1 MiB TCP stream, UDP GSO→GRO datagrams of the RoCE packet
size, and an 8-byte ping-pong.
"""

import socket
import struct
import time

from .udp import SOL_UDP, UDP_SEGMENT, UdpLink

_U64 = struct.Struct("!Q")


class TcpSink:
    """Accepts one stream and reads it with ``recv_into`` (the TCP baseline's far end)."""

    def __init__(self, ip: str) -> None:
        s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ip, 0))
        s.listen(1)
        self.listener = s
        self.port: int = s.getsockname()[1]

    def serve(self, chunk: int) -> tuple[int, float]:
        try:
            return _tcp_sink(self.listener, chunk)
        finally:
            self.listener.close()


def _tcp_sink(listener: socket.socket, chunk: int) -> tuple[int, float]:
    """Read ``total`` (an 8-byte header) bytes with recv_into; ack with 1 byte."""
    conn, _ = listener.accept()
    with conn:
        hdr = conn.recv(8, socket.MSG_WAITALL)
        (total,) = _U64.unpack(hdr)
        buf = bytearray(chunk)
        view = memoryview(buf)
        got = 0
        t0 = time.perf_counter()
        while got < total:
            n = conn.recv_into(view[: min(chunk, total - got)])
            if n == 0:
                break
            got += n
        dt = time.perf_counter() - t0
        conn.sendall(b"k")
    return got, dt


def tcp_source(ip: str, port: int, chunk: int, total: int) -> float:
    """Send ``total`` bytes in ``chunk``-sized ``sendall``s; seconds until the sink acked."""
    data = bytes(chunk)
    with socket.create_connection((ip, port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        s.sendall(_U64.pack(total))
        sent = 0
        while sent < total:
            s.sendall(data)
            sent += chunk
        s.recv(1)
        return time.perf_counter() - t0


def udp_gro_sink(link: UdpLink, expect: int, idle: float = 0.3) -> tuple[int, float]:
    """Drain datagrams (GRO batches) until ``expect`` bytes or ``idle`` seconds of silence.

    Returns bytes received and the seconds from the first to the last arrival.
    """
    sock = link.sock
    sock.setblocking(True)
    sock.settimeout(idle)
    buf = bytearray(1 << 20)
    got = 0
    first = last = 0.0
    try:
        while got < expect:
            n, _anc, _f, _a = sock.recvmsg_into([buf], socket.CMSG_SPACE(4))
            last = time.perf_counter()
            if not got:
                first = last
            got += n
    except TimeoutError:
        pass
    finally:
        sock.setblocking(False)
    return got, max(last - first, 1e-9)


def udp_gso_source(ip: str, dest: tuple[str, int], seg: int, total: int) -> float:
    """Send ``total`` bytes as ``seg``-byte datagrams, as many per GSO call as fit."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 0))
    count = max(1, min(64, 65507 // seg))
    payload = bytes(seg * count)
    cmsg = [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", seg))]
    sent = 0
    t0 = time.perf_counter()
    try:
        while sent < total:
            try:
                s.sendmsg([payload], cmsg, 0, dest)
            except OSError:
                s.sendmsg([payload[:seg]], (), 0, dest)  # no GSO here: one datagram
                sent += seg
                continue
            sent += len(payload)
    finally:
        s.close()
    return time.perf_counter() - t0


class UdpEcho:
    """A UDP echo server for ``count`` datagrams (the latency baseline's far end).

    Blocking in ``recvfrom``, or with ``poll`` a non-blocking socket read in a
    busy loop (what a polling RDMA application does with its CQ).
    """

    def __init__(self, ip: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ip, 0))
        self.port: int = self.sock.getsockname()[1]

    def serve(self, count: int, poll: bool = False) -> None:
        buf = bytearray(2048)
        s = self.sock
        s.setblocking(not poll)
        try:
            for _ in range(count):
                while True:
                    try:
                        n, addr = s.recvfrom_into(buf)
                        break
                    except BlockingIOError:
                        continue
                s.sendto(memoryview(buf)[:n], addr)
        finally:
            s.close()


def udp_ping(ip: str, dest: tuple[str, int], count: int, size: int, poll: bool = False) -> list[float]:
    """Round-trip times of ``count`` ping-pongs of ``size`` bytes (blocking, or busy-polling)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 0))
    s.connect(dest)
    s.setblocking(not poll)
    msg = bytes(size)
    buf = bytearray(2048)
    out: list[float] = []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            s.send(msg)
            while True:
                try:
                    s.recv_into(buf)
                    break
                except BlockingIOError:
                    continue
            out.append(time.perf_counter() - t0)
    finally:
        s.close()
    return out
