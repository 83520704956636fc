"""Public ICRC test vectors (tests/wire/vectors.py), reproduced byte for byte, checked."""

import re

import pytest

from rdmakit.wire import (
    BTH_LEN,
    ICRC_LEN,
    IcrcFlow,
    WireError,
    decode,
    icrc_ipv4,
    icrc_ipv6,
    icrc_of_ip_packet,
    pack_icrc,
    unpack_icrc,
)
from tests.wire.vectors import CX4_CNP_IP, CX4_ICRC, SCAPY_V4_ICRC, SCAPY_V4_IP, SCAPY_V6_ICRC, SCAPY_V6_IP


def test_connectx4_capture_icrc_from_the_ip_packet() -> None:
    assert CX4_CNP_IP[-4:] == CX4_ICRC
    icrc = icrc_of_ip_packet(CX4_CNP_IP[:-ICRC_LEN])
    assert pack_icrc(icrc) == CX4_ICRC
    assert unpack_icrc(CX4_CNP_IP) == icrc == 0x2A00FD82


def test_connectx4_capture_icrc_from_addresses_ports_and_id() -> None:
    ip, body = CX4_CNP_IP[:20], CX4_CNP_IP[28:-ICRC_LEN]
    assert ip[4:6] == b"\x71\x8c"  # Identification 0x718c
    assert ip[6] & 0x40  # DF
    src, dst = ip[12:16], ip[16:20]
    sport, dport = int.from_bytes(CX4_CNP_IP[20:22], "big"), int.from_bytes(CX4_CNP_IP[22:24], "big")
    assert (src, dst, sport, dport) == (bytes([10, 0, 17, 1]), bytes([10, 0, 18, 1]), 0, 4791)
    assert pack_icrc(icrc_ipv4(src, dst, sport, dport, body, ident=0x718C)) == CX4_ICRC
    # Split anywhere after the BTH: the same CRC.
    for cut in range(BTH_LEN, len(body) + 1, 5):
        assert pack_icrc(icrc_ipv4(src, dst, sport, dport, body[:cut], body[cut:], ident=0x718C)) == CX4_ICRC
    flow = IcrcFlow.ipv4(src, dst, sport, dport, ident=0x718C)
    assert pack_icrc(flow.icrc(body)) == pack_icrc(flow.icrc(body[:12], body[12:])) == CX4_ICRC


def test_the_ipv4_identification_is_in_the_icrc() -> None:
    zeroed = bytearray(CX4_CNP_IP[:-ICRC_LEN])
    zeroed[4:6] = b"\0\0"
    assert pack_icrc(icrc_of_ip_packet(bytes(zeroed))) != CX4_ICRC
    src, dst, body = CX4_CNP_IP[12:16], CX4_CNP_IP[16:20], CX4_CNP_IP[28:-ICRC_LEN]
    assert pack_icrc(icrc_ipv4(src, dst, 0, 4791, body, ident=0)) != CX4_ICRC
    assert pack_icrc(IcrcFlow.ipv4(src, dst, 0, 4791).icrc(body)) != CX4_ICRC
    # ... and so is DF.
    assert pack_icrc(icrc_ipv4(src, dst, 0, 4791, body, ident=0x718C, df=False)) != CX4_ICRC


def test_scapy_ipv6_vector() -> None:
    assert SCAPY_V6_IP[-4:] == SCAPY_V6_ICRC
    icrc = icrc_of_ip_packet(SCAPY_V6_IP[:-ICRC_LEN])
    assert pack_icrc(icrc) == SCAPY_V6_ICRC
    src, dst, body = SCAPY_V6_IP[8:24], SCAPY_V6_IP[24:40], SCAPY_V6_IP[48:-ICRC_LEN]
    assert pack_icrc(icrc_ipv6(src, dst, 49152, 4791, body)) == SCAPY_V6_ICRC
    assert pack_icrc(IcrcFlow.ipv6(src, dst, 49152, 4791).icrc(body)) == SCAPY_V6_ICRC


def test_scapy_ipv4_uc_vector() -> None:
    assert pack_icrc(icrc_of_ip_packet(SCAPY_V4_IP[:-ICRC_LEN])) == SCAPY_V4_ICRC
    src, dst, body = SCAPY_V4_IP[12:16], SCAPY_V4_IP[16:20], SCAPY_V4_IP[28:-ICRC_LEN]
    assert pack_icrc(icrc_ipv4(src, dst, 49152, 4791, body, ident=1144)) == SCAPY_V4_ICRC


#: Byte offsets (in the IP packet) the ICRC masks to all ones (IBTA A17.3.3; rxe_icrc.c).
V4_MASKED = {1, 8, 10, 11, 20 + 6, 20 + 7, 28 + 4}  # TOS, TTL, IP checksum, UDP checksum, BTH byte 4
V6_MASKED = {1, 2, 3, 7, 40 + 6, 40 + 7, 48 + 4}  # class+flow label, hop limit, UDP checksum, BTH byte 4
#: Offsets icrc_of_ip_packet checks rather than hashes: version/IHL, lengths, protocol.
V4_CHECKED = {0, 2, 3, 9}
V6_CHECKED = {0, 4, 5, 6}


@pytest.mark.parametrize(
    ("packet", "masked", "checked"),
    [(CX4_CNP_IP, V4_MASKED, V4_CHECKED), (SCAPY_V4_IP, V4_MASKED, V4_CHECKED),
     (SCAPY_V6_IP, V6_MASKED, V6_CHECKED)],
    ids=["cx4-ipv4", "scapy-ipv4", "scapy-ipv6"],
)  # fmt: skip
def test_every_byte_is_covered_unless_masked(packet: bytes, masked: set[int], checked: set[int]) -> None:
    """Flip each bit of each byte: the ICRC moves exactly when the byte is not masked."""
    body = packet[:-ICRC_LEN]
    want = icrc_of_ip_packet(body)
    for i in range(len(body)):
        for bit in range(8):
            b = bytearray(body)
            b[i] ^= 1 << bit
            if i in checked and not (i == 0 and packet[0] >> 4 == 6 and bit < 4):
                with pytest.raises(WireError):
                    icrc_of_ip_packet(bytes(b))
                continue
            got = icrc_of_ip_packet(bytes(b))
            is_masked = i in masked or (i == 0 and packet[0] >> 4 == 6 and bit < 4)  # IPv6 class, high half
            assert (got == want) == is_masked, (i, bit)


def test_rc_decoder_refuses_the_vectors_bths() -> None:
    # CNP and UC are not RC: the codec's decoder says so instead of misreading them.
    with pytest.raises(WireError, match=re.escape("opcode 0x81")):
        decode(CX4_CNP_IP[28:-ICRC_LEN])
    with pytest.raises(WireError, match=re.escape("opcode 0x24")):
        decode(SCAPY_V6_IP[48:-ICRC_LEN])
