"""Host <-> DPU DMA throughput over shared memory, against a plain memcpy (not a test).

Run: ``python benchmarks/bench_dma.py [--size MiB] [--chunk KiB] [--repeat N]``

This process is the host: it exports ``--size`` MiB of shared memory
(``Mmap.export_dpu``) and hands the descriptor and the memory's fd to a DPU
process over a comm channel. The DPU process imports it and times, in the
same run and interleaved so both see the same machine:

- ``memcpy``: one slice assignment between two private buffers of that size
  (CPython's memcpy), the baseline;
- ``host->DPU`` and ``DPU->host``: DMA memcpy jobs on its `Dma` context
  between the imported host memory and its own buffer, one job per
  ``--chunk`` KiB (0: one job for the whole buffer), up to 16 in flight,
  from the first submit to the last event.

Buffers are touched before timing (steady state, no page faults). Reported:
the median of ``--repeat`` runs in GiB/s, and DMA / memcpy throughput, the
median over runs of each DMA run against the memcpy just before it (target
>= 0.8).

``--rdma`` measures the path between machines instead, on two soft RDMA
devices on loopback (``--addrs``): the host exports ``--size`` MiB with
``export_rdma`` and answers; the DPU process runs the same DMA jobs through
`Dma.set_rdma` (host->DPU: RDMA READs, DPU->host: RDMA WRITEs) and, in the
same run and interleaved, a plain stream of ``RdmaWriteJob`` s of the same
size, chunk and depth on the same connection, the baseline. Reported: GiB/s
and the median over runs of DMA-over-RDMA / RDMA WRITE.
"""

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time
import uuid

from rdmakit.cli.dma_rdma import DmaOverRdma
from rdmakit.doca import (
    AccessFlag,
    BufInventory,
    CommChannel,
    CommChannelServer,
    Dev,
    Dma,
    DmaMemcpyJob,
    Mmap,
    Rdma,
    RdmaWriteJob,
    SharedMemory,
    WorkQ,
    local_devinfo,
)

DEPTH = 16


def host(args: argparse.Namespace) -> None:
    size = args.size << 20
    service = f"bench-dma-{uuid.uuid4().hex[:12]}"
    with CommChannelServer(service) as server, SharedMemory(size) as memory, Dev.open(local_devinfo()) as dev:
        memory.buf[:] = os.urandom(size)
        mmap = Mmap()
        mmap.set_permissions(AccessFlag.LOCAL_READ_WRITE | AccessFlag.PCI_READ_WRITE)
        mmap.set_memrange(memory.buf)
        mmap.add_dev(dev)
        mmap.start()
        child = subprocess.Popen([sys.executable, __file__, "--dpu", service, "--chunk", str(args.chunk)])
        with server.accept(60) as chan:
            msg = {"descriptor": mmap.export_dpu(dev).decode(), "addr": mmap.addr, "length": size,
                   "repeat": args.repeat}  # fmt: skip
            chan.send(json.dumps(msg).encode(), fds=(memory.fd,))
            results = json.loads(chan.recv(600))
        child.wait()
        mmap.destroy()
    job = "one job" if args.chunk == 0 else f"{args.chunk} KiB jobs"
    print(f"{args.size} MiB, {job}, {DEPTH} in flight, median of {args.repeat} runs")
    base = results["memcpy"]
    print(f"  {'memcpy':>10}: {size / statistics.median(base) / 2**30:6.2f} GiB/s")
    for name in ("host->DPU", "DPU->host"):
        seconds = results[name]
        # Each run's DMA time against the memcpy timed just before it, then the median: robust to drift.
        ratio = statistics.median(b / s for b, s in zip(base, seconds, strict=True))
        print(
            f"  {name:>10}: {size / statistics.median(seconds) / 2**30:6.2f} GiB/s   DMA/memcpy {ratio:.2f}"
        )


def dpu(service: str, chunk_kib: int) -> None:
    with Dev.open(local_devinfo("dpu0")) as dev, CommChannel.connect(service, timeout=60) as chan:
        data, fds = chan.recv_fds(60)
        msg = json.loads(data)
        size, addr, repeat = msg["length"], msg["addr"], msg["repeat"]
        remote = Mmap.create_from_export(msg["descriptor"].encode(), dev, fd=fds[0])
        for fd in fds:
            os.close(fd)
        mine = bytearray(os.urandom(size))
        local = Mmap()
        local.set_memrange(mine)
        local.add_dev(dev)
        local.start()
        plain_src, plain_dst = bytearray(os.urandom(size)), bytearray(size)
        src_view, dst_view = memoryview(plain_src), memoryview(plain_dst)
        chunk = size if chunk_kib == 0 else chunk_kib << 10
        inventory = BufInventory(2 * DEPTH)
        inventory.start()
        with Dma(dev) as dma, WorkQ(DEPTH) as workq:
            dma.workq_add(workq)
            dma.start()

            def dma_copy(src: Mmap, src_addr: int, dst: Mmap, dst_addr: int) -> float:
                t0 = time.perf_counter()
                offset = inflight = done = 0
                while done < size:
                    while inflight < DEPTH and offset < size:
                        n = min(chunk, size - offset)
                        s = inventory.get_by_args(src, src_addr + offset, n, src_addr + offset, n)
                        d = inventory.get_by_args(dst, dst_addr + offset, n, dst_addr + offset, 0)
                        workq.submit(DmaMemcpyJob(ctx=dma, src=s, dst=d))
                        offset += n
                        inflight += 1
                    event = workq.progress_retrieve()
                    if event is None:
                        continue
                    assert event.ok, event.error
                    job = event.job
                    assert isinstance(job, DmaMemcpyJob)
                    job.src.dec_refcount()
                    job.dst.dec_refcount()
                    inflight -= 1
                    assert isinstance(event.result, int)
                    done += event.result
                return time.perf_counter() - t0

            def memcpy() -> float:
                t0 = time.perf_counter()
                dst_view[:] = src_view
                return time.perf_counter() - t0

            runs: dict[str, list[float]] = {"memcpy": [], "host->DPU": [], "DPU->host": []}
            memcpy()
            dma_copy(remote, addr, local, local.addr)  # warm up: every page touched
            dma_copy(local, local.addr, remote, addr)
            for _ in range(repeat):
                runs["memcpy"].append(memcpy())
                runs["host->DPU"].append(dma_copy(remote, addr, local, local.addr))
                runs["DPU->host"].append(dma_copy(local, local.addr, remote, addr))
        remote.destroy()
        local.destroy()
        chan.send(json.dumps(runs).encode())


RDMA_PERMS = AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE


def rdma_host(args: argparse.Namespace) -> None:
    size = args.size << 20
    service = f"bench-dma-rdma-{uuid.uuid4().hex[:12]}"
    host_ip, dpu_ip = args.addrs.split(",")
    memory = bytearray(os.urandom(size))
    with (
        CommChannelServer(service) as server,
        Dev.open(host_ip) as dev,
        Rdma() as rdma,
        WorkQ(4, event_driven=True) as wq,
    ):
        rdma.add_dev(dev)
        rdma.set_permissions(RDMA_PERMS)
        rdma.workq_add(wq)
        rdma.start()
        mmap = Mmap()
        mmap.set_permissions(RDMA_PERMS)
        mmap.set_memrange(memory)
        mmap.add_dev(dev)
        mmap.start()
        child = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--rdma-dpu",
                service,
                "--chunk",
                str(args.chunk),
                "--addrs",
                args.addrs,
            ]
        )
        with server.accept(60) as chan:
            msg = {"descriptor": mmap.export_rdma(dev).decode(), "addr": mmap.addr, "length": size,
                   "repeat": args.repeat, "connection": rdma.export().decode()}  # fmt: skip
            chan.send(json.dumps(msg).encode())
            rdma.connect(chan.recv(60))
            chan.send(b"ready")
            while (data := chan.try_recv()) is None:  # answer the DPU's requests until it reports
                while wq.progress_retrieve() is not None:
                    pass
                wq.arm()
                if select.select([chan.fileno(), wq.fileno()], [], [], 1.0)[0]:
                    wq.clear()
            results = json.loads(data)
        child.wait()
        rdma.stop()
        mmap.destroy()
    job = "one job" if args.chunk == 0 else f"{args.chunk} KiB jobs"
    print(
        f"{args.size} MiB over RDMA ({host_ip} <-> {dpu_ip}), {job}, {DEPTH} in flight, "
        f"median of {args.repeat}"
    )
    base = results["RDMA WRITE"]
    print(f"  {'RDMA WRITE':>10}: {size / statistics.median(base) / 2**30:6.2f} GiB/s")
    for name in ("host->DPU", "DPU->host"):
        seconds = results[name]
        ratio = statistics.median(b / s for b, s in zip(base, seconds, strict=True))
        print(
            f"  {name:>10}: {size / statistics.median(seconds) / 2**30:6.2f} GiB/s   "
            f"DMA/RDMA WRITE {ratio:.2f}"
        )


def rdma_dpu(service: str, chunk_kib: int, addrs: str) -> None:
    _, dpu_ip = addrs.split(",")
    with (
        Dev.open(dpu_ip) as dev,
        CommChannel.connect(service, timeout=60) as chan,
        Rdma() as rdma,
        WorkQ(DEPTH) as rwq,
        DmaOverRdma(dev) as dma,
        WorkQ(DEPTH) as workq,
    ):
        msg = json.loads(chan.recv(60))
        size, addr, repeat = msg["length"], msg["addr"], msg["repeat"]
        rdma.add_dev(dev)
        rdma.workq_add(rwq)
        rdma.start()
        rdma.connect(msg["connection"].encode())
        chan.send(rdma.export())
        assert chan.recv(60) == b"ready"
        remote = Mmap.create_from_export(msg["descriptor"].encode(), dev)
        mine = bytearray(os.urandom(size))
        local = Mmap()
        local.set_permissions(AccessFlag.LOCAL_READ_WRITE)
        local.set_memrange(mine)
        local.add_dev(dev)
        local.start()
        chunk = size if chunk_kib == 0 else chunk_kib << 10
        inventory = BufInventory(2 * DEPTH)
        inventory.start()
        dma.set_rdma(rdma)
        dma.workq_add(workq)
        dma.start()

        def stream(wq: WorkQ, make: object, src: Mmap, src_addr: int, dst: Mmap, dst_addr: int) -> float:
            t0 = time.perf_counter()
            offset = inflight = done = 0
            while done < size:
                while inflight < DEPTH and offset < size:
                    n = min(chunk, size - offset)
                    s = inventory.get_by_args(src, src_addr + offset, n, src_addr + offset, n)
                    d = inventory.get_by_args(dst, dst_addr + offset, n, dst_addr + offset, 0)
                    if make is DmaMemcpyJob:
                        wq.submit(DmaMemcpyJob(ctx=dma, src=s, dst=d, user_data=(s, d, n)))
                    else:
                        wq.submit(RdmaWriteJob(ctx=rdma, src_buf=s, dst_buf=d, user_data=(s, d, n)))
                    offset += n
                    inflight += 1
                event = wq.progress_retrieve()
                if event is None:
                    continue
                assert event.ok, event.error
                s, d, n = event.user_data  # type: ignore[misc]
                s.dec_refcount()
                d.dec_refcount()
                inflight -= 1
                done += n
            return time.perf_counter() - t0

        runs: dict[str, list[float]] = {"RDMA WRITE": [], "host->DPU": [], "DPU->host": []}
        stream(rwq, RdmaWriteJob, local, local.addr, remote, addr)  # warm up
        stream(workq, DmaMemcpyJob, remote, addr, local, local.addr)
        for _ in range(repeat):
            runs["RDMA WRITE"].append(stream(rwq, RdmaWriteJob, local, local.addr, remote, addr))
            runs["host->DPU"].append(stream(workq, DmaMemcpyJob, remote, addr, local, local.addr))
            runs["DPU->host"].append(stream(workq, DmaMemcpyJob, local, local.addr, remote, addr))
        dma.stop()
        remote.destroy()
        local.destroy()
        chan.send(json.dumps(runs).encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="MiB copied per run (default 64)")
    parser.add_argument(
        "--chunk", type=int, default=1024, help="KiB per DMA job, 0 for one job (default 1024)"
    )
    parser.add_argument("--repeat", type=int, default=9, help="runs; the median is reported (default 9)")
    parser.add_argument("--rdma", action="store_true", help="between machines: DMA over RDMA vs RDMA WRITE")
    parser.add_argument(
        "--addrs", default="127.0.77.1,127.0.77.2", help="--rdma: host,DPU soft device addresses"
    )
    parser.add_argument("--dpu", metavar="SERVICE", help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--rdma-dpu", metavar="SERVICE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dpu:
        dpu(args.dpu, args.chunk)
    elif args.rdma_dpu:
        rdma_dpu(args.rdma_dpu, args.chunk, args.addrs)
    elif args.rdma:
        rdma_host(args)
    else:
        host(args)


if __name__ == "__main__":
    main()
