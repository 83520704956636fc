"""The tester's CM MADs: UD SEND ONLY to QP1, built and read with scapy (:mod:`.scapy_cm`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from .frames import DREP, DREQ, MRA, QP1_QKEY, REJ, REP, REQ, RTU, UD_SEND_ONLY, Flow, check_icrc, scapy

if TYPE_CHECKING:
    from scapy.packet import Packet as ScapyPacket

__all__ = ["DREP", "DREQ", "MRA", "QP1_QKEY", "REJ", "REP", "REQ", "RTU", "MadRx", "build_mad", "dissect_mad",
           "mad"]  # fmt: skip


@lru_cache(maxsize=1)
def _cm() -> SimpleNamespace:
    """scapy's layers and the CM layers (:mod:`.scapy_cm`), imported on first use."""
    from . import scapy_cm

    return SimpleNamespace(**vars(scapy()), DETH=scapy_cm.DETH, MAD=scapy_cm.MAD, MESSAGES=scapy_cm.MESSAGES)


NAMES = {0x10: "REQ", 0x11: "MRA", 0x12: "REJ", 0x13: "REP", 0x14: "RTU", 0x15: "DREQ", 0x16: "DREP"}


def mad(attr: int, tid: int, **fields: Any) -> ScapyPacket:
    """A CM MAD: the MAD header and the message of attribute `attr` with `fields`."""
    S = _cm()
    message: ScapyPacket = S.MESSAGES[attr](**fields)
    header: ScapyPacket = S.MAD(attr_id=attr, tid=tid)
    return header / message


def build_mad(
    flow: Flow, message: ScapyPacket, *, qkey: int = QP1_QKEY, dqpn: int = 1, pkey: int = 0xFFFF,
    corrupt_icrc: bool = False,
) -> bytes:  # fmt: skip
    """The UDP payload (BTH .. ICRC) of one UD SEND ONLY carrying `message` to QP `dqpn`."""
    S = _cm()
    stack = S.BTH(opcode=UD_SEND_ONLY, pkey=pkey, dqpn=dqpn, psn=0) / S.DETH(qkey=qkey, srcqp=1) / message
    pkt = flow.ip() / S.UDP(sport=flow.sport, dport=flow.dport) / stack
    body = bytes(pkt[S.UDP].payload)
    if corrupt_icrc:
        body = body[:-4] + bytes(b ^ 0xFF for b in body[-4:])
    return body


@dataclass(slots=True)
class MadRx:
    """A CM MAD the DUT sent, with how its ICRC checked."""

    attr: int
    tid: int
    message: ScapyPacket
    qkey: int
    srcqp: int
    icrc_ok: bool
    icrc_method: str

    @property
    def name(self) -> str:
        return NAMES.get(self.attr, f"attribute {self.attr:#06x}")

    def describe(self) -> str:
        m = self.message
        ids = f"local {int(m.local_comm_id):#x}" if hasattr(m, "local_comm_id") else ""
        if hasattr(m, "remote_comm_id"):
            ids += f" remote {int(m.remote_comm_id):#x}"
        extra = f" reason {int(m.reason)}" if self.attr == 0x12 else ""
        return f"{self.name} tid {self.tid:#x} {ids}{extra}".rstrip()


def dissect_mad(
    src: str, sport: int, dst: str, dport: int, body: bytes, ip_header: bytes | None
) -> MadRx | None:
    """A received UDP payload as a CM MAD to QP1; None if it is anything else."""
    if len(body) < 12 + 8 + 24 + 4 or body[0] != UD_SEND_ONLY:
        return None
    S = _cm()
    bth = S.BTH(body)
    if int(bth.dqpn) != 1 or S.DETH not in bth or S.MAD not in bth:
        return None
    m = bth[S.MAD]
    attr = int(m.attr_id)
    if attr not in S.MESSAGES or S.MESSAGES[attr] not in m:
        return None
    ok, method, _ = check_icrc(src, sport, dst, dport, body, ip_header)
    d = bth[S.DETH]
    return MadRx(attr, int(m.tid), m[S.MESSAGES[attr]], int(d.qkey), int(d.srcqp), ok, method)
