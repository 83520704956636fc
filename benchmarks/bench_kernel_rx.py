"""Receive CPU per datagram of a WRITE from a sender numbering its IPv4 IDs as kernel rxe does (not a test).

Run: ``python benchmarks/bench_kernel_rx.py [--runs N] [--mib M] [--ip-a A] [--ip-b B]``
(``RDMAKIT_PURE_PYTHON=1`` for the pure-Python codec).

Two soft RoCE-UDP devices in this one thread. The sender sends each packet
alone, its ICRC over IPv4 IDs of its own counter (``rdmakit.testing.kernel_ids``),
as rxe in a guest does; the receiver must check each with the ID the sender
most likely used. The CPU time (``process_time``) the receiving device spends
in its ``receive``, divided by the datagrams, is printed per run with the
median: the cost a kernel sender's packets have here, which its fixed
retransmission timer holds against.
"""

import argparse
import statistics
import time
from typing import Any

from rdmakit.engine import SGE, Access, CompletionQueue, SendWR, WcStatus, WrOpcode
from rdmakit.testing.engine import until_completions
from rdmakit.testing.kernel_ids import KernelIds
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver


def _run(ip_a: str, ip_b: str, size: int) -> tuple[float, int]:
    """(receive CPU seconds, datagrams) of one WRITE of ``size`` bytes from a kernel-like sender."""
    patched: list[tuple[Any, str, Any]] = []

    def setattr_(obj: Any, name: str, value: Any) -> None:
        patched.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    a, b = SoftDevice(ip_a, port=0, gso=False), SoftDevice(ip_b, port=0, gso=False)
    drv = Driver()
    try:
        drv.add(a)
        drv.add(b)
        port = b.udp_port
        assert port is not None
        real = port.receive
        spent = [0.0]

        def timed(now: float, readable: bool | None = None) -> bool:
            t = time.process_time()
            busy = real(now, readable)
            spent[0] += time.process_time() - t
            return busy

        port.receive = timed  # type: ignore[method-assign]
        kernel = KernelIds(a, 0x1000, {})
        kernel.install(setattr_)
        cqa, cqb = CompletionQueue(64), CompletionQueue(64)
        qa, qb = a.create_qp(send_cq=cqa, recv_cq=cqa), b.create_qp(send_cq=cqb, recv_cq=cqb)
        connect_qp(a, qa, 10, local_endpoint(b, qb, 20))
        connect_qp(b, qb, 20, local_endpoint(a, qa, 10))
        src, dst = bytearray(bytes(range(256)) * (size // 256)), bytearray(size)
        mra = a.pd.register(src, 0x1_0000, Access.LOCAL_WRITE)
        mrb = b.pd.register(dst, 0x4000_0000, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        qa.post_send(SendWR(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(mra.addr, size, mra.lkey),),
                            remote_addr=mrb.addr, rkey=mrb.rkey))  # fmt: skip
        got: list[Any] = []
        if not drv.run_until(until_completions(cqa, got), 120) or got[0].status is not WcStatus.SUCCESS:
            raise SystemExit(f"bench_kernel_rx: the WRITE did not complete: {got}")
        if dst != src:
            raise SystemExit("bench_kernel_rx: the bytes differ")
        return spent[0], len(kernel.sent)
    finally:
        for obj, name, value in reversed(patched):
            setattr(obj, name, value)
        a.close()
        b.close()
        drv.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mib", type=int, default=8, help="MiB per WRITE (8)")
    ap.add_argument("--ip-a", default="127.0.0.2")  # (ports of its own: any free one)
    ap.add_argument("--ip-b", default="127.0.0.3")
    args = ap.parse_args()
    if args.runs < 1 or not 0 < args.mib <= 256:
        ap.error("--runs must be at least 1 and --mib in 1..256")
    per = []
    for _ in range(args.runs):
        cpu, n = _run(args.ip_a, args.ip_b, args.mib << 20)
        per.append(cpu / n * 1e6)
    runs = " ".join(f"{x:.1f}" for x in per)
    med = statistics.median(per)
    print(f"receive CPU per datagram from a kernel-ID sender: median {med:.1f} µs (runs: {runs})")


if __name__ == "__main__":
    main()
