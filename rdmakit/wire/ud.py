"""Unreliable Datagram SEND ONLY with its DETH, as far as the GSI (QP1) needs it.

IBTA Vol. 1 §9.3 (BTH), §9.3.3 (DETH: Q_Key, then a reserved byte and the
24-bit source QP) and §9.8.3 (UD SEND ONLY, opcode 0b011_00100 = 0x64). The
connection manager's MADs travel this way to and from QP1, with Q_Key
0x80010000 (``IB_QP1_QKEY``, Linux ``ib_mad.h``) and P_Key 0xFFFF. The ICRC
covers BTH + DETH + payload like any RoCEv2 packet (``icrc_ipv4`` over the
bytes `encode_ud_send` returns); a UD packet has no PSN sequence to check
(rxe's ``check_psn`` has no UD branch), so the PSN is carried, not judged.
"""

import struct
from typing import NamedTuple

from .errors import LocalWireError, WireError
from .packet import BTH_LEN, DEFAULT_PKEY

__all__ = [
    "DETH_LEN",
    "GSI_QKEY",
    "GSI_QPN",
    "UD_SEND_ONLY",
    "UdSend",
    "decode_ud_send",
    "encode_ud_send",
]

UD_SEND_ONLY = 0x64
DETH_LEN = 8
GSI_QPN = 1
GSI_QKEY = 0x80010000
_U24 = (1 << 24) - 1
_U32 = (1 << 32) - 1
#: BTH (opcode, flags, P_Key, reserved, DestQP, A/reserved, PSN) + DETH (Q_Key, reserved, SrcQP).
_HEADERS = struct.Struct("!BBHI I I I")


class UdSend(NamedTuple):
    """One UD SEND ONLY: the fields a receiver uses and its payload (a MAD for the GSI)."""

    dest_qp: int
    src_qp: int
    qkey: int
    payload: bytes
    psn: int = 0
    pkey: int = DEFAULT_PKEY
    solicited: bool = False


def _check(name: str, value: int, top: int) -> None:
    if type(value) is not int or not 0 <= value <= top:
        raise LocalWireError(f"UD {name} {value!r} is out of range")


def encode_ud_send(pkt: UdSend) -> bytes:
    """BTH + DETH + payload + pad (the ICRC is the caller's, over these bytes)."""
    _check("dest_qp", pkt.dest_qp, _U24)
    _check("src_qp", pkt.src_qp, _U24)
    _check("qkey", pkt.qkey, _U32)
    _check("psn", pkt.psn, _U24)
    _check("pkey", pkt.pkey, 0xFFFF)
    pad = -len(pkt.payload) % 4
    flags = (0x80 if pkt.solicited else 0) | (pad << 4)  # SE, M=0, PadCnt, TVer=0
    head = _HEADERS.pack(UD_SEND_ONLY, flags, pkt.pkey, pkt.dest_qp, pkt.psn, pkt.qkey, pkt.src_qp)
    return head + bytes(pkt.payload) + bytes(pad)


def decode_ud_send(data: bytes | bytearray | memoryview) -> UdSend:
    """Parse BTH + DETH + payload + pad (no ICRC); WireError for anything else."""
    view = memoryview(data).cast("B")
    if len(view) < BTH_LEN + DETH_LEN:
        raise WireError(f"a UD SEND ONLY needs {BTH_LEN + DETH_LEN} bytes of headers, got {len(view)}")
    opcode, flags, pkey, dqp, psn, qkey, sqp = _HEADERS.unpack_from(view)
    if opcode != UD_SEND_ONLY:
        raise WireError(f"opcode {opcode:#04x} is not UD SEND ONLY")
    if flags & 0x0F:
        raise WireError(f"BTH TVer {flags & 0x0F} is not 0")
    # Reserved bits and the AckReq bit mean nothing to a UD receiver: ignored, as rxe does.
    dqp, psn, sqp = dqp & _U24, psn & _U24, sqp & _U24
    pad = (flags >> 4) & 3
    body = view[BTH_LEN + DETH_LEN :]
    if pad > len(body):
        raise WireError(f"pad count {pad} is longer than the payload")
    return UdSend(
        dest_qp=dqp,
        src_qp=sqp,
        qkey=qkey,
        payload=bytes(body[: len(body) - pad]),
        psn=psn,
        pkey=pkey,
        solicited=bool(flags & 0x80),
    )
