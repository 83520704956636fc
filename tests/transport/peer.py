"""A responder process for two-process transport tests.

Usage: peer.py TRANSPORT IP INFO_OUT REQUEST_IN [--no-gso]

Publishes its endpoint and memory (JSON, written atomically), connects to the
requester named in REQUEST_IN, keeps receives posted, and prints one JSON line per
receive completion. A SEND whose payload is b"BYE" ends it; it then prints the
SHA-256 of its target memory and exits 0.
"""

import dataclasses
import hashlib
import json
import os
import random
import sys
import time

from rdmakit.engine import SGE, Access, CompletionQueue, RecvWR, WcStatus
from rdmakit.transport.connect import Endpoint, connect_qp, init_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver

MEM = 8 << 20
RECV_SLOT = 4 << 20
NRECV = 8


def main() -> int:
    transport, ip, out_path, in_path = sys.argv[1:5]
    dev = SoftDevice(ip, transport=transport, gso="--no-gso" not in sys.argv)  # type: ignore[arg-type]
    drv = Driver()
    drv.add(dev)
    cq = CompletionQueue(4096)
    qp = dev.create_qp(send_cq=cq, recv_cq=cq)
    target = bytearray(MEM)
    recv_area = bytearray(RECV_SLOT * NRECV)
    all_remote = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
    mr = dev.pd.register(target, 0x7000_0000, all_remote)
    rmr = dev.pd.register(recv_area, 0x9000_0000, Access.LOCAL_WRITE)
    psn = random.getrandbits(24)
    ep = local_endpoint(dev, qp, psn)
    info = {"endpoint": dataclasses.asdict(ep), "addr": mr.addr, "rkey": mr.rkey, "length": MEM}
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, out_path)
    end = time.monotonic() + 30
    while not os.path.exists(in_path):
        if time.monotonic() > end:
            print(json.dumps({"error": "requester never appeared"}), flush=True)
            return 2
        time.sleep(0.01)
    with open(in_path) as f:
        peer = Endpoint(**json.load(f)["endpoint"])
    init_qp(qp)
    for i in range(NRECV):
        qp.post_recv(RecvWR(wr_id=i, sg_list=(SGE(rmr.addr + i * RECV_SLOT, RECV_SLOT, rmr.lkey),)))
    connect_qp(dev, qp, psn, peer)
    print(json.dumps({"ready": True}), flush=True)
    done = False
    parent = os.getppid()
    while not done:
        if os.getppid() != parent:
            return 3  # the requester died: nobody will say BYE
        if not drv.progress():
            drv.wait(0.5)
        for wc in cq.poll(64):
            slot = wc.wr_id % NRECV
            data = bytes(recv_area[slot * RECV_SLOT : slot * RECV_SLOT + wc.byte_len])
            print(
                json.dumps(
                    {
                        "wr_id": wc.wr_id,
                        "status": wc.status.name,
                        "opcode": wc.opcode.name,
                        "byte_len": wc.byte_len,
                        "imm": wc.imm_data,
                        "sha256": hashlib.sha256(data).hexdigest(),
                    }
                ),
                flush=True,
            )
            if wc.status is not WcStatus.SUCCESS:
                return 1
            if data == b"BYE":
                done = True
            qp.post_recv(
                RecvWR(
                    wr_id=wc.wr_id + NRECV, sg_list=(SGE(rmr.addr + slot * RECV_SLOT, RECV_SLOT, rmr.lkey),)
                )
            )
    # Let the final ACK go out before leaving.
    drv.run_until(lambda: False, 0.2)
    print(
        json.dumps({"memory_sha256": hashlib.sha256(target).hexdigest(), "counters": dev.counters.as_dict()}),
        flush=True,
    )
    dev.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
