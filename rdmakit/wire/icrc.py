"""The RoCEv2 invariant CRC (IBTA Annex A17.3.3), exactly as Linux rxe computes it.

The ICRC is a CRC-32 (the Ethernet polynomial) over a pseudo-packet: 8 bytes of
0xFF standing for the masked LRH, the IP header with its variant fields set to
all ones (IPv4 TOS, TTL and checksum; IPv6 traffic class, flow label and hop
limit), the UDP header with its checksum set to all ones, the BTH with byte 4
(FECN, BECN, reserved) set to all ones, and then everything after the BTH up to
the end of the pad. Everything else stays in, notably the IPv4 Identification
and flags. The result is stored least significant byte first on the wire (rxe
``rxe_icrc.c``; scapy ``contrib/roce.py``).
"""

import struct
import zlib
from collections.abc import Callable

from .errors import WireError
from .packet import BTH_LEN, ICRC_LEN, Payload

Crc32 = Callable[[Payload, int], int]


def _pick_crc32() -> tuple[Crc32, str]:
    """The fastest CRC-32 at hand with zlib's polynomial and calling convention."""
    try:
        from isal import isal_zlib

        return isal_zlib.crc32, "isal"
    except ImportError:
        pass
    try:
        from zlib_ng import zlib_ng

        return zlib_ng.crc32, "zlib-ng"
    except ImportError:
        pass
    return zlib.crc32, "zlib"


crc32, CRC32_IMPL = _pick_crc32()

#: CRC-32 state after the 8 bytes of 0xFF that stand for the masked LRH.
_SEED = 0x2144DF1C
ROCE_UDP_PORT = 4791
IP_PROTO_UDP = 17
_ICRC = struct.Struct("<I")
_V4_MASKED = struct.Struct(">BBHHHBBH4s4sHHHH")
_V6_MASKED = struct.Struct(">IHBB16s16sHHHH")


def _masked_bth(first: Payload) -> bytes:
    b = bytes(first[:BTH_LEN])
    if len(b) < BTH_LEN:
        raise WireError("an ICRC needs at least a whole BTH")
    return b[:4] + b"\xff" + b[5:]


def _finish(crc: int, parts: tuple[Payload, ...]) -> int:
    first = parts[0]
    crc = crc32(_masked_bth(first), crc)
    if len(first) > BTH_LEN:
        crc = crc32(memoryview(first)[BTH_LEN:], crc)
    for p in parts[1:]:
        crc = crc32(p, crc)
    return crc


def _total(parts: tuple[Payload, ...]) -> int:
    return sum(len(p) for p in parts)


def icrc_ipv4(
    src: bytes, dst: bytes, sport: int, dport: int, *parts: Payload, ident: int = 0, df: bool = True
) -> int:
    """ICRC of a RoCEv2 packet carried in IPv4/UDP.

    ``src``/``dst`` are 4-byte addresses; ``parts`` concatenated are the UDP
    payload from the BTH to the end of the pad (no ICRC). ``ident`` and ``df``
    are the IPv4 Identification and Don't Fragment values the datagram will
    carry on the wire: both are covered by the ICRC.
    """
    n = _total(parts) + ICRC_LEN
    hdr = _V4_MASKED.pack(
        0x45, 0xFF, 20 + 8 + n, ident, 0x4000 if df else 0, 0xFF, IP_PROTO_UDP, 0xFFFF,
        src, dst, sport, dport, 8 + n, 0xFFFF,
    )  # fmt: skip
    return _finish(crc32(hdr, _SEED), parts)


def icrc_ipv6(
    src: bytes, dst: bytes, sport: int, dport: int, *parts: Payload, next_header: int = IP_PROTO_UDP
) -> int:
    """ICRC of a RoCEv2 packet carried in IPv6/UDP (``src``/``dst`` 16 bytes)."""
    n = _total(parts) + ICRC_LEN
    hdr = _V6_MASKED.pack(0x6FFFFFFF, 8 + n, next_header, 0xFF, src, dst, sport, dport, 8 + n, 0xFFFF)
    return _finish(crc32(hdr, _SEED), parts)


def pack_icrc(value: int) -> bytes:
    """The 4 ICRC bytes as they appear on the wire."""
    return _ICRC.pack(value)


def unpack_icrc(data: Payload) -> int:
    if len(data) < ICRC_LEN:
        raise WireError("datagram too short for an ICRC")
    return int(_ICRC.unpack_from(data, len(data) - ICRC_LEN)[0])


def icrc_of_ip_packet(ip_packet: Payload) -> int:
    """ICRC of a whole IPv4 or IPv6 packet (headers .. pad, without the ICRC).

    For captures and packet sockets, where the real IP header is known. The
    IPv4 header must be exactly 20 bytes, as rxe assumes.
    """
    b = bytearray(ip_packet)
    if len(b) < 1:
        raise WireError("empty IP packet")
    version = b[0] >> 4
    if version == 4:
        if b[0] != 0x45:
            raise WireError("IPv4 header with options is not RoCEv2 (rxe assumes 20 bytes)")
        b[1] = 0xFF
        b[8] = 0xFF
        b[10:12] = b"\xff\xff"
        udp = 20
    elif version == 6:
        if len(b) < 40:
            raise WireError("truncated IPv6 header")
        b[0] |= 0x0F
        b[1:4] = b"\xff\xff\xff"
        b[7] = 0xFF
        udp = 40
    else:
        raise WireError(f"IP version {version}")
    if len(b) < udp + 8 + BTH_LEN:
        raise WireError("IP packet too short for UDP and a BTH")
    b[udp + 6 : udp + 8] = b"\xff\xff"
    b[udp + 8 + 4] = 0xFF
    return crc32(bytes(b), _SEED)
