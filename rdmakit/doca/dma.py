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

Between machines. An mmap made from an ``export_rdma`` descriptor is memory
on another machine, reached through an RDMA connection the caller gives the
context while IDLE (`Dma.set_rdma`): a connected `Rdma` context on the same
device, as the DOCA RDMA samples build it. The same job then runs as RDMA
operations on that connection: a remote destination is an RDMA WRITE, a
remote source an RDMA READ, one per piece that is contiguous on both sides
(a chain has several); local to local stays a memcpy. The buffer rules above
hold unchanged; the remote side's device is the authority on its memory (the
export's permissions and the peer Rdma context's), and a refusal, a peer
that stopped answering or a connection in ERROR fails the job with IO_FAILED
and the RDMA error as the cause. A failed job over RDMA leaves the
destination's data length unchanged, but pieces that landed before the
failure may have been written. Without a connection a remote buffer is
NOT_SUPPORTED at submit; with one not yet connected, BAD_STATE.
"""

import contextlib
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from rdmakit.doca.backend import JobType
from rdmakit.doca.buf import Buf
from rdmakit.doca.ctx import CtxState, Event
from rdmakit.doca.device import Dev, DevInfo
from rdmakit.doca.dma_tasks import DmaMemcpyJob, DmaTaskApi
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.inventory import BufInventory
from rdmakit.doca.mmap import Mmap, MmapDescriptor
from rdmakit.doca.rdma import Rdma, RdmaReadJob, RdmaWriteJob

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


def _pieces(plan: _Plan) -> list[tuple[_Segment, _Segment]]:
    """The copy as (source, destination) pairs, each contiguous on both sides, in order."""
    out: list[tuple[_Segment, _Segment]] = []
    di = doff = 0
    for s in plan.src:
        soff = 0
        while soff < s.length:
            d = plan.dst[di][1]
            n = min(s.length - soff, d.length - doff)
            out.append((_Segment(s.mmap, s.addr + soff, n), _Segment(d.mmap, d.addr + doff, n)))
            soff += n
            doff += n
            if doff == d.length:
                di, doff = di + 1, 0
    return out


@dataclass(slots=True, eq=False)
class _Remote:
    """A job that runs over the RDMA connection: its pieces, posted as the send queue allows."""

    job: DmaMemcpyJob
    plan: _Plan
    todo: deque[tuple[_Segment, _Segment]]
    started: bool = False
    inflight: int = 0
    error: DocaError | None = None
    cancelled: bool = False


class _Landing:
    """Where the RDMA context delivers the events of the pieces (a `ctx._Sink`).

    Whichever context's progress reaps the connection may deliver here, so each event
    also wakes the DMA context (its eventfd), as `WorkQ._deliver` does.
    """

    __slots__ = ("closed", "events", "wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self.events: deque[Event] = deque()
        self.wake = wake
        self.closed = False  # the DMA context is closed: give the pieces' buffers back at once

    def _deliver(self, event: Event) -> None:
        if self.closed:
            _release_piece(event)
            return
        if not self.events:
            self.wake()
        self.events.append(event)


def _release_piece(event: Event) -> None:
    piece = event.job
    assert isinstance(piece, (RdmaWriteJob, RdmaReadJob))
    piece.src_buf.dec_refcount()
    piece.dst_buf.dec_refcount()


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
        # Over RDMA: the connection, the jobs whose pieces are not all back, the pieces' events.
        self._rdma: Rdma | None = None
        self._remote: deque[_Remote] = deque()
        self._landing = _Landing(self._wake)
        self._pieces_inflight = 0
        self._piece_bufs: BufInventory | None = None
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

    @property
    def rdma(self) -> Rdma | None:
        """The RDMA connection that reaches memory on other machines, if one was given."""
        return self._rdma

    def set_rdma(self, rdma: Rdma | None) -> None:
        """Reach remote mmaps (``export_rdma``) through `rdma`; None takes it away. IDLE only.

        `rdma` is an `Rdma` context on this context's device (checked at
        ``start``), connected to the peer that exported the memory before a
        job uses it. It stays the caller's: it may run its own jobs on its
        own WorkQ meanwhile, and closing the DMA context does not close it.
        The pieces of a job are RDMA READs and WRITEs on it, at most its
        send queue size in flight; this context's WorkQ gets one event per
        job. An RDMA job that fails moves the connection to ERROR, as any
        RDMA job does: recover it with the RDMA recovery flow.
        """
        self._require_idle("set_rdma")
        if rdma is not None and not isinstance(rdma, Rdma):
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"expected an Rdma context, got {rdma!r}")
        self._rdma = rdma

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
        rdma = self._rdma
        if rdma is not None:
            if rdma.closed or rdma.dev is not self.dev:
                raise DocaError(
                    DocaErrorCode.INVALID_VALUE,
                    f"the RDMA context must be open on the DMA context's device {self.dev.name} "
                    f"(it is on {'nothing' if rdma.dev is None else rdma.dev.name})",
                )
            if self._piece_bufs is None:
                self._piece_bufs = BufInventory(2 * rdma.send_queue_size)
                self._piece_bufs.start()
        if self._efd < 0:  # kept across stop/start; closed by close()
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._watch_fd(self._efd)
        return True

    def _cancel(self) -> None:
        self._queue.clear()
        self._busy.clear()
        for rec in self._remote:  # pieces in flight come back to the landing and are dropped
            rec.cancelled = True
            rec.todo.clear()
        self._remote = deque(rec for rec in self._remote if rec.inflight)

    def _close(self) -> None:
        if self._efd >= 0:
            os.close(self._efd)
            self._efd = -1
        # Pieces still on the connection return when it completes or flushes them.
        self._landing.closed = True
        while self._landing.events:
            _release_piece(self._landing.events.popleft())
        self._remote.clear()

    def _submit(self, job: DmaMemcpyJob) -> None:
        if not isinstance(job, DmaMemcpyJob):
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{type(job).__name__} is not a DMA job")
        plan = self._plan(job)
        remote = any(_is_remote(seg.mmap) for seg in plan.src) or any(
            _is_remote(seg.mmap) for _, seg in plan.dst
        )
        if remote:
            pieces = self._check_rdma(plan)
        ids = {id(buf) for buf, _ in plan.dst}
        if ids & self._busy:
            raise DocaError(DocaErrorCode.IN_USE, "the destination is already in a job in flight")
        self._busy |= ids
        if not self._queue and not self._remote:  # else the eventfd is signalled already
            os.eventfd_write(self._efd, 1)
        if remote:
            self._remote.append(_Remote(job, plan, deque(pieces)))
        else:
            self._queue.append((job, plan))

    def _check_rdma(self, plan: _Plan) -> list[tuple[_Segment, _Segment]]:
        """The pieces of a job that touches remote memory, if the connection can run them."""
        rdma = self._rdma
        if rdma is None:  # _elements refused it already; kept for the single-buf path
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, "no RDMA connection (Dma.set_rdma)")
        if rdma.closed or rdma.state is not CtxState.RUNNING:
            raise DocaError(
                DocaErrorCode.BAD_STATE,
                f"the job reaches memory on another machine, but the DMA context's RDMA connection is "
                f"{'closed' if rdma.closed else rdma.rdma_state.name}: connect it first",
            )
        pieces = _pieces(plan)
        for s, d in pieces:
            if _is_remote(s.mmap) and _is_remote(d.mmap):
                raise DocaError(
                    DocaErrorCode.NOT_SUPPORTED,
                    "source and destination are both memory on other machines: one side must be local",
                )
        return pieces

    def _progress(self) -> bool:
        if self._efd < 0:
            return False  # never started: nothing to do
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._efd)
        busy = bool(self._remote) and self._progress_remote()
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
            if _is_remote(buf.mmap) and self._rdma is None:  # buf.mmap: BAD_STATE if returned
                raise DocaError(
                    DocaErrorCode.NOT_SUPPORTED,
                    f"{what} is memory on another machine (an export_rdma mmap): reaching it takes an "
                    "RDMA connection, and the DMA context has none (Dma.set_rdma)",
                )
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

    # -- execution over RDMA ----------------------------------------------------------------

    def _progress_remote(self) -> bool:
        rdma = self._rdma
        landing = self._landing.events
        if rdma is not None and self._pieces_inflight and not rdma.closed:
            rdma._progress()
        busy = bool(landing)
        while landing:
            self._on_piece(landing.popleft())
        depth = rdma.send_queue_size if rdma is not None else 0
        posted = self._pieces_inflight
        for rec in list(self._remote):
            if rec.cancelled:
                continue
            if not rec.started:
                rec.started = True
                busy = True
                self._begin(rec)
            while rec.todo and self._pieces_inflight < depth:
                busy = True
                self._post(rec, *rec.todo.popleft())
            if not rec.todo and not rec.inflight:
                self._finish(rec)
            if rec.todo:
                break  # the send queue is full: later jobs wait their turn
        if self._pieces_inflight > posted:
            self.dev.backend.pump.progress()  # transmit now, and arm the pump's descriptor for what follows
        return busy

    def _begin(self, rec: _Remote) -> None:
        """Check the local memory as a local copy does, and copy local-to-local pieces now."""
        try:
            for buf, _ in rec.plan.dst:
                buf.mmap  # noqa: B018 - BAD_STATE if the buf was returned meanwhile
            local = []
            for s, d in rec.todo:
                src = None if _is_remote(s.mmap) else self._resolve(s, write=False)
                dst = None if _is_remote(d.mmap) else self._resolve(d, write=True)
                if src is not None and dst is not None:
                    local.append((src, dst))
        except DocaError as exc:
            rec.error = exc
            rec.todo.clear()
            return
        for src, dst in local:
            dst[:] = src
        rec.todo = deque((s, d) for s, d in rec.todo if _is_remote(s.mmap) or _is_remote(d.mmap))

    def _post(self, rec: _Remote, src: _Segment, dst: _Segment) -> None:
        """One piece as an RDMA WRITE (remote destination) or READ (remote source)."""
        rdma = self._rdma
        bufs = self._piece_bufs
        assert rdma is not None
        assert bufs is not None
        n = src.length
        try:
            s = bufs.get_by_args(src.mmap, src.addr, n, src.addr, n)
            try:
                d = bufs.get_by_args(dst.mmap, dst.addr, n, dst.addr, 0)
            except BaseException:
                s.dec_refcount()
                raise
            piece: RdmaWriteJob | RdmaReadJob
            if _is_remote(dst.mmap):
                piece = RdmaWriteJob(ctx=rdma, src_buf=s, dst_buf=d, user_data=rec)
            else:
                piece = RdmaReadJob(ctx=rdma, src_buf=s, dst_buf=d, user_data=rec)
            try:
                rdma._dispatch(piece, self._landing)
            except BaseException:
                s.dec_refcount()
                d.dec_refcount()
                raise
        except DocaError as exc:
            rec.error = rec.error or _cause(exc)
            rec.todo.clear()
            return
        rec.inflight += 1
        self._pieces_inflight += 1

    def _on_piece(self, event: Event) -> None:
        rec = event.job.user_data
        assert isinstance(rec, _Remote)
        _release_piece(event)
        rec.inflight -= 1
        self._pieces_inflight -= 1
        if not event.ok:
            assert event.error is not None
            rec.error = rec.error or _cause(event.error)
            rec.todo.clear()
        if rec.cancelled and not rec.inflight:
            self._remote.remove(rec)

    def _finish(self, rec: _Remote) -> None:
        self._remote.remove(rec)
        self._busy.difference_update(id(buf) for buf, _ in rec.plan.dst)
        if rec.error is not None:
            self._complete(rec.job, error=rec.error)
            return
        try:
            for buf, seg in rec.plan.dst:
                buf.commit_append(seg.length)
        except DocaError as exc:
            self._complete(rec.job, error=exc)
            return
        self._complete(rec.job, result=rec.plan.total)


def _cause(exc: DocaError) -> DocaError:
    """The error of a job whose RDMA piece failed: the same code and fault, saying so."""
    return DocaError(exc.code, f"DMA over RDMA: {exc.message}", exc.fault)


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
