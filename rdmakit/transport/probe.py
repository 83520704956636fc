"""The conformance tester's link: hand-built RoCEv2 datagrams out, the DUT's datagrams in, with IP headers.

The tester (``rdmakit.conformance``) builds every byte of its BTH .. ICRC
itself; this module only moves them, so that all socket code stays in the
transport layer. It sends from a UDP socket bound to the tester's address and
port 4791, unconnected with ``IP_MTU_DISCOVER = IP_PMTUDISC_DO``: the kernel
sets DF and an IPv4 Identification of 0 (``ip_select_ident_segs``), the
header the tester's ICRC covers (IBTA Annex A17.3.3).

The ICRC of a received IPv4 packet covers its Identification, which a UDP
socket does not show. Where it may (root, or ``CAP_NET_RAW``) the link also
opens a raw ``IPPROTO_UDP`` socket, which gets a copy of every UDP datagram
delivered to this host with its IP header; `recv` then returns the header of
each datagram for the tester's address and port. Elsewhere ``ip_header`` is
None and the tester solves for the Identification.

A sender using UDP GSO (``UDP_SEGMENT``) hands loopback one super-datagram:
the raw socket sees it whole, before the UDP layer splits it into segments
for the UDP socket (``udp_rcv_segment()``). The link pairs each raw frame with
the UDP socket's datagrams: a frame that is the concatenation of the next
``k`` of them is returned as those ``k`` datagrams, segment ``i`` with the
header the kernel gave it (``inet_gso_segment()``: Identification ``id + i``,
its own total length). The run may start past stale datagrams (copies of a
frame paired late, or of a batch the DUT sent again with the same bytes):
those are dropped. A frame that matches nothing is returned without a
header, so the tester solves for it; so is a UDP datagram whose raw copy does
not come within ``_PAIR_WAIT`` (the raw socket sees every UDP datagram of the
host and drops some when the host is busy).

Every datagram carries the kernel's receive time (``SO_TIMESTAMPNS``): on
loopback or a direct link that is when the DUT sent it, not when the tester
got round to reading it, so timers measured between two of the DUT's packets
do not grow or shrink with the tester's own scheduling.
"""

import array
import select
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass

__all__ = ["Datagram", "ProbeLink"]

_IP_MTU_DISCOVER = 10  # linux/in.h
_IP_PMTUDISC_DO = 2
_UDP = struct.Struct(">HHHH")
_MAX_DATAGRAM = 65535
_PAIR_WAIT = 0.5  # how long a raw frame waits for the UDP socket's copies of its segments
_MAX_PENDING = 4096  # UDP datagrams held for pairing, at most
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # linux/asm-generic/socket.h
_ANC = socket.CMSG_SPACE(16)
_IP_TOS = socket.IP_TOS


def _stamp(anc: list[tuple[int, int, bytes]]) -> float:
    """The kernel receive time in an ``SO_TIMESTAMPNS`` control message (CLOCK_REALTIME), else now."""
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = array.array("q", data[:16])
            return sec + nsec * 1e-9
    return time.time()


@dataclass(frozen=True, slots=True)
class Datagram:
    """One datagram for the tester: where it came from, its UDP payload, its IPv4 header if seen."""

    src_ip: str
    sport: int
    payload: bytes
    ip_header: bytes | None
    #: When the kernel received it (seconds, CLOCK_REALTIME like ``time.time()``).
    stamp: float = 0.0


class ProbeLink:
    """A UDP socket on (ip, port) and, when permitted and wanted, a raw socket beside it."""

    def __init__(self, ip: str, port: int = 4791, *, raw: bool = True) -> None:
        self.ip = ip
        self.port = port
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._udp.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)
            self._udp.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            self._udp.bind((ip, port))
            self._udp.setblocking(False)
        except BaseException:
            self._udp.close()
            raise
        self.port = self._udp.getsockname()[1]
        self._raw: socket.socket | None = None
        self._pending: deque[Datagram] = deque()  # the UDP socket's datagrams, for pairing
        self._ready: deque[Datagram] = deque()
        #: Payloads returned without their raw frame (`_orphan`): that frame, if it comes, is dropped.
        self._orphans: deque[bytes] = deque(maxlen=64)
        #: Payloads of raw frames returned without their UDP copies: those copies, if they come, are dropped.
        self._unpaired: deque[bytes] = deque(maxlen=64)
        if raw:
            try:
                r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
            except PermissionError:
                r = None
            if r is not None:
                r.setblocking(False)
                r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                r.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self._raw = r

    @property
    def sees_ip_headers(self) -> bool:
        """Whether received datagrams carry their IPv4 header (a raw socket is open)."""
        return self._raw is not None

    def send(self, payload: bytes, dst: tuple[str, int], tos: int = 0) -> float:
        """Send one datagram (IPv4 TOS byte ``tos``: DSCP and ECN); return when (``time.time()``)."""
        anc = [(socket.IPPROTO_IP, _IP_TOS, bytes([tos & 0xFF]))] if tos else []
        at = time.time()
        self._udp.sendmsg([payload], anc, 0, dst)
        return at

    def _from_raw(self, pkt: bytes, stamp: float) -> Datagram | None:
        if len(pkt) < 28 or pkt[0] >> 4 != 4:
            return None
        ihl = (pkt[0] & 0xF) * 4
        if len(pkt) < ihl + 8 or socket.inet_ntoa(pkt[16:20]) != self.ip:
            return None
        sport, dport, ulen, _ = _UDP.unpack_from(pkt, ihl)
        if dport != self.port or ulen < 8 or ihl + ulen > len(pkt):
            return None
        return Datagram(socket.inet_ntoa(pkt[12:16]), sport, pkt[ihl + 8 : ihl + ulen], pkt[:ihl], stamp)

    def _recv_udp(self) -> Datagram | None:
        try:
            data, anc, _flags, (src, sport) = self._udp.recvmsg(_MAX_DATAGRAM, _ANC)
        except BlockingIOError:
            return None
        return Datagram(src, sport, data, None, _stamp(anc))

    def _read_udp(self) -> None:
        while len(self._pending) < _MAX_PENDING:
            d = self._recv_udp()
            if d is None:
                return
            self._pending.append(d)

    def _match(self, payload: bytes) -> tuple[int, int] | None:
        """(start, count): the first run of pending datagrams whose bytes are ``payload``."""
        pending = self._pending
        for start in range(len(pending)):
            size, k = 0, 0
            for i in range(start, len(pending)):
                d = pending[i]
                if payload[size : size + len(d.payload)] != d.payload:
                    break
                size, k = size + len(d.payload), k + 1
                if size >= len(payload):
                    break
            if k and size == len(payload):
                return start, k
        return None

    def _segments(self, whole: Datagram) -> None:
        """Queue the UDP datagrams `whole` (a raw frame) was split into, each with its own header."""
        assert whole.ip_header is not None
        deadline = time.monotonic() + _PAIR_WAIT
        while True:
            self._read_udp()
            found = self._match(whole.payload)
            if found is not None or time.monotonic() >= deadline:
                break
            select.select([self._udp], [], [], max(0.0, deadline - time.monotonic()))
        if found is None:
            if whole.payload in self._orphans:  # its UDP copy went out already, without a header
                self._orphans.remove(whole.payload)
                return
            self._unpaired.append(whole.payload)
            self._ready.append(Datagram(whole.src_ip, whole.sport, whole.payload, None, whole.stamp))
            return
        start, k = found
        for _ in range(start):  # stale copies of frames already returned
            self._pending.popleft()
        parts = [self._pending.popleft() for _ in range(k)]
        ident = int.from_bytes(whole.ip_header[4:6], "big")
        for i, d in enumerate(parts):
            hdr = bytearray(whole.ip_header)
            hdr[2:4] = (len(hdr) + 8 + len(d.payload)).to_bytes(2, "big")
            hdr[4:6] = ((ident + i) & 0xFFFF).to_bytes(2, "big")
            self._ready.append(Datagram(whole.src_ip, whole.sport, d.payload, bytes(hdr), whole.stamp))

    def recv(self, timeout: float) -> Datagram | None:
        """The next datagram for (ip, port), or None if none came within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            if self._ready:
                return self._ready.popleft()
            if self._raw is not None:
                self._read_udp()
                while True:
                    try:
                        pkt, anc, _flags, _addr = self._raw.recvmsg(_MAX_DATAGRAM, _ANC)
                    except BlockingIOError:
                        break
                    d = self._from_raw(pkt, _stamp(anc))
                    if d is not None:
                        self._segments(d)
                        if self._ready:
                            return self._ready.popleft()
                orphan = self._orphan()
                if orphan is not None:
                    return orphan
                fds = [self._raw.fileno(), self._udp.fileno()]
            else:
                d = self._recv_udp()
                if d is not None:
                    return d
                fds = [self._udp.fileno()]
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            select.select(fds, [], [], min(left, _PAIR_WAIT / 4))

    def _orphan(self) -> Datagram | None:
        """A UDP datagram whose raw copy has not come in `_PAIR_WAIT` (the raw socket, which
        sees every UDP datagram of the host, dropped it when full): returned without a header."""
        pending = self._pending
        while pending and time.time() - pending[0].stamp >= _PAIR_WAIT:
            d = pending.popleft()
            if d.payload in self._unpaired:  # the late copy of a frame returned already
                self._unpaired.remove(d.payload)
                continue
            self._orphans.append(d.payload)
            return d
        return None

    def close(self) -> None:
        self._udp.close()
        if self._raw is not None:
            self._raw.close()

    def __enter__(self) -> "ProbeLink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
