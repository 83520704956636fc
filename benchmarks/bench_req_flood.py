"""Does a real client still connect while one address floods a server with REQs? (a script, not a test)

    python benchmarks/bench_req_flood.py [--rate N] [--seconds S] [--client-at T]

A server (a soft device and its ``RdmaCm``, rdma_cm's timeouts) listens on
a port, refuses every request from the flooding address and accepts the
others. One thread sends it REQs from one loopback address at ``--rate`` a
second, each asking for the longest timeouts a REQ can; after
``--client-at`` seconds a real client connects. Printed: the REQs sent and
handled, the largest the CM's table grew, and what the client got
(ESTABLISHED, or REJECTED with its reason) and after how long.
"""

from __future__ import annotations

import argparse
import ipaddress
import random
import socket
import threading
import time

from rdmakit.engine import CompletionQueue
from rdmakit.transport.cma import CmaEventKind, RdmaCm
from rdmakit.transport.device import SoftDevice
from rdmakit.wire import ROCE_UDP_PORT, icrc_ipv4, pack_icrc
from rdmakit.wire.cm import CmaHeader, CmAttr, CmMad, PortSpace, encode_cm, service_id
from rdmakit.wire.ud import GSI_QKEY, GSI_QPN, UdSend, encode_ud_send

BASE = f"127.{random.Random().randrange(100, 250)}.{random.Random().randrange(256)}"
SERVER, CLIENT, FLOODER = f"{BASE}.1", f"{BASE}.2", f"{BASE}.3"
PORT = 7174


def _req(i: int) -> bytes:
    """A REQ from FLOODER asking for the longest timeouts (IBTA §12.7.24: 2^31 × 4.096 µs, 15 tries)."""
    hdr = CmaHeader(ipaddress.ip_address(FLOODER), ipaddress.ip_address(SERVER), 40000).encode()
    values = {
        "local_comm_id": i, "service_id": service_id(PortSpace.TCP, PORT), "local_ca_guid": 0xF100D,
        "local_qpn": 0x100 + i, "starting_psn": 1, "path_mtu": 3, "remote_cm_response_timeout": 31,
        "local_cm_response_timeout": 31, "max_cm_retries": 15,
    }  # fmt: skip
    mad = encode_cm(CmMad(CmAttr.REQ, i, values, hdr))
    body = encode_ud_send(UdSend(dest_qp=GSI_QPN, src_qp=GSI_QPN, qkey=GSI_QKEY, payload=mad))
    src, dst = socket.inet_aton(FLOODER), socket.inet_aton(SERVER)
    return body + pack_icrc(icrc_ipv4(src, dst, ROCE_UDP_PORT, ROCE_UDP_PORT, body, ident=0))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1000.0, help="REQs a second")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long the flood lasts")
    ap.add_argument("--client-at", type=float, default=6.0, help="when the real client connects")
    args = ap.parse_args(argv)
    sdev, cdev = SoftDevice(SERVER), SoftDevice(CLIENT)
    scm, ccm = RdmaCm(sdev), RdmaCm(cdev)
    scm.listen(PORT)
    scq, ccq = CompletionQueue(64), CompletionQueue(64)
    flood = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flood.bind((FLOODER, ROCE_UDP_PORT))  # the server's REJs land here
    flood.setblocking(False)
    reqs = [_req(i) for i in range(1, 1 + int(args.rate * args.seconds) + 1)]
    stop = threading.Event()
    sent = [0]
    got: dict[str, object] = {}

    def flooder() -> None:
        start = time.monotonic()
        for i, data in enumerate(reqs):
            if stop.is_set():
                return
            ahead = start + i / args.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            try:
                flood.sendto(data, (SERVER, ROCE_UDP_PORT))
                sent[0] += 1
                while flood.recv(4096):
                    pass
            except BlockingIOError:
                pass

    def client() -> None:
        time.sleep(args.client_at)
        qp = cdev.create_qp(send_cq=ccq, recv_cq=ccq)
        t0 = time.monotonic()
        handle = ccm.connect(SERVER, PORT, qp, t0)
        while time.monotonic() - t0 < 30:
            now = time.monotonic()
            cdev.progress(now)
            ev = ccm.poll_event(now)
            if ev is not None and ev.conn == handle:
                got.update(event=ev.kind.name, reason=ev.reason, after=round(time.monotonic() - t0, 3))
                return
            time.sleep(0.0005)
        got["event"] = "nothing within 30 s"

    threads = [threading.Thread(target=flooder), threading.Thread(target=client)]
    for t in threads:
        t.start()
    t0, peak, handled = time.monotonic(), 0, 0
    try:
        while time.monotonic() - t0 < args.seconds or threads[1].is_alive():
            now = time.monotonic()
            sdev.progress(now)
            while (ev := scm.poll_event(now)) is not None:
                if ev.kind is CmaEventKind.CONNECT_REQUEST:
                    handled += 1
                    if ev.peer_ip == FLOODER:
                        scm.reject(ev.conn, now)
                    else:
                        scm.accept(ev.conn, sdev.create_qp(send_cq=scq, recv_cq=scq), now)
            peak = max(peak, len(scm.cm._conns))
            if now - t0 > args.seconds:
                stop.set()
            time.sleep(0.0001)
    finally:
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        rej = scm.cm.stats.get("rej_no_resources", 0)
        rate = sent[0] / elapsed
        print(f"bench_req_flood: {sent[0]} REQs from one address in {elapsed:.1f} s ({rate:.0f}/s); "
              f"{handled} reported to the server, {rej} REJ no resources; CM entries at most {peak}; "
              f"the real client: {got}")  # fmt: skip
        flood.close()
        sdev.close()
        cdev.close()


if __name__ == "__main__":
    main()
