"""RoCEv2 on UDP port 4791: the socket, batched sends (GSO) and receives (GRO).

Sending rules that make our ICRC one a kernel peer accepts (RoCEv2 Annex A17.3.3
covers the IPv4 Identification and flags):

- the socket is unconnected and has ``IP_MTU_DISCOVER = IP_PMTUDISC_DO``, so the
  kernel sets DF and an Identification of 0 (``ip_select_ident_segs``);
- with UDP GSO the kernel numbers the segments of one send 0, 1, 2, …
  (``inet_gso_segment``), so segment *k* of a batch is checksummed with ID *k*.
  A hop may split the batch (a NIC's USO, a qdisc that must) and GRO may merge
  any run of it: the receiver accepts any ID below ``SEGMENT_IDS`` whatever a
  segment's place in its read (``IcrcFlow.id_shift``);
- packets leave from exactly the address in our GID (rxe's ``check_addr``) and go
  to the peer's port 4791.
"""

import errno
import select
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from rdmakit.wire import ROCE_UDP_PORT, Payload

#: The errnos of a full non-blocking socket (try again later).
WOULD_BLOCK = frozenset((errno.EAGAIN, errno.EWOULDBLOCK))

SOL_UDP = 17
UDP_SEGMENT = 103  # linux/udp.h
UDP_GRO = 104
#: Take IPv6 datagrams whose UDP checksum is 0: Linux rxe sends RoCEv2 over IPv6 so (``rxe_net.c``
#: ``prepare_udp_hdr()``; its own socket accepts 0, ``udp_sock_create6()``); the ICRC covers them.
UDP_NO_CHECK6_RX = 102
SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32
IP_MTU_DISCOVER = 10  # linux/in.h
IP_PMTUDISC_DO = 2
IPV6_MTU_DISCOVER = 23
IPV6_PMTUDISC_DO = 2
IP_RECVTOS = 13  # linux/in.h
IPV6_RECVTCLASS = 66  # linux/in6.h
IPV6_TCLASS = 67
#: The ECN field (RFC 3168 §5): ECT(0), which a RoCEv2 sender sets (Annex A17.9.1), and CE.
ECT0 = 0b10
CE = 0b11
#: The kernel refuses GSO batches of more than 64 segments (UDP_MAX_SEGMENTS)
#: and of more than 64 KiB in all.
GSO_MAX_SEGMENTS = 64
GSO_MAX_BYTES = 65507
SOCKET_BUFFER = 32 << 20
RECV_BUFFER = 1 << 20
_U16 = struct.Struct("=H")
_I32 = struct.Struct("=i")


@dataclass(slots=True)
class UdpCounters:
    datagrams_in: int = 0
    datagrams_out: int = 0
    sends: int = 0
    gso_sends: int = 0
    gro_batches: int = 0
    #: Reads whose IP header carried CE (Congestion Experienced, RFC 3168).
    ce_reads: int = 0
    send_would_block: int = 0
    send_errors: int = 0
    last_error: str = ""
    errors_by_errno: dict[int, int] = field(default_factory=dict)


def _set_buffer(sock: socket.socket, force: int, plain: int, size: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)  # root: beyond rmem_max
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, plain, size)


class UdpLink:
    """One non-blocking UDP socket bound to ``(ip, port)`` speaking RoCEv2.

    ``send_batch`` takes datagrams as lists of buffers (scatter-gather: no copy of
    payload in Python); ``recv`` drains the socket into a preallocated buffer and
    returns ``(segments, source address)`` where ``segments`` are memoryviews that
    stay valid until the next ``recv``.
    """

    def __init__(self, ip: str, port: int = ROCE_UDP_PORT, *, gso: bool = True, gro: bool = True) -> None:
        self.family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        self.ip = ip
        sock = socket.socket(self.family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
            if self.family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
            else:
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.setsockopt(SOL_UDP, UDP_NO_CHECK6_RX, 1)
            _set_buffer(sock, SO_RCVBUFFORCE, socket.SO_RCVBUF, SOCKET_BUFFER)
            _set_buffer(sock, SO_SNDBUFFORCE, socket.SO_SNDBUF, SOCKET_BUFFER)
            sock.bind((ip, port))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.gso = gso and self._try(sock, SOL_UDP, UDP_SEGMENT, 0)
        self.gro = gro and self._try(sock, SOL_UDP, UDP_GRO, 1)
        # ECN (RoCEv2 Annex A17.9): send ECT(0), and read the ECN field of what arrives.
        if self.family == socket.AF_INET:
            self.ecn = self._try(sock, socket.IPPROTO_IP, socket.IP_TOS, ECT0)
            self.ecn &= self._try(sock, socket.IPPROTO_IP, IP_RECVTOS, 1)
        else:
            self.ecn = self._try(sock, socket.IPPROTO_IPV6, IPV6_TCLASS, ECT0)
            self.ecn &= self._try(sock, socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
        #: The ECN field of the last read (GRO merges only datagrams whose TOS agrees).
        self.last_ecn = 0
        self._buf = bytearray(RECV_BUFFER)
        self._view = memoryview(self._buf)
        self._cmsg_space = socket.CMSG_SPACE(4) * 2
        self.counters = UdpCounters()
        # Readiness without a raising recv (an empty non-blocking read costs
        # an exception): one epoll_wait(0) says whether ``recv`` has data.
        self._ep = select.epoll(1)
        self._ep.register(sock.fileno(), select.EPOLLIN)
        self._ready = self._ep.poll

    @staticmethod
    def _try(sock: socket.socket, level: int, opt: int, value: int) -> bool:
        try:
            sock.setsockopt(level, opt, value)
        except OSError:
            return False
        return True

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self._ep.close()
        self.sock.close()

    def ready(self) -> bool:
        """True if a datagram is waiting (``recv`` will not come back empty-handed)."""
        return bool(self._ready(0))

    # -- receive ---------------------------------------------------------------
    def recv(self) -> tuple[list[memoryview], tuple[str, int]] | None:
        """One read: the datagrams it held (several with GRO), or None if empty."""
        try:
            n, anc, _flags, addr = self.sock.recvmsg_into([self._buf], self._cmsg_space)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:  # ICMP errors surface on the next read; not ours to die of
            self._error(e)
            return [], ("", 0)
        c = self.counters
        seg = self._ancillary(anc)
        view = self._view
        if seg and seg < n:
            c.gro_batches += 1
            segs = [view[i : min(i + seg, n)] for i in range(0, n, seg)]
        else:
            segs = [view[:n]]
        c.datagrams_in += len(segs)
        return segs, (addr[0], addr[1])

    def recv_raw(self) -> tuple[int, int, tuple[str, int]] | None:
        """One read into ``view``: ``(nbytes, segment size, source)``, or None if empty.

        The datagrams are ``view[k*seg : min((k+1)*seg, nbytes)]`` (one, of
        ``nbytes``, without GRO); the segment size is 0 after a socket error.
        """
        try:
            n, anc, _flags, addr = self.sock.recvmsg_into([self._buf], self._cmsg_space)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            self._error(e)
            return 0, 0, ("", 0)
        seg = self._ancillary(anc)
        if not 0 < seg < n:
            seg = max(n, 1)
        self.count_read(n, seg)
        return n, seg, (addr[0], addr[1])

    def _ancillary(self, anc: list[tuple[int, int, bytes]]) -> int:
        """The GRO segment size of a read (0: none); its ECN field goes to ``last_ecn``."""
        seg = ecn = 0
        for level, typ, data in anc:
            if level == SOL_UDP and typ == UDP_GRO and len(data) >= 4:
                seg = _I32.unpack_from(data)[0]
            elif level == socket.IPPROTO_IP and typ == socket.IP_TOS and data:
                ecn = data[0] & 3
            elif level == socket.IPPROTO_IPV6 and typ == IPV6_TCLASS and len(data) >= 4:
                ecn = _I32.unpack_from(data)[0] & 3
        self.last_ecn = ecn
        if ecn == CE:
            self.counters.ce_reads += 1
        return seg

    def count_read(self, nbytes: int, seg: int) -> None:
        """Count a read of ``nbytes`` in segments of ``seg`` (one done outside: the native data plane)."""
        c = self.counters
        if seg < nbytes:
            c.gro_batches += 1
            c.datagrams_in += (nbytes + seg - 1) // seg
        else:
            c.datagrams_in += 1

    @property
    def view(self) -> memoryview:
        """The receive buffer ``recv_raw`` fills."""
        return self._view

    # -- send ------------------------------------------------------------------
    def send(self, parts: Sequence[Payload], addr: tuple[str, int]) -> bool:
        """Send one datagram; False if the socket buffer is full (try again later)."""
        try:
            self.sock.sendmsg(parts, (), 0, addr)
        except (BlockingIOError, InterruptedError):
            self.counters.send_would_block += 1
            return False
        except OSError as e:
            self._error(e)  # a dead route is a lost packet; the engine retransmits
        self.counters.datagrams_out += 1
        self.counters.sends += 1
        return True

    def send_gso(self, parts: Sequence[Payload], seg_size: int, count: int, addr: tuple[str, int]) -> bool:
        """Send ``count`` datagrams of ``seg_size`` bytes (the last may be shorter) in one call."""
        try:
            self.sock.sendmsg(parts, [(SOL_UDP, UDP_SEGMENT, _U16.pack(seg_size))], 0, addr)
        except (BlockingIOError, InterruptedError):
            self.counters.send_would_block += 1
            return False
        except OSError as e:
            if e.errno in (errno.EIO, errno.EINVAL, errno.EOPNOTSUPP):
                self.gso = False  # no GSO on this path after all: fall back for good
                return self._send_each(parts, seg_size, addr)
            self._error(e)
        c = self.counters
        c.datagrams_out += count
        c.sends += 1
        c.gso_sends += 1
        return True

    def _send_each(self, parts: Sequence[Payload], seg_size: int, addr: tuple[str, int]) -> bool:
        data = b"".join(parts)
        return all(self.send([data[i : i + seg_size]], addr) for i in range(0, len(data), seg_size))

    def record_error(self, e: OSError) -> None:
        """Count a send error met outside this link (the native data plane)."""
        self._error(e)

    def _error(self, e: OSError) -> None:
        c = self.counters
        c.send_errors += 1
        c.last_error = str(e)
        c.errors_by_errno[e.errno or 0] = c.errors_by_errno.get(e.errno or 0, 0) + 1
