"""DOCA Sync Event (DOCA Core 3.5, ``doca_sync_event.h``), within one process.

A `SyncEvent` holds a 64-bit counter. Publishers update it (`update_set`,
`update_add`); subscribers read it (`get`) or wait for it (`wait_gt`,
`wait_eq`, comparing ``value & mask``). Each operation exists twice:

- as a direct call, usable from any thread; the waits block (with an optional
  timeout: TIME_OUT);
- as a job (`SyncEventGetJob`, `SyncEventSetJob`, `SyncEventAddJob`,
  `SyncEventWaitGtJob`, `SyncEventWaitEqJob`) submitted to the WorkQ the
  event is attached to. Get/set/add complete at once; a wait completes when
  a later update satisfies it, and in event-driven mode the WorkQ handle
  becomes readable then, even when the update came from another thread.

The event is a context: it must be started before use and a stop fails
pending waits (SHUTDOWN). Arithmetic is modulo 2**64, like the C ``uint64_t``.

The task API of DOCA 2.5+ (``task_get``, ``task_notify_set``,
``task_notify_add``, ``task_wait_gt``) is in ``rdmakit.doca.sync_event_tasks``.

Locations: the CPU of this process, a remote peer on the network
(`add_publisher_location_remote_net`): `export_to_remote_net` gives the peer
a descriptor of the counter, which it imports as a
``rdmakit.doca.sync_event_remote.SyncEventRemoteNet`` and reads, sets and adds
to with RDMA tasks; and the DPU (`add_publisher_location_dpu`, DOCA 2.0-2.6;
``remote_pci`` later): `export_to_dpu` and `SyncEvent.create_from_export` share
the counter with another process (``rdmakit.doca.sync_event_dpu``). DPA and
GPU locations are not modelled.

`set_addr` puts the counter in the caller's own 8 bytes (IDLE only); such an
event is this process's memory, so `export_to_dpu` refuses it (NOT_SUPPORTED).
"""

import contextlib
import os
import sys
import threading
import time
from typing import Self

from rdmakit.doca.ctx import CtxState, Job
from rdmakit.doca.device import Dev
from rdmakit.doca.errors import DocaError, DocaErrorCode
from rdmakit.doca.mmap import AccessFlag, Mmap
from rdmakit.doca.sync_event_dpu import export_blob, import_page, page_locked, shared_page
from rdmakit.doca.sync_event_tasks import (
    U64_MAX,
    SyncEventAddJob,
    SyncEventGetJob,
    SyncEventSetJob,
    SyncEventTaskApi,
    SyncEventWaitEqJob,
    SyncEventWaitGtJob,
)
from rdmakit.doca.sync_event_tasks import check_u64 as _check_u64

__all__ = [
    "U64_MAX",
    "SyncEvent",
    "SyncEventAddJob",
    "SyncEventGetJob",
    "SyncEventSetJob",
    "SyncEventWaitEqJob",
    "SyncEventWaitGtJob",
]

_WaitJob = SyncEventWaitGtJob | SyncEventWaitEqJob
#: How often a blocking wait looks at a counter that a remote peer may change.
_REMOTE_POLL = 0.001
#: What a remote-net publisher may do to the counter: read it, write it, add to it.
_REMOTE_ACCESS = (
    AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC
)


def _satisfied(job: _WaitJob, current: int) -> bool:
    masked = current & job.mask
    if isinstance(job, SyncEventWaitGtJob):
        return masked > job.value
    return masked == job.value


class SyncEvent(SyncEventTaskApi):
    """A 64-bit event counter shared by publishers and subscribers (``doca_sync_event``)."""

    def __init__(self) -> None:
        super().__init__()
        # The counter is a native-order uint64 in a page of its own, so a remote
        # peer's RDMA READ, WRITE and FETCH_ADD reach it as they reach any memory,
        # and a sealed memfd, so that a DPU process can map it (export_to_dpu).
        self._memfd, self._page = shared_page()
        self._cell = memoryview(self._page)[:8]
        self._cond = threading.Condition()
        self._waits: list[_WaitJob] = []
        self._efd = -1
        self._cpu_dev: Dev | None = None
        self._remote_net = False
        self._dpu = False  # a DPU location was added, or this is the DPU's handle (create_from_export)
        self._imported = False
        self._user_addr = False
        self._export: Mmap | None = None

    @property
    def _value(self) -> int:
        return int.from_bytes(self._cell, sys.byteorder)

    @_value.setter
    def _value(self, value: int) -> None:
        self._cell[:] = value.to_bytes(8, sys.byteorder)

    # -- locations (IDLE only) ----------------------------------------------------

    def add_publisher_location_cpu(self, dev: Dev) -> None:
        """This process's CPU publishes, through `dev` (``doca_sync_event_add_publisher_location_cpu``)."""
        self._require_idle("add_publisher_location_cpu")
        self._cpu_dev = dev

    def add_subscriber_location_cpu(self, dev: Dev) -> None:
        """This process's CPU subscribes, through `dev` (``doca_sync_event_add_subscriber_location_cpu``)."""
        self._require_idle("add_subscriber_location_cpu")
        self._cpu_dev = dev

    def add_publisher_location_remote_net(self) -> None:
        """A peer publishes over RDMA (``doca_sync_event_add_publisher_location_remote_net``).

        The peer imports `export_to_remote_net` as a `SyncEventRemoteNet` and
        updates the counter with the RDMA remote net sync event tasks. Its
        updates are not atomic with this process's `update_add`, as a NIC's
        are not with a CPU's. They wake nothing: waits and wait jobs see them
        when they look, a blocking wait every millisecond and a wait job at
        every progress of its engine (so an event-driven loop must progress
        the event's engine from time to time).
        """
        self._require_idle("add_publisher_location_remote_net")
        self._remote_net = True

    def add_publisher_location_dpu(self) -> None:
        """The DPU publishes (``doca_sync_event_add_publisher_location_dpu``; later ``_remote_pci``)."""
        self._location_dpu("add_publisher_location_dpu")

    def add_subscriber_location_dpu(self) -> None:
        """The DPU subscribes (``doca_sync_event_add_subscriber_location_dpu``; later ``_remote_pci``)."""
        self._location_dpu("add_subscriber_location_dpu")

    add_publisher_location_remote_pci = add_publisher_location_dpu
    add_subscriber_location_remote_pci = add_subscriber_location_dpu

    def _location_dpu(self, what: str) -> None:
        self._require_idle(what)
        if self._imported:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, f"{what}: this event was created from an export")
        self._dpu = True

    def set_addr(self, addr: bytearray | memoryview) -> None:
        """Keep the counter in `addr`, 8 writable bytes of the caller's (``doca_sync_event_set_addr``).

        IDLE only.
        """
        self._require_idle("set_addr")
        if self._imported:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "set_addr: this event was created from an export")
        view = memoryview(addr)
        if view.readonly or view.nbytes != 8:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "set_addr takes 8 writable bytes")
        self._cell = view.cast("B")
        self._user_addr = True

    def export_to_dpu(self, dev: Dev) -> bytes:
        """The blob the DPU process turns into its handle (``doca_sync_event_export_to_dpu``).

        RUNNING only (BAD_STATE), with a DPU location (NOT_PERMITTED) and the
        event's own page (NOT_SUPPORTED after `set_addr`). The blob goes with
        `export_fd` over a Unix-socket comm channel.
        """
        self._check_running()
        if self._imported:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED, "export_to_dpu: a sync event is exported from the host CPU only"
            )
        if not self._dpu or self._cpu_dev is None:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                "export_to_dpu: declare a DPU location and a CPU location (publisher and subscriber) first",
            )
        if self._user_addr:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                "export_to_dpu: the counter is at a user address (set_addr); another process cannot map it",
            )
        return export_blob()

    @property
    def export_fd(self) -> int:
        """rdmakit: the descriptor of the counter's page, sent with `export_to_dpu`'s blob (still ours)."""
        return self._memfd

    @classmethod
    def create_from_export(cls, dev: Dev, blob: bytes, fd: int | None) -> Self:
        """The DPU's handle on a host's event (``doca_sync_event_create_from_export``); start it to use it.

        `fd` is the descriptor that came with the blob (a duplicate is kept).
        INVALID_VALUE for a malformed blob or a descriptor that is not a sealed
        one-page file.
        """
        own, page = import_page(blob, fd)
        event = cls()
        event._cell.release()
        event._page.close()
        os.close(event._memfd)
        event._memfd, event._page = own, page
        event._cell = memoryview(page)[:8]
        event._dpu = event._imported = True
        event._cpu_dev = dev
        return event

    def export_to_remote_net(self) -> bytes:
        """The descriptor a peer turns into a `SyncEventRemoteNet` (``doca_sync_event_export_to_remote_net``).

        RUNNING only, with a remote-net publisher and a CPU location whose
        device the peer reaches; NOT_PERMITTED otherwise. The descriptor is an
        RDMA mmap export of the 8-byte counter, valid until the event stops.
        """
        self._check_running()
        if not self._remote_net:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED, "export_to_remote_net: no remote-net publisher was added"
            )
        dev = self._cpu_dev
        if dev is None:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                "export_to_remote_net: add a CPU publisher or subscriber location with its device first",
            )
        if self._export is None:
            region = Mmap()
            try:
                region.set_memrange(self._cell)
                region.set_permissions(_REMOTE_ACCESS)
                region.add_dev(dev)
                region.start()
            except BaseException:
                region.destroy()
                raise
            self._export = region
        return self._export.export_rdma(dev)

    def _start(self) -> bool:
        if self._efd < 0:  # kept across stop/start; closed by close()
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._watch_fd(self._efd)
        return True

    def _unexport(self) -> None:
        region, self._export = self._export, None
        if region is not None:
            region.destroy()  # the peer's rkey dies with it

    def _stop(self) -> None:
        self._unexport()
        with self._cond:
            self._cond.notify_all()  # blocked waiters see the state and give up
        self._flush("sync event stopped")

    def _cancel(self) -> None:
        self._waits.clear()

    def _close(self) -> None:
        self._unexport()
        if self._efd >= 0:
            os.close(self._efd)
            self._efd = -1
        if self._memfd >= 0:
            self._cell.release()
            with contextlib.suppress(BufferError):
                self._page.close()
            os.close(self._memfd)
            self._memfd = -1

    def _check_running(self) -> None:
        if self._state is not CtxState.RUNNING:
            raise DocaError(DocaErrorCode.BAD_STATE, f"sync event is {self._state.name}, not RUNNING")

    # -- direct calls -------------------------------------------------------------

    def get(self) -> int:
        """The current value (``doca_sync_event_get``)."""
        self._check_running()
        return self._value

    def _publish(self, value: int) -> None:
        # Caller holds self._cond.
        self._value = value
        self._cond.notify_all()
        if self._efd >= 0:
            os.eventfd_write(self._efd, 1)

    def update_set(self, value: int) -> None:
        """Set the value (``doca_sync_event_update_set``)."""
        self._check_running()
        _check_u64("value", value)
        with self._cond:
            self._publish(value)

    def update_add(self, value: int) -> int:
        """Add `value` modulo 2**64 and return the value before (``doca_sync_event_update_add``)."""
        self._check_running()
        _check_u64("value", value)
        with self._cond:
            if self._dpu and not self._user_addr:  # another process adds to the same page
                with page_locked(self._memfd):
                    before = self._value
                    self._publish((before + value) & U64_MAX)
                return before
            before = self._value
            self._publish((before + value) & U64_MAX)
        return before

    def _wait(self, job: _WaitJob, timeout: float | None) -> int:
        self._check_running()
        _check_u64("value", job.value)
        _check_u64("mask", job.mask)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._state is not CtxState.RUNNING:
                    raise DocaError(DocaErrorCode.SHUTDOWN, "sync event stopped while waiting")
                current = self._value
                if _satisfied(job, current):
                    return current
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise DocaError(DocaErrorCode.TIME_OUT, f"sync event wait timed out after {timeout}s")
                if self._remote_net or self._dpu:  # a peer's update notifies nobody: look again soon
                    left = _REMOTE_POLL if left is None else min(left, _REMOTE_POLL)
                self._cond.wait(left)

    def wait_gt(self, value: int, *, mask: int = U64_MAX, timeout: float | None = None) -> int:
        """Block until ``current & mask > value``; returns the value seen (``doca_sync_event_wait_gt``)."""
        return self._wait(SyncEventWaitGtJob(ctx=self, value=value, mask=mask), timeout)

    def wait_eq(self, value: int, *, mask: int = U64_MAX, timeout: float | None = None) -> int:
        """Block until ``current & mask == value``; returns the value seen."""
        return self._wait(SyncEventWaitEqJob(ctx=self, value=value, mask=mask), timeout)

    # -- jobs -------------------------------------------------------------------------

    def _submit(self, job: Job) -> None:
        match job:
            case SyncEventGetJob():
                self._complete(job, result=self._value)
            case SyncEventSetJob(value=value):
                self.update_set(value)
                self._complete(job)
            case SyncEventAddJob(value=value):
                self._complete(job, result=self.update_add(value))
            case SyncEventWaitGtJob() | SyncEventWaitEqJob():
                _check_u64("value", job.value)
                _check_u64("mask", job.mask)
                current = self._value
                if _satisfied(job, current):
                    self._complete(job, result=current)
                else:
                    self._waits.append(job)
            case _:
                raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{type(job).__name__} is not a sync event job")

    def _progress(self) -> bool:
        if self._efd >= 0:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._efd)
        if not self._waits:
            return False
        current = self._value
        done = [job for job in self._waits if _satisfied(job, current)]
        for job in done:
            self._waits.remove(job)
            self._complete(job, result=current)
        return bool(done)

    def __repr__(self) -> str:
        return f"<SyncEvent {self._state.name} value={self._value} waits={len(self._waits)}>"
