"""The tester's CM MADs: UD SEND ONLY to QP1, built and read with scapy (:mod:`.scapy_cm`)."""

from dataclasses import dataclass
from typing import Any

from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.packet import Packet as ScapyPacket

from .frames import Flow, check_icrc
from .scapy_cm import DETH, MAD, MESSAGES, QP1_QKEY, UD_SEND_ONLY

__all__ = ["QP1_QKEY", "MadRx", "build_mad", "dissect_mad", "mad"]

NAMES = {0x10: "REQ", 0x11: "MRA", 0x12: "REJ", 0x13: "REP", 0x14: "RTU", 0x15: "DREQ", 0x16: "DREP"}


def mad(attr: int, tid: int, **fields: Any) -> ScapyPacket:
    """A CM MAD: the MAD header and the message of attribute `attr` with `fields`."""
    message: ScapyPacket = MESSAGES[attr](**fields)
    header: ScapyPacket = MAD(attr_id=attr, tid=tid)
    return header / message


def build_mad(
    flow: Flow, message: ScapyPacket, *, qkey: int = QP1_QKEY, dqpn: int = 1, pkey: int = 0xFFFF,
    corrupt_icrc: bool = False,
) -> bytes:  # fmt: skip
    """The UDP payload (BTH .. ICRC) of one UD SEND ONLY carrying `message` to QP `dqpn`."""
    stack = BTH(opcode=UD_SEND_ONLY, pkey=pkey, dqpn=dqpn, psn=0) / DETH(qkey=qkey, srcqp=1) / message
    pkt = IP(src=flow.src, dst=flow.dst, id=0, flags="DF") / UDP(sport=flow.sport, dport=flow.dport) / stack
    body = bytes(pkt[UDP].payload)
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
    bth = BTH(body)
    if int(bth.dqpn) != 1 or DETH not in bth or MAD not in bth:
        return None
    m = bth[MAD]
    attr = int(m.attr_id)
    if attr not in MESSAGES or MESSAGES[attr] not in m:
        return None
    ok, method, _ = check_icrc(src, sport, dst, dport, body, ip_header)
    d = bth[DETH]
    return MadRx(attr, int(m.tid), m[MESSAGES[attr]], int(d.qkey), int(d.srcqp), ok, method)
