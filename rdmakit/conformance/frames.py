"""The tester's packets: built and dissected with scapy, ICRCs checked independently of ``rdmakit.wire``.

Requests and responses are scapy ``IP/UDP/BTH/...`` or ``IPv6/UDP/BTH/...``
stacks (``scapy.contrib.roce`` and :mod:`.scapy_layers`), by the family of the
tester's address; the ICRC is scapy's ``BTH.compute_icrc`` over the masked
IPv4 or IPv6 pseudo-header (IBTA Annex A17.3.3; on IPv6 traffic class, flow
label and hop limit are masked, Annex A17.4). The tester sends IPv4 with DF
set and an Identification of 0 (:mod:`rdmakit.transport.probe`), so that is
the header its ICRCs cover.

A received IPv6 packet's ICRC is checked against the header it came with
(:mod:`rdmakit.transport.probe` rebuilds it from the kernel's ancillary data;
``method="ipv6-header"``): scapy masks its real traffic class, flow label and
hop limit.

A received packet's ICRC is checked against its real IPv4 header when the
link saw it (a raw socket, ``method="ip-header"``). Otherwise the
Identification is unknown: CRC-32 is affine over GF(2), so for one packet
length ``icrc(id) = icrc(0) ^ L(id)`` with ``L`` linear; the tester computes
``L`` on the 16 unit IDs with scapy and finds the ID whose ICRC matches by
meeting in the middle (256 + 256 candidates: the whole 2^16 space), or proves
none does (``method="solved-id"``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scapy.packet import Packet as ScapyPacket


@lru_cache(maxsize=1)
def scapy() -> SimpleNamespace:
    """scapy's layers, imported on first use: listing the cases needs no scapy."""
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.packet import Raw

    from .scapy_layers import IETH, RETH, AtomicAckETH, AtomicETH, ImmDt

    return SimpleNamespace(
        BTH=BTH, IP=IP, IPv6=IPv6, UDP=UDP, Raw=Raw, IETH=IETH, RETH=RETH, AtomicAckETH=AtomicAckETH,
        AtomicETH=AtomicETH, ImmDt=ImmDt,
    )  # fmt: skip


ROCE_PORT = 4791

# RC opcodes (IBTA Vol. 1 §9.2 table 35).
SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_LAST_IMM, SEND_ONLY, SEND_ONLY_IMM = range(6)
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM = range(6, 12)
READ_REQUEST = 0x0C
READ_RESP_FIRST, READ_RESP_MIDDLE, READ_RESP_LAST, READ_RESP_ONLY = range(0x0D, 0x11)
ACKNOWLEDGE = 0x11
ATOMIC_ACKNOWLEDGE = 0x12
COMPARE_SWAP = 0x13
FETCH_ADD = 0x14
SEND_LAST_INV = 0x16
SEND_ONLY_INV = 0x17
UD_SEND_ONLY = 0x64  # the CM's MADs to QP1
QP1_QKEY = 0x80010000  # IBTA Vol. 1 ch. 13: the GSI's well-known Q_Key
#: CM attribute IDs (IBTA Vol. 1 ch. 12, the MAD attribute of each CM message).
REQ, MRA, REJ, REP, RTU, DREQ, DREP = 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16

OPCODE_NAMES = {
    0: "SEND_FIRST", 1: "SEND_MIDDLE", 2: "SEND_LAST", 3: "SEND_LAST_IMM", 4: "SEND_ONLY",
    5: "SEND_ONLY_IMM", 6: "WRITE_FIRST", 7: "WRITE_MIDDLE", 8: "WRITE_LAST", 9: "WRITE_LAST_IMM",
    10: "WRITE_ONLY", 11: "WRITE_ONLY_IMM", 12: "READ_REQUEST", 13: "READ_RESP_FIRST",
    14: "READ_RESP_MIDDLE", 15: "READ_RESP_LAST", 16: "READ_RESP_ONLY", 17: "ACKNOWLEDGE",
    18: "ATOMIC_ACKNOWLEDGE", 19: "COMPARE_SWAP", 20: "FETCH_ADD", 22: "SEND_LAST_INV", 23: "SEND_ONLY_INV",
}  # fmt: skip

_WITH_RETH = {WRITE_FIRST, WRITE_ONLY, WRITE_ONLY_IMM, READ_REQUEST}
_WITH_IMM = {SEND_LAST_IMM, SEND_ONLY_IMM, WRITE_LAST_IMM, WRITE_ONLY_IMM}
_WITH_AETH = {READ_RESP_FIRST, READ_RESP_LAST, READ_RESP_ONLY, ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE}

# AETH syndromes (IBTA §9.7.5.1 tables 44, 45).
ACK_KIND, RNR_KIND, NAK_KIND = 0, 1, 3
NAK_PSN_SEQ, NAK_INVALID_REQ, NAK_REMOTE_ACCESS, NAK_REMOTE_OP = 0, 1, 2, 3
CREDITS_UNLIMITED = 0x1F
PSN_MASK = 0xFFFFFF


def syndrome(kind: int, value: int) -> int:
    return (kind << 5) | (value & 0x1F)


def psn_add(psn: int, n: int) -> int:
    return (psn + n) & PSN_MASK


@dataclass(frozen=True, slots=True)
class Flow:
    """The addresses a tester's packets carry: (src ip, src port) -> (dst ip, 4791)."""

    src: str
    dst: str
    sport: int = ROCE_PORT
    dport: int = ROCE_PORT

    def ip(self, ip_id: int = 0) -> ScapyPacket:
        """The IP layer of the tester's packets: IPv4 with DF and ``ip_id``, or IPv6 (nothing to fix:
        the ICRC masks traffic class, flow label and hop limit, whatever the kernel puts there)."""
        return ip_layer(self.src, self.dst, ip_id, True)


def ip_layer(src: str, dst: str, ip_id: int, df: bool) -> ScapyPacket:
    S = scapy()
    layer: ScapyPacket
    if ":" in src:
        layer = S.IPv6(src=src, dst=dst, nh=17)
    else:
        layer = S.IP(src=src, dst=dst, id=ip_id, flags="DF" if df else 0)
    return layer


def build(
    flow: Flow,
    opcode: int,
    dqpn: int,
    psn: int,
    *,
    payload: bytes = b"",
    ackreq: bool = False,
    solicited: bool = False,
    pkey: int = 0xFFFF,
    version: int = 0,
    reth: tuple[int, int, int] | None = None,
    atomic: tuple[int, int, int, int] | None = None,
    imm: int | None = None,
    ieth: int | None = None,
    aeth: tuple[int, int] | None = None,
    orig: int | None = None,
    corrupt_icrc: bool = False,
    ip_id: int = 0,
) -> bytes:
    """The UDP payload (BTH .. ICRC) of one RC packet, as scapy builds it.

    ``reth`` is (va, rkey, dma_len); ``atomic`` (va, rkey, swap_or_add, compare);
    ``aeth`` (syndrome, msn). Headers are stacked in IBTA §9.2 order whatever
    the opcode, so a test can put a wrong one on purpose.
    """
    S = scapy()
    pad = -len(payload) % 4
    stack: ScapyPacket = S.BTH(
        opcode=opcode, solicited=int(solicited), padcount=pad, version=version, pkey=pkey,
        dqpn=dqpn, ackreq=int(ackreq), psn=psn & PSN_MASK,
    )  # fmt: skip
    if reth is not None:
        stack = stack / S.RETH(va=reth[0], rkey=reth[1], dlen=reth[2])
    if aeth is not None:
        stack = stack / S.Raw(bytes([aeth[0]]) + (aeth[1] & PSN_MASK).to_bytes(3, "big"))
    if orig is not None:
        stack = stack / S.AtomicAckETH(origremdt=orig)
    if atomic is not None:
        stack = stack / S.AtomicETH(va=atomic[0], rkey=atomic[1], swapdt=atomic[2], cmpdt=atomic[3])
    if imm is not None:
        stack = stack / S.ImmDt(immdt=imm)
    if ieth is not None:
        stack = stack / S.IETH(rkey=ieth)
    stack = stack / S.Raw(payload + b"\0" * pad)
    pkt = flow.ip(ip_id) / S.UDP(sport=flow.sport, dport=flow.dport) / stack
    body = bytes(pkt[S.UDP].payload)
    if corrupt_icrc:
        body = body[:-4] + bytes(b ^ 0xFF for b in body[-4:])
    return body


def _icrc_for(
    src: str, dst: str, sport: int, dport: int, body: bytes, ip_id: int, df: bool, v6_header: bytes = b""
) -> bytes:
    """scapy's ICRC of ``body`` (its own last 4 bytes replaced) under an IPv4 header, or under
    ``v6_header`` as received (traffic class, flow label, hop limit as they came)."""
    S = scapy()
    ip = S.IPv6(v6_header[:40]) if v6_header else ip_layer(src, dst, ip_id, df)
    ip.remove_payload()
    pkt = ip / S.UDP(sport=sport, dport=dport) / S.BTH(body)
    del pkt[S.BTH].icrc
    return bytes(pkt)[-4:]


def unmasked_v6_icrc(flow: Flow, body: bytes, tclass: int, flow_label: int, hop_limit: int) -> bytes:
    """The ICRC of ``body`` (its last 4 bytes left out) as a sender that forgot Annex A17.3.3's IPv6
    masks computes it: over the traffic class, flow label and hop limit it sends with, not ones.

    The rest is as ``BTH.compute_icrc``: 8 bytes of ones for the LRH, the UDP checksum and BTH
    byte 4 masked, CRC-32 stored least significant byte first. With all three fields at ones
    it is scapy's ICRC (``tests/conformance/test_ipv6.py`` checks it)."""
    S = scapy()
    n = 8 + len(body)
    ip = S.IPv6(src=flow.src, dst=flow.dst, nh=17, tc=tclass, fl=flow_label, hlim=hop_limit, plen=n)
    udp = S.UDP(sport=flow.sport, dport=flow.dport, len=n, chksum=0xFFFF)
    bth = bytearray(body[:-4])
    bth[4] = 0xFF
    crc = zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth))
    return crc.to_bytes(4, "little")


@lru_cache(maxsize=64)
def _id_basis(length: int, df: bool) -> tuple[int, ...]:
    """L(1 << i) for the 16 ID bits, for bodies of ``length`` bytes (any content, any addresses)."""
    body = bytes(length)
    zero = int.from_bytes(_icrc_for("0.0.0.0", "0.0.0.0", 0, 0, body, 0, df), "little")
    return tuple(
        int.from_bytes(_icrc_for("0.0.0.0", "0.0.0.0", 0, 0, body, 1 << i, df), "little") ^ zero
        for i in range(16)
    )


def solve_ip_id(src: str, dst: str, sport: int, dport: int, body: bytes, df: bool = True) -> int | None:
    """The IPv4 Identification that makes ``body``'s ICRC check, or None when none of the 2^16 does."""
    basis = _id_basis(len(body), df)
    base = int.from_bytes(_icrc_for(src, dst, sport, dport, body[:-4] + b"\0\0\0\0", 0, df), "little")
    want = int.from_bytes(body[-4:], "little") ^ base

    def span(bits: tuple[int, ...]) -> list[int]:
        out = [0]
        for v in bits:
            out += [x ^ v for x in out]
        return out

    low = {v: i for i, v in enumerate(span(basis[:8]))}
    for hi, v in enumerate(span(basis[8:])):
        lo = low.get(want ^ v)
        if lo is not None:
            return (hi << 8) | lo
    return None


@dataclass(slots=True)
class Rx:
    """One packet the DUT sent, as scapy dissected it."""

    opcode: int
    dqpn: int
    psn: int
    ackreq: bool
    pkey: int
    version: int
    padcount: int
    payload: bytes
    icrc_ok: bool
    icrc_method: str
    syndrome: int | None = None
    msn: int | None = None
    orig: int | None = None
    reth: tuple[int, int, int] | None = None
    atomic: tuple[int, int, int, int] | None = None
    imm: int | None = None
    ip_id: int | None = None
    extra: dict[str, object] = field(default_factory=dict)
    #: The UDP source port, the BTH SE and MigReq bits, the reserved bits (resv6, resv7),
    #: the IPv4 TOS byte or IPv6 traffic class (None when the link did not see the header), the pad bytes.
    sport: int = 0
    solicited: bool = False
    migreq: bool = False
    reserved: int = 0
    tos: int | None = None
    pad: bytes = b""
    #: The IPv4 TTL or IPv6 hop limit, and the IPv6 flow label (None when not seen, or IPv4).
    hop_limit: int | None = None
    flow_label: int | None = None
    #: When the DUT sent it: the kernel's receive time at the tester (``time.time()`` clock).
    stamp: float = 0.0

    @property
    def name(self) -> str:
        return OPCODE_NAMES.get(self.opcode, f"0x{self.opcode:02x}")

    @property
    def ack_kind(self) -> int | None:
        return None if self.syndrome is None else self.syndrome >> 5

    def is_ack(self) -> bool:
        return self.opcode == ACKNOWLEDGE and self.ack_kind == ACK_KIND

    def is_nak(self, code: int | None = None) -> bool:
        return (
            self.opcode == ACKNOWLEDGE
            and self.ack_kind == NAK_KIND
            and (code is None or (self.syndrome is not None and self.syndrome & 0x1F == code))
        )

    def is_rnr(self) -> bool:
        return self.opcode == ACKNOWLEDGE and self.ack_kind == RNR_KIND

    def describe(self) -> str:
        s = f"{self.name} psn={self.psn:#x}"
        if self.syndrome is not None:
            s += f" syndrome={self.syndrome:#04x} msn={self.msn}"
        if self.orig is not None:
            s += f" orig={self.orig:#x}"
        if self.payload:
            s += f" len={len(self.payload)}"
        return s


def check_icrc(
    src: str, sport: int, dst: str, dport: int, body: bytes, ip_header: bytes | None
) -> tuple[bool, str, int]:
    """Whether ``body``'s ICRC checks; how it was checked; the IPv4 ID it covers (-1: none)."""
    if ":" in src:
        if ip_header is None or len(ip_header) < 40:
            return False, "ipv6-header: the link gave no IPv6 header", -1
        return _icrc_for(src, dst, sport, dport, body, 0, True, ip_header) == body[-4:], "ipv6-header", -1
    if ip_header is not None:
        ip_id = int.from_bytes(ip_header[4:6], "big")
        df = bool(ip_header[6] & 0x40)
        ok = _icrc_for(src, dst, sport, dport, body, ip_id, df) == body[-4:]
        method = "ip-header"
        if not ok:  # say which ID the sender computed its ICRC for, if any
            meant = solve_ip_id(src, dst, sport, dport, body, df)
            method += f": the IP ID was {ip_id:#06x}, the ICRC covers " + (
                f"ID {meant:#06x}" if meant is not None else "no ID"
            )
        return ok, method, ip_id
    solved = solve_ip_id(src, dst, sport, dport, body, True)
    if solved is None:
        solved = solve_ip_id(src, dst, sport, dport, body, False)
    return solved is not None, "solved-id", -1 if solved is None else solved


def dissect(src: str, sport: int, dst: str, dport: int, body: bytes, ip_header: bytes | None) -> Rx | None:
    """Dissect one received UDP payload; None when it is not an RC packet scapy can read."""
    if len(body) < 16:
        return None
    S = scapy()
    ok, method, ip_id = check_icrc(src, sport, dst, dport, body, ip_header)
    bth = S.BTH(body)
    op = int(bth.opcode)
    pad = int(bth.padcount)
    rest = body[12:-4]
    rx = Rx(
        opcode=op, dqpn=int(bth.dqpn), psn=int(bth.psn), ackreq=bool(bth.ackreq), pkey=int(bth.pkey),
        version=int(bth.version), padcount=pad, payload=b"", icrc_ok=ok, icrc_method=method, ip_id=ip_id,
        sport=sport, solicited=bool(bth.solicited), migreq=bool(bth.migreq),
        reserved=(int(bth.resv6) << 7) | int(bth.resv7),
    )  # fmt: skip
    if ip_header is not None and ip_header[0] >> 4 == 6 and len(ip_header) >= 40:
        first = int.from_bytes(ip_header[:4], "big")
        rx.tos, rx.flow_label, rx.hop_limit = first >> 20 & 0xFF, first & 0xFFFFF, ip_header[7]
    elif ip_header is not None and len(ip_header) >= 20:
        rx.tos, rx.hop_limit = ip_header[1], ip_header[8]
    if op in _WITH_AETH:
        if len(rest) < 4:
            return None
        rx.syndrome, rx.msn = rest[0], int.from_bytes(rest[1:4], "big")
        rest = rest[4:]
    if op == ATOMIC_ACKNOWLEDGE:
        if len(rest) < 8:
            return None
        rx.orig = int(S.AtomicAckETH(rest[:8]).origremdt)
        rest = rest[8:]
    if op in _WITH_RETH:
        r = S.RETH(rest[:16])
        rx.reth = (int(r.va), int(r.rkey), int(r.dlen))
        rest = rest[16:]
    if op in (COMPARE_SWAP, FETCH_ADD):
        a = S.AtomicETH(rest[:28])
        rx.atomic = (int(a.va), int(a.rkey), int(a.swapdt), int(a.cmpdt))
        rest = rest[28:]
    if op in _WITH_IMM:
        rx.imm = int(S.ImmDt(rest[:4]).immdt)
        rest = rest[4:]
    if pad > len(rest):
        return None
    rx.payload = rest[: len(rest) - pad]
    rx.pad = rest[len(rest) - pad :]
    return rx


__all__ = ["Flow", "Rx", "build", "dissect", "ip_layer", "scapy", "solve_ip_id", "unmasked_v6_icrc"]
