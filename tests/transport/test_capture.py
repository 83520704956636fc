"""A capture of a two-process run, checked by tools rdmakit did not write.

tcpdump records every RoCEv2 packet of a run of every RC operation on
loopback; tshark must dissect each one as InfiniBand over UDP 4791 with no
malformed packet, and scapy (``scapy.contrib.roce``) must recompute the ICRC of
each one to the bytes on the wire. The capture also shows what a kernel rxe
peer will check: DF set, IP Identification 0, the source address of our GID,
destination port 4791.

GSO is off here: on loopback a GSO batch is captured as one unsegmented
super-packet (segmentation never happens on ``lo``), which no dissector can
read as RoCEv2. The segmented path is checked against kernel rxe in the lab.
"""

import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.utils import rdpcap

from rdmakit.wire import icrc_of_ip_packet, unpack_icrc
from tests.transport.two_process import Requester, check_peer_report, exercise

pytestmark = [
    pytest.mark.capture,
    pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump is not installed"),
    pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root"),
]


TCPDUMP = ("tcpdump", "-i", "lo", "-n", "-U", "--immediate-mode", "-s", "0", "-B", "65536")
#: Every opcode shows up at these sizes (MTU 4096: ONLY, FIRST/MIDDLE/LAST); multi-MiB
#: messages would only give a loaded machine's tcpdump a chance to fall behind.
CAPTURE_SIZES = (0, 1, 1024, 4096, 4097, 64 << 10)


class Capture:
    def __init__(self, path: Path, ips: tuple[str, str]) -> None:
        self.path = path
        flt = f"udp port 4791 and host {ips[0]} and host {ips[1]}"
        self.proc = subprocess.Popen(
            [*TCPDUMP, "-w", str(path), flt],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()  # "listening on lo, ..." once it captures
        assert "listening" in line, line

    def stop(self) -> str:
        time.sleep(0.5)  # let the last packets reach tcpdump before it is told to stop
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=30)
        return err


#: Payload heuristics of Wireshark's InfiniBand dissector (SMC, RPC-over-RDMA, NVMe,
#: Ethernet over IB, …) guess an upper protocol from a few payload bytes; our
#: payloads are opaque test data, so they are switched off and only the
#: InfiniBand headers are judged.
_PAYLOAD_HEURISTICS = (
    "fc_infiniband", "iser_infiniband", "lnet_ib", "mellanox_eoib", "eth_over_ib", "rpcrdma_infiniband",
    "sdp_infiniband", "smb_direct_infiniband", "smcr_infiniband", "nvme_rdma",
)  # fmt: skip


@functools.cache
def _heuristics_off(path: Path) -> tuple[str, ...]:
    """``--disable-heuristic`` arguments for the names this tshark knows (it refuses others)."""
    args: list[str] = []
    for h in _PAYLOAD_HEURISTICS:
        probe = ["tshark", "-r", str(path), "-c", "1", "--disable-heuristic", h]
        if subprocess.run(probe, check=False, capture_output=True, timeout=60).returncode == 0:
            args += ["--disable-heuristic", h]
    return tuple(args)


def _tshark(path: Path, *args: str) -> list[str]:
    off = _heuristics_off(path)
    out = subprocess.run(
        ["tshark", "-r", str(path), "-n", *off, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if line.strip()]


def test_capture_dissects_and_icrc_recomputes(tmp_path: Path, new_ip: Callable[[], str]) -> None:
    ip_a, ip_b = new_ip(), new_ip()
    cap = Capture(tmp_path / "run.pcap", (ip_a, ip_b))
    r = Requester("roce-udp", ip_a, tmp_path, ip_b, gso=False)
    try:
        expected = exercise(r, CAPTURE_SIZES)
    except BaseException:
        r.close(failed=True)
        cap.stop()
        raise
    recvs, last = r.close()
    stats = cap.stop()
    check_peer_report(recvs, last, list(expected))
    # (On lo libpcap sees each packet twice and keeps one: "received by filter" is double.)
    assert "\n0 packets dropped by kernel" in "\n" + stats, stats

    # tshark: every frame is InfiniBand over UDP 4791, none malformed.
    rows = _tshark(
        cap.path, "-T", "fields", "-E", "separator=|",
        "-e", "frame.protocols", "-e", "ip.src", "-e", "ip.id", "-e", "ip.flags.df", "-e", "udp.dstport",
        "-e", "infiniband.bth.opcode",
    )  # fmt: skip
    assert len(rows) > 100, "the run should take hundreds of packets"
    for row in rows:
        protocols, src, ident, df, dport, opcode = row.split("|")
        assert protocols.endswith(":ip:udp:infiniband") or ":ip:udp:infiniband:" in protocols, row
        assert dport == "4791", row
        assert opcode, row
        assert src in (ip_a, ip_b), row
        assert int(ident, 0) == 0, f"IP ID must be 0 so the ICRC is computable: {row}"
        assert df in ("1", "True"), f"DF must be set: {row}"
    malformed = _tshark(cap.path, "-Y", "_ws.malformed || _ws.expert.severity >= error")
    assert malformed == []

    # scapy: rebuilding each packet with the ICRC left for scapy to compute gives the same bytes.
    packets = rdpcap(str(cap.path))
    assert len(packets) == len(rows)
    opcodes = set()
    for p in packets:
        ip = p[IP]
        wire = bytes(ip)
        assert p.haslayer(UDP)
        assert p[UDP].dport == 4791
        rebuilt = ip.copy()
        rebuilt[BTH].icrc = None
        assert bytes(rebuilt)[-4:] == wire[-4:], f"scapy computes another ICRC for {p.summary()}"
        assert icrc_of_ip_packet(wire[:-4]) == unpack_icrc(wire)
        opcodes.add(p[BTH].opcode)
    # The run covers SEND/WRITE/READ segments, their _IMM forms, ACKs and both atomics.
    assert {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B} <= opcodes
    assert {0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14} <= opcodes
