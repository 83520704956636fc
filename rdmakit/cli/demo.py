"""``rdmakit demo``: every RDMA operation over loopback on the soft engine, verified.

Both sides live in this process, each on its own soft device (by default
``udp:127.0.0.2`` and ``udp:127.0.0.3``: real RoCEv2 datagrams on UDP 4791,
ICRC and all). Side A is the requester, side B the responder, set up as the
DOCA RDMA samples do: two contexts swap connection descriptors, B exports its
memory map and A imports it. Each operation runs at several sizes, the bytes
that land are compared with the bytes sent, and a table reports the time per
checked operation and the throughput it makes. That time is not a round trip:
both ends and the byte checks share this one thread (`rdmakit bench` and
``rdmakit perftest`` measure round trips between two processes); the legend
the demo prints says so.
"""

import argparse
import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from rdmakit.cli.errors import CliError
from rdmakit.cli.lifecycle import run
from rdmakit.cli.options import TIMEOUT, add_general_flags, int_in
from rdmakit.cli.session import ALL_REMOTE, Session
from rdmakit.doca import (
    AccessFlag,
    Buf,
    Job,
    Mmap,
    RdmaAtomicCmpSwpJob,
    RdmaAtomicFetchAddJob,
    RdmaOpcode,
    RdmaReadJob,
    RdmaRecvJob,
    RdmaSendImmJob,
    RdmaSendJob,
    RdmaWriteImmJob,
    RdmaWriteJob,
)

KiB, MiB = 1 << 10, 1 << 20
SIZES = (1, 4 * KiB, 64 * KiB, MiB, 4 * MiB)
#: Bytes moved per operation and size, so every row takes about as long.
BUDGET = 16 * MiB
ATOMIC_WORD = 8 * MiB - 64  # 8-byte aligned, past every data transfer


@dataclass
class Row:
    op: str
    size: int
    reps: int
    ok: bool
    seconds: float
    note: str = ""


def _human(n: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


class Demo:
    def __init__(self, dev_a: str, dev_b: str, timeout: float, seed: int) -> None:
        self.timeout = timeout
        self.rng = random.Random(seed)
        local = AccessFlag.LOCAL_READ_WRITE
        self.a = Session(dev_a, permissions=local)
        self.b = Session(dev_b, permissions=local | ALL_REMOTE)
        size = 8 * MiB
        self.src, self.dst, self.res = bytearray(size), bytearray(size), bytearray(64)
        self.target, self.inbox = bytearray(size), bytearray(size)
        self.src_mm = self.a.mmap(self.src, local)
        self.dst_mm = self.a.mmap(self.dst, local)
        self.res_mm = self.a.mmap(self.res, local)
        self.target_mm = self.b.mmap(self.target, local | ALL_REMOTE)
        self.inbox_mm = self.b.mmap(self.inbox, local)
        da, db = self.a.start(), self.b.start()
        self.a.rdma.connect(db)
        self.b.rdma.connect(da)
        self.remote: Mmap = self.a.import_mmap(self.target_mm.export_rdma(self.b.dev))

    def close(self) -> None:
        self.a.close()
        self.b.close()

    # -- one operation, ``reps`` times -----------------------------------------------------

    def _finish(self, jobs_a: list[Job], jobs_b: list[Job], what: str) -> list[object]:
        evs = self.a.wait(jobs_a, self.timeout, what) + self.b.wait(jobs_b, self.timeout, what)
        for ev in evs:
            if not ev.ok:
                raise CliError(f"{what} failed: {ev.error}")
        bufs = [getattr(j, f) for j in (*jobs_a, *jobs_b) for f in ("src_buf", "dst_buf", "result_buf")
                if isinstance(getattr(j, f, None), Buf)]  # fmt: skip
        for buf in bufs:
            buf.dec_refcount()
        return [ev.result for ev in evs]

    def send(self, n: int, imm: bool) -> str:
        recv = RdmaRecvJob(ctx=self.b.rdma, dst_buf=self.b.room(self.inbox_mm, 0, n))
        self.b.submit(recv)
        src = self.a.data(self.src_mm, 0, n)
        immediate = self.rng.getrandbits(32)
        job: Job = (
            RdmaSendImmJob(ctx=self.a.rdma, src_buf=src, immediate=immediate)
            if imm
            else RdmaSendJob(ctx=self.a.rdma, src_buf=src)
        )
        self.a.submit(job)
        _, got = self._finish([job], [recv], "send")
        want_op = RdmaOpcode.RECV_SEND_WITH_IMM if imm else RdmaOpcode.RECV_SEND
        if getattr(got, "opcode", None) is not want_op or getattr(got, "length", None) != n:
            return f"receive reported {got}"
        if imm and getattr(got, "immediate", None) != immediate:
            return "immediate differs"
        return "" if self.inbox[:n] == self.src[:n] else "received bytes differ"

    def write(self, n: int, imm: bool) -> str:
        jobs_b: list[Job] = []
        immediate = self.rng.getrandbits(32)
        if imm:
            recv = RdmaRecvJob(ctx=self.b.rdma, dst_buf=None)
            self.b.submit(recv)
            jobs_b.append(recv)
        src, dst = self.a.data(self.src_mm, 0, n), self.a.room(self.remote, 0, n)
        job: Job = (
            RdmaWriteImmJob(ctx=self.a.rdma, src_buf=src, dst_buf=dst, immediate=immediate)
            if imm
            else RdmaWriteJob(ctx=self.a.rdma, src_buf=src, dst_buf=dst)
        )
        self.a.submit(job)
        results = self._finish([job], jobs_b, "write")
        if imm:
            got = results[-1]
            if getattr(got, "opcode", None) is not RdmaOpcode.RECV_WRITE_WITH_IMM:
                return f"receive reported {got}"
            if getattr(got, "immediate", None) != immediate:
                return "immediate differs"
        return "" if self.target[:n] == self.src[:n] else "written bytes differ"

    def read(self, n: int) -> str:
        job = RdmaReadJob(
            ctx=self.a.rdma, src_buf=self.a.data(self.remote, 0, n), dst_buf=self.a.room(self.dst_mm, 0, n)
        )
        self.a.submit(job)
        self._finish([job], [], "read")
        return "" if self.dst[:n] == self.target[:n] else "read bytes differ"

    def atomic(self, op: str) -> str:
        word = self.target[ATOMIC_WORD : ATOMIC_WORD + 8]
        before = int.from_bytes(word, "little")
        dst = self.a.data(self.remote, ATOMIC_WORD, 8)
        res = self.a.room(self.res_mm, 0, 8)
        if op == "cas":
            swap = self.rng.getrandbits(64)
            job: Job = RdmaAtomicCmpSwpJob(
                ctx=self.a.rdma, dst_buf=dst, result_buf=res, cmp=before, swap=swap
            )
            after = swap
        else:
            add = self.rng.getrandbits(32)
            job = RdmaAtomicFetchAddJob(ctx=self.a.rdma, dst_buf=dst, result_buf=res, add=add)
            after = (before + add) % (1 << 64)
        self.a.submit(job)
        self._finish([job], [], op)
        if int.from_bytes(self.res[:8], "little") != before:
            return "original value differs"
        now = int.from_bytes(self.target[ATOMIC_WORD : ATOMIC_WORD + 8], "little")
        return "" if now == after else "remote word differs"

    def row(self, op: str, size: int, once: Callable[[], str]) -> Row:
        reps = max(3, min(200, BUDGET // size))
        note = ""
        t0 = time.perf_counter()
        for _ in range(reps):
            self.src[:size] = self.rng.randbytes(size) if size <= 4096 else self.src[:size]
            note = once()
            if note:
                break
        return Row(op, size, reps, not note, time.perf_counter() - t0, note)


def _demo(args: argparse.Namespace) -> int:
    def spec(device: str) -> str:
        if args.transport == "tcp" and not device.startswith(("tcp:", "udp:")):
            return f"tcp:{device}"
        return str(device)

    demo = Demo(spec(args.device_a), spec(args.device_b), args.timeout, args.seed)
    sizes = [s for s in SIZES if s <= args.max_size]
    ops: dict[str, Callable[[int], str]] = {
        "send": lambda n: demo.send(n, imm=False),
        "send with immediate": lambda n: demo.send(n, imm=True),
        "write": lambda n: demo.write(n, imm=False),
        "write with immediate": lambda n: demo.write(n, imm=True),
        "read": demo.read,
    }
    plan: list[tuple[str, int, Callable[[], str]]] = [
        (name, size, functools.partial(fn, size)) for name, fn in ops.items() for size in sizes
    ]
    plan += [
        ("atomic compare-swap", 8, functools.partial(demo.atomic, "cas")),
        ("atomic fetch-add", 8, functools.partial(demo.atomic, "faa")),
    ]
    demo.src[:] = random.Random(args.seed).randbytes(len(demo.src))
    print(f"rdmakit demo: {demo.a.dev.name} (requester) <-> {demo.b.dev.name} (responder), "
          f"{'RoCEv2 over UDP 4791' if args.transport == 'udp' else 'RC packets framed on TCP'}")  # fmt: skip
    print(LEGEND)
    print(f"{'operation':<22}{'size':>9}{'runs':>6}  {'result':<8}{'time/op':>12}{'throughput':>14}")
    failures = 0
    try:
        for op, size, once in plan:
            r = demo.row(op, size, once)
            lat = r.seconds / r.reps
            lat_s = f"{lat * 1e6:.0f} µs" if lat < 1e-3 else f"{lat * 1e3:.2f} ms"
            rate = r.size * r.reps / r.seconds
            thr = f"{rate / 1e6:.1f} MB/s" if rate >= 1e6 else f"{rate / 1e3:.1f} kB/s"
            result = "ok" if r.ok else "FAILED"
            failures += not r.ok
            print(f"{r.op:<22}{_human(r.size):>9}{r.reps:>6}  {result:<8}{lat_s:>12}{thr:>14}"
                  + (f"  {r.note}" if r.note else ""), flush=True)  # fmt: skip
    finally:
        demo.close()
    print("all operations verified" if not failures else f"{failures} operation(s) FAILED")
    return 0 if not failures else 1


#: What the table's figures are (printed above it).
LEGEND = (
    "time/op: wall time per operation, from posting it to checking every byte that landed,\n"
    "with both ends in this one thread: not a round trip ('rdmakit bench' and 'rdmakit perftest'\n"
    "time those between two processes); throughput: bytes moved per second of that time"
)


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("demo", help="every RDMA operation over loopback on the soft engine, verified")
    add_general_flags(p)
    p.add_argument("--transport", choices=("udp", "tcp"), default="udp", help="soft transport (udp)")
    p.add_argument("--device-a", default="127.0.0.2", help="requester device (127.0.0.2)")
    p.add_argument("--device-b", default="127.0.0.3", help="responder device (127.0.0.3)")
    p.add_argument(
        "--max-size",
        type=int_in(1, SIZES[-1]),
        default=SIZES[-1],
        help=f"largest message in bytes, at most {_human(SIZES[-1])} (4 MiB)",
    )
    p.add_argument("--timeout", type=TIMEOUT, default=30.0, help="seconds any one operation may take")
    p.add_argument(
        "--seed", type=int_in(-(1 << 64), 1 << 64), default=1, help="seed of the data and values used"
    )
    p.set_defaults(handler=run(p, _demo))
