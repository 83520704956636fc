"""The verbs backend on a real verbs device (rxe0 in the lab guest; any rxe or RNIC).

Runs wherever pyverbs and a RoCE device with a RoCE v2 GID are present (in the
lab: ``test_interop.py::test_verbs_backend_on_rxe`` runs this file in the
guest); skipped elsewhere, with the reason. Two QPs of one device talk to each
other over the device's own GID (rxe loops them back).
"""

from __future__ import annotations

import os
import random
import select
import time
from collections.abc import Callable, Iterator
from ipaddress import IPv6Address
from typing import Any

import pytest

from rdmakit.engine.states import QpState
from rdmakit.engine.types import SGE, Access, Completion, QpCaps, RecvWR, SendWR, WcOpcode, WcStatus, WrOpcode
from rdmakit.verbs import VerbsError, buffer_address
from tests.lab.verbs_env import DEVICES, NAME, marks

pytestmark = marks()

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


@pytest.fixture
def dev() -> Iterator[Any]:
    from rdmakit.verbs import VerbsDevice

    d = VerbsDevice(NAME, rng=random.Random(1))
    yield d
    d.close()


class Pair:
    """Two connected QPs of one device and a registered buffer for each."""

    def __init__(self, dev: Any, size: int = 1 << 16) -> None:
        self.a, self.b = dev.create_qp(QpCaps()), dev.create_qp(QpCaps())
        self.ma, self.mb = bytearray(size), bytearray(size)
        self.ra, self.rb = dev.register(self.ma, ALL), dev.register(self.mb, ALL)
        self.a.init()
        self.b.init()

    def connect(self) -> None:
        self.a.connect(self.b.export())
        self.b.connect(self.a.export())


def wait(qp: Any, n: int = 1, timeout: float = 20) -> list[Completion]:
    got: list[Completion] = []
    end = time.monotonic() + timeout
    while len(got) < n:
        qp.progress()
        got.extend(qp.poll(n - len(got)))
        assert time.monotonic() < end, f"timed out with {got}"
    return got


def send(p: Pair, wr_id: int, opcode: WrOpcode, n: int, off: int = 0, **kw: Any) -> SendWR:
    sg = (SGE(p.ra.addr + off, n, p.ra.lkey),) if n else ()
    return SendWR(wr_id=wr_id, opcode=opcode, sg_list=sg, rkey=p.rb.rkey, remote_addr=p.rb.addr, **kw)


def test_discovery_picks_the_ipv4_mapped_roce_v2_gid() -> None:
    info = next(d for d in DEVICES if d.name == NAME)
    assert info.gid.ipv4_mapped is not None
    assert info.ip_addrs[0] == info.gid.ipv4_mapped
    assert info.gids.index(info.gid) == info.gid_index  # the table has no holes before it
    assert info.mtu in (256, 512, 1024, 2048, 4096)
    assert "rdma.atomic_fetch_add" in info.caps.job_types
    if "RDMAKIT_LAB_GID_INDEX" in os.environ:  # the lab guest's own report (docs/lab.md)
        assert info.gid_index == int(os.environ["RDMAKIT_LAB_GID_INDEX"])
        assert str(info.gid.ipv4_mapped) == os.environ["RDMAKIT_LAB_GUEST_ADDR"]
        assert info.mtu == 1024  # netdev MTU 1500: rxe's largest IB MTU <= 1500 - 80


def test_export_names_the_device_gid_and_a_fresh_qp(dev: Any) -> None:
    qp = dev.create_qp(QpCaps())
    assert qp.state is QpState.RESET
    d = qp.export()
    assert d["transport"] == "verbs"
    assert d["port"] == 4791
    assert d["mtu"] == dev.mtu
    assert d["qpn"] == qp.qpn
    assert 0 <= d["psn"] < 1 << 24
    assert d["ip"] == str(dev.gid.ipv4_mapped)
    assert IPv6Address(d["gid"]) == dev.gid
    assert [len(x) for x in d["gid"].split(":")] == [4] * 8  # the form pyverbs' GID parses


def test_registration_checks_access_and_address(dev: Any) -> None:
    buf = bytearray(4096)
    view = memoryview(buf)
    mr = dev.register_memory(view, buffer_address(view), Access.LOCAL_WRITE | Access.REMOTE_READ)
    assert mr.addr == buffer_address(view)
    assert mr.length == 4096
    assert mr.lkey
    assert mr.rkey
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: dev.register_memory(view, buffer_address(view) + 8, Access.LOCAL_WRITE), "INVALID_VALUE"),
        (lambda: dev.register(bytes(64), Access.LOCAL_WRITE), "INVALID_VALUE"),  # read-only memory
        (lambda: dev.register(buf, Access.REMOTE_WRITE), "INVALID_VALUE"),  # needs LOCAL_WRITE
        (lambda: dev.register(bytearray(0), Access.LOCAL_WRITE), "INVALID_VALUE"),
    ]
    for call, code in cases:
        with pytest.raises(VerbsError) as exc:
            call()
        assert exc.value.code == code
    ro = dev.register(bytes(64), Access.REMOTE_READ)  # read-only memory, read rights: fine
    dev.deregister(ro)
    dev.deregister(ro)  # idempotent
    assert ro.closed


def test_sends_writes_and_reads_between_two_qps(dev: Any) -> None:
    p = Pair(dev)
    sizes = (0, 1, 5000)
    for i, _ in enumerate(sizes):
        p.b.post_recv(RecvWR(wr_id=100 + i, sg_list=(SGE(p.rb.addr + 8192, 8192, p.rb.lkey),)))
    p.b.post_recv(RecvWR(wr_id=200, sg_list=()))  # consumed by the WRITE with immediate
    p.connect()
    assert p.a.state is QpState.RTS
    assert p.b.state is QpState.RTS
    rng = random.Random(3)
    for i, n in enumerate(sizes):
        p.ma[:n] = rng.randbytes(n)
        p.a.post_send(send(p, i, WrOpcode.SEND_WITH_IMM, n, imm_data=0x11223344))
        (c,) = wait(p.a)
        assert (c.wr_id, c.status, c.opcode, c.imm_data) == (i, WcStatus.SUCCESS, WcOpcode.SEND, None)
        (r,) = wait(p.b)
        assert (r.wr_id, r.status, r.opcode, r.byte_len, r.imm_data) == (
            100 + i, WcStatus.SUCCESS, WcOpcode.RECV, n, 0x11223344,
        )  # fmt: skip
        assert p.mb[8192 : 8192 + n] == p.ma[:n]
    p.ma[:64] = rng.randbytes(64)
    p.a.post_send(send(p, 10, WrOpcode.RDMA_WRITE_WITH_IMM, 64, imm_data=0xA0B0C0D0))
    assert wait(p.a)[0].opcode is WcOpcode.RDMA_WRITE
    (r,) = wait(p.b)
    assert (r.wr_id, r.opcode, r.byte_len, r.imm_data) == (200, WcOpcode.RECV_RDMA_WITH_IMM, 64, 0xA0B0C0D0)
    assert p.mb[:64] == p.ma[:64]
    p.a.post_send(send(p, 11, WrOpcode.RDMA_READ, 64, off=1024))
    (c,) = wait(p.a)
    assert (c.opcode, c.byte_len) == (WcOpcode.RDMA_READ, 64)
    assert p.ma[1024:1088] == p.mb[:64]


def test_atomics_target_the_remote_word(dev: Any) -> None:
    p = Pair(dev)
    p.connect()
    p.mb[4096:4104] = (7).to_bytes(8, "little")
    p.a.post_send(send(p, 1, WrOpcode.ATOMIC_FETCH_AND_ADD, 8, off=0, compare_add=5))
    wait(p.a)
    p.a.post_send(
        SendWR(
            wr_id=2, opcode=WrOpcode.ATOMIC_CMP_AND_SWP, sg_list=(SGE(p.ra.addr + 8, 8, p.ra.lkey),),
            rkey=p.rb.rkey, remote_addr=p.rb.addr + 4096, compare_add=7, swap=1,
        )
    )  # fmt: skip
    wait(p.a)
    # The fetch-and-add above targeted the start of the remote buffer (0), not 4096.
    assert int.from_bytes(p.ma[0:8], "little") == 0
    assert int.from_bytes(p.mb[0:8], "little") == 5
    assert int.from_bytes(p.ma[8:16], "little") == 7
    assert int.from_bytes(p.mb[4096:4104], "little") == 1


def test_unsignaled_requests_complete_silently(dev: Any) -> None:
    p = Pair(dev)
    p.connect()
    for i in range(3):
        p.a.post_send(send(p, i, WrOpcode.RDMA_WRITE, 16, signaled=False))
    p.a.post_send(send(p, 3, WrOpcode.RDMA_WRITE, 16))
    (c,) = wait(p.a)
    assert (c.wr_id, c.status) == (3, WcStatus.SUCCESS)
    assert len(p.a._tracker) == 0  # the three unsignaled ones were retired with it
    time.sleep(0.05)
    p.a.progress()
    assert list(p.a.poll(10)) == []


def test_fileno_wakes_for_a_completion_and_rearms(dev: Any) -> None:
    p = Pair(dev)
    p.connect()
    waiter = select.poll()
    waiter.register(p.a.fileno(), select.POLLIN)
    assert waiter.poll(0) == []
    p.a.post_send(send(p, 1, WrOpcode.RDMA_WRITE, 8))
    assert waiter.poll(10_000), "no completion event"
    assert p.a.progress() is True
    assert [c.wr_id for c in p.a.poll(4)] == [1]
    assert waiter.poll(0) == []  # the event was consumed; the CQ is armed again
    p.a.post_send(send(p, 2, WrOpcode.RDMA_WRITE, 8))
    assert waiter.poll(10_000), "no event after re-arming"
    p.a.progress()
    assert [c.wr_id for c in p.a.poll(4)] == [2]


def test_failed_requests_keep_their_wr_id_and_operation(dev: Any) -> None:
    p = Pair(dev)
    p.b.post_recv(RecvWR(wr_id=77, sg_list=(SGE(p.rb.addr, 64, p.rb.lkey),)))
    p.connect()
    bad = SendWR(
        wr_id=5, opcode=WrOpcode.RDMA_READ, sg_list=(SGE(p.ra.addr, 8, p.ra.lkey),),
        rkey=p.rb.rkey ^ 0x5A5A00, remote_addr=p.rb.addr,
    )  # fmt: skip
    p.a.post_send(bad)
    p.a.post_send(send(p, 6, WrOpcode.SEND, 8))
    c1, c2 = wait(p.a, 2)
    assert (c1.wr_id, c1.status, c1.opcode) == (5, WcStatus.REM_ACCESS_ERR, WcOpcode.RDMA_READ)
    assert (c2.wr_id, c2.status, c2.opcode) == (6, WcStatus.WR_FLUSH_ERR, WcOpcode.SEND)
    assert p.a.state is QpState.ERR
    p.a.reset()  # and back: RESET, INIT, connect again
    assert p.a.state is QpState.RESET  # type: ignore[comparison-overlap]  # reset() changed it
    p.b.reset()  # posted receives are dropped without completions
    assert p.b.state is QpState.RESET


def test_state_rules(dev: Any) -> None:
    qp = dev.create_qp(QpCaps())
    with pytest.raises(VerbsError) as exc:
        qp.post_recv(RecvWR(wr_id=1, sg_list=()))
    assert exc.value.code == "BAD_STATE"
    with pytest.raises(VerbsError) as exc:
        qp.post_send(SendWR(wr_id=1, opcode=WrOpcode.SEND))
    assert exc.value.code == "BAD_STATE"
    psn = qp.psn
    qp.init()
    assert qp.state is QpState.INIT
    qp.reset()
    assert qp.state is QpState.RESET  # type: ignore[comparison-overlap]  # reset() changed it
    assert qp.psn != psn
    with pytest.raises(VerbsError) as exc:
        qp.connect({**qp.export(), "transport": "tcp"})
    assert exc.value.code == "NOT_SUPPORTED"
    qp.close()
    qp.close()
    with pytest.raises(VerbsError):
        qp.poll(1)


def test_doca_discovers_and_opens_the_device() -> None:
    from rdmakit.doca import Dev, DocaError, DocaErrorCode, Mmap, devinfo_list
    from rdmakit.doca.verbs_glue import VerbsBackendDevice, install, uninstall

    installed_here = install()
    try:
        infos = [i for i in devinfo_list() if i.kind == "verbs"]
        assert NAME in [i.name for i in infos]
        with Dev.open(NAME) as d:
            assert isinstance(d.backend, VerbsBackendDevice)
            mem = bytearray(1 << 16)
            mmap = Mmap()
            mmap.set_memrange(mem)
            mmap.set_permissions(0b111)  # LOCAL_READ_WRITE | RDMA_READ | RDMA_WRITE
            mmap.add_dev(d)
            mmap.start()
            reg = mmap.registration(d)
            assert reg.addr == buffer_address(memoryview(mem))
            assert reg.rkey
            mmap.destroy()
            with pytest.raises(DocaError) as exc:
                d.backend.register_memory(memoryview(bytes(8)), 0, Access.LOCAL_WRITE)
            assert exc.value.code is DocaErrorCode.INVALID_VALUE
    finally:
        if installed_here:
            uninstall()


def test_doca_rdma_contexts_over_the_verbs_device() -> None:
    """Two DOCA RDMA contexts on the device, event-driven: send/receive, write, read, fetch-and-add."""
    import selectors

    from rdmakit.doca import (
        AccessFlag,
        BufInventory,
        Dev,
        Mmap,
        Rdma,
        RdmaAtomicFetchAddJob,
        RdmaReadJob,
        RdmaRecvJob,
        RdmaSendJob,
        RdmaWriteJob,
        WorkQ,
    )  # fmt: skip
    from rdmakit.doca.verbs_glue import install, uninstall

    installed_here = install()
    every = (
        AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC
    )
    sides = []
    try:
        for _ in range(2):
            dev = Dev.open(NAME)
            rdma = Rdma()
            rdma.add_dev(dev)
            rdma.set_permissions(every)
            wq = WorkQ(16, event_driven=True)
            rdma.workq_add(wq)
            inv = BufInventory(16)
            inv.start()
            mem = bytearray(4096)
            mmap = Mmap()
            mmap.set_permissions(every)
            mmap.set_memrange(mem)
            mmap.add_dev(dev)
            mmap.start()
            rdma.start()
            sides.append((dev, rdma, wq, inv, mmap, mem))
        (da, ra, wa, ia, ma, mem_a), (db, rb, wb, ib, mb, mem_b) = sides
        ra.connect(rb.export())
        rb.connect(ra.export())
        remote_b = Mmap.create_from_export(mb.export_rdma(db), da)

        def run(*jobs: Any) -> list[Any]:
            for job in jobs:
                (wa if job.ctx is ra else wb).submit(job)
            got: dict[int, Any] = {}
            end = time.monotonic() + 20
            with selectors.DefaultSelector() as sel:
                for wq in (wa, wb):
                    sel.register(wq.fileno(), selectors.EVENT_READ)
                while len(got) < len(jobs):
                    for wq in (wa, wb):
                        while (ev := wq.progress_retrieve()) is not None:
                            got[id(ev.job)] = ev
                    if len(got) < len(jobs):
                        assert time.monotonic() < end, f"stalled with {list(got.values())}"
                        for wq in (wa, wb):
                            wq.arm()
                        for key, _ in sel.select(1.0):
                            next(w for w in (wa, wb) if w.fileno() == key.fd).clear()
            return [got[id(j)] for j in jobs]

        mem_a[:5] = b"hello"
        recv = RdmaRecvJob(ctx=rb, dst_buf=ib.get_by_addr(mb, mb.addr + 1024, 64))
        send = RdmaSendJob(ctx=ra, src_buf=ia.get_by_data(ma, ma.addr, 5))
        assert all(ev.ok for ev in run(recv, send))
        assert mem_b[1024:1029] == b"hello"
        mem_a[8:12] = b"abcd"
        write = RdmaWriteJob(ctx=ra, src_buf=ia.get_by_data(ma, ma.addr + 8, 4),
                             dst_buf=ia.get_by_addr(remote_b, remote_b.addr + 2048, 4))  # fmt: skip
        (ev,) = run(write)
        assert ev.ok, ev
        assert mem_b[2048:2052] == b"abcd"
        read = RdmaReadJob(ctx=ra, src_buf=ia.get_by_data(remote_b, remote_b.addr + 1024, 5),
                           dst_buf=ia.get_by_addr(ma, ma.addr + 512, 5))  # fmt: skip
        (ev,) = run(read)
        assert ev.ok, ev
        assert mem_a[512:517] == b"hello"
        mem_b[3072:3080] = (40).to_bytes(8, "little")
        fadd = RdmaAtomicFetchAddJob(ctx=ra, dst_buf=ia.get_by_data(remote_b, remote_b.addr + 3072, 8),
                                     result_buf=ia.get_by_addr(ma, ma.addr + 3072, 8), add=2)  # fmt: skip
        (ev,) = run(fadd)
        assert ev.ok, ev
        assert int.from_bytes(mem_a[3072:3080], "little") == 40
        assert int.from_bytes(mem_b[3072:3080], "little") == 42
    finally:
        for dev, rdma, wq, *_ in reversed(sides):
            rdma.close()
            wq.close()
            dev.close_all()  # the memory map still registered with it goes first
        if installed_here:
            uninstall()
