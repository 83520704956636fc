"""Public ICRC test vectors, reproduced byte for byte.

From scapy's ``test/contrib/roce.uts`` (secdev/scapy; the IPv6 case as in the
polybassa/scapy-1 copy of that file, added with scapy PR #4154):

* "RoCE CNP captured on ConnectX-4 Lx": a real IPv4 capture, IP ID 0x718c,
  ICRC bytes 82 fd 00 2a. It proves the IPv4 Identification is inside the ICRC.
* "RoCE over IPv6": ICRC bytes 3e 5b 74 3b.
* "RoCE layer": an IPv4 UC SEND_ONLY, ICRC bytes 78 f3 53 f3.

The packets are not RC (CNP is opcode 0x81, the others UC 0x24), so they
exercise the ICRC functions, which take any BTH, and not ``decode``.
"""

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


def hexcap(text: str) -> bytes:
    """Bytes of a tcpdump -xx dump (offsets before ':' are dropped)."""
    return bytes.fromhex("".join(line.split(":", 1)[1] for line in text.strip().splitlines()))


# roce.uts, "RoCE CNP captured on ConnectX-4 Lx" (Ethernet frame, 74 bytes).
CX4_CNP_FRAME = hexcap("""
0x0000:  e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2
0x0010:  003c 718c 4000 4011 9161 0a00 1101 0a00
0x0020:  1201 0000 12b7 0028 0000 8100 ffff 4000
0x0030:  0118 0000 0000 0000 0000 0000 0000 0000
0x0040:  0000 0000 0000 82fd 002a
""")
CX4_CNP_IP = CX4_CNP_FRAME[14:]  # after the Ethernet header
CX4_ICRC = bytes.fromhex("82fd002a")

# roce.uts, "RoCE over IPv6": IPv6(nh=17, src='2022::1023', dst='2023::1024',
# hlim=255, plen=44, fl=0x1face, tc=226) / UDP(sport=49152, dport=4791, len=44)
# / BTH(opcode=UC_SEND_ONLY, migreq=1, padcount=2, dqpn=211, psn=13571856)
# / 20 bytes, written out field by field; the UDP checksum e7c5 is the one the
# test asserts.
SCAPY_V6_IP = bytes.fromhex(
    "6e21face"  # version 6, traffic class 0xe2, flow label 0x1face
    "002c 11 ff"  # payload length 44, next header UDP, hop limit 255
    "2022 0000 0000 0000 0000 0000 0000 1023"  # source 2022::1023
    "2023 0000 0000 0000 0000 0000 0000 1024"  # destination 2023::1024
    "c000 12b7 002c e7c5"  # UDP 49152 -> 4791, length 44, checksum
    "24 60 ffff 00 0000d3 00 cf1710"  # BTH: UC SEND_ONLY, MigReq+PadCnt 2, QPN 211, PSN 13571856
    "4630818be28935d90e9a95505401be885e50 0000"  # 18 payload bytes, 2 pad bytes
    "3e5b743b"  # ICRC
)
SCAPY_V6_ICRC = bytes.fromhex("3e5b743b")

# roce.uts, "RoCE layer": IP(tos=1, id=1144, flags=DF, ttl=64, src=dst=192.168.0.7,
# len=64) / UDP(sport=49152, dport=4791, len=44) / the same BTH and bytes as above.
SCAPY_V4_IP = bytes.fromhex(
    "4501 0040 0478 4000 4011 b4d5 c0a80007 c0a80007"  # IPv4, TOS 1, ID 1144, DF, TTL 64
    "c000 12b7 002c aca2"  # UDP
    "24 60 ffff 00 0000d3 00 cf1710"
    "4630818be28935d90e9a95505401be885e50 0000"
    "78f353f3"
)
SCAPY_V4_ICRC = bytes.fromhex("78f353f3")


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
