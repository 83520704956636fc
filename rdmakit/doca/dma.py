"""DOCA DMA (``doca_dma.h``): memory copies between buffers, run as a context.

A `Dma` context copies with `DmaMemcpyJob` s submitted to its `WorkQ`; a
job's event arrives after a later ``progress_retrieve``, with ``result`` the
number of bytes copied. The task API (``task_memcpy_set_conf``,
``task_memcpy_alloc_init``, ``rdmakit.doca.dma_tasks``) runs the same jobs.
The buffer rules (``doca_dma_task_memcpy_alloc_init`` and DOCA Core's buffer
rules):

- The source is the data section of `src`, of every element of its list in
  order (gather). `src` and `dst` are list heads.
- The copy is appended to `dst`: it starts at the tail of the last element
  of the list that holds data (the head when none does) and continues into
  the tailroom of the elements after it (scatter). Each element's
  ``data_len`` grows by what it received, so the list's data is its old data
  followed by the copy.
- That room must hold the whole source, and source and destination ranges
  may not overlap: INVALID_VALUE at submit.
- Limits (`max_buf_size` for the copy, `max_buf_list_len` for each list) come
  from the device: TOO_BIG at submit.
- Memory is reached through the context's device, as hardware does: every
  element's mmap must be registered on it (added to the mmap before
  ``start``, or made by ``create_from_export`` on it), and the destination's
  registration must allow writes (LOCAL_READ_WRITE for local memory,
  PCI_READ_WRITE for memory a host exported). A violation fails the job
  (event status IO_FAILED, error NOT_PERMITTED) and nothing is copied.

Host and DPU. A DPU process copies to and from host memory through an mmap
made by ``Mmap.create_from_export`` from the host's ``export_dpu``
descriptor: on one machine its pages are shared memory (``rdmakit.doca.shm``),
so the copy is a memcpy with no socket in the path.

Between machines. DOCA DMA never crosses the network: an mmap made from an
``export_rdma`` descriptor is memory on another machine, and a job that
names one is NOT_SUPPORTED at submit. Copying to or from another machine is
DOCA RDMA's work (READ and WRITE tasks); the dma-copy tool's ``--transport
rdma`` builds it from an `Rdma` connection (``rdmakit.cli.dma_rdma``), with
the buffer rules above unchanged. `_submit_remote`, `_progress_remote` and
`_refuse_remote` are the hooks it uses.
"""

import contextlib
import os
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from rdmakit.doca.backend import JobType
from rdmakit.doca.buf import Buf
from rdmakit.doca.device import Dev, DevInfo
from rdmakit.doca.dma_tasks import DmaMemcpyJob, DmaTaskApi
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.mmap import Mmap, MmapDescriptor

__all__ = ["Dma", "DmaMemcpyJob"]


class _Segment(NamedTuple):
    mmap: Mmap
    addr: int
    length: int


class _Plan(NamedTuple):
    """A job checked at submit: the source segments, and the destination segments with their bufs."""

    src: tuple[_Segment, ...]
    dst: tuple[tuple[Buf, _Segment], ...]
    total: int


def _overlap(a: _Segment, b: _Segment) -> bool:
    return a.mmap is b.mmap and a.addr < b.addr + b.length and b.addr < a.addr + a.length


def _is_remote(mmap: Mmap) -> bool:
    """Memory on another machine: an mmap made from an ``export_rdma`` descriptor."""
    return isinstance(mmap.descriptor, MmapDescriptor)


class Dma(DmaTaskApi):
    """A DMA context (``doca_dma``) on one device; see the module docstring for the rules."""

    def __init__(self, dev: Dev | None = None) -> None:
        """``doca_dma_create(dev)``; `dev` may also be added later with `add_dev`."""
        super().__init__()
        self._queue: deque[tuple[DmaMemcpyJob, _Plan]] = deque()
        self._busy: set[int] = set()  # ids of the destination bufs of jobs in flight
        self._efd = -1
        # Fixed while running (devices change only in IDLE); looked up once at start.
        self._limits = (0, 0)  # max_buf_size, max_buf_list_len
        if dev is not None:
            self.add_dev(dev)

    # -- capabilities (doca_dma_cap_task_memcpy_*) ---------------------------------------

    @staticmethod
    def cap_is_supported(info: DevInfo) -> bool:
        """Whether `info`'s device runs memcpy jobs (``doca_dma_cap_task_memcpy_is_supported``)."""
        return info.is_job_supported(JobType.DMA_MEMCPY)

    @staticmethod
    def cap_max_buf_size(info: DevInfo) -> int:
        """Largest copy one job may do (``doca_dma_cap_task_memcpy_get_max_buf_size``)."""
        return info.max_buf_size()

    @staticmethod
    def cap_max_buf_list_len(info: DevInfo) -> int:
        """Longest source or destination list (``doca_dma_cap_task_memcpy_get_max_buf_list_len``)."""
        return info.max_buf_list_len()

    @property
    def dev(self) -> Dev:
        if not self._devs:
            raise DocaError(DocaErrorCode.BAD_STATE, "the DMA context has no device")
        return self._devs[0]

    @property
    def max_buf_size(self) -> int:
        """Largest copy one job may do on this context's device."""
        return self.dev.backend.caps.max_buf_size

    @property
    def max_buf_list_len(self) -> int:
        """Longest list a job's source or destination may be on this context's device."""
        return self.dev.backend.caps.max_buf_list_len

    def _wake(self) -> None:
        if self._efd >= 0:
            os.eventfd_write(self._efd, 1)

    # -- context hooks ----------------------------------------------------------------------

    def _check_dev(self, dev: Dev) -> None:
        if self._devs:
            raise DocaError(DocaErrorCode.IN_USE, "a DMA context has one device")
        if JobType.DMA_MEMCPY not in dev.backend.caps.job_types:
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{dev.name} does not run DMA memcpy jobs")

    def _start(self) -> bool:
        backend = self.dev.backend
        self._limits = (backend.caps.max_buf_size, backend.caps.max_buf_list_len)
        if self._efd < 0:  # kept across stop/start; closed by close()
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._watch_fd(self._efd)
        return True

    def _cancel(self) -> None:
        self._queue.clear()
        self._busy.clear()

    def _close(self) -> None:
        if self._efd >= 0:
            os.close(self._efd)
            self._efd = -1

    def _submit(self, job: DmaMemcpyJob) -> None:
        if not isinstance(job, DmaMemcpyJob):
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{type(job).__name__} is not a DMA job")
        plan = self._plan(job)
        remote = any(_is_remote(seg.mmap) for seg in plan.src) or any(
            _is_remote(seg.mmap) for _, seg in plan.dst
        )
        ids = {id(buf) for buf, _ in plan.dst}
        if ids & self._busy:
            raise DocaError(DocaErrorCode.IN_USE, "the destination is already in a job in flight")
        if remote:
            self._submit_remote(job, plan)  # NOT_SUPPORTED here; a subclass may run it
            self._busy |= ids
            return
        self._busy |= ids
        if not self._queue:  # else the eventfd is signalled already
            os.eventfd_write(self._efd, 1)
        self._queue.append((job, plan))

    def _refuse_remote(self, what: str) -> None:
        """Memory on another machine in a job: DOCA DMA does not reach it."""
        raise DocaError(
            DocaErrorCode.NOT_SUPPORTED,
            f"{what} is memory on another machine (an export_rdma mmap): DOCA DMA copies only memory "
            "its device reaches; use DOCA RDMA read and write tasks",
        )

    def _submit_remote(self, job: DmaMemcpyJob, plan: _Plan) -> None:
        """A job that touches memory on another machine (refused; `_elements` did already)."""
        self._refuse_remote("the job's memory")

    def _progress_remote(self) -> bool:
        """Advance jobs on memory of other machines: there are none here."""
        return False

    def _progress(self) -> bool:
        if self._efd < 0:
            return False  # never started: nothing to do
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._efd)
        busy = self._progress_remote()
        if not self._queue:
            return busy
        while self._queue:
            job, plan = self._queue.popleft()
            self._busy.difference_update(id(buf) for buf, _ in plan.dst)
            try:
                copied = self._execute(plan)
            except DocaError as exc:
                self._complete(job, error=exc)
            else:
                self._complete(job, result=copied)
        return True

    # -- submit-time checks -------------------------------------------------------------------

    def _elements(self, head: Buf, what: str, limit: int) -> list[Buf]:
        head.mmap  # noqa: B018 - BAD_STATE if the buf was returned
        if not head.is_first:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{what} must be the head of its list")
        bufs = list(head)
        if len(bufs) > limit:
            raise DocaError(
                DocaErrorCode.TOO_BIG, f"{what} list of {len(bufs)} bufs; {self.dev.name} takes {limit}"
            )
        for buf in bufs:
            if _is_remote(buf.mmap):  # buf.mmap: BAD_STATE if returned
                self._refuse_remote(what)
        return bufs

    def _plan(self, job: DmaMemcpyJob) -> _Plan:
        head, tail = job.src, job.dst
        if (
            head.get_next() is None
            and tail.get_next() is None
            and head.is_first
            and tail.is_first
            and not _is_remote(head.mmap)
            and not _is_remote(tail.mmap)
        ):
            return self._plan_single(head, tail)
        max_size, limit = self._limits
        srcs = self._elements(job.src, "source", limit)
        dsts = self._elements(job.dst, "destination", limit)
        src = tuple(_Segment(b.mmap, b.data, b.data_len) for b in srcs if b.data_len)
        total = sum(seg.length for seg in src)
        if total > max_size:
            raise DocaError(
                DocaErrorCode.TOO_BIG, f"copy of {total} bytes; {self.dev.name} copies {max_size}"
            )
        first = max((i for i, b in enumerate(dsts) if b.data_len), default=0)
        dst: list[tuple[Buf, _Segment]] = []
        room = 0
        for buf in dsts[first:]:
            if room >= total:
                break
            if buf.tailroom:
                take = min(buf.tailroom, total - room)
                dst.append((buf, _Segment(buf.mmap, buf.data + buf.data_len, take)))
                room += take
        if room < total:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"destination has room for {room} bytes, the source has {total}"
            )
        for s in src:
            for _, d in dst:
                if _overlap(s, d):
                    raise DocaError(DocaErrorCode.INVALID_VALUE, "source and destination overlap")
        return _Plan(src, tuple(dst), total)

    def _plan_single(self, src: Buf, dst: Buf) -> _Plan:
        """`_plan` for one local buf each, the common case: the same checks, less work."""
        src_mmap, dst_mmap = src.mmap, dst.mmap
        total = src.data_len
        if total > self._limits[0]:
            raise DocaError(
                DocaErrorCode.TOO_BIG, f"copy of {total} bytes; {self.dev.name} copies {self._limits[0]}"
            )
        if not total:
            return _Plan((), (), 0)
        if dst.tailroom < total:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"destination has room for {dst.tailroom} bytes, the source has {total}",
            )
        seg_src = _Segment(src_mmap, src.data, total)
        seg_dst = _Segment(dst_mmap, dst.data + dst.data_len, total)
        if _overlap(seg_src, seg_dst):
            raise DocaError(DocaErrorCode.INVALID_VALUE, "source and destination overlap")
        return _Plan((seg_src,), ((dst, seg_dst),), total)

    # -- execution ----------------------------------------------------------------------------

    def _resolve(self, seg: _Segment, write: bool) -> memoryview:
        dev = self.dev
        try:
            reg = seg.mmap.registration(dev)
        except DocaError as exc:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                f"{'destination' if write else 'source'} mmap is not registered on {dev.name}",
                Fault.CALLER,
            ) from exc
        view = dev.backend.local_view(reg.lkey, seg.addr, seg.length, write=write)
        if view is None:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                f"local protection error: key {reg.lkey:#x}, {seg.addr:#x}+{seg.length}, write={write}",
                Fault.CALLER,
            )
        return view

    def _execute(self, plan: _Plan) -> int:
        # Check and resolve everything first: a failed job copies nothing.
        for buf, _ in plan.dst:
            buf.mmap  # noqa: B018 - BAD_STATE if the buf was returned meanwhile
        sources = [self._resolve(seg, write=False) for seg in plan.src]
        targets = [self._resolve(seg, write=True) for _, seg in plan.dst]
        _scatter_gather(sources, targets)
        for buf, seg in plan.dst:
            buf.commit_append(seg.length)
        return plan.total


def _scatter_gather(sources: Sequence[memoryview], targets: Sequence[memoryview]) -> None:
    """Copy the concatenation of `sources` into the concatenation of `targets` (same total)."""
    if len(sources) == 1 and len(targets) == 1:
        targets[0][:] = sources[0]
        return
    ti, toff = 0, 0
    for src in sources:
        soff = 0
        while soff < len(src):
            dst = targets[ti]
            n = min(len(src) - soff, len(dst) - toff)
            dst[toff : toff + n] = src[soff : soff + n]
            soff += n
            toff += n
            if toff == len(dst):
                ti, toff = ti + 1, 0
