"""Where the CPU time of one 8-byte RDMA WRITE round trip goes, stage by stage (not a test).

Run: ``python benchmarks/bench_rtt_stages.py [--count N] [--ip-a A] [--ip-b B] [--op OP]``
(``--op``: the WRITE, or an 8-byte READ, FETCH ADD or COMPARE SWAP instead)
(``RDMAKIT_PURE_PYTHON=1`` for the pure-Python codec).

Two soft RoCE-UDP devices in this one thread, so no scheduler or polling loop
is timed: each stage is the engine's own call, timed with ``perf_counter``,
and the median of each over ``--count`` round trips is printed:

- ``post_send`` of the WRITE;
- the requester's device progress that builds the packet and sends it;
- the responder's device progress that receives it, checks it, places the
  8 bytes and sends the ACK;
- the requester's progress that receives the ACK and completes the WRITE;
- ``poll`` of the completion.

Beside them, the same four datagram system calls (two ``sendto``, two
``recv_into``) in a Python loop on two sockets: the floor of this layout.
"""

import argparse
import random
import socket
import statistics
import time

from rdmakit.engine import SGE, Access, CompletionQueue, SendWR, WcStatus, WrOpcode
from rdmakit.transport import fastpath
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice

STAGES = (
    "post_send",
    "requester transmit",
    "responder: receive, place, ACK",
    "requester: ACK, complete",  # (READ: its response, placed; atomic: its ATOMIC ACKNOWLEDGE)
    "poll",
)


#: --op: the work request of the round trip.
OPS = {
    "write": WrOpcode.RDMA_WRITE, "read": WrOpcode.RDMA_READ, "fetch_add": WrOpcode.ATOMIC_FETCH_AND_ADD,
    "cmp_swp": WrOpcode.ATOMIC_CMP_AND_SWP,
}  # fmt: skip


def stages(
    ip_a: str, ip_b: str, count: int, warm: int = 500, op: WrOpcode = WrOpcode.RDMA_WRITE, post: bool = True
) -> dict[str, float]:
    """Median seconds of each stage over `count` round trips (``post``: the request leaves in its
    ``post_send``, natively where it can, as under a ``Driver``; else at the next ``progress``)."""
    da, db = SoftDevice(ip_a), SoftDevice(ip_b)
    da.post_with(time.perf_counter if post else None)
    try:
        ca, cb = CompletionQueue(64), CompletionQueue(64)
        qa, qb = da.create_qp(send_cq=ca, recv_cq=ca), db.create_qp(send_cq=cb, recv_cq=cb)
        pa, pb = random.getrandbits(24), random.getrandbits(24)
        ea, eb = local_endpoint(da, qa, pa), local_endpoint(db, qb, pb)
        connect_qp(da, qa, pa, eb)
        connect_qp(db, qb, pb, ea)
        src, dst = bytearray(8), bytearray(8)
        remote = Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
        mra = da.pd.register(src, 0x1000, Access.LOCAL_WRITE)
        mrb = db.pd.register(dst, 0x2000, Access.LOCAL_WRITE | remote)
        atomic = op in (WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP)
        wr = SendWR(
            wr_id=1, opcode=op, sg_list=(SGE(0x1000, 8, mra.lkey),), remote_addr=0x2000, rkey=mrb.rkey,
            compare_add=1 if atomic else 0,
        )  # fmt: skip
        clock = time.perf_counter
        times: list[list[float]] = [[] for _ in STAGES]
        for i in range(warm + count):
            t0 = clock()
            qa.post_send(wr)
            t1 = clock()
            while not da.progress(clock()) and not post:
                pass  # (posted natively, the WRITE has left already: one turn of the pump)
            t2 = clock()
            while not db.progress(clock()):
                pass
            t3 = clock()
            while len(ca) == 0:
                da.progress(clock())
            t4 = clock()
            wcs = ca.poll(1)
            t5 = clock()
            if wcs[0].status is not WcStatus.SUCCESS:
                raise SystemExit(f"{op.name} failed: {wcs[0].status.name}")
            if i >= warm:
                for k, v in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                    times[k].append(v)
        return {name: statistics.median(t) for name, t in zip(STAGES, times, strict=True)}
    finally:
        da.close()
        db.close()


def raw_floor(ip_a: str, ip_b: str, count: int, warm: int = 500) -> float:
    """Median seconds of two sendto and two recv_into between two sockets, in this thread."""
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s1,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s2,
    ):
        s1.bind((ip_a, 0))
        s2.bind((ip_b, 0))
        a1, a2 = s1.getsockname(), s2.getsockname()
        buf, out, back = bytearray(2048), b"x" * 48, b"x" * 32  # a WRITE ONLY of 8 bytes, an ACK
        clock = time.perf_counter
        ts: list[float] = []
        for i in range(warm + count):
            t0 = clock()
            s1.sendto(out, a2)
            s2.recv_into(buf)
            s2.sendto(back, a1)
            s1.recv_into(buf)
            if i >= warm:
                ts.append(clock() - t0)
        return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=5000, help="round trips timed (5000)")
    ap.add_argument("--ip-a", default="127.202.0.1", help="the requester's loopback address")
    ap.add_argument("--ip-b", default="127.202.0.2", help="the responder's loopback address")
    ap.add_argument("--op", choices=sorted(OPS), default="write", help="the operation (write)")
    ap.add_argument("--no-post", action="store_true", help="posts wait for progress (no native posting)")
    a = ap.parse_args()
    got = stages(a.ip_a, a.ip_b, a.count, op=OPS[a.op], post=not a.no_post)
    print(f"8-byte {OPS[a.op].name} round trip, one thread, data plane: {fastpath.describe()}")
    for name, secs in got.items():
        print(f"  {name:32s} {secs * 1e6:7.2f} µs")
    print(f"  {'total':32s} {sum(got.values()) * 1e6:7.2f} µs")
    print(f"  {'raw: the same 4 system calls':32s} {raw_floor(a.ip_a, a.ip_b, a.count) * 1e6:7.2f} µs")


if __name__ == "__main__":
    main()
