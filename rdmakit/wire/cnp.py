"""The RoCEv2 Congestion Notification Packet (Annex A17.9.2).

A CNP is a BTH with opcode 0b100_00001 (0x81: the CNP transport, bits 7:5 =
100), the BECN bit set, the DestQP of the QP whose packets were marked, and
16 reserved bytes, then the ICRC (computed as for any RoCEv2 packet over the
bytes `encode_cnp` returns). The P_Key is the default one; the PSN, AckReq
and the other BTH fields are reserved and sent as zero (scapy's
``contrib/roce.py`` ``cnp()`` builds the same packet). A receiver takes the
DestQP; it checks the opcode, the header version, the length and the BECN
bit and judges nothing else.
"""

import struct

from .errors import LocalWireError, WireError
from .packet import BTH_LEN, DEFAULT_PKEY

__all__ = ["CNP_LEN", "CNP_OPCODE", "decode_cnp", "encode_cnp"]

CNP_OPCODE = 0x81
#: BTH + 16 reserved bytes (no ICRC).
CNP_LEN = BTH_LEN + 16
_BECN = 0x40000000
_U24 = (1 << 24) - 1
#: BTH: opcode, SE/M/pad/TVer, P_Key, FECN/BECN/reserved + DestQP, A/reserved + PSN.
_BTH = struct.Struct("!BBHII")


def encode_cnp(dest_qp: int) -> bytes:
    """BTH + the 16 reserved bytes of a CNP for ``dest_qp`` (the ICRC is the caller's)."""
    if type(dest_qp) is not int or not 0 <= dest_qp <= _U24:
        raise LocalWireError(f"CNP dest_qp {dest_qp!r} is out of range")
    return _BTH.pack(CNP_OPCODE, 0, DEFAULT_PKEY, _BECN | dest_qp, 0) + bytes(16)


def decode_cnp(data: bytes | bytearray | memoryview) -> int:
    """The DestQP of a CNP (``data``: BTH .. reserved bytes, without the ICRC)."""
    if len(data) != CNP_LEN:
        raise WireError(f"a CNP is {CNP_LEN} bytes before its ICRC, got {len(data)}")
    op, flags, _pkey, w1, _w2 = _BTH.unpack_from(data)
    if op != CNP_OPCODE:
        raise WireError(f"opcode 0x{op:02x} is not a CNP")
    if flags & 0x0F:
        raise WireError(f"unsupported transport header version {flags & 0x0F}")
    if not w1 & _BECN:
        raise WireError("a CNP without its BECN bit")
    return int(w1 & _U24)
