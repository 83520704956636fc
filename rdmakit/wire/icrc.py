"""The RoCEv2 invariant CRC (IBTA Annex A17.3.3), exactly as Linux rxe computes it.

The ICRC is a CRC-32 (the Ethernet polynomial) over a pseudo-packet: 8 bytes of
0xFF standing for the masked LRH, the IP header with its variant fields set to
all ones (IPv4 TOS, TTL and checksum; IPv6 traffic class, flow label and hop
limit), the UDP header with its checksum set to all ones, the BTH with byte 4
(FECN, BECN, reserved) set to all ones, and then everything after the BTH up to
the end of the pad. Everything else stays in, notably the IPv4 Identification
and flags. The result is stored least significant byte first on the wire (rxe
``rxe_icrc.c``; scapy ``contrib/roce.py``).

Speed: the CRC of the payload is one call into the fastest CRC-32 at hand; what
remains is the per-packet pseudo-header. :class:`IcrcFlow` caches the CRC state
after the masked IP/UDP header of one flow for each packet length, which is the
cheapest way to ICRC many packets between the same two ports.
"""

import struct
import zlib
from array import array
from collections.abc import Callable

from .errors import LocalWireError, WireError
from .packet import BTH_LEN, ICRC_LEN, Payload, _byte_view

Crc32 = Callable[[Payload, int], int]


def _pick_crc32() -> tuple[Crc32, str]:
    """The fastest CRC-32 at hand with zlib's polynomial and calling convention.

    Order from ``benchmarks/bench_wire.py`` (AMD EPYC, x86-64, against zlib
    1.2.13): at 4 KiB zlib-ng 2.x is 3.7x zlib and ISA-L 3.3x, at 64 KiB 4.1x
    and 3.4x; at 1 KiB they tie and under that ISA-L is ~10 ns ahead, which
    the ICRC's per-call overhead hides. Rerun the benchmark on other CPUs.
    """
    try:
        from zlib_ng import zlib_ng

        return zlib_ng.crc32, "zlib-ng"
    except ImportError:
        pass
    try:
        from isal import isal_zlib

        return isal_zlib.crc32, "isal"
    except ImportError:
        pass
    return zlib.crc32, "zlib"


crc32, CRC32_IMPL = _pick_crc32()

#: CRC-32 state after the 8 bytes of 0xFF that stand for the masked LRH.
_SEED = 0x2144DF1C
ROCE_UDP_PORT = 4791
IP_PROTO_UDP = 17
_ICRC = struct.Struct("<I")
# Masked IPv4 header (version/IHL, TOS=FF, total length, ID, flags, TTL=FF,
# protocol, checksum=FFFF, src, dst) + masked UDP header (ports, length, checksum=FFFF).
_V4_MASKED = struct.Struct(">BBHHHBBH4s4sHHHH")
# Masked IPv6 header (version 6 + traffic class and flow label all ones, payload
# length, next header, hop limit=FF, src, dst) + masked UDP header.
_V6_MASKED = struct.Struct(">IHBB16s16sHHHH")
#: (version/IHL, total length, protocol) of an IPv4 header.
_V4_FIELDS = struct.Struct(">BxH5xB")
#: (version/class/flow label, payload length, next header) of an IPv6 header.
_V6_FIELDS = struct.Struct(">IHB")
_BYTES_TYPES = (bytes, bytearray)
_V4_LEN = 20
_V6_LEN = 40
_UDP_LEN = 8
#: Headers no longer than this are masked by copying them whole.
_SMALL_FIRST = 64
#: Bound on the per-flow cache of header states (one entry per packet length and GSO segment).
_FLOW_CACHE_MAX = 1024
#: The IPv4 IDs rdmakit's packets carry: segment k of a UDP GSO batch (at most
#: 64 segments, UDP_MAX_SEGMENTS) has ID k (``inet_gso_segment``).
SEGMENT_IDS = 64


def _body_crc(crc: int, parts: tuple[Payload, ...]) -> int:
    """Continue ``crc`` over ``parts`` (BTH .. pad) with BTH byte 4 (FECN, BECN, resv6) masked.

    The common case is a first part of headers only (at most ``_SMALL_FIRST``
    bytes), masked in a copy; payload and pad follow as further parts.
    """
    if not parts:
        raise LocalWireError("an ICRC needs the packet's bytes")
    first = parts[0]
    try:
        if BTH_LEN <= len(first) <= _SMALL_FIRST:
            m = bytearray(first)
            m[4] = 0xFF
            crc = crc32(m, crc)
        elif len(first) >= BTH_LEN:
            m = bytearray(first[:BTH_LEN])
            m[4] = 0xFF
            crc = crc32(memoryview(first)[BTH_LEN:], crc32(m, crc))
        else:
            raise WireError("an ICRC needs at least a whole BTH in the first part")
        for p in parts[1:]:
            if p:
                crc = crc32(p, crc)
    except (TypeError, BufferError) as e:
        raise LocalWireError(f"ICRC parts must be byte buffers: {e}") from None
    return crc


def _check_addrs(src: bytes, dst: bytes, size: int) -> None:
    if len(src) != size or len(dst) != size:
        raise LocalWireError(f"IP addresses must be {size} bytes, got {len(src)} and {len(dst)}")


def icrc_ipv4(
    src: bytes, dst: bytes, sport: int, dport: int, *parts: Payload, ident: int = 0, df: bool = True
) -> int:
    """ICRC of a RoCEv2 packet carried in IPv4/UDP.

    ``src``/``dst`` are 4-byte addresses; ``parts`` concatenated are the UDP
    payload from the BTH to the end of the pad (no ICRC), the first part
    holding at least the whole BTH. ``ident`` and ``df`` are the IPv4
    Identification and Don't Fragment values the datagram will carry on the
    wire: both are covered by the ICRC. For many packets of one flow,
    :class:`IcrcFlow` is faster.
    """
    if len(src) != 4 or len(dst) != 4:
        _check_addrs(src, dst, 4)
    try:
        n = ICRC_LEN
        for p in parts:
            n += len(p)
        crc = crc32(_V4_MASKED.pack(
            0x45, 0xFF, _V4_LEN + _UDP_LEN + n, ident, 0x4000 if df else 0, 0xFF, IP_PROTO_UDP, 0xFFFF,
            src, dst, sport, dport, _UDP_LEN + n, 0xFFFF,
        ), _SEED)  # fmt: skip
    except (TypeError, BufferError, struct.error) as e:
        raise LocalWireError(f"icrc_ipv4: {e}") from None
    return _body_crc(crc, parts)


def icrc_ipv6(
    src: bytes, dst: bytes, sport: int, dport: int, *parts: Payload, next_header: int = IP_PROTO_UDP
) -> int:
    """ICRC of a RoCEv2 packet carried in IPv6/UDP (``src``/``dst`` 16 bytes)."""
    if len(src) != 16 or len(dst) != 16:
        _check_addrs(src, dst, 16)
    try:
        n = ICRC_LEN
        for p in parts:
            n += len(p)
        crc = crc32(_V6_MASKED.pack(
            0x6FFFFFFF, _UDP_LEN + n, next_header, 0xFF, src, dst, sport, dport, _UDP_LEN + n, 0xFFFF
        ), _SEED)  # fmt: skip
    except (TypeError, BufferError, struct.error) as e:
        raise LocalWireError(f"icrc_ipv6: {e}") from None
    return _body_crc(crc, parts)


class IcrcFlow:
    """ICRCs of the packets of one flow: fixed addresses, ports (and IPv4 ID and DF).

    ``flow.icrc(*parts)`` equals ``icrc_ipv4(src, dst, sport, dport, *parts,
    ident=ident, df=df)`` (or ``icrc_ipv6``), but caches the CRC state after
    the masked pseudo-LRH, IP and UDP headers for each packet length it sees,
    so a packet costs the CRC of its BTH and body only. Use it when the IPv4
    ID is fixed for the flow, as on an unconnected UDP socket with
    ``IP_PMTUDISC_DO`` (ID 0).

    Segment *k* of a UDP GSO batch carries IPv4 ID ``ident + k`` (see
    :mod:`rdmakit.transport.udp`): ``flow.icrc_seg(k, *parts)`` is its ICRC, and
    ``flow.state(n, k)`` the cached header state itself, for hot loops that
    continue it with :func:`crc32` over the BTH (byte 4 masked) and body.
    IPv6 has no ID: ``k`` is ignored there.

    Where the network split the batch (a NIC's or a qdisc's segmentation) or
    GRO merged part of one, a segment's place in what was read no longer says
    its ID. ``flow.id_shifts(n)`` lets one CRC decide among all
    ``SEGMENT_IDS`` candidates: CRC-32 is affine, so for equal lengths
    ``icrc(ID a) ^ icrc(ID b)`` depends only on ``a ^ b``, and a segment checked
    with ID ``k`` whose ICRC differs by ``id_shifts(n)[d]`` carried ID ``k ^ d``.
    """

    __slots__ = ("_arrays", "_header", "_shifts", "_v6", "states")

    def __init__(self, header: Callable[[int, int], bytes], v6: bool = False) -> None:
        """Use :meth:`ipv4` or :meth:`ipv6`; ``header(n, k)``: the masked headers for ``n``
        bytes after UDP (BTH .. ICRC) in segment ``k``."""
        self._header = header
        self._v6 = v6
        #: ``n | k << 16`` -> CRC state after the masked headers (read-only; see :meth:`state`).
        self.states: dict[int, int] = {}
        self._arrays: dict[int, array[int]] = {}
        self._shifts: dict[int, tuple[array[int], dict[int, int]]] = {}
        header(BTH_LEN + ICRC_LEN, 0)  # validate the addresses and ports now

    @classmethod
    def ipv4(
        cls, src: bytes, dst: bytes, sport: int, dport: int, *, ident: int = 0, df: bool = True
    ) -> "IcrcFlow":
        _check_addrs(src, dst, 4)
        pack, flags = _V4_MASKED.pack, 0x4000 if df else 0

        def header(n: int, k: int) -> bytes:
            return pack(
                0x45, 0xFF, _V4_LEN + _UDP_LEN + n, (ident + k) & 0xFFFF, flags, 0xFF, IP_PROTO_UDP,
                0xFFFF, src, dst, sport, dport, _UDP_LEN + n, 0xFFFF,
            )  # fmt: skip

        return cls._checked(header, False)

    @classmethod
    def ipv6(
        cls, src: bytes, dst: bytes, sport: int, dport: int, *, next_header: int = IP_PROTO_UDP
    ) -> "IcrcFlow":
        _check_addrs(src, dst, 16)
        pack = _V6_MASKED.pack

        def header(n: int, k: int) -> bytes:
            return pack(
                0x6FFFFFFF, _UDP_LEN + n, next_header, 0xFF, src, dst, sport, dport, _UDP_LEN + n, 0xFFFF
            )

        return cls._checked(header, True)

    @classmethod
    def _checked(cls, header: Callable[[int, int], bytes], v6: bool) -> "IcrcFlow":
        try:
            return cls(header, v6)
        except struct.error as e:
            raise LocalWireError(f"IP/UDP header: {e}") from None

    def icrc(self, *parts: Payload) -> int:
        """ICRC of the packet whose BTH .. pad are ``parts`` concatenated."""
        return self.icrc_seg(0, *parts)

    def icrc_seg(self, k: int, *parts: Payload) -> int:
        """ICRC of segment ``k`` of a GSO batch (IPv4 ID ``ident + k``) made of ``parts``."""
        try:
            n = ICRC_LEN
            for p in parts:
                n += len(p)
            crc = self.states.get(n | k << 16) if 0 <= k < 0x10000 else None
            if crc is None:
                crc = self.state(n, k)
            first = parts[0] if parts else b""
            if BTH_LEN <= len(first) <= _SMALL_FIRST:
                m = bytearray(first)
                m[4] = 0xFF
                crc = crc32(m, crc)
                for p in parts[1:]:
                    if p:
                        crc = crc32(p, crc)
                return crc
        except (TypeError, BufferError) as e:
            raise LocalWireError(f"ICRC parts must be byte buffers: {e}") from None
        return _body_crc(crc, parts)

    def state(self, n: int, k: int = 0) -> int:
        """CRC state after the masked headers of segment ``k`` with ``n`` bytes after UDP (BTH .. ICRC)."""
        if not 0 <= k < 0x10000:
            raise LocalWireError(f"GSO segment index {k} is not a u16")
        states = self.states
        if len(states) >= _FLOW_CACHE_MAX:
            states.clear()
        try:
            crc = states[n | k << 16] = crc32(self._header(n, 0 if self._v6 else k), _SEED)
        except struct.error as e:
            raise LocalWireError(f"a packet of {n - ICRC_LEN} bytes does not fit in a UDP datagram") from e
        return crc

    def seg_states(self, n: int, count: int) -> "array[int]":
        """``state(n, k)`` for ``k`` in ``range(count)`` (at least), as a native ``uint32`` array.

        For code that continues the CRC of many segments of one size in bulk.
        """
        arr = self._arrays.get(n)
        if arr is None or len(arr) < count:
            if len(self._arrays) >= _FLOW_CACHE_MAX:
                self._arrays.clear()
            arr = self._arrays[n] = array("I", [self.state(n, k) for k in range(count)])
        return arr

    def id_shifts(self, n: int) -> "array[int]":
        """``icrc(ID d) ^ icrc(ID 0)`` of an ``n``-byte segment (BTH .. ICRC) for ``d`` in
        ``range(SEGMENT_IDS)``, as a native ``uint32`` array (all 0 on IPv6)."""
        return self._shift_table(n)[0]

    def id_shift(self, n: int, diff: int) -> int | None:
        """The ``d`` below ``SEGMENT_IDS`` with ``id_shifts(n)[d] == diff``, or None.

        ``diff`` is a received ICRC XOR the one computed with some ID ``k``: the
        segment carried ID ``k ^ d``. A corrupted segment passes with probability
        ``SEGMENT_IDS / 2**32`` = 2^-26 (the shifts are distinct; ``test_icrc_ids``).
        """
        return self._shift_table(n)[1].get(diff)

    def _shift_table(self, n: int) -> "tuple[array[int], dict[int, int]]":
        got = self._shifts.get(n)
        if got is None:
            if len(self._shifts) >= _FLOW_CACHE_MAX:
                self._shifts.clear()
            zeros = bytes(n - ICRC_LEN)
            base = crc32(zeros, self.state(n, 0))
            if self._v6:
                arr = array("I", bytes(4 * SEGMENT_IDS))
            else:  # the header states, not cached in ``states`` (one per ID is not kept)
                hdr = self._header
                arr = array("I", [crc32(zeros, crc32(hdr(n, d), _SEED)) ^ base for d in range(SEGMENT_IDS)])
            got = self._shifts[n] = (arr, {0: 0} if self._v6 else {v: d for d, v in enumerate(arr)})
        return got


def pack_icrc(value: int) -> bytes:
    """The 4 ICRC bytes as they appear on the wire."""
    return _ICRC.pack(value)


def unpack_icrc(data: Payload) -> int:
    """The ICRC in the last 4 bytes of ``data`` (a UDP payload as received)."""
    mv = _byte_view(data)
    if len(mv) < ICRC_LEN:
        raise WireError("datagram too short for an ICRC")
    return int(_ICRC.unpack_from(mv, len(mv) - ICRC_LEN)[0])


def icrc_of_ip_packet(ip_packet: Payload) -> int:
    """ICRC of a whole IPv4 or IPv6 packet (headers .. pad, without the ICRC).

    For captures and packet sockets, where the real IP header is known. The
    IPv4 header must be exactly 20 bytes and the IPv6 header be followed
    directly by UDP, as rxe assumes; the IP length field must count the 4
    ICRC bytes that ``ip_packet`` leaves out. Raises :class:`WireError`
    otherwise.
    """
    mv = memoryview(ip_packet) if type(ip_packet) in _BYTES_TYPES else _byte_view(ip_packet)
    n = len(mv)
    if n < _V4_LEN + _UDP_LEN + BTH_LEN:
        raise WireError(f"IP packet of {n} bytes is too short for UDP and a BTH")
    first = mv[0]
    if first == 0x45:
        _, ip_len, proto = _V4_FIELDS.unpack_from(mv)
        udp = _V4_LEN
    elif first >> 4 == 6:
        if n < _V6_LEN + _UDP_LEN + BTH_LEN:
            raise WireError(f"IPv6 packet of {n} bytes is too short for UDP and a BTH")
        _, plen, proto = _V6_FIELDS.unpack_from(mv)
        ip_len = _V6_LEN + plen
        udp = _V6_LEN
    elif first >> 4 == 4:
        raise WireError("IPv4 header with options is not RoCEv2 (rxe assumes 20 bytes)")
    else:
        raise WireError(f"IP version {first >> 4}")
    if proto != IP_PROTO_UDP:
        raise WireError(f"IP next protocol {proto} is not UDP")
    if ip_len != n + ICRC_LEN:
        raise WireError(f"IP length field says {ip_len} bytes, packet has {n} + {ICRC_LEN} ICRC")
    end = udp + _UDP_LEN + BTH_LEN
    h = bytearray(mv[:end])
    if udp == _V4_LEN:
        h[1] = h[8] = h[10] = h[11] = 0xFF  # TOS, TTL, header checksum
    else:
        h[0] |= 0x0F  # traffic class, flow label, hop limit
        h[1] = h[2] = h[3] = h[7] = 0xFF
    h[udp + 6] = h[udp + 7] = 0xFF  # UDP checksum
    h[udp + _UDP_LEN + 4] = 0xFF  # BTH FECN, BECN, resv6
    return crc32(mv[end:], crc32(h, _SEED))
