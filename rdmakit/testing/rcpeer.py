"""One side of an RC exchange that checks every byte: every operation, both directions.

    python3 -m rdmakit.testing.rcpeer --side host|guest --dir DIR [--ip ADDR] [--device NAME]
        [--backend soft|verbs] [--sizes N,N,...] [--timeout S]

Two processes, one per side, run it: the soft engine against kernel rxe in the lab
(tests/lab/test_interop.py), two soft engines or a soft engine and rxe on the guest's
netem paths (:mod:`rdmakit.testing.netem`). Each side's ``--backend`` is
``soft``, rdmakit's soft engine (``SoftBackendDevice``, RoCEv2 on UDP from ADDR), or
``verbs``, rdmakit's verbs backend (``VerbsDevice`` on NAME, e.g. rxe0); by default
the ``host`` side is soft and the ``guest`` side verbs. Both sides drive their QP
through the same backend protocol, in event-driven mode (waiting on ``fileno()``
when idle).

Two phases, one RC connection each: in ``host-requests`` the host is the
requester and the guest the responder, in ``guest-requests`` the other way
round. The requester runs every RC operation for every size (send and send
with immediate, write and write with immediate, read, fetch-and-add,
compare-and-swap; ``--sizes``), checks its completions and what it reads back, and ends
with a SEND of b"BYE". The responder keeps receives posted, reports each
receive completion, and at BYE the SHA-256 of its target memory.

Descriptors go through DIR (shared by host and guest): ``PHASE.SIDE.json``
(the QP's ``export()`` and the target memory), ``PHASE.SIDE.ready`` once the
responder is at RTS. Output: one JSON object per line, the last one
``{"event": "done", ...}`` with the device counters.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rdmakit.engine.types import SGE, Access, Completion, QpCaps, RecvWR, SendWR, WcOpcode, WcStatus, WrOpcode
from rdmakit.transport.driver import wait_readable
from rdmakit.verbs.buffers import buffer_address

PHASES = ("host-requests", "guest-requests")
SIZES = (0, 1, 1023, 1024, 1025, 4097, 65537, 4 << 20)
TARGET_LEN = 8 << 20
ATOMIC_OFF = 6 << 20
SRC_LEN = 4 << 20
READBACK_OFF = SRC_LEN
LOCAL_LEN = 2 * SRC_LEN + 4096
ATOMIC_RESULT_OFF = 2 * SRC_LEN
ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
# Distinct bytes, so a byte-swapped value can never pass for the right one.
ATOMIC_START = 0x0123_4567_89AB_CDEF
ATOMIC_ADD = 0x0000_0010_0000_0001
ATOMIC_SWAP = 0xFEDC_BA98_7654_3210
U64 = (1 << 64) - 1


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


class Fail(Exception):
    pass


class Side:
    """The device of one side and the few things that differ between backends."""

    def __init__(self, side: str, backend: str, ip: str, device: str, qp_timeout: int | None) -> None:
        self.side = side
        self.soft = backend == "soft"
        self.qp_timeout = qp_timeout
        if self.soft:
            from rdmakit.doca.soft import SoftBackendDevice

            self.dev: Any = SoftBackendDevice("roce-udp", ip)
        else:
            from rdmakit.verbs import VerbsDevice

            self.dev = VerbsDevice(device)

    def create_qp(self) -> Any:
        qp = self.dev.create_qp(QpCaps())
        if self.qp_timeout is not None and self.soft:  # a SoftBackendQP
            qp.connect_attrs = dataclasses.replace(qp.connect_attrs, timeout=self.qp_timeout)
        elif self.qp_timeout is not None:  # a VerbsQP
            qp.options = dataclasses.replace(qp.options, timeout=self.qp_timeout)
        return qp

    def register(self, buf: bytearray) -> Any:
        view = memoryview(buf)
        return self.dev.register_memory(view, buffer_address(view), ALL)

    def counters(self) -> dict[str, int]:
        if self.soft:
            return dict(self.dev.soft.counters.as_dict())
        out = subprocess.run(
            ["rdma", "-j", "statistic", "show", "link", f"{self.dev.name}/{self.dev.port}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (entry,) = json.loads(out)
        found = {k: v for k, v in entry.items() if isinstance(v, int) and k != "port"}
        netdev = self.dev.info.netdev
        for name in ("rx_packets", "tx_packets", "rx_dropped", "rx_missed_errors", "rx_fifo_errors"):
            path = Path(f"/sys/class/net/{netdev}/statistics/{name}")
            found[f"{netdev}.{name}"] = int(path.read_text())
        lines = Path("/proc/net/softnet_stat").read_text().splitlines()
        found["softnet_dropped"] = sum(int(line.split()[1], 16) for line in lines)
        return found

    def qp_stats(self, qp: Any) -> dict[str, Any]:
        if not self.soft:
            return {}
        s = qp.engine_qp.stats
        return {
            "packets_in": s.packets_in,
            "packets_out": s.packets_out,
            "rnr_naks_sent": s.rnr_naks_sent,
            "retransmits": s.retransmits,
            "probes": s.probes,
            "random_losses": s.random_losses,
            "retries": s.retries,
            "timeouts": s.timeouts,
            "duplicates": s.duplicates,
            "rnr_naks_received": s.rnr_naks_received,
            "naks_received": dict(s.naks_received),
            "naks_sent": dict(s.naks_sent),
            "dropped": dict(s.dropped),
        }


def write_json(path: Path, obj: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def wait_file(path: Path, deadline: float) -> None:
    while not path.exists():
        if time.monotonic() > deadline:
            raise Fail(f"{path.name} never appeared")
        time.sleep(0.01)


def pump(qp: Any, done: Callable[[list[Completion]], bool], deadline: float, what: str) -> list[Completion]:
    """Progress `qp` until ``done(completions so far)``; waits on its fileno when idle."""
    got: list[Completion] = []
    while True:
        busy = qp.progress()
        got.extend(qp.poll(64))
        if done(got):
            return got
        left = deadline - time.monotonic()
        if left <= 0:
            raise Fail(f"{what}: timed out with {got}")
        if not busy:
            wait_readable(qp.fileno(), min(left, 0.5))


def receive_sizes(sizes: tuple[int, ...]) -> list[int]:
    """The receive WQE each message of a phase consumes, in order (the requester's plan).

    Each is 64 bytes larger than its message: a receive buffer may be larger.
    """
    out: list[int] = []
    for n in sizes:
        out += [n + 64, n + 64, 64]  # SEND, SEND with immediate, WRITE with immediate
    return [*out, 64]  # BYE


def responder(
    side: Side, phase: str, shared: Path, peer_side: str, deadline: float, plan: tuple[int, ...]
) -> dict[str, Any]:
    qp = side.create_qp()
    target = bytearray(TARGET_LEN)
    sizes = receive_sizes(plan)
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    recv_area = bytearray(sum(sizes))
    mr = side.register(target)
    rmr = side.register(recv_area)
    qp.init()
    # Every receive is posted before the peer may send: no RNR NAK is ever needed.
    for i, (off, size) in enumerate(zip(offsets, sizes, strict=True)):
        qp.post_recv(RecvWR(wr_id=i, sg_list=(SGE(rmr.addr + off, size, rmr.lkey),)))
    me = shared / f"{phase}.{side.side}.json"
    write_json(me, {"qp": qp.export(), "mem": {"addr": mr.addr, "rkey": mr.rkey, "length": TARGET_LEN}})
    wait_file(shared / f"{phase}.{peer_side}.json", deadline)
    peer = json.loads((shared / f"{phase}.{peer_side}.json").read_text())
    qp.connect(peer["qp"])
    write_json(shared / f"{phase}.{side.side}.ready", {"state": qp.state.name})
    recvs: list[dict[str, Any]] = []
    bye = False
    while not bye:
        for wc in pump(qp, bool, deadline, f"{phase} responder"):
            off = offsets[wc.wr_id]
            data = bytes(recv_area[off : off + wc.byte_len])
            recv = {
                "wr_id": wc.wr_id,
                "status": wc.status.name,
                "opcode": wc.opcode.name,
                "byte_len": wc.byte_len,
                "imm": wc.imm_data,
                "sha256": hashlib.sha256(data).hexdigest() if wc.opcode is WcOpcode.RECV else "",
            }
            recvs.append(recv)
            if wc.status is not WcStatus.SUCCESS:
                raise Fail(f"{phase}: receive failed: {recv}")
            bye = wc.opcode is WcOpcode.RECV and data == b"BYE"
    # The last ACK is out once the completion is (the soft engine sends it in the same
    # progress round); keep pumping a little for retransmitted requests anyway.
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        qp.progress()
        time.sleep(0.01)
    result = {
        "recvs": recvs,
        "target_sha256": hashlib.sha256(target).hexdigest(),
        "qp_stats": side.qp_stats(qp),
        "state": qp.state.name,
    }
    qp.close()
    return result


class Requester:
    def __init__(
        self, side: Side, phase: str, shared: Path, peer_side: str, deadline: float, sizes: tuple[int, ...]
    ) -> None:
        self.side, self.phase, self.deadline, self.sizes = side, phase, deadline, sizes
        self.qp = side.create_qp()
        self.local = bytearray(LOCAL_LEN)
        self.mr = side.register(self.local)
        write_json(shared / f"{phase}.{side.side}.json", {"qp": self.qp.export(), "mem": None})
        wait_file(shared / f"{phase}.{peer_side}.json", deadline)
        peer = json.loads((shared / f"{phase}.{peer_side}.json").read_text())
        self.remote = peer["mem"]
        self.qp.connect(peer["qp"])
        # Requests sent before the responder is at RTR would be dropped and retried.
        wait_file(shared / f"{phase}.{peer_side}.ready", deadline)
        self.next_id = 0
        self.ops: list[dict[str, Any]] = []

    def post(
        self, opcode: WrOpcode, length: int, offset: int = 0, remote_offset: int = 0, **kw: Any
    ) -> Completion:
        self.next_id += 1
        wr = SendWR(
            wr_id=self.next_id,
            opcode=opcode,
            sg_list=(SGE(self.mr.addr + offset, length, self.mr.lkey),) if length else (),
            remote_addr=self.remote["addr"] + remote_offset,
            rkey=self.remote["rkey"],
            **kw,
        )
        t = time.monotonic()
        self.qp.post_send(wr)
        (wc,) = pump(self.qp, bool, self.deadline, f"{self.phase} {opcode.name} {length}")
        self.ops.append(
            {
                "op": opcode.name,
                "length": length,
                "status": wc.status.name,
                "opcode": wc.opcode.name,
                "byte_len": wc.byte_len,
                "wr_id_ok": wc.wr_id == self.next_id,
                "ms": round((time.monotonic() - t) * 1000, 2),
            }
        )
        if wc.status is not WcStatus.SUCCESS or wc.wr_id != self.next_id:
            raise Fail(
                f"{self.phase}: {opcode.name} of {length} B completed {wc} after {self.ops[-1]['ms']} ms;"
                f" QP stats {self.side.qp_stats(self.qp)}; device {self.side.counters()}"
            )
        return wc

    def run(self) -> dict[str, Any]:
        rng = random.Random(f"{self.phase}-7")
        local = self.local
        expected_target = bytearray(TARGET_LEN)
        expected_recvs: list[list[Any]] = []
        checks: dict[str, bool] = {}
        for n in self.sizes:
            local[:n] = rng.randbytes(n)
            digest = hashlib.sha256(local[:n]).hexdigest()
            self.post(WrOpcode.SEND, n)
            expected_recvs.append(["RECV", n, None, digest])
            self.post(WrOpcode.SEND_WITH_IMM, n, imm_data=0x1234_5600 + n % 256)
            expected_recvs.append(["RECV", n, 0x1234_5600 + n % 256, digest])
            self.post(WrOpcode.RDMA_WRITE, n)
            expected_target[:n] = local[:n]
            local[READBACK_OFF : READBACK_OFF + n] = bytes(n)
            wc = self.post(WrOpcode.RDMA_READ, n, offset=READBACK_OFF)
            checks[f"read {n}: byte_len"] = wc.byte_len == n
            checks[f"read {n}: data"] = local[READBACK_OFF : READBACK_OFF + n] == local[:n]
            local[:n] = rng.randbytes(n)  # a fresh pattern for the write with immediate
            self.post(WrOpcode.RDMA_WRITE_WITH_IMM, n, imm_data=0xABCD_EF00 + n % 256)
            expected_target[:n] = local[:n]
            # byte_len is the RETH length (rxe do_complete()); no receive buffer is touched.
            expected_recvs.append(["RECV_RDMA_WITH_IMM", n, 0xABCD_EF00 + n % 256, ""])
        # Atomics on an 8-byte aligned word: a known start value, so the byte order of
        # both the target word and the returned original is checked (little-endian, as
        # rxe keeps a CPU-native u64; IBTA §9.4.5 leaves the memory format to the host).
        res = ATOMIC_RESULT_OFF
        local[res : res + 8] = ATOMIC_START.to_bytes(8, "little")
        self.post(WrOpcode.RDMA_WRITE, 8, offset=res, remote_offset=ATOMIC_OFF)
        local[res : res + 8] = bytes(8)
        self.post(
            WrOpcode.ATOMIC_FETCH_AND_ADD, 8, offset=res, remote_offset=ATOMIC_OFF, compare_add=ATOMIC_ADD
        )
        checks["fetch_add returns the original"] = (
            int.from_bytes(local[res : res + 8], "little") == ATOMIC_START
        )
        after_add = (ATOMIC_START + ATOMIC_ADD) & U64
        self.post(
            WrOpcode.ATOMIC_CMP_AND_SWP, 8, offset=res + 8, remote_offset=ATOMIC_OFF,
            compare_add=after_add, swap=ATOMIC_SWAP,
        )  # fmt: skip
        checks["cmp_swap returns the sum"] = int.from_bytes(local[res + 8 : res + 16], "little") == after_add
        self.post(
            WrOpcode.ATOMIC_CMP_AND_SWP, 8, offset=res + 16, remote_offset=ATOMIC_OFF,
            compare_add=after_add, swap=0,
        )  # fmt: skip
        checks["failed cmp_swap returns the swapped value"] = (
            int.from_bytes(local[res + 16 : res + 24], "little") == ATOMIC_SWAP
        )
        self.post(WrOpcode.RDMA_READ, 8, offset=res + 24, remote_offset=ATOMIC_OFF)
        checks["target holds the swapped value"] = (
            int.from_bytes(local[res + 24 : res + 32], "little") == ATOMIC_SWAP
        )
        expected_target[ATOMIC_OFF : ATOMIC_OFF + 8] = ATOMIC_SWAP.to_bytes(8, "little")
        local[:3] = b"BYE"
        self.post(WrOpcode.SEND, 3)
        expected_recvs.append(["RECV", 3, None, hashlib.sha256(b"BYE").hexdigest()])
        result = {
            "ops": self.ops,
            "checks": checks,
            "expected_recvs": expected_recvs,
            "expected_target_sha256": hashlib.sha256(expected_target).hexdigest(),
            "qp_stats": self.side.qp_stats(self.qp),
            "state": self.qp.state.name,
        }
        self.qp.close()
        return result


#: What each work request completes as on the requester (``ibv_wc_opcode``).
WC_OPCODE = {
    "SEND": "SEND", "SEND_WITH_IMM": "SEND", "RDMA_WRITE": "RDMA_WRITE",
    "RDMA_WRITE_WITH_IMM": "RDMA_WRITE", "RDMA_READ": "RDMA_READ",
    "ATOMIC_CMP_AND_SWP": "COMP_SWAP", "ATOMIC_FETCH_AND_ADD": "FETCH_ADD",
}  # fmt: skip


def verify(requester: dict[str, Any], responder: dict[str, Any]) -> list[str]:
    """What is wrong with one direction's two ``phase`` records (none: every byte checked)."""
    problems = [f"check failed: {name}" for name, ok in requester["checks"].items() if not ok]
    for op in requester["ops"]:
        if op["status"] != "SUCCESS" or not op["wr_id_ok"] or op["opcode"] != WC_OPCODE[op["op"]]:
            problems.append(f"completion {op}")
    got = [[r["opcode"], r["byte_len"], r["imm"], r["sha256"]] for r in responder["recvs"]]
    if got != requester["expected_recvs"]:
        problems.append("the receives differ from what was sent")
    if any(r["status"] != "SUCCESS" for r in responder["recvs"]):
        problems.append("a receive completed with an error")
    if responder["target_sha256"] != requester["expected_target_sha256"]:
        problems.append("the target memory differs from what was written")
    if not requester["state"] == responder["state"] == "RTS":
        problems.append(f"QP states {requester['state']}/{responder['state']}, not RTS")
    return problems


def _sizes(text: str) -> tuple[int, ...]:
    """``--sizes``: message sizes, 0 to 4 MiB each (the source area), at most 16 of them."""
    try:
        sizes = tuple(int(n) for n in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of sizes: {text!r}") from None
    if not 1 <= len(sizes) <= 16 or any(not 0 <= n <= SRC_LEN for n in sizes):
        raise argparse.ArgumentTypeError(f"1 to 16 sizes of 0 to {SRC_LEN} bytes: {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m rdmakit.testing.rcpeer")
    ap.add_argument("--side", choices=("host", "guest"), required=True)
    ap.add_argument("--backend", choices=("soft", "verbs"), help="default: soft for host, verbs for guest")
    ap.add_argument("--sizes", type=_sizes, default=SIZES, help="message sizes (both sides give the same)")
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--ip", default="10.77.0.1")
    ap.add_argument("--device", default=os.environ.get("RDMAKIT_RXE_DEV", "rxe0"))
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument(
        "--qp-timeout", type=int, default=None, help="local ACK timeout exponent (4.096 us x 2^N)"
    )
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    backend = args.backend or ("soft" if args.side == "host" else "verbs")
    side = Side(args.side, backend, args.ip, args.device, args.qp_timeout)
    peer_side = "guest" if args.side == "host" else "host"
    emit(event="open", side=args.side, device=side.dev.name, startup_s=round(time.monotonic() - t0, 2))
    before = side.counters()
    try:
        for phase in PHASES:
            t = time.monotonic()
            requests = (phase == "host-requests") == (args.side == "host")
            if requests:
                result = Requester(side, phase, args.dir, peer_side, deadline, args.sizes).run()
            else:
                result = responder(side, phase, args.dir, peer_side, deadline, args.sizes)
            role = "requester" if requests else "responder"
            emit(event="phase", phase=phase, role=role, seconds=round(time.monotonic() - t, 2), **result)
    except Fail as e:
        emit(event="error", error=str(e))
        return 1
    after = side.counters()
    extra: dict[str, Any] = {}
    if not side.soft:
        dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout
        extra["bad_icrc_lines"] = [line for line in dmesg.splitlines() if "bad ICRC" in line]
    emit(
        event="done",
        counters_before=before,
        counters_after=after,
        seconds=round(time.monotonic() - t0, 2),
        **extra,
    )
    side.dev.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
