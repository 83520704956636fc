"""Export to the DPU (doca_mmap_export_pci): shared memory, the descriptor, import across processes."""

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmakit.doca import (
    DPU_DESCRIPTOR_FORMAT,
    AccessFlag,
    BufInventory,
    CommChannelServer,
    Dev,
    Dma,
    DmaMemcpyJob,
    DocaError,
    DocaErrorCode,
    DpuDescriptor,
    Fault,
    Mmap,
    SharedMemory,
    WorkQ,
    local_devinfo,
)
from tests.doca.util import error_code

PCI_RO = AccessFlag.LOCAL_READ_WRITE | AccessFlag.PCI_READ_ONLY
PCI_RW = AccessFlag.LOCAL_READ_WRITE | AccessFlag.PCI_READ_WRITE


def _exported(dev: Dev, memory: memoryview, access: AccessFlag) -> Mmap:
    mmap = Mmap()
    mmap.set_permissions(access)
    mmap.set_memrange(memory)
    mmap.add_dev(dev)
    mmap.start()
    return mmap


@pytest.fixture
def shared() -> Iterator[SharedMemory]:
    with SharedMemory(8192) as memory:
        yield memory


@pytest.fixture
def dpu_dev() -> Iterator[Dev]:
    """The importing side's device: another device, as the DPU's own would be."""
    with Dev.open(local_devinfo("dpu0")) as opened:
        yield opened


def dma_copy(dev: Dev, src: Mmap, src_range: tuple[int, int], dst: Mmap, dst_addr: int) -> DocaError | None:
    """One DMA job on `dev`: `src_range` of `src` to the tail of an empty buf at `dst_addr`."""
    inventory = BufInventory(2)
    inventory.start()
    with Dma(dev) as dma, WorkQ(1) as workq:
        dma.workq_add(workq)
        dma.start()
        addr, length = src_range
        s = inventory.get_by_args(src, addr, length, addr, length)
        d = inventory.get_by_args(dst, dst_addr, length, dst_addr, 0)
        workq.submit(DmaMemcpyJob(ctx=dma, src=s, dst=d))
        event = workq.progress_retrieve()
        assert event is not None
        s.dec_refcount()
        d.dec_refcount()
        return event.error


# -- shared memory -----------------------------------------------------------------------------


def test_shared_memory_is_a_shared_mapping(shared: SharedMemory) -> None:
    assert shared.size == 8192
    assert shared.writable
    assert len(shared.buf) == 8192
    assert bytes(shared.buf[:4]) == bytes(4)
    shared.buf[:5] = b"hello"
    assert os.pread(shared.fd, 5, 0) == b"hello"  # the same pages as the file


def test_shared_memory_close_waits_for_its_mmap(dev: Dev, shared: SharedMemory) -> None:
    mmap = _exported(dev, shared.buf, PCI_RO)
    assert error_code(shared.close) is DocaErrorCode.IN_USE
    assert not shared.closed
    mmap.destroy()
    shared.close()
    assert shared.closed
    assert error_code(lambda: shared.fd) is DocaErrorCode.BAD_STATE
    shared.close()  # idempotent


def test_shared_memory_from_a_file(tmp_path: os.PathLike[str], dev: Dev) -> None:
    path = os.path.join(tmp_path, "data.bin")
    with open(path, "wb") as f:
        f.write(b"file contents")
    with SharedMemory.from_file(path) as memory:
        assert not memory.writable
        assert bytes(memory.buf) == b"file contents"
        mmap = _exported(dev, memory.buf, AccessFlag.PCI_READ_ONLY)
        assert DpuDescriptor.from_bytes(mmap.export_dpu(dev)).length == 13
        mmap.destroy()
        # read-only memory cannot be exported writable
        writable = Mmap()
        writable.set_permissions(AccessFlag.PCI_READ_WRITE)
        assert error_code(lambda: writable.set_memrange(memory.buf)) is DocaErrorCode.INVALID_VALUE
    with open(path, "wb"):
        pass
    assert error_code(lambda: SharedMemory.from_file(path)) is DocaErrorCode.INVALID_VALUE  # empty
    assert error_code(lambda: SharedMemory(0)) is DocaErrorCode.INVALID_VALUE


# -- export_dpu --------------------------------------------------------------------------------


def test_export_dpu_needs_pci_permission_a_started_mmap_and_shared_memory(
    dev: Dev, shared: SharedMemory
) -> None:
    """doca_mmap_export_pci: NOT_PERMITTED without a PCI flag or before start; our NOT_SUPPORTED off shm."""
    plain = _exported(dev, shared.buf, AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ)
    assert error_code(lambda: plain.export_dpu(dev)) is DocaErrorCode.NOT_PERMITTED
    plain.destroy()
    idle = Mmap()
    idle.set_permissions(PCI_RO)
    idle.set_memrange(shared.buf)
    idle.add_dev(dev)
    assert error_code(lambda: idle.export_dpu(dev)) is DocaErrorCode.NOT_PERMITTED
    idle.destroy()
    private = _exported(dev, memoryview(bytearray(64)), PCI_RO)
    assert error_code(lambda: private.export_dpu(dev)) is DocaErrorCode.NOT_SUPPORTED
    private.destroy()
    with Dev.open(local_devinfo("unrelated")) as other:
        mmap = _exported(dev, shared.buf, PCI_RO)
        assert error_code(lambda: mmap.export_dpu(other)) is DocaErrorCode.NOT_FOUND
        mmap.destroy()


def test_descriptor_names_the_range_and_the_pages(dev: Dev, shared: SharedMemory) -> None:
    window = shared.buf[4096:6144]
    mmap = _exported(dev, window, PCI_RW)
    raw = mmap.export_dpu(dev)
    assert mmap.exported
    desc = DpuDescriptor.from_bytes(raw)
    st = os.fstat(shared.fd)
    assert (desc.addr, desc.length, desc.offset) == (shared.addr + 4096, 2048, 4096)
    assert (desc.st_dev, desc.st_ino) == (st.st_dev, st.st_ino)
    assert not {"pid", "fd"} & set(json.loads(raw))  # nothing for an importer to open by path
    assert desc.access == PCI_RW
    assert desc.device == dev.name
    assert json.loads(raw)["format"] == DPU_DESCRIPTOR_FORMAT
    assert DpuDescriptor.from_bytes(desc.to_bytes()) == desc
    mmap.destroy()
    window.release()


def _good() -> dict[str, object]:
    return {
        "format": DPU_DESCRIPTOR_FORMAT, "addr": 4096, "length": 10, "access": ["PCI_READ_ONLY"],
        "device": "d", "st_dev": 1, "st_ino": 2, "offset": 0, "boot_id": "b",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("format", "rdmakit.mmap/1"),
        ("addr", -1),
        ("addr", "4096"),
        ("length", 0),
        ("access", ["RDMA_READ"]),
        ("access", ["PCI_READ_ONLY", "PCI_READ_WRITE"]),
        ("access", ["NOPE"]),
        ("access", "PCI_READ_ONLY"),
        ("pid", 1),  # the first format's /proc/PID/fd/N fields are unknown now
        ("fd", 3),
        ("offset", -5),
        ("device", ""),
        ("boot_id", 7),
        ("extra", 1),
    ],
)
def test_malformed_descriptors_are_the_peers_fault(field: str, value: object) -> None:
    obj = _good()
    obj[field] = value
    with pytest.raises(DocaError) as exc:
        DpuDescriptor.from_bytes(json.dumps(obj).encode())
    assert exc.value.code is DocaErrorCode.INVALID_VALUE
    assert exc.value.fault is Fault.PEER
    assert field in str(exc.value) or field in ("format", "pid", "fd")


def test_missing_field_and_garbage() -> None:
    obj = _good()
    del obj["st_ino"]
    assert (
        error_code(lambda: DpuDescriptor.from_bytes(json.dumps(obj).encode())) is DocaErrorCode.INVALID_VALUE
    )
    assert error_code(lambda: DpuDescriptor.from_bytes(b"\xff")) is DocaErrorCode.INVALID_VALUE
    assert not DpuDescriptor.matches(b"not json")
    assert DpuDescriptor.matches(json.dumps(_good()).encode())


# -- import in this process ----------------------------------------------------------------------


def test_import_reaches_the_exporters_pages_through_dma(dev: Dev, dpu_dev: Dev, shared: SharedMemory) -> None:
    """create_from_export: the host's range at the host's addresses; jobs on the DPU's device reach it."""
    shared.buf[:11] = b"from host!!"
    host = _exported(dev, shared.buf, PCI_RW)
    remote = Mmap.create_from_export(host.export_dpu(dev), dpu_dev, fd=shared.fd)
    assert remote.from_export
    assert (remote.addr, remote.length) == (host.addr, host.length)
    assert error_code(lambda: remote.view(remote.addr, 1)) is DocaErrorCode.NOT_PERMITTED  # no CPU access
    local_mem = bytearray(b"from dpu")
    local = _exported(dpu_dev, memoryview(local_mem), AccessFlag.LOCAL_READ_WRITE)
    staging = bytearray(11)
    landing = _exported(dpu_dev, memoryview(staging), AccessFlag.LOCAL_READ_WRITE)
    assert dma_copy(dpu_dev, remote, (remote.addr, 11), landing, landing.addr) is None
    assert staging == b"from host!!"
    assert dma_copy(dpu_dev, local, (local.addr, 8), remote, remote.addr + 100) is None
    assert bytes(shared.buf[100:108]) == b"from dpu"
    for mmap in (remote, local, landing, host):
        mmap.destroy()


def test_read_only_export_refuses_dma_writes(dev: Dev, dpu_dev: Dev, shared: SharedMemory) -> None:
    host = _exported(dev, shared.buf, PCI_RO)
    remote = Mmap.create_from_export(host.export_dpu(dev), dpu_dev, fd=shared.fd)
    local_mem = bytearray(b"scribble")
    local = _exported(dpu_dev, memoryview(local_mem), AccessFlag.LOCAL_READ_WRITE)
    error = dma_copy(dpu_dev, local, (local.addr, 8), remote, remote.addr)
    assert error is not None
    assert error.code is DocaErrorCode.NOT_PERMITTED
    assert bytes(shared.buf[:8]) == bytes(8)
    for mmap in (remote, local, host):
        mmap.destroy()


def test_imported_mmap_is_not_configurable_or_reexportable(
    dev: Dev, dpu_dev: Dev, shared: SharedMemory
) -> None:
    host = _exported(dev, shared.buf, PCI_RO)
    remote = Mmap.create_from_export(host.export_dpu(dev), dpu_dev, fd=shared.fd)
    assert error_code(lambda: remote.export_dpu(dpu_dev)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: remote.set_permissions(PCI_RW)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(remote.stop) is DocaErrorCode.NOT_PERMITTED
    assert "exported by" in repr(remote)
    inventory = BufInventory(1)
    inventory.start()
    buf = inventory.get_by_args(remote, remote.addr, 16, remote.addr, 16)
    assert error_code(remote.destroy) is DocaErrorCode.NOT_PERMITTED  # a buf points into it
    buf.dec_refcount()
    remote.destroy()
    host.destroy()


def _tampered(raw: bytes, **fields: object) -> bytes:
    obj = json.loads(raw)
    obj.update(fields)
    return json.dumps(obj).encode()


def test_import_refuses_stale_foreign_or_unreachable_exports(
    dev: Dev, dpu_dev: Dev, shared: SharedMemory
) -> None:
    host = _exported(dev, shared.buf, PCI_RO)
    raw = host.export_dpu(dev)
    other_machine = _tampered(raw, boot_id="another-machine")
    assert error_code(lambda: Mmap.create_from_export(other_machine, dpu_dev, fd=shared.fd)) is (
        DocaErrorCode.NOT_SUPPORTED
    )
    with SharedMemory(4096) as unrelated:
        with pytest.raises(DocaError) as exc:  # a descriptor of other memory
            Mmap.create_from_export(raw, dpu_dev, fd=unrelated.fd)
        assert exc.value.code is DocaErrorCode.INVALID_VALUE
        assert exc.value.fault is Fault.PEER
    beyond = _tampered(raw, offset=8192)
    assert error_code(lambda: Mmap.create_from_export(beyond, dpu_dev, fd=shared.fd)) is (
        DocaErrorCode.INVALID_VALUE
    )
    # Without the memory's descriptor (a TCP channel cannot carry one) nothing is opened.
    with pytest.raises(DocaError) as exc:
        Mmap.create_from_export(raw, dpu_dev)
    assert exc.value.code is DocaErrorCode.INVALID_VALUE
    assert "Unix-socket comm channel" in exc.value.message
    with open(os.devnull, "rb") as wrong:
        assert (
            error_code(lambda: Mmap.create_from_export(raw, dpu_dev, fd=wrong.fileno()))
            is DocaErrorCode.INVALID_VALUE
        )
    assert error_code(lambda: Mmap.create_from_export(b"{}", dpu_dev, fd=0)) is DocaErrorCode.INVALID_VALUE
    host.destroy()


def test_write_access_is_what_the_descriptor_carries(dev: Dev, dpu_dev: Dev, tmp_path: Path) -> None:
    """An export claiming PCI_READ_WRITE with a read-only descriptor is refused; the file is not reopened."""
    path = tmp_path / "pages"
    path.write_bytes(bytes(8192))
    with SharedMemory.from_file(path, writable=True) as writable:
        host = _exported(dev, writable.buf, PCI_RW)
        raw = host.export_dpu(dev)
        read_only = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(DocaError) as exc:
                Mmap.create_from_export(raw, dpu_dev, fd=read_only)
            assert exc.value.code is DocaErrorCode.NOT_PERMITTED
            assert exc.value.fault is Fault.PEER
            remote = Mmap.create_from_export(_tampered(raw, access=["PCI_READ_ONLY"]), dpu_dev, fd=read_only)
            remote.destroy()
        finally:
            os.close(read_only)
            host.destroy()
    assert path.read_bytes() == bytes(8192)


# -- across two processes ------------------------------------------------------------------------

_DPU = textwrap.dedent(
    """
    import json, os, sys
    from rdmakit.doca import *

    service = sys.argv[1]
    with Dev.open(local_devinfo("dpu")) as dev, CommChannel.connect(service, timeout=30) as chan:
        data, fds = chan.recv_fds(30)
        msg = json.loads(data)
        raw = msg["descriptor"].encode()
        remote = Mmap.create_from_export(raw, dev, fd=fds[0])  # the pages came with the message
        for fd in fds:
            os.close(fd)
        mine = bytearray(msg["length"])
        local = Mmap(); local.set_memrange(mine); local.add_dev(dev); local.start()
        inv = BufInventory(4); inv.start()
        dma = Dma(dev); wq = WorkQ(2); dma.workq_add(wq); dma.start()
        def run(s, d):
            wq.submit(DmaMemcpyJob(ctx=dma, src=s, dst=d))
            event = None
            while event is None:
                event = wq.progress_retrieve()
            assert event.ok, event.error
            s.dec_refcount(); d.dec_refcount()
        n, host = msg["length"], msg["addr"]
        run(inv.get_by_args(remote, host, n, host, n), inv.get_by_args(local, local.addr, n, local.addr, 0))
        mine[:] = bytes(reversed(mine))
        run(inv.get_by_args(local, local.addr, n, local.addr, n), inv.get_by_args(remote, host, n, host, 0))
        remote.destroy(); local.destroy(); dma.close(); wq.close()
        chan.send(json.dumps({"pid": os.getpid()}).encode())
    """
)


def test_a_dpu_process_copies_host_memory_both_ways(dev: Dev) -> None:
    """Another process imports the export and DMAs from and into the host's memory, no socket in between.

    The memory's descriptor came over the comm channel with the export message (SCM_RIGHTS).
    """
    service = f"test-export-{uuid.uuid4().hex[:12]}"
    payload = os.urandom(1 << 20)
    with CommChannelServer(service) as server, SharedMemory(len(payload)) as memory:
        memory.buf[:] = payload
        host = _exported(dev, memory.buf, PCI_RW)
        child = subprocess.Popen([sys.executable, "-c", _DPU, service])
        try:
            with server.accept(30) as chan:
                msg = {"descriptor": host.export_dpu(dev).decode(), "addr": host.addr, "length": host.length}
                chan.send(json.dumps(msg).encode(), fds=(memory.fd,))
                reply = json.loads(chan.recv(60))
            assert child.wait(30) == 0
        finally:
            child.kill()
            child.wait()
        assert reply["pid"] == child.pid != os.getpid()
        assert bytes(memory.buf) == payload[::-1]  # written by the other process's DMA job
        host.destroy()
