"""Per-packet cost of the RC engine and of the codec (not a test).

Run: ``python benchmarks/bench_engine.py [--size BYTES] [--mtu BYTES] [--repeat N]``

1. A WRITE (and a READ) of ``--size`` bytes between two engines wired back to
   back, no network and no codec: every packet one side emits is handed to
   the other's ``receive`` at once. Reported as µs per data packet for the
   whole exchange (requester + responder + ACKs).
2. ``encode`` + rxe ICRC of one full-MTU data packet, and ICRC check +
   ``decode`` on the receive side: the work a UDP transport adds per packet.
"""

import argparse
import random
import statistics
import time

from rdmakit.engine import (
    SGE,
    Access,
    CompletionQueue,
    ProtectionDomain,
    QpState,
    QueuePair,
    SendWR,
    WcStatus,
    WrOpcode,
)
from rdmakit.wire import (
    CRC32_IMPL,
    ROCE_UDP_PORT,
    Opcode,
    Packet,
    decode,
    encode,
    icrc_ipv4,
    pack_icrc,
    unpack_icrc,
)

ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


def pair(size: int, mtu: int) -> tuple[QueuePair, QueuePair, bytearray, bytearray, int, int]:
    rng = random.Random(1)
    qps = []
    mems = []
    keys = []
    for qpn in (0x11, 0x22):
        pd = ProtectionDomain(rng)
        mem = bytearray(rng.randbytes(size))
        mr = pd.register(mem, 0x1000_0000, ACCESS)
        qp = QueuePair(pd, qpn=qpn, send_cq=CompletionQueue(64), recv_cq=CompletionQueue(64), rng=rng)
        qps.append(qp)
        mems.append(mem)
        keys.append((mr.lkey, mr.rkey))
    a, b = qps
    for qp, peer, psn in ((a, b, 100), (b, a, 200)):
        qp.modify(QpState.INIT, port=1, pkey_index=0, access=ACCESS)
        qp.modify(
            QpState.RTR, path_mtu=mtu, dest_qpn=peer.qpn, rq_psn=300 - psn, max_dest_rd_atomic=1,
            min_rnr_timer=12,
        )  # fmt: skip
        qp.modify(QpState.RTS, timeout=14, retry_cnt=7, rnr_retry=7, sq_psn=psn, max_rd_atomic=1)
    return a, b, mems[0], mems[1], keys[0][0], keys[1][1]


def transfer(op: WrOpcode, size: int, mtu: int) -> tuple[float, int]:
    """Seconds for one ``op`` of ``size`` bytes from a to b, and the data packets it took."""
    a, b, mem_a, mem_b, lkey, rkey = pair(size, mtu)
    a.post_send(
        SendWR(
            wr_id=1, opcode=op, sg_list=(SGE(0x1000_0000, size, lkey),), remote_addr=0x1000_0000, rkey=rkey
        )
    )
    now = 0.0
    t0 = time.perf_counter()
    while not len(a.send_cq):
        for pkt in a.poll_transmit(now, 64):
            b.receive(pkt, now)
        for pkt in b.poll_transmit(now, 64):
            a.receive(pkt, now)
    elapsed = time.perf_counter() - t0
    (wc,) = a.send_cq.poll()
    assert wc.status is WcStatus.SUCCESS
    assert mem_a == mem_b
    return elapsed, (size + mtu - 1) // mtu


def codec(mtu: int, n: int) -> tuple[float, float]:
    mem = memoryview(bytearray(random.Random(2).randbytes(mtu)))
    pkt = Packet(Opcode.RDMA_WRITE_MIDDLE, 0x22, 1234, payload=mem)
    src, dst = bytes((10, 0, 0, 1)), bytes((10, 0, 0, 2))
    t0 = time.perf_counter()
    for _ in range(n):
        body = encode(pkt)
        wire = body + pack_icrc(icrc_ipv4(src, dst, 0xC000, ROCE_UDP_PORT, body))
    t1 = time.perf_counter()
    for _ in range(n):
        mv = memoryview(wire)
        body_mv = mv[:-4]
        assert icrc_ipv4(src, dst, 0xC000, ROCE_UDP_PORT, body_mv) == unpack_icrc(mv)
        decode(body_mv)
    t2 = time.perf_counter()
    return (t1 - t0) / n, (t2 - t1) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4 << 20)
    ap.add_argument("--mtu", type=int, nargs="*", default=[1024, 4096])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"CRC-32: {CRC32_IMPL}")
    for mtu in args.mtu:
        for op in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_READ):
            runs = [transfer(op, args.size, mtu) for _ in range(args.repeat)]
            best = min(t for t, _ in runs)
            npk = runs[0][1]
            median = statistics.median(t for t, _ in runs)
            print(
                f"{op.name:<11} {args.size >> 20} MiB mtu {mtu:>5}: {npk} data packets, "
                f"best {best * 1e3:7.1f} ms = {best / npk * 1e6:5.2f} µs/packet "
                f"({args.size / best / 1e6:7.1f} MB/s), median {median * 1e3:.1f} ms"
            )
        enc, dec = codec(mtu, 20000)
        print(
            f"codec mtu {mtu:>5}: encode+ICRC {enc * 1e6:5.2f} µs/packet, "
            f"ICRC check+decode {dec * 1e6:5.2f} µs/packet"
        )


if __name__ == "__main__":
    main()
