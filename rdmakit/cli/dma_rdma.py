"""The dma-copy tool's ``--transport rdma``: DMA jobs whose memory is on another machine, run as RDMA.

DOCA DMA never crosses the network (``rdmakit.doca.dma``: a job naming an
``export_rdma`` mmap is NOT_SUPPORTED). The DMA Copy application's flow is
the same on one machine and across two, so the tool keeps its DMA jobs and
gives them a connection instead: `DmaOverRdma` is a `Dma` context that,
given a connected `Rdma` context on the same device (`DmaOverRdma.set_rdma`,
while IDLE), runs a job that names remote memory as RDMA operations on
that connection: a remote destination is an RDMA WRITE, a remote source an
RDMA READ, one per piece that is contiguous on both sides (a chain has
several); local to local stays a memcpy. The buffer rules of DOCA DMA hold
unchanged; the remote side's device is the authority on its memory (the
export's permissions and the peer Rdma context's), and a refusal, a peer
that stopped answering or a connection in ERROR fails the job with
IO_FAILED and the RDMA error as the cause. A failed job leaves the
destination's data length unchanged, but pieces that landed before the
failure may have been written. Without a connection a remote buffer is
NOT_SUPPORTED at submit, as on a `Dma`; with one not yet connected,
BAD_STATE.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rdmakit.doca import BufInventory, CtxState, Dev, DocaError, DocaErrorCode, Rdma
from rdmakit.doca.ctx import Event
from rdmakit.doca.dma import Dma, DmaMemcpyJob, _is_remote, _Plan, _Segment
from rdmakit.doca.rdma import RdmaReadJob, RdmaWriteJob

__all__ = ["DmaOverRdma"]


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


def _cause(exc: DocaError) -> DocaError:
    """The error of a job whose RDMA piece failed: the same code and fault, saying so."""
    return DocaError(exc.code, f"DMA over RDMA: {exc.message}", exc.fault)


class DmaOverRdma(Dma):
    """A `Dma` context that reaches memory on another machine through an RDMA connection."""

    def __init__(self, dev: Dev | None = None) -> None:
        # The connection, the jobs whose pieces are not all back, the pieces' events.
        self._rdma: Rdma | None = None
        self._remote: deque[_Remote] = deque()
        self._pieces_inflight = 0
        self._piece_bufs: BufInventory | None = None
        super().__init__(dev)
        self._landing = _Landing(self._wake)

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

    def _start(self) -> bool:
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
        return super()._start()

    def _cancel(self) -> None:
        super()._cancel()
        for rec in self._remote:  # pieces in flight come back to the landing and are dropped
            rec.cancelled = True
            rec.todo.clear()
        self._remote = deque(rec for rec in self._remote if rec.inflight)

    def _close(self) -> None:
        super()._close()
        # Pieces still on the connection return when it completes or flushes them.
        self._landing.closed = True
        while self._landing.events:
            _release_piece(self._landing.events.popleft())
        self._remote.clear()

    def _refuse_remote(self, what: str) -> None:
        if self._rdma is None:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"{what} is memory on another machine (an export_rdma mmap): reaching it takes an "
                "RDMA connection, and the DMA context has none (DmaOverRdma.set_rdma)",
            )

    def _submit_remote(self, job: DmaMemcpyJob, plan: _Plan) -> None:
        pieces = self._check_rdma(plan)
        if not self._queue and not self._remote:  # else the eventfd is signalled already
            self._wake()
        self._remote.append(_Remote(job, plan, deque(pieces)))

    def _check_rdma(self, plan: _Plan) -> list[tuple[_Segment, _Segment]]:
        """The pieces of a job that touches remote memory, if the connection can run them."""
        rdma = self._rdma
        if rdma is None:  # _elements refused it already; kept for the single-buf path
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, "no RDMA connection (DmaOverRdma.set_rdma)")
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

    # -- execution over RDMA ----------------------------------------------------------------

    def _progress_remote(self) -> bool:
        if not self._remote:
            return False
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
