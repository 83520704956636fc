"""A requester in this process and tests/transport/peer.py in another: every RC operation between them."""

import dataclasses
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rdmakit.engine import SGE, Access, Completion, CompletionQueue, SendWR, WcOpcode, WcStatus, WrOpcode
from rdmakit.testing.engine import until_completions
from rdmakit.transport.connect import Endpoint, connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver

PEER = Path(__file__).with_name("peer.py")
SIZES = [0, 1, 1024, 4096, 4097, 3 << 20]


class Requester:
    def __init__(self, transport: str, ip: str, tmp: Path, peer_ip: str, *, gso: bool = True) -> None:
        self.tmp = tmp
        argv = [sys.executable, str(PEER), transport, peer_ip, str(tmp / "peer.json"), str(tmp / "req.json")]
        self.proc = subprocess.Popen(
            [*argv, *([] if gso else ["--no-gso"])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.dev = SoftDevice(ip, transport=transport, gso=gso)  # type: ignore[arg-type]
        self.drv = Driver()
        self.drv.add(self.dev)
        self.cq = CompletionQueue(4096)
        self.qp = self.dev.create_qp(send_cq=self.cq, recv_cq=self.cq)
        self.mem = bytearray(8 << 20)
        self.mr = self.dev.pd.register(self.mem, 0x1000_0000, Access.LOCAL_WRITE)
        psn = random.getrandbits(24)
        ep = local_endpoint(self.dev, self.qp, psn)
        (tmp / "req.json.tmp").write_text(json.dumps({"endpoint": dataclasses.asdict(ep)}))
        os.replace(tmp / "req.json.tmp", tmp / "req.json")
        deadline = time.monotonic() + 30
        while not (tmp / "peer.json").exists():
            assert time.monotonic() < deadline, "peer never published its endpoint"
            time.sleep(0.005)
        self.peer = json.loads((tmp / "peer.json").read_text())
        connect_qp(self.dev, self.qp, psn, Endpoint(**self.peer["endpoint"]))
        self.next_id = 0

    def post(
        self,
        opcode: WrOpcode,
        length: int,
        offset: int = 0,
        *,
        remote_offset: int = 0,
        imm_data: int | None = None,
        compare_add: int = 0,
        swap: int = 0,
    ) -> Completion:
        self.next_id += 1
        wr = SendWR(
            wr_id=self.next_id, opcode=opcode,
            sg_list=(SGE(self.mr.addr + offset, length, self.mr.lkey),) if length else (),
            remote_addr=self.peer["addr"] + remote_offset, rkey=self.peer["rkey"], imm_data=imm_data,
            compare_add=compare_add, swap=swap,
        )  # fmt: skip
        self.qp.post_send(wr)
        got: list[Completion] = []
        assert self.drv.run_until(until_completions(self.cq, got), 30), f"{opcode.name} hung"
        return got[0]

    def close(self, failed: bool = False) -> tuple[list[dict[str, object]], dict[str, object]]:
        if failed:
            self.proc.kill()
        out, err = self.proc.communicate(timeout=30)
        self.dev.close()
        self.drv.close()
        assert self.proc.returncode == 0, err + out
        lines = [json.loads(x) for x in out.splitlines()]
        return [x for x in lines if "wr_id" in x], lines[-1]


def exercise(r: Requester, sizes: Sequence[int] = SIZES) -> list[tuple[str, int, int | None, str]]:
    """Every RC operation at every size; returns the receives the peer must report."""
    rng = random.Random(7)
    expected_recv: list[tuple[str, int, int | None, str]] = []
    for n in sizes:
        r.mem[:n] = rng.randbytes(n)
        digest = hashlib.sha256(r.mem[:n]).hexdigest()
        wc = r.post(WrOpcode.SEND, n)
        assert (wc.status, wc.opcode) == (WcStatus.SUCCESS, WcOpcode.SEND)
        expected_recv.append(("RECV", n, None, digest))
        wc = r.post(WrOpcode.SEND_WITH_IMM, n, imm_data=0x1234_0000 + n)
        assert wc.status is WcStatus.SUCCESS
        expected_recv.append(("RECV", n, 0x1234_0000 + n, digest))
        # WRITE then READ it back into another part of local memory.
        wc = r.post(WrOpcode.RDMA_WRITE, n)
        assert (wc.status, wc.opcode) == (WcStatus.SUCCESS, WcOpcode.RDMA_WRITE)
        wc = r.post(WrOpcode.RDMA_READ, n, offset=4 << 20)
        assert (wc.status, wc.opcode, wc.byte_len) == (WcStatus.SUCCESS, WcOpcode.RDMA_READ, n)
        assert r.mem[4 << 20 : (4 << 20) + n] == r.mem[:n]
        wc = r.post(WrOpcode.RDMA_WRITE_WITH_IMM, n, imm_data=0xABCD_0000 + n)
        assert wc.status is WcStatus.SUCCESS
        # byte_len is the RETH length (rxe do_complete()); the receive buffer is untouched.
        expected_recv.append(("RECV_RDMA_WITH_IMM", n, 0xABCD_0000 + n, ""))
    # Atomics on an 8-byte aligned word of the peer's memory (initially zero).
    wc = r.post(WrOpcode.ATOMIC_FETCH_AND_ADD, 8, offset=64, remote_offset=6 << 20, compare_add=5)
    assert (wc.status, wc.opcode) == (WcStatus.SUCCESS, WcOpcode.FETCH_ADD)
    assert int.from_bytes(r.mem[64:72], "little") == 0
    wc = r.post(WrOpcode.ATOMIC_CMP_AND_SWP, 8, offset=64, remote_offset=6 << 20, compare_add=5, swap=99)
    assert (wc.status, wc.opcode) == (WcStatus.SUCCESS, WcOpcode.COMP_SWAP)
    assert int.from_bytes(r.mem[64:72], "little") == 5
    wc = r.post(WrOpcode.RDMA_READ, 8, offset=128, remote_offset=6 << 20)
    assert int.from_bytes(r.mem[128:136], "little") == 99
    r.mem[:3] = b"BYE"
    assert r.post(WrOpcode.SEND, 3).status is WcStatus.SUCCESS
    return expected_recv


def check_peer_report(
    recvs: list[dict[str, object]], last: dict[str, object], expected: list[object]
) -> None:
    got = [
        (x["opcode"], x["byte_len"], x["imm"], x["sha256"] if x["opcode"] == "RECV" else "") for x in recvs
    ]
    assert got[:-1] == expected
    assert all(x["status"] == "SUCCESS" for x in recvs)
    counters = last["counters"]
    assert isinstance(counters, dict)
    assert counters["bad_icrc"] == counters["malformed"] == counters["unknown_qp"] == 0
