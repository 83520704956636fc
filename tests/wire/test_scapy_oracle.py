"""scapy as an independent oracle: it dissects our packets, and we decode its.

scapy's ``contrib/roce.py`` (BTH, AETH, and the ICRC over the masked IPv4 or
IPv6 pseudo-header) plus the extension headers in :mod:`.scapy_roce_ext`,
written from the IBTA field definitions. For every opcode: our encoded packet,
wrapped in IPv4/UDP or IPv6/UDP, dissects in scapy to the same field values,
and scapy computes the same ICRC as ``icrc_ipv4``/``icrc_ipv6``/
``icrc_of_ip_packet``/``IcrcFlow``; and a packet scapy builds decodes with
ours to the same values.
"""

import ipaddress
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Packet as ScapyPacket
from scapy.packet import Raw

from rdmakit.testing.strategies import U8, U16, U24, U32, U64, packets
from rdmakit.wire import (
    AETH,
    ICRC_LEN,
    OPCODE_INFO,
    RETH,
    AtomicETH,
    IcrcFlow,
    Opcode,
    Packet,
    decode,
    encode,
    icrc_ipv4,
    icrc_ipv6,
    icrc_of_ip_packet,
    pack_icrc,
    pad_len,
)
from tests.wire import scapy_roce_ext as X
from tests.wire.vectors import SCAPY_V6_IP

SETTINGS = settings(max_examples=150, deadline=None)

V4 = st.integers(0, 2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))
V6 = st.integers(0, 2**128 - 1).map(lambda n: str(ipaddress.IPv6Address(n)))


def wrap(body: bytes, family: int, src: str, dst: str, sport: int, ip: dict[str, Any]) -> bytes:
    """``body`` + a placeholder ICRC in an IP/UDP datagram that scapy builds (lengths, checksums)."""
    net = IP(src=src, dst=dst, **ip) if family == 4 else IPv6(src=src, dst=dst, **ip)
    return bytes(net / UDP(sport=sport, dport=4791) / Raw(body + b"\0" * ICRC_LEN))


def scapy_icrc(datagram: bytes, family: int) -> bytes:
    """The ICRC bytes scapy computes for ``datagram`` (its own BTH.post_build)."""
    pkt = (IP if family == 4 else IPv6)(datagram)
    del pkt[X.BTH].icrc
    rebuilt = bytes(pkt)
    assert len(rebuilt) == len(datagram)
    return rebuilt[-ICRC_LEN:]


def check_dissection(pkt: Packet, dissected: ScapyPacket) -> None:
    """Every field scapy sees equals the one we encoded."""
    bth = dissected[X.BTH]
    info = OPCODE_INFO[pkt.opcode]
    assert bth.opcode == pkt.opcode
    assert bth.solicited == pkt.se
    assert bth.migreq == pkt.migreq
    assert bth.padcount == pad_len(len(pkt.payload))
    assert bth.version == 0
    assert bth.pkey == pkt.pkey
    assert bth.fecn == pkt.fecn
    assert bth.becn == pkt.becn
    assert bth.resv6 == 0
    assert bth.dqpn == pkt.dest_qp
    assert bth.ackreq == pkt.ackreq
    assert bth.resv7 == 0
    assert bth.psn == pkt.psn
    layers: list[type[ScapyPacket]] = []
    if info.reth:
        assert pkt.reth is not None
        r = dissected[X.RETH]
        assert (r.va, r.rkey, r.dlen) == tuple(pkt.reth)
        layers.append(X.RETH)
    if info.aeth:
        assert pkt.aeth is not None
        a = dissected[X.AETH]
        assert (a.syndrome, a.msn) == tuple(pkt.aeth)
        layers.append(type(a))
    if info.atomic_eth:
        assert pkt.atomic_eth is not None
        t = dissected[X.AtomicETH]
        assert (t.va, t.rkey, t.swapdt, t.cmpdt) == tuple(pkt.atomic_eth)
        layers.append(X.AtomicETH)
    if info.atomic_ack_eth:
        assert dissected[X.AtomicAckETH].origremdt == pkt.atomic_ack
        layers.append(X.AtomicAckETH)
    if info.imm:
        assert dissected[X.ImmDt].immdt == pkt.imm
        layers.append(X.ImmDt)
    if info.ieth:
        assert dissected[X.IETH].rkey == pkt.ieth
        layers.append(X.IETH)
    # The extension headers come in the order IBTA gives, then payload and pad as Raw.
    below = [type(layer) for layer in bth.iterpayloads()][1:]
    tail = below[len(layers) :]
    assert below[: len(layers)] == layers
    payload = bytes(pkt.payload) + b"\0" * pad_len(len(pkt.payload))
    if payload:
        assert tail == [Raw]
        assert dissected[Raw].load == payload
    else:
        assert tail == []


@SETTINGS
@given(
    pkt=packets(max_payload=200),
    src=V4,
    dst=V4,
    sport=U16,
    ident=U16,
    df=st.booleans(),
    tos=U8,
    ttl=U8,
)
def test_scapy_dissects_our_ipv4_packets_and_agrees_on_the_icrc(
    pkt: Packet, src: str, dst: str, sport: int, ident: int, df: bool, tos: int, ttl: int
) -> None:
    body = encode(pkt)
    datagram = wrap(
        body, 4, src, dst, sport, {"id": ident, "flags": "DF" if df else 0, "tos": tos, "ttl": ttl}
    )
    check_dissection(pkt, IP(datagram))
    want = scapy_icrc(datagram, 4)
    s, d = ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed
    assert pack_icrc(icrc_ipv4(s, d, sport, 4791, body, ident=ident, df=df)) == want
    assert pack_icrc(icrc_of_ip_packet(datagram[:-ICRC_LEN])) == want
    assert pack_icrc(IcrcFlow.ipv4(s, d, sport, 4791, ident=ident, df=df).icrc(body)) == want


@SETTINGS
@given(pkt=packets(max_payload=200), src=V6, dst=V6, sport=U16, tc=U8, fl=st.integers(0, 2**20 - 1), hlim=U8)
def test_scapy_dissects_our_ipv6_packets_and_agrees_on_the_icrc(
    pkt: Packet, src: str, dst: str, sport: int, tc: int, fl: int, hlim: int
) -> None:
    body = encode(pkt)
    datagram = wrap(body, 6, src, dst, sport, {"tc": tc, "fl": fl, "hlim": hlim})
    check_dissection(pkt, IPv6(datagram))
    want = scapy_icrc(datagram, 6)
    s, d = ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed
    assert pack_icrc(icrc_ipv6(s, d, sport, 4791, body)) == want
    assert pack_icrc(icrc_of_ip_packet(datagram[:-ICRC_LEN])) == want
    assert pack_icrc(IcrcFlow.ipv6(s, d, sport, 4791).icrc(body)) == want


# --- The other direction: scapy builds, we decode --------------------------------


@st.composite
def scapy_packets(draw: st.DrawFn) -> tuple[bytes, dict[str, Any]]:
    """A packet built from scapy layers alone, and the field values it was built from."""
    op = draw(st.sampled_from(sorted(Opcode)))
    info = OPCODE_INFO[op]
    f: dict[str, Any] = {
        "opcode": op, "se": draw(st.booleans()), "migreq": draw(st.booleans()), "pkey": draw(U16),
        "fecn": draw(st.booleans()), "becn": draw(st.booleans()), "dest_qp": draw(U24),
        "ackreq": draw(st.booleans()), "psn": draw(U24),
        "payload": draw(st.binary(max_size=80)) if info.payload else b"",
    }  # fmt: skip
    pad = pad_len(len(f["payload"]))
    layer: ScapyPacket = X.BTH(
        opcode=int(op), solicited=f["se"], migreq=f["migreq"], padcount=pad, pkey=f["pkey"],
        fecn=f["fecn"], becn=f["becn"], dqpn=f["dest_qp"], ackreq=f["ackreq"], psn=f["psn"],
    )  # fmt: skip
    if info.reth:
        f["reth"] = RETH(draw(U64), draw(U32), draw(U32))
        layer /= X.RETH(va=f["reth"].va, rkey=f["reth"].rkey, dlen=f["reth"].dma_len)
    if info.aeth:
        f["aeth"] = AETH(draw(U8), draw(U24))
        layer /= (X.AETH if op is Opcode.ACKNOWLEDGE else X.RcAETH)(
            syndrome=f["aeth"].syndrome, msn=f["aeth"].msn
        )
    if info.atomic_eth:
        f["atomic_eth"] = AtomicETH(draw(U64), draw(U32), draw(U64), draw(U64))
        va, rkey, swap, cmp = f["atomic_eth"]
        layer /= X.AtomicETH(va=va, rkey=rkey, swapdt=swap, cmpdt=cmp)
    if info.atomic_ack_eth:
        f["atomic_ack"] = draw(U64)
        layer /= X.AtomicAckETH(origremdt=f["atomic_ack"])
    if info.imm:
        f["imm"] = draw(U32)
        layer /= X.ImmDt(immdt=f["imm"])
    if info.ieth:
        f["ieth"] = draw(U32)
        layer /= X.IETH(rkey=f["ieth"])
    if f["payload"] or pad:
        layer /= Raw(f["payload"] + b"\0" * pad)
    # scapy's BTH ends with its 4-byte ICRC field; built outside IP/UDP it is a
    # placeholder, which we cut off.
    wire = bytes(layer)[:-ICRC_LEN]
    return wire, f


@SETTINGS
@given(scapy_packets())
def test_we_decode_what_scapy_builds(case: tuple[bytes, dict[str, Any]]) -> None:
    wire, fields = case
    got = decode(wire)
    assert got == Packet(**fields)
    assert encode(got) == wire


def test_ipv6_vector_is_the_one_scapy_builds() -> None:
    """The hand-written IPv6 vector is byte for byte what roce.uts builds (and its ICRC)."""
    built = (
        IPv6(nh=17, src="2022::1023", dst="2023::1024", hlim=255, plen=44, fl=0x1FACE, tc=226)
        / UDP(sport=49152, dport=4791, len=44)
        / X.BTH(opcode=0x24, migreq=1, padcount=2, pkey=0xFFFF, dqpn=211, psn=13571856)
        / Raw(b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00")
    )
    assert bytes(built) == SCAPY_V6_IP
