"""The conformance tester's link: hand-built RoCEv2 datagrams out, the DUT's datagrams in, with IP headers.

The link speaks IPv4 or IPv6, by the family of its address (RoCEv2 runs on
both, IBTA Annex A17.4). What follows up to "IPv6" is about IPv4.

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

IPv6 has no Identification: the ICRC's IPv6 pseudo-header (Annex A17.3.3)
is the fixed header with traffic class, flow label and hop limit masked to
ones, and the UDP socket knows every other field. A raw IPv6 socket never
shows the IP header (RFC 3542 §3), so the link opens none; it asks the kernel
for the masked fields too, as ancillary data of each datagram
(``IPV6_RECVTCLASS``, ``IPV6_RECVHOPLIMIT``, ``IPV6_FLOWINFO``), and gives
the tester the 40-byte header the datagram arrived with, rebuilt from them:
its ICRC oracle then masks real values, and cases can check the DUT's
traffic class, flow label and hop limit. It also takes datagrams whose UDP
checksum is 0 (``UDP_NO_CHECK6_RX``): Linux rxe sends RoCEv2 over IPv6 so
(``rxe_net.c`` ``prepare_udp_hdr()`` leaves it 0, and its own tunnel socket
accepts 0, ``udp_sock_create6()``), which a plain IPv6 UDP socket drops
(RFC 8200 §8.1; RFC 6936 allows it for tunnels); the ICRC still covers the
datagram. The tester's own datagrams carry the
flow label its kernel chooses (``net.ipv6.auto_flowlabels``) unless `send` is
given one, which the link then leases (``IPV6_FLOWLABEL_MGR``: Linux sends a
chosen label only under a lease, at most 32 per socket without
``CAP_NET_ADMIN``).

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

from .udp import SOL_UDP, UDP_NO_CHECK6_RX

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
# linux/in6.h
_IPV6_FLOWINFO = 11
_IPV6_MTU_DISCOVER = 23
_IPV6_PMTUDISC_DO = 2
_IPV6_RECVHOPLIMIT = 51
_IPV6_HOPLIMIT = 52
_IPV6_RECVTCLASS = 66
_IPV6_TCLASS = 67
_IPV6_FLOWLABEL_MGR = 32
_IPV6_FLOWINFO_SEND = 33
#: ``struct in6_flowlabel_req``: dst, label (network order), action, share, flags, expires, linger, pad.
_FLOWLABEL_REQ = struct.Struct("=16s4sBBHHHI")
_IPV6_FL_A_GET, _IPV6_FL_S_ANY, _IPV6_FL_F_CREATE = 0, 255, 1
_FLOW_LABELS_MAX = 32  # leases one link takes, at most (FL_MAX_PER_SOCK, net/ipv6/ip6_flowlabel.c)
_ANC6 = _ANC + 3 * socket.CMSG_SPACE(4)
_IPV6_FIXED = struct.Struct(">IHBB16s16s")  # version/class/flow label, payload length, next header, hop limit
_IPPROTO_UDP = 17


def _stamp(anc: list[tuple[int, int, bytes]]) -> float:
    """The kernel receive time in an ``SO_TIMESTAMPNS`` control message (CLOCK_REALTIME), else now."""
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = array.array("q", data[:16])
            return sec + nsec * 1e-9
    return time.time()


@dataclass(frozen=True, slots=True)
class Datagram:
    """One datagram for the tester: where it came from, its UDP payload, its IP header if seen.

    On IPv4 the header is the one a raw socket saw (None when it saw none); on
    IPv6 it is always there, rebuilt from the kernel's ancillary data.
    """

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
        self.v6 = ":" in ip
        self._udp = socket.socket(socket.AF_INET6 if self.v6 else socket.AF_INET, socket.SOCK_DGRAM)
        try:
            if self.v6:
                self._packed = socket.inet_pton(socket.AF_INET6, ip)
                for opt, value in (
                    (socket.IPV6_V6ONLY, 1), (_IPV6_MTU_DISCOVER, _IPV6_PMTUDISC_DO), (_IPV6_RECVTCLASS, 1),
                    (_IPV6_RECVHOPLIMIT, 1), (_IPV6_FLOWINFO, 1), (_IPV6_FLOWINFO_SEND, 1),
                ):  # fmt: skip
                    self._udp.setsockopt(socket.IPPROTO_IPV6, opt, value)
                self._udp.setsockopt(SOL_UDP, UDP_NO_CHECK6_RX, 1)
            else:
                self._udp.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)
            self._udp.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            self._udp.bind((ip, port))
            self._udp.setblocking(False)
        except BaseException:
            self._udp.close()
            raise
        self.ip = self._udp.getsockname()[0]
        self.port = self._udp.getsockname()[1]
        self._raw: socket.socket | None = None
        self._labels: set[tuple[str, int]] = set()  # (destination, IPv6 flow label) leases this socket holds
        self._pending: deque[Datagram] = deque()  # the UDP socket's datagrams, for pairing
        self._ready: deque[Datagram] = deque()
        #: Payloads returned without their raw frame (`_orphan`): that frame, if it comes, is dropped.
        self._orphans: deque[bytes] = deque(maxlen=64)
        #: Payloads of raw frames returned without their UDP copies: those copies, if they come, are dropped.
        self._unpaired: deque[bytes] = deque(maxlen=64)
        if raw and not self.v6:
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
        """Whether received datagrams carry their IP header (IPv6, or a raw socket is open)."""
        return self.v6 or self._raw is not None

    @property
    def header_source(self) -> str:
        """Where received datagrams' IP headers come from, in words for a report."""
        if self.v6:
            return "IPv6 header from the kernel's ancillary data (traffic class, flow label, hop limit)"
        if self._raw is not None:
            return "raw socket (IPv4 headers seen)"
        return "IPv4 ID solved per packet"

    def send(
        self, payload: bytes, dst: tuple[str, int], tos: int = 0, hop_limit: int | None = None,
        flow_label: int = 0,
    ) -> float:  # fmt: skip
        """Send one datagram; return when (``time.time()``).

        ``tos`` is the IPv4 TOS byte or the IPv6 traffic class (DSCP and ECN);
        ``hop_limit`` the IPv6 hop limit or IPv4 TTL (None: the kernel's default);
        ``flow_label`` an IPv6 flow label (0: the kernel's, ``net.ipv6.auto_flowlabels``).
        """
        anc: list[tuple[int, int, bytes]] = []
        address: tuple[str, int] | tuple[str, int, int, int] = dst
        if flow_label:
            if not self.v6 or not 0 < flow_label <= 0xFFFFF:
                raise ValueError("a flow label is a 20-bit IPv6 field")
            self._lease(dst[0], flow_label)
            address = (dst[0], dst[1], flow_label, 0)
        if self.v6:
            if tos:
                anc.append((socket.IPPROTO_IPV6, _IPV6_TCLASS, struct.pack("=i", tos & 0xFF)))
            if hop_limit is not None:
                anc.append((socket.IPPROTO_IPV6, _IPV6_HOPLIMIT, struct.pack("=i", hop_limit & 0xFF)))
        else:
            if tos:
                anc.append((socket.IPPROTO_IP, _IP_TOS, bytes([tos & 0xFF])))
            if hop_limit is not None:
                anc.append((socket.IPPROTO_IP, socket.IP_TTL, struct.pack("=i", hop_limit & 0xFF)))
        at = time.time()
        self._udp.sendmsg([payload], anc, 0, address)
        return at

    def _lease(self, dst: str, label: int) -> None:
        """Hold ``label`` towards ``dst`` (``IPV6_FLOWLABEL_MGR``): Linux sends a chosen flow label
        only under a lease."""
        if (dst, label) in self._labels:
            return
        if len(self._labels) >= _FLOW_LABELS_MAX:
            raise ValueError(f"at most {_FLOW_LABELS_MAX} flow labels per link")
        req = _FLOWLABEL_REQ.pack(
            socket.inet_pton(socket.AF_INET6, dst), label.to_bytes(4, "big"), _IPV6_FL_A_GET, _IPV6_FL_S_ANY,
            _IPV6_FL_F_CREATE, 0, 0, 0,
        )  # fmt: skip
        self._udp.setsockopt(socket.IPPROTO_IPV6, _IPV6_FLOWLABEL_MGR, req)
        self._labels.add((dst, label))

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
            data, anc, _flags, addr = self._udp.recvmsg(_MAX_DATAGRAM, _ANC6 if self.v6 else _ANC)
        except BlockingIOError:
            return None
        src, sport = addr[0], addr[1]
        header = self._v6_header(src, len(data), anc) if self.v6 else None
        return Datagram(src, sport, data, header, _stamp(anc))

    def _v6_header(self, src: str, length: int, anc: list[tuple[int, int, bytes]]) -> bytes:
        """The fixed IPv6 header a datagram of ``length`` UDP payload bytes from ``src`` came with.

        The kernel sends ``IPV6_FLOWINFO`` (traffic class and flow label, network order)
        only when they are not all zero."""
        tclass, hop, flowinfo = 0, 0, 0
        for level, kind, data in anc:
            if level != socket.IPPROTO_IPV6 or len(data) < 4:
                continue
            if kind == _IPV6_TCLASS:
                tclass = struct.unpack("=i", data[:4])[0] & 0xFF
            elif kind == _IPV6_HOPLIMIT:
                hop = struct.unpack("=i", data[:4])[0] & 0xFF
            elif kind == _IPV6_FLOWINFO:
                flowinfo = int.from_bytes(data[:4], "big")
        first = 6 << 28 | tclass << 20 | flowinfo & 0xFFFFF
        return _IPV6_FIXED.pack(
            first, 8 + length, _IPPROTO_UDP, hop, socket.inet_pton(socket.AF_INET6, src), self._packed
        )

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
