"""``rdmakit capture``: decoding pcap files with rdmakit's codec, ICRC checked."""

import io
import os
import subprocess
import sys
from pathlib import Path

from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from rdmakit.transport.capture import PcapWriter, read_pcap
from rdmakit.wire import RETH, Opcode, Packet, encode
from rdmakit.wire.frames import LINKTYPE_ETHERNET, parse_frame


def _frame(pkt: Packet, ip_id: int = 0) -> bytes:
    body = encode(pkt)
    # scapy builds the headers and computes the ICRC (an independent implementation).
    layer = BTH(
        opcode=int(pkt.opcode),
        dqpn=pkt.dest_qp,
        psn=pkt.psn,
        ackreq=int(pkt.ackreq),
        padcount=(-len(pkt.payload)) & 3,
    )
    frame = Ether() / IP(src="10.0.0.1", dst="10.0.0.2", id=ip_id, flags="DF") / UDP(sport=49152, dport=4791)
    return bytes(frame / layer / Raw(body[12:]))


def test_capture_decodes_a_pcap_and_flags_a_bad_icrc(tmp_path: Path) -> None:
    good = [
        _frame(Packet(Opcode.SEND_ONLY, 0x11, 5, ackreq=True, payload=b"hello")),
        _frame(
            Packet(Opcode.RDMA_WRITE_FIRST, 0x11, 6, reth=RETH(0x1000, 0x77, 8192), payload=b"\1" * 4096),
            ip_id=0x718C,
        ),
    ]
    bad = bytearray(good[0])
    bad[-1] ^= 1
    other = bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(dport=53) / Raw(b"dns"))
    path = tmp_path / "t.pcap"
    buf = io.BytesIO()
    w = PcapWriter(buf, LINKTYPE_ETHERNET)
    for i, f in enumerate([*good, other, bytes(bad)]):
        w.write(1_700_000_000 + i, f)
    path.write_bytes(buf.getvalue())

    linktype, frames = read_pcap(path)
    parsed = [parse_frame(linktype, f) for _, f in frames]
    assert parsed[2] is None  # not RoCEv2
    assert [p.icrc_ok for p in parsed if p] == [True, True, False]
    assert parsed[1] is not None
    assert parsed[1].ip_id == 0x718C

    out = subprocess.run(
        [sys.executable, "-m", "rdmakit", "capture", "-r", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = out.stdout.splitlines()
    assert out.returncode == 1  # a bad ICRC was seen
    assert len(lines) == 3
    assert "SEND_ONLY QP=0x000011 PSN=5 A payload=5 [icrc ok]" in lines[0]
    assert "RDMA_WRITE_FIRST" in lines[1]
    assert "RETH(va=0x1000 rkey=0x77 len=8192)" in lines[1]
    assert lines[2].endswith("[icrc BAD]")
    assert out.stderr.strip() == "3 RoCEv2 packets, 1 with a bad ICRC or undecodable"


def test_capture_refuses_what_is_not_pcap(tmp_path: Path) -> None:
    p = tmp_path / "x.pcap"
    p.write_bytes(b"\x0a\x0d\x0d\x0a" + b"\0" * 40)  # pcapng
    out = subprocess.run(
        [sys.executable, "-m", "rdmakit", "capture", "-r", str(p)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "not a pcap file" in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_capture_writes_only_a_regular_file(tmp_path: Path) -> None:
    """``-w`` naming a FIFO nobody reads, or a directory, ends with one line (opening would block)."""
    src = tmp_path / "in.pcap"
    buf = io.BytesIO()
    PcapWriter(buf, LINKTYPE_ETHERNET).write(1_700_000_000, _frame(Packet(Opcode.SEND_ONLY, 0x11, 5)))
    src.write_bytes(buf.getvalue())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, tmp_path):
        out = subprocess.run(
            [sys.executable, "-m", "rdmakit", "capture", "-q", "-r", str(src), "-w", str(target)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 1, out
        assert out.stderr.splitlines() == [
            f"rdmakit capture: cannot write the capture {target}: something other than a file is there"
        ]
    out = subprocess.run(
        [sys.executable, "-m", "rdmakit", "capture", "-q", "-r", str(src), "-w", str(tmp_path / "out.pcap")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out
    assert (tmp_path / "out.pcap").read_bytes() == src.read_bytes()
