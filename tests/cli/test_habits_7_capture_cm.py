"""``rdmakit capture`` decodes the connection manager's packets: UD SEND ONLY, DETH and the CM MAD.

rdmakit's soft devices speak the CM on QP1 in UD SENDs (opcode 0x64); the
capture called them MALFORMED and exited 1. Here each CM message is encoded
with the wire package's layouts, sent in a UD SEND that scapy frames and
ICRCs (an independent implementation), and decoded by the capture command.
"""

import io
import subprocess
import sys
from ipaddress import IPv4Address
from pathlib import Path

from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from rdmakit.transport.capture import PcapWriter
from rdmakit.wire.cm import CmaHeader, CmAttr, CmMad, RejReason, encode_cm
from rdmakit.wire.frames import LINKTYPE_ETHERNET
from rdmakit.wire.ud import GSI_QKEY, UdSend, encode_ud_send

MESSAGES = [
    CmMad(CmAttr.REQ, 0x11,
          {"local_comm_id": 0xABCD, "service_id": 0x106_0000_0000_4E20, "local_qpn": 0x1234},
          CmaHeader(IPv4Address("10.0.0.1"), IPv4Address("10.0.0.2"), 4242).encode()),
    CmMad(CmAttr.REP, 0x11, {"local_comm_id": 0x55, "remote_comm_id": 0xABCD, "local_qpn": 0x777}),
    CmMad(CmAttr.RTU, 0x11, {"local_comm_id": 0xABCD, "remote_comm_id": 0x55}),
    CmMad(CmAttr.REJ, 0x12, {"remote_comm_id": 0xABCD, "reason": int(RejReason.INVALID_SERVICE_ID)}),
    CmMad(CmAttr.MRA, 0x13, {"local_comm_id": 0xABCD, "service_timeout": 20}),
    CmMad(CmAttr.DREQ, 0x14, {"local_comm_id": 0xABCD, "remote_comm_id": 0x55, "remote_qpn": 0x777}),
    CmMad(CmAttr.DREP, 0x14, {"local_comm_id": 0x55, "remote_comm_id": 0xABCD}),
]  # fmt: skip


def _frame(mad: CmMad) -> bytes:
    body = encode_ud_send(UdSend(dest_qp=1, src_qp=1, qkey=GSI_QKEY, payload=encode_cm(mad)))
    eth = Ether() / IP(src="10.0.0.1", dst="10.0.0.2", flags="DF") / UDP(sport=49152, dport=4791)
    return bytes(eth / BTH(opcode=0x64, dqpn=1, psn=0) / Raw(body[12:]))


def test_capture_decodes_every_cm_message(tmp_path: Path) -> None:
    buf = io.BytesIO()
    w = PcapWriter(buf, LINKTYPE_ETHERNET)
    for i, mad in enumerate(MESSAGES):
        w.write(1_700_000_000 + i, _frame(mad))
    path = tmp_path / "cm.pcap"
    path.write_bytes(buf.getvalue())
    out = subprocess.run(
        [sys.executable, "-m", "rdmakit", "capture", "-r", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr.strip() == f"{len(MESSAGES)} RoCEv2 packets, 0 with a bad ICRC or undecodable"
    lines = out.stdout.splitlines()
    assert len(lines) == len(MESSAGES)
    for line, mad in zip(lines, MESSAGES, strict=True):
        assert "UD_SEND_ONLY QP=0x000001" in line
        assert "DETH(qkey=0x80010000 src_qp=0x000001)" in line
        assert f"CM {mad.attr.name}(tid={mad.tid:#x}" in line
        assert line.endswith("[icrc ok]")
        assert "MALFORMED" not in line
    assert "local_qpn=0x1234" in lines[0]
    assert "service_id=0x106000000004e20" in lines[0]
    assert "cma_hdr(src=10.0.0.1:4242 dst=10.0.0.2)" in lines[0]
    assert "reason=8(INVALID_SERVICE_ID)" in lines[3]
    assert "service_timeout=20" in lines[4]
    assert "remote_qpn=0x777" in lines[5]
