"""Public ICRC test vectors, reproduced byte for byte.

From scapy's ``test/contrib/roce.uts`` (secdev/scapy; the IPv6 case as in the
polybassa/scapy-1 copy of that file, added with scapy PR #4154):

* "RoCE CNP captured on ConnectX-4 Lx": a real IPv4 capture, IP ID 0x718c,
  ICRC bytes 82 fd 00 2a. It proves the IPv4 Identification is inside the ICRC.
* "RoCE over IPv6": ICRC bytes 3e 5b 74 3b.
* "RoCE layer": an IPv4 UC SEND_ONLY, ICRC bytes 78 f3 53 f3.

The packets are not RC (CNP is opcode 0x81, the others UC 0x24), so they
exercise the ICRC functions, which take any BTH, and not ``decode``. Their tests are in
tests/wire/test_vectors.py.
"""


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
