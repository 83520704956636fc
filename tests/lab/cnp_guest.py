"""In the lab guest: CNPs sent to kernel rxe's QPs while they carry every RC operation.

    python3 tests/lab/cnp_guest.py run [--every-ms N]     (prints one JSON object)
    python3 tests/lab/cnp_guest.py inject --dir D --src A --dst B [--every-ms N]

``run`` builds the netem bed's path between kernel rxe (k0, initial namespace)
and rdmakit's soft engine (namespace c) without impairment, runs the byte-checked
exchange of :mod:`rdmakit.testing.rcpeer` across it (rxe is the ``guest`` side,
requester in one phase and responder in the other) and, beside it, ``inject``
in namespace c: for each of rxe's QPs, as soon as its descriptor appears, a
RoCEv2 CNP (Annex A17.9.2: opcode 0x81, BECN, the QP's number, a valid ICRC)
from the soft engine's address every ``--every-ms``, until the exchange ends.
The CNPs come from the peer's address, as a responder's would, and from a port
of their own (rxe accepts any source port). Output: the exchange's records, the
CNPs sent per QP and how rxe's counters moved from before the exchange to
after the last CNP.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rdmakit.testing.netbed import HUNG
from rdmakit.testing.netembed import RXE, NetemBed
from rdmakit.transport.cnp import check_cnp
from rdmakit.transport.udp import IP_MTU_DISCOVER, IP_PMTUDISC_DO
from rdmakit.wire import icrc_ipv4, pack_icrc
from rdmakit.wire.cnp import encode_cnp
from rdmakit.wire.icrc import ROCE_UDP_PORT

PHASES = ("host-requests", "guest-requests")
SIZES = "0,1,1025,65537,262144"
#: rxe's local ACK timeout, 4.096 µs × 2^18: its peer runs in the same TCG guest.
QP_TIMEOUT = "18"


def inject(shared: Path, src: str, dst: str, every_s: float) -> dict[str, int]:
    """CNPs to each of rxe's QPs (``PHASE.guest.json``) until ``shared/stop`` appears."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # DF and IPv4 ID 0 on a datagram sent alone from an unconnected socket: the ICRC covers both.
    sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    sock.bind((src, 0))
    sport = sock.getsockname()[1]
    sent: dict[str, int] = {}
    datagrams: dict[str, bytes] = {}
    deadline = time.monotonic() + 600
    while not (shared / "stop").exists() and time.monotonic() < deadline:
        for phase in PHASES:
            desc = shared / f"{phase}.guest.json"
            if phase not in datagrams and desc.exists():
                qpn = int(json.loads(desc.read_text())["qp"]["qpn"])
                body = encode_cnp(qpn)
                icrc = icrc_ipv4(socket.inet_aton(src), socket.inet_aton(dst), sport, ROCE_UDP_PORT, body)
                datagrams[phase] = body + pack_icrc(icrc)
                # The same CNP a responder of rdmakit's sends: its own receiver takes it.
                dst_bytes = socket.inet_aton(dst)
                got = check_cnp(memoryview(datagrams[phase]), src, sport, dst_bytes, ROCE_UDP_PORT)
                if got != qpn:
                    raise SystemExit(f"rdmakit does not accept the CNP for QP {qpn:#x}")
                sent[phase] = 0
        for phase, datagram in datagrams.items():
            sock.sendto(datagram, (dst, ROCE_UDP_PORT))
            sent[phase] += 1
        time.sleep(every_s)
    sock.close()
    return sent


def _events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def rxe_counters(dev: str, netdev: str) -> dict[str, int]:
    """rxe's port counters (``rdma statistic``) and its netdev's received packets."""
    out = subprocess.run(
        ["rdma", "-j", "statistic", "show", "link", f"{dev}/1"], capture_output=True, text=True, check=True
    ).stdout
    (entry,) = json.loads(out)
    found = {k: v for k, v in entry.items() if isinstance(v, int) and k != "port"}
    found["rx_packets"] = int(Path(f"/sys/class/net/{netdev}/statistics/rx_packets").read_text())
    return found


def run(every_ms: float) -> dict[str, Any]:
    with NetemBed() as bed:
        bed.set_netem(())
        before = rxe_counters(RXE["k0"], "k0")
        (k_ns, _k, k_addr), (c_ns, _c, c_addr) = bed.links["kern"].left, bed.links["kern"].right
        assert c_ns is not None
        shared = Path(f"/tmp/cnp-{os.getpid()}")
        shared.mkdir()
        peer = [sys.executable, "-m", "rdmakit.testing.rcpeer", "--dir", str(shared), "--sizes", SIZES]
        guest = bed.popen(k_ns, [*peer, "--side", "guest", "--device", RXE["k0"], "--qp-timeout", QP_TIMEOUT])
        host = bed.popen(c_ns, [*peer, "--side", "host", "--ip", c_addr])
        me = [sys.executable, os.path.abspath(__file__), "inject", "--dir", str(shared)]
        flood = bed.popen(c_ns, [*me, "--src", c_addr, "--dst", k_addr, "--every-ms", str(every_ms)])
        deadline = time.monotonic() + 400
        h, g = bed.wait(host, deadline), bed.wait(guest, deadline)
        (shared / "stop").touch()
        f = bed.wait(flood, time.monotonic() + 60)
        after = rxe_counters(RXE["k0"], "k0")
    return {
        "rxe": {k: after[k] - before.get(k, 0) for k in after},
        "host": {"rc": h.rc, "events": _events(h.out), "err": h.err[-2000:]},
        "guest": {"rc": g.rc, "events": _events(g.out), "err": g.err[-2000:]},
        "inject": {"rc": f.rc, "sent": json.loads(f.out) if f.rc == 0 else {}, "err": f.err[-2000:]},
        "hung": HUNG in (h.rc, g.rc, f.rc),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("run", "inject"))
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--src")
    ap.add_argument("--dst")
    ap.add_argument("--every-ms", type=float, default=2.0)
    a = ap.parse_args()
    if a.what == "inject":
        print(json.dumps(inject(a.dir, a.src, a.dst, a.every_ms / 1000)))
    else:
        print(json.dumps(run(a.every_ms)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
