"""``doca_sync_event.h``: a sync event shared by the host and the DPU (DOCA Core §3.4.6.4).

Each test names the function and the sentence of its documentation it checks. The "DPU" is this
process (a second handle on the same page) or another process that gets the page's descriptor.
"""

import fcntl
import mmap
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from rdmakit.doca import DPU_EXPORT_SIZE, CtxState, Dev, DocaErrorCode, SyncEvent, local_devinfo
from tests.doca.util import error_code


@pytest.fixture
def dev() -> Iterator[Dev]:
    with Dev.open(local_devinfo("se0")) as d:
        yield d


def _host_event(dev: Dev) -> SyncEvent:
    se = SyncEvent()
    se.add_publisher_location_dpu()
    se.add_subscriber_location_cpu(dev)
    se.start()
    return se


def test_export_to_dpu_needs_both_locations_and_a_started_event(dev: Dev) -> None:
    """doca_sync_event_export_to_dpu: "Sync Event should be properly configured, both subscriber and
    publisher must be declared as either CPU or DPU location"."""
    with SyncEvent() as bare:
        bare.start()
        assert error_code(lambda: bare.export_to_dpu(dev)) is DocaErrorCode.NOT_PERMITTED
    with SyncEvent() as cpu_only:
        cpu_only.add_publisher_location_cpu(dev)
        cpu_only.start()
        assert error_code(lambda: cpu_only.export_to_dpu(dev)) is DocaErrorCode.NOT_PERMITTED
    with SyncEvent() as idle:
        idle.add_publisher_location_dpu()
        idle.add_subscriber_location_cpu(dev)
        assert error_code(lambda: idle.export_to_dpu(dev)) is DocaErrorCode.BAD_STATE
    with _host_event(dev) as se:
        assert len(se.export_to_dpu(dev)) == DPU_EXPORT_SIZE


def test_create_from_export_shares_the_counter(dev: Dev) -> None:
    """doca_sync_event_export_to_dpu: "The exported data stream an be used from the DPU to created an
    exported Sync Event (see doca_sync_event_create_from_export)"; both handles see one value."""
    with _host_event(dev) as host:
        blob = host.export_to_dpu(dev)
        with SyncEvent.create_from_export(dev, blob, host.export_fd) as dpu:
            dpu.start()
            host.update_set(1)
            assert dpu.wait_gt(0, timeout=5) == 1
            assert dpu.update_add(1) == 1
            assert host.wait_gt(1, timeout=5) == 2
            assert (
                error_code(lambda: dpu.export_to_dpu(dev)) is DocaErrorCode.NOT_PERMITTED
            )  # "from the Host CPU only"
        assert host.state is CtxState.RUNNING


_CHILD = textwrap.dedent(
    """
    import sys
    from rdmakit.doca import Dev, SyncEvent, local_devinfo
    blob, fd, n = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    with Dev.open(local_devinfo("child0")) as dev, SyncEvent.create_from_export(dev, blob, fd) as se:
        se.start()
        se.update_set(1)                # ready
        se.wait_gt(1, timeout=30)       # the host's go
        for _ in range(n):
            se.update_add(1)
        print(se.get())
    """
)


def test_update_add_is_atomic_across_processes(dev: Dev) -> None:
    """doca_sync_event_update_add: "Atomically increase the value of a Sync Event by some value": the host
    and the DPU process add at once and no addition is lost; doca_sync_event_wait_gt across processes."""
    n = 20000
    with _host_event(dev) as host:
        blob = host.export_to_dpu(dev)
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, blob.hex(), str(host.export_fd), str(n)],
            pass_fds=(host.export_fd,), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        host.wait_gt(0, timeout=60)  # the DPU process is ready
        host.update_set(2)  # go: both add at once
        for _ in range(n):
            host.update_add(1)
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert host.get() == 2 * n + 2
        assert int(out) <= 2 * n + 2


def test_create_from_export_refuses_what_is_not_an_export(dev: Dev) -> None:
    """doca_sync_event_create_from_export of a data stream that is not an export: INVALID_VALUE (a peer's
    blob and descriptor are hostile input: exact format, a one-page memfd sealed against resizing)."""
    with _host_event(dev) as host:
        blob = host.export_to_dpu(dev)
        fd = host.export_fd
        assert (
            error_code(lambda: SyncEvent.create_from_export(dev, blob[:-1], fd))
            is DocaErrorCode.INVALID_VALUE
        )
        assert error_code(lambda: SyncEvent.create_from_export(dev, b"x" + blob[1:], fd)) is (
            DocaErrorCode.INVALID_VALUE
        )
        assert (
            error_code(lambda: SyncEvent.create_from_export(dev, blob, None)) is DocaErrorCode.INVALID_VALUE
        )
        unsealed = os.memfd_create("unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(unsealed, mmap.PAGESIZE)
            assert error_code(lambda: SyncEvent.create_from_export(dev, blob, unsealed)) is (
                DocaErrorCode.INVALID_VALUE
            )
            fcntl.fcntl(unsealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)  # grow still allowed
            assert error_code(lambda: SyncEvent.create_from_export(dev, blob, unsealed)) is (
                DocaErrorCode.INVALID_VALUE
            )
        finally:
            os.close(unsealed)
        r, w = os.pipe()
        try:
            assert (
                error_code(lambda: SyncEvent.create_from_export(dev, blob, r)) is DocaErrorCode.INVALID_VALUE
            )
        finally:
            os.close(r)
            os.close(w)


def test_set_addr_before_start_only(dev: Dev) -> None:
    """doca_sync_event_set_addr: "DOCA_ERROR_BAD_STATE - setting address for event which has already been
    started is not allowed"; "DOCA_ERROR_INVALID_VALUE - received invalid input"; the event then keeps its
    value in the user's 8 bytes, which another process cannot map (export_to_dpu: NOT_SUPPORTED)."""
    cell = bytearray(8)
    with SyncEvent() as se:
        assert error_code(lambda: se.set_addr(bytearray(4))) is DocaErrorCode.INVALID_VALUE
        assert error_code(lambda: se.set_addr(memoryview(bytes(8)))) is DocaErrorCode.INVALID_VALUE
        se.add_publisher_location_dpu()
        se.add_subscriber_location_cpu(dev)
        se.set_addr(cell)
        se.start()
        assert error_code(lambda: se.set_addr(bytearray(8))) is DocaErrorCode.BAD_STATE
        se.update_set(0x0102)
        assert int.from_bytes(cell, sys.byteorder) == 0x0102
        assert error_code(lambda: se.export_to_dpu(dev)) is DocaErrorCode.NOT_SUPPORTED
