"""The verbs backend behind the DOCA layer on a real verbs device (rxe0 in the lab guest; any RNIC).

Runs wherever pyverbs and a RoCE device with a RoCE v2 GID are present;
skipped elsewhere with the reason, as ``test_verbs_device.py``. Checks the
backend conformance suite, the connect attributes a verbs QP is given
(``ibv_query_qp``), the GID a verbs mmap descriptor exports and that
``Rdma.set_gid_index`` reaches the queue pair's address vector: two contexts
connected through the chosen GID move a message, an index without a RoCE v2
GID is refused. It also runs the job-vs-task scenarios of
``tests/doca/test_tasks_vs_jobs.py``, the remote net sync event tasks and the
flush of tasks in flight at stop, on the verbs device.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from rdmakit.engine.types import QpCaps
from rdmakit.testing.backend import check_backend_pair
from tests.lab.verbs_env import NAME, marks

pytestmark = marks()


def _backend() -> Any:
    from rdmakit.doca.verbs_glue import VerbsBackendDevice
    from rdmakit.verbs import VerbsDevice

    return VerbsBackendDevice(VerbsDevice(NAME, rng=random.Random(7)))


@pytest.fixture
def doca_dev() -> Iterator[Any]:
    from rdmakit.doca import Dev, find_devinfo
    from rdmakit.doca.verbs_glue import install

    install()  # idempotent; another lab module may have taken the provider away again
    with Dev.open(find_devinfo(NAME)) as dev:
        yield dev


def test_verbs_backend_keeps_the_protocols_promises() -> None:
    """Two contexts of one device (rxe loops its QPs back) pass the suite the soft backend passes."""
    check_backend_pair(lambda: (_backend(), _backend()))


def test_connect_attrs_reach_the_verbs_qp() -> None:
    """BackendQP.connect_attrs are what ibv_query_qp reports after connect (IBTA §11.2.5.3)."""
    from rdmakit.doca import ConnectAttrs
    from rdmakit.engine.types import Access
    from rdmakit.verbs.attrs import QpAttrMask

    dev = _backend()
    try:
        qp, peer = dev.create_qp(QpCaps()), dev.create_qp(QpCaps())
        limits = dev.verbs.info.caps
        want = ConnectAttrs(
            max_rd_atomic=min(2, limits.max_qp_init_rd_atom),
            max_dest_rd_atomic=min(4, limits.max_qp_rd_atom),  # a power of two: rxe rounds up
            min_rnr_timer=20, timeout=17, retry_cnt=4, rnr_retry=5, hop_limit=9,
        )  # fmt: skip
        qp.connect_attrs = want
        qp.init(Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        peer.init(Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        qp.connect(peer.export())
        peer.connect(qp.export())
        mask = (
            QpAttrMask.TIMEOUT | QpAttrMask.RETRY_CNT | QpAttrMask.RNR_RETRY | QpAttrMask.MIN_RNR_TIMER
            | QpAttrMask.MAX_QP_RD_ATOMIC | QpAttrMask.MAX_DEST_RD_ATOMIC | QpAttrMask.AV
        )  # fmt: skip
        got, _ = qp.verbs._qp.query(int(mask))
        assert (got.timeout, got.retry_cnt, got.rnr_retry, got.min_rnr_timer) == (17, 4, 5, 20)
        assert (got.max_rd_atomic, got.max_dest_rd_atomic) == (want.max_rd_atomic, want.max_dest_rd_atomic)
        # The hop limit is set as given, but for RoCE the kernel's IB core replaces it with
        # the route's (ib_resolve_eth_dmac), so ibv_query_qp cannot show it: the modify's own value.
        assert qp.verbs.connect_params(peer.export()).hop_limit == 9
        default, _ = peer.verbs._qp.query(int(mask))
        assert (default.timeout, default.retry_cnt, default.rnr_retry) == (14, 6, 7)  # ConnectAttrs()
        qp.close()
        peer.close()
    finally:
        dev.close()


def test_verbs_mmap_descriptor_carries_the_roce_v2_gid(doca_dev: Any) -> None:
    """export_rdma names the device's RoCE v2 GID of its own address, not gids[0] (link-local)."""
    from rdmakit.doca import AccessFlag, Mmap, MmapDescriptor
    from rdmakit.verbs.sysfs import SYSFS_ROOT, read_device

    mmap = Mmap()
    mmap.set_permissions(AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE)
    mmap.set_memrange(bytearray(4096))
    mmap.add_dev(doca_dev)
    mmap.start()
    try:
        desc = MmapDescriptor.from_bytes(mmap.export_rdma(doca_dev))
    finally:
        mmap.stop()
        mmap.destroy()
    backend = doca_dev.backend
    assert desc.gid == backend.gid
    assert not desc.gid.is_link_local
    port = next(p for p in read_device(SYSFS_ROOT / NAME).ports if p.num == backend.verbs.port)
    entry = next(g for g in port.gids if g.index == backend.gid_index)
    assert entry.gid == desc.gid
    assert entry.roce_v2  # gid_attrs/types: "RoCE v2"
    assert entry.ip in doca_dev.info.ip_addrs  # the device's own IPv4/IPv6 address
    if "RDMAKIT_LAB_GUEST_ADDR" in os.environ:
        assert str(desc.gid.ipv4_mapped) == os.environ["RDMAKIT_LAB_GUEST_ADDR"]


def _other_roce_v2_index(backend: Any) -> int:
    from rdmakit.verbs.sysfs import SYSFS_ROOT, read_device

    port = next(p for p in read_device(SYSFS_ROOT / NAME).ports if p.num == backend.verbs.port)
    others = [g for g in port.gids if g.roce_v2 and g.index != backend.gid_index]
    if not others:
        pytest.skip(f"{NAME} port {port.num} has one RoCE v2 GID; nothing else to select")
    return min(others, key=lambda g: g.gid.is_link_local).index


def test_set_gid_index_takes_effect(doca_dev: Any) -> None:
    """doca_rdma_set_gid_index: the exported descriptor and the QP's source GID index follow it."""
    from rdmakit.doca import ConnectionDescriptor, DocaError, DocaErrorCode, Rdma

    backend = doca_dev.backend
    index = _other_roce_v2_index(backend)
    with Rdma() as rdma:
        rdma.add_dev(doca_dev)
        rdma.set_gid_index(index)
        rdma.start()
        assert rdma.gid_index == index
        desc = ConnectionDescriptor.from_bytes(rdma.export())
        assert desc.gid == backend.gid_at(index) != backend.gid
        rdma.stop()
    with Rdma() as plain:
        plain.add_dev(doca_dev)
        plain.start()
        assert ConnectionDescriptor.from_bytes(plain.export()).gid == backend.gid
        plain.stop()
    with Rdma() as bad:
        bad.add_dev(doca_dev)
        empty = max(g.index for g in _port_entries(backend)) + 1
        with pytest.raises(DocaError) as info:
            bad.set_gid_index(empty)
        assert info.value.code is DocaErrorCode.INVALID_VALUE
    # The address vector: the sgid_index the QP connects with (ibv_global_route.sgid_index).
    qp, peer = backend.verbs.create_qp(QpCaps(), index), backend.verbs.create_qp(QpCaps())
    try:
        assert qp.gid_index == index
        assert qp.connect_params(peer.export()).sgid_index == index
        assert peer.connect_params(qp.export()).sgid_index == backend.gid_index
    finally:
        qp.close()
        peer.close()


@pytest.mark.parametrize("which", ["default", "other"])
def test_a_connection_runs_through_the_selected_gid(doca_dev: Any, which: str) -> None:
    """Two Rdma contexts on rxe0, both set to one GID index, connect with that GID and move a message."""
    from rdmakit.doca import (
        AccessFlag,
        BufInventory,
        ConnectionDescriptor,
        Mmap,
        Rdma,
        RdmaRecvJob,
        RdmaSendJob,
        RdmaState,
        WorkQ,
    )

    backend = doca_dev.backend
    index = backend.gid_index if which == "default" else _other_roce_v2_index(backend)
    wq, inv = WorkQ(16), BufInventory(8)
    inv.start()
    a, b = Rdma(), Rdma()
    src, dst = bytearray(b"through the chosen GID"), bytearray(64)
    maps, bufs = [], []
    try:
        for rdma in (a, b):
            rdma.add_dev(doca_dev)
            rdma.set_permissions(AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE)
            rdma.set_gid_index(index)
            rdma.workq_add(wq)
            rdma.start()
        da, db = ConnectionDescriptor.from_bytes(a.export()), ConnectionDescriptor.from_bytes(b.export())
        assert da.gid == db.gid == backend.gid_at(index)
        a.connect(db)
        b.connect(da)
        assert a.rdma_state is b.rdma_state is RdmaState.CONNECTED
        for mem in (src, dst):
            m = Mmap()
            m.set_memrange(mem)
            m.add_dev(doca_dev)
            m.start()
            maps.append(m)
        bufs += [inv.get_by_data(maps[0], maps[0].addr, len(src)), inv.get_by_addr(maps[1], maps[1].addr, 64)]
        send, recv = RdmaSendJob(ctx=a, src_buf=bufs[0]), RdmaRecvJob(ctx=b, dst_buf=bufs[1])
        wq.submit(recv)
        wq.submit(send)
        events = []
        for _ in range(2_000_000):
            ev = wq.progress_retrieve()
            if ev is not None:
                events.append(ev)
            if len(events) == 2:
                break
        assert [ev.ok for ev in events] == [True, True], events
        assert bytes(dst[: len(src)]) == bytes(src)
    finally:
        for rdma in (a, b):
            rdma.close()
        for buf in bufs:
            buf.dec_refcount()
        for m in maps:
            m.destroy()
        inv.close()
        wq.close()


def _port_entries(backend: Any) -> tuple[Any, ...]:
    from rdmakit.verbs.sysfs import SYSFS_ROOT, read_device

    return next(p for p in read_device(SYSFS_ROOT / NAME).ports if p.num == backend.verbs.port).gids


# -- the task API and the job API on verbs --------------------------------------------------------


def _scenarios() -> list[Any]:
    from tests.doca.test_tasks_vs_jobs import SCENARIOS

    return SCENARIOS


@pytest.mark.parametrize("scenario", _scenarios())
def test_both_apis_give_identical_results_on_verbs(scenario: Any) -> None:
    """The job/task scenarios of tests/doca/test_tasks_vs_jobs.py through rxe: identical results."""
    from rdmakit.doca.verbs_glue import install
    from tests.doca.test_tasks_vs_jobs import run_scenario

    install()
    no_ips = lambda: pytest.fail("a verbs Duo needs no address")  # noqa: E731
    by_jobs = run_scenario("job", f"verbs:{NAME}", no_ips, scenario)
    by_tasks = run_scenario("task", f"verbs:{NAME}", no_ips, scenario)
    assert by_tasks == by_jobs


def test_remote_net_sync_event_tasks_on_verbs() -> None:
    """A sync event exported over rxe: the peer's READ, WRITE and FETCH_ADD reach its counter."""
    from rdmakit.doca.verbs_glue import install
    from tests.doca.test_sync_event_tasks import remote_duo, remote_tasks_scenario

    install()
    d = remote_duo(f"verbs:{NAME}", lambda: pytest.fail("a verbs Duo needs no address"))
    try:
        remote_tasks_scenario(d)
    finally:
        d.close()


def test_stop_flushes_tasks_in_flight_on_verbs() -> None:
    """doca_ctx_stop with receive tasks in flight on a verbs QP: each is flushed with SHUTDOWN, then IDLE
    once they are freed."""
    from rdmakit.doca import CtxState, DocaErrorCode
    from rdmakit.doca.verbs_glue import install
    from tests.doca.task_harness import Duo

    install()
    d = Duo("task", f"verbs:{NAME}", lambda: pytest.fail("a verbs Duo needs no address"), num_tasks=4)
    try:
        d.up()
        mb, _ = d.b.mmap(64)
        tasks = [d.b.rdma.task_receive_allocate_init(d.b.room(mb, i * 8, 8)) for i in range(3)]
        for t in tasks:
            t.submit()
        assert d.b.rdma.stop() is DocaErrorCode.IN_PROGRESS
        d._until(lambda: all(any(t is x for x in d.done) for t in tasks), lambda: "the flushed tasks")
        assert [t.get_status() for t in tasks] == [DocaErrorCode.SHUTDOWN] * 3
        for t in tasks:  # doca_task_free: "All tasks MUST be freed in order for a context to be stopped"
            t.free()
        d._until(lambda: d.b.rdma.state is CtxState.IDLE, lambda: "the stop")
    finally:
        d.close()
