"""The requester of an 8-byte RDMA WRITE round trip through the DOCA job or task API, set up once.

One `Rdma` context on a soft device, connected by descriptor to a peer's queue
pair, writes 8 local bytes into 8 bytes of the peer's memory, one operation at
a time: through the job API (DOCA 2.0: ``doca_workq_submit`` of one
`RdmaWriteJob`, ``doca_workq_progress_retrieve``) or the task API (DOCA 2.5+:
``doca_task_submit`` of one `RdmaTaskWrite`, its callback run by
``doca_pe_progress``). The peer's queue pair and memory come as what its
``doca_rdma_export`` and ``doca_mmap_export_rdma`` would give
(`ConnectionDescriptor`, `MmapDescriptor`); `write_loop` hands this side's
descriptor to `exchange`, which gets the peer to connect to it, and yields
the objects a loop of round trips uses (`WriteLoop`).

``rdmakit bench``'s DOCA rows (the peer another process) and the stage
profiler ``rdmakit.testing.doca_rtt`` (the peer in the same thread) both run on it.
"""

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv6Address, ip_address
from typing import Any, Literal

from rdmakit.doca.buf import Buf
from rdmakit.doca.ctx import CtxState
from rdmakit.doca.descriptor import ConnectionDescriptor
from rdmakit.doca.device import Dev
from rdmakit.doca.errors import DocaError
from rdmakit.doca.inventory import BufInventory
from rdmakit.doca.mmap import AccessFlag, Mmap, MmapDescriptor
from rdmakit.doca.pe import ProgressEngine
from rdmakit.doca.rdma import Rdma, RdmaWriteJob
from rdmakit.doca.rdma_tasks import RdmaTaskWrite
from rdmakit.doca.workq import WorkQ

__all__ = ["Api", "WriteLoop", "peer_descriptor", "write_loop"]

Api = Literal["job", "task"]


@dataclass
class WriteLoop:
    """What a loop of 8-byte WRITEs uses: for the job API `wq` and `job`, for the task API `task`,
    whose callbacks (success and error) put it in ``done[0]`` (the loop empties it again)."""

    pe: ProgressEngine
    rdma: Rdma
    src: Buf  # the 8 local bytes
    dst: Buf  # the peer's 8 bytes; a WRITE appends at its data's end (`reset` before each)
    wq: WorkQ | None = None
    job: RdmaWriteJob | None = None
    task: RdmaTaskWrite | None = None
    done: list[RdmaTaskWrite | None] = field(default_factory=lambda: [None])

    def reset(self) -> None:
        """Empty `dst`'s data: the next WRITE lands on the same 8 bytes."""
        self.dst.set_data(self.dst.addr, 0)


def peer_descriptor(ep: Mapping[str, Any]) -> ConnectionDescriptor:
    """The `ConnectionDescriptor` of a soft RoCEv2 queue pair's endpoint fields (``transport, gid,
    ip, port, qpn, psn, mtu``), as its ``doca_rdma_export`` would give it."""
    return ConnectionDescriptor(
        transport="roce-udp", gid=IPv6Address(ep["gid"]), ip=ip_address(ep["ip"]), port=ep["port"],
        qpn=ep["qpn"], psn=ep["psn"], mtu=ep["mtu"],
    )  # fmt: skip


@contextlib.contextmanager
def write_loop(
    api: Api,
    ip: str,
    peer: ConnectionDescriptor,
    peer_mem: MmapDescriptor,
    exchange: Callable[[Mapping[str, object]], None],
) -> Iterator[WriteLoop]:
    """This side on a soft device at `ip`, connected to `peer`; `peer_mem` is the memory written.

    `exchange` gets this side's descriptor (``ConnectionDescriptor.to_backend``
    form) once the context is started and returns once the peer's queue pair is
    connected to it. On exit everything made here is closed, the mmaps first.
    """
    pe = ProgressEngine()
    dev = Dev.open(ip, pe=pe)
    rdma = Rdma()
    inv = BufInventory(2)
    inv.start()
    out: WriteLoop | None = None
    wq: WorkQ | None = None
    mmaps: list[Mmap] = []
    done: list[RdmaTaskWrite | None] = [None]

    def finished(task: RdmaTaskWrite, user_data: object, ctx_data: object) -> None:
        done[0] = task  # the application's record of the callback: a slot, nothing made

    try:
        rdma.add_dev(dev)
        rdma.set_permissions(AccessFlag.LOCAL_READ_WRITE)
        if api == "job":
            wq = WorkQ(4, pe=pe)
            rdma.workq_add(wq)
        else:
            pe.connect_ctx(rdma)
            rdma.task_write_set_conf(finished, finished, 1)
        rdma.start()
        exchange(ConnectionDescriptor.from_bytes(rdma.export()).to_backend())
        rdma.connect(peer)
        while rdma.state is CtxState.STARTING:  # doca_rdma_connect: RUNNING after the next progress
            pe.progress()
        local = Mmap()
        local.set_permissions(AccessFlag.LOCAL_READ_WRITE)
        local.set_memrange(bytearray(b"8 bytes!"))
        local.add_dev(dev)
        local.start()
        mmaps.append(local)
        mmaps.append(Mmap.create_from_export(peer_mem.to_bytes(), dev))
        src = inv.get_by_data(local, local.addr, 8)
        dst = inv.get_by_addr(mmaps[1], mmaps[1].addr, 8)
        out = WriteLoop(pe, rdma, src, dst, done=done)
        if wq is not None:
            out.wq, out.job = wq, RdmaWriteJob(ctx=rdma, src_buf=src, dst_buf=dst)
        else:
            out.task = rdma.task_write_allocate_init(src, dst)
        yield out
    finally:
        if out is not None and out.task is not None:
            with contextlib.suppress(DocaError):  # best effort: it may still be submitted
                out.task.free()
        rdma.close()
        if wq is not None:
            wq.close()
        for m in reversed(mmaps):
            with contextlib.suppress(DocaError):  # best effort: buffers may still hold it
                m.destroy()
        dev.close_all()  # teardown: what the buffers still hold goes too
        pe.close_all()
