"""DOCA RDMA (DOCA RDMA guide ch. 4-5, ``doca_rdma.h``): RC connections as a DOCA context.

Lifecycle (guide §4, "Configuring DOCA RDMA instances")::

    Rdma() -> add_dev -> set_* (IDLE) -> start            ctx STARTING, rdma_state INIT
           -> export() (send to the peer out of band)
           -> connect(peer's descriptor)                   ctx RUNNING,  rdma_state CONNECTED
           -> jobs ...                                     a failed job: rdma_state ERROR
           -> stop                                         ctx IDLE,     rdma_state RESET

As in DOCA 2.5 and later, ``start`` leaves the context STARTING and returns
IN_PROGRESS (C ``doca_ctx_start`` returns ``DOCA_ERROR_IN_PROGRESS``).
``connect`` moves it to RUNNING: on a progress engine inside the next
``progress`` (``doca_rdma_connect``: "Once called, doca_pe_progress() should
be called, in order to transition the ctx to DOCA_CTX_STATE_RUNNING state"),
on a WorkQ (the DOCA 2.0 job API, which has no STARTING) at once. Receive
jobs may be submitted while STARTING: they are posted to the queue pair in
INIT, so a peer's first send finds them. Every other job needs RUNNING
(BAD_STATE). `export_connection` and ``connect(blob, connection)`` are the
connection-aware forms (each export a further `RdmaConnection`).

Connected by descriptor, a context is one RC connection. Connected by
address (``rdmakit.doca.rdma_cm``) it holds up to ``max_num_connections``,
each an `RdmaConnection` with a queue pair of its own; the first uses the
queue pair made at ``start``, and every one completes through the context.

The connection state (`Rdma.rdma_state`, ``enum doca_rdma_state``) follows the
queue pair made at ``start``: RESET before ``start`` and after ``stop``, INIT once
started, CONNECTED once connected, ERROR once a job failed (IBTA Vol. 1
§10.3.1: the QP moved to the Error state). In ERROR every job in flight and
every later job completes with IO_FAILED (flushed) until the recovery flow:
``workq_rm``, ``stop``, ``start``, ``export``, ``connect`` again, on both
sides (the peer's QP is in ERROR too when it refused a request).

The jobs, and how each becomes a work request, are in ``rdmakit.doca.rdma_jobs``;
the tasks of DOCA 2.5+ (``task_<x>_set_conf``, ``task_<x>_allocate_init``) are
in ``rdmakit.doca.rdma_tasks`` and run as those jobs.

Permissions (guide §5.1.4, "summary of necessary permissions"), enforced on
both sides:

===========================  =====================  ======================  =====================
job (requester)              requester local mmap   responder mmap          responder Rdma ctx
===========================  =====================  ======================  =====================
receive (dst)                LOCAL_READ_WRITE       -                       -
send, send-imm (src)         any                    (its receive dst:       -
                                                    LOCAL_READ_WRITE)
read (dst)                   LOCAL_READ_WRITE       RDMA_READ               RDMA_READ
write, write-imm (src)       any                    RDMA_WRITE              RDMA_WRITE
atomics (result)             LOCAL_READ_WRITE       RDMA_ATOMIC             RDMA_ATOMIC
===========================  =====================  ======================  =====================

What the requester's own device would refuse without touching the network is
refused at submit with a raised `DocaError` and the connection stays usable:
a destination whose mmap lacks LOCAL_READ_WRITE (NOT_PERMITTED), a buffer on
the wrong side (local where remote is needed, INVALID_VALUE), memory not
registered on this device (NOT_FOUND), a request that cannot fit (INVALID_VALUE).
What only the responder can decide, it decides, as a NIC does: its memory
keys (the mmap permissions become the MR access flags) and its queue pair's
access flags (the Rdma context permissions) are checked by the responding
engine. A refusal comes back as a NAK: the job's event is IO_FAILED with the
`DocaError` of the work-completion status (remote access error: NOT_PERMITTED;
remote invalid request, e.g. the context lacks the permission: INVALID_VALUE;
fault PEER) and a message saying which permission the job needed, and the
connection is in ERROR. The remote mmap descriptor's claimed permissions are
not checked at submit: the peer's device is the authority (a tampered
descriptor cannot grant anything), and the error message quotes the claim.

Progress: the context's queue pair lives on its device, whose pump the
device's `ProgressEngine` runs (``rdmakit.doca.pe``); the context collects
its completions when the engine of its WorkQ progresses it. Every context on
one engine is progressed by any of its WorkQs, so a wait on one WorkQ never
starves a connection whose other end another WorkQ of the thread serves.
Like DOCA, contexts are not thread-safe.
"""

import itertools
from collections.abc import Mapping
from dataclasses import replace
from enum import IntEnum

from rdmakit.doca.backend import BackendQP, BackendSRQ
from rdmakit.doca.buf import plan_holds
from rdmakit.doca.ctx import CtxState, Event, Job, _Sink
from rdmakit.doca.descriptor import ConnectionDescriptor
from rdmakit.doca.device import Dev
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.rdma_conns import RdmaConnection
from rdmakit.doca.rdma_jobs import (
    JOBS,
    JobSpec,
    Planning,
    Posted,
    RdmaAtomicCmpSwpJob,
    RdmaAtomicFetchAddJob,
    RdmaJob,
    RdmaOpcode,
    RdmaReadJob,
    RdmaRecvJob,
    RdmaResult,
    RdmaSendImmJob,
    RdmaSendJob,
    RdmaWriteImmJob,
    RdmaWriteJob,
    _OnConnection,
    wc_error,
)
from rdmakit.doca.rdma_props import RDMA_PERMISSIONS, RdmaPropsApi, RdmaTransportType
from rdmakit.engine.states import QpState
from rdmakit.engine.types import Completion, QpCaps, RecvWR, SendWR, WcOpcode, WcStatus

__all__ = [
    "RDMA_PERMISSIONS",
    "Rdma",
    "RdmaAtomicCmpSwpJob",
    "RdmaAtomicFetchAddJob",
    "RdmaJob",
    "RdmaOpcode",
    "RdmaReadJob",
    "RdmaRecvJob",
    "RdmaResult",
    "RdmaSendImmJob",
    "RdmaSendJob",
    "RdmaState",
    "RdmaTransportType",
    "RdmaWriteImmJob",
    "RdmaWriteJob",
]


#: Completions taken from a queue pair per poll (fewer: it is drained).
_POLL = 64


class RdmaState(IntEnum):
    """``enum doca_rdma_state`` (``doca_rdma.h``): the connection's state."""

    RESET = 0  # not started, or stopped
    INIT = 1  # started; receives may be posted; not connected yet
    CONNECTED = 2  # connected: jobs run
    ERROR = 3  # a job failed (QP in the Error state, IBTA §10.3.1); recover with stop/start


class Rdma(RdmaPropsApi):
    """A DOCA RDMA context (``doca_rdma``): RC connections, one by descriptor or several by address."""

    def __init__(self, dev: Dev | None = None) -> None:
        """``doca_rdma_create(dev, &rdma)``: a context on `dev`; without one, `add_dev` before start."""
        super().__init__()
        self._qp: BackendQP | None = None
        self._qp_key: tuple[QpCaps, int, bool] | None = None  # what the QP was created with
        self._srq: BackendSRQ | None = None  # the connections' shared receive queue (several of them)
        self._posted: dict[int, Posted] = {}
        self._wr_ids = itertools.count(1)
        # What start decides once for every job: the planning limits and the job classes the
        # device runs. The epoch changes at each start and flush, and with it every plan.
        self._planning: Planning | None = None
        self._runs: dict[type[Job], JobSpec] = {}
        self._epoch = 0
        self._error: DocaError | None = None
        self._export_ids = itertools.count(1)  # export_connection's handles: -1, -2, ...
        if dev is not None:
            self.add_dev(dev)

    # -- connection ----------------------------------------------------------------------------

    @property
    def rdma_state(self) -> RdmaState:
        """The connection state (``doca_rdma_get_state``) of the queue pair made at start.

        With several connections by address, each `RdmaConnection` has its own ``state``.
        """
        qp = self._qp
        if qp is None or self._state is CtxState.IDLE:
            return RdmaState.RESET
        st = qp.state
        if st is QpState.ERR or st is QpState.SQE:
            return RdmaState.ERROR
        if st >= QpState.RTR:
            return RdmaState.CONNECTED
        return RdmaState.INIT

    @property
    def error(self) -> DocaError | None:
        """Why the connection is in ERROR (the first failed job's error), if known."""
        return self._error

    @property
    def qpn(self) -> int | None:
        return None if self._qp is None else self._qp.qpn

    def _start(self) -> bool:
        dev = self.dev
        if dev is None:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "no device: add_dev before start")
        backend = dev.backend
        caps = backend.caps
        qp_caps, gid_index = self._qp_caps(dev)
        key = (qp_caps, gid_index, self._cm_max > 1)
        if self._qp is not None and self._qp_key != key:
            self._qp.close()
            self._qp = None
        if self._qp is None:
            if key[2]:  # receive on any connection: IBTA §10.2.9, one queue for every QP
                self._srq = backend.create_srq(self._recv_queue_size, self._recv_buf_chain_len)
            self._qp = backend.create_qp(qp_caps, gid_index, self._srq)
            self._qp_key = key
        self._qp.connect_attrs = replace(self._qp.connect_attrs, rnr_retry=self._rnr_retry)
        # IBTA §10.6.3.1: the responder's remote-access rights are the QP's access flags.
        self._qp.init(self._qp_access())
        self._planning = Planning(dev, caps.max_sge, self._recv_buf_chain_len)
        self._runs = {cls: spec for cls, spec in JOBS.items() if spec.job_type in caps.job_types}
        self._epoch += 1
        self._error = None
        self._by_descriptor = False
        return False  # STARTING until connect()

    def _new_qp(self) -> BackendQP:
        """The queue pair of a further connection by address: made like the start one, in INIT."""
        dev = self.dev
        if dev is None or self._qp_key is None:
            raise DocaError(DocaErrorCode.BAD_STATE, "the RDMA context is not started")
        qp = dev.backend.create_qp(self._qp_key[0], self._qp_key[1], self._srq)
        qp.connect_attrs = replace(qp.connect_attrs, rnr_retry=self._rnr_retry)
        try:
            qp.init(self._qp_access())
        except BaseException:
            qp.close()
            raise
        return qp

    def _check_exportable(self, what: str) -> BackendQP:
        self._check_not_closed()
        if self._qp is None or self._state not in (CtxState.STARTING, CtxState.RUNNING):
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"{what} needs a started context; it is {self._state.name}"
            )
        return self._qp

    def _with_mtu(self, info: Mapping[str, object]) -> dict[str, object]:
        """`info` with its path MTU no larger than `set_mtu`'s (the exported and the connected one)."""
        out = dict(info)
        mtu = out.get("mtu")
        if self._mtu is not None and type(mtu) is int:
            out["mtu"] = min(mtu, self._mtu)
        return out

    def _descriptor(self, qp: BackendQP) -> bytes:
        return ConnectionDescriptor.from_backend(self._with_mtu(qp.export())).to_bytes()

    def export(self) -> bytes:
        """This side's connection descriptor, ``rdmakit.connection/1`` (DOCA 2.5 ``doca_rdma_export``).

        The descriptor of the queue pair made at ``start``; `connect` without a
        connection connects it. `export_connection` is the newer form.
        """
        return self._descriptor(self._check_exportable("export"))

    def export_connection(self) -> tuple[bytes, RdmaConnection]:
        """A new connection and its descriptor (the connection-aware ``doca_rdma_export``).

        Each call "returns" a further `RdmaConnection` (out parameter
        ``rdma_connection``) with a queue pair of its own, the first one the
        queue pair made at ``start``; `connect` names it. FULL when the context
        holds ``max_num_connections`` connections ("DOCA_ERROR_FULL - if all
        connections are being used").
        """
        self._check_exportable("export")
        self._cm_check_room()
        conn = RdmaConnection(self, self, -next(self._export_ids), self._cm_free_id(), ("", 0), b"")
        qp = self._cm_give_qp(conn)
        try:
            blob = self._descriptor(qp)
        except BaseException:
            self._cm_take_back_qp(conn)
            raise
        conn._state = "connecting"
        self._cm_conns[conn._handle] = conn
        return blob, conn

    def connect(
        self,
        remote: bytes | bytearray | memoryview | ConnectionDescriptor,
        connection: RdmaConnection | None = None,
    ) -> None:
        """Connect to the peer that exported `remote` (``doca_rdma_connect``).

        `connection` names one `export_connection` made (the connection-aware
        header); None connects the queue pair made at ``start`` (DOCA 2.5).
        "Can only be called when the ctx is in DOCA_CTX_STATE_STARTING state":
        BAD_STATE otherwise, and for a connection already connected. On a
        progress engine the context becomes RUNNING in the next ``progress``
        ("Once called, doca_pe_progress() should be called, in order to
        transition the ctx to DOCA_CTX_STATE_RUNNING state"); on a WorkQ (the
        DOCA 2.0 job API, synchronous) at once. A descriptor that does not
        parse, or that the queue pair cannot connect to, is CONNECTION_ABORTED
        ("if connection failed or connection details object was corrupted"),
        with the field named.
        """
        self._check_not_closed()
        if self._qp is None or self._state is not CtxState.STARTING:
            raise DocaError(
                DocaErrorCode.BAD_STATE,
                f"connect needs a STARTING context; it is {self._state.name} (stop and start to reconnect)",
            )
        if connection is None:
            if self.rdma_state is not RdmaState.INIT or self._cm_primary is not None:
                raise DocaError(
                    DocaErrorCode.BAD_STATE,
                    f"the connection is {self.rdma_state.name}; name the exported connection to connect",
                )
            qp = self._qp
        else:
            if not isinstance(connection, RdmaConnection) or connection._ctx is not self:
                raise DocaError(
                    DocaErrorCode.INVALID_VALUE, f"{connection!r} is not a connection of this context"
                )
            if connection._handle >= 0 or connection._state != "connecting" or connection._qp is None:
                raise DocaError(
                    DocaErrorCode.BAD_STATE,
                    f"{connection!r} is not an exported connection waiting to connect",
                )
            qp = connection._qp
        try:
            desc = (
                remote
                if isinstance(remote, ConnectionDescriptor)
                else ConnectionDescriptor.from_bytes(remote)
            )
            qp.connect(self._with_mtu(desc.to_backend()))
        except DocaError as e:
            if e.code is not DocaErrorCode.INVALID_VALUE:
                raise
            raise DocaError(
                DocaErrorCode.CONNECTION_ABORTED, f"the peer's connection details: {e.message}", e.fault
            ) from e
        if connection is None:
            self._by_descriptor = True
        else:
            connection._state = "established"
        self._connected()

    def _stop(self) -> None:
        self._cm_release()  # every connection by address disconnected
        self._flush("RDMA context stopped")
        self._cm_close_qps()
        if self._srq is not None:
            self._close_srq()  # its receives were flushed above; a new start makes a new one
        elif self._qp is not None:
            self._qp.reset()  # back to RESET; start() re-initialises it with a fresh PSN

    def _close_srq(self) -> None:
        """The start queue pair, then the SRQ it shares with the other connections' (all closed)."""
        if self._qp is not None:
            self._qp.close()
            self._qp = None
        if self._srq is not None:
            self._srq.close()
            self._srq = None

    def _cancel(self) -> None:
        self._posted.clear()
        self._epoch += 1  # a flushed work request's late completion must not match a new plan
        for qp in self._cm_lanes():
            qp.to_error()  # the buffers of flushed jobs are the caller's again

    def _close(self) -> None:
        self._cm_release()
        self._cm_close_qps()
        self._close_srq()
        if self._qp is not None:
            self._qp.close()
            self._qp = None

    # -- submission ----------------------------------------------------------------------------

    def _dispatch(self, job: Job, sink: _Sink) -> None:
        qp = self._qp
        if (
            isinstance(job, _OnConnection)
            and (posted := job._plan) is not None
            and posted.lane is qp
            and qp is not None
            and self._state is CtxState.RUNNING
            and not self._cm_conns
            and job.connection is None
            and posted.epoch == self._epoch
            and plan_holds(posted.bufs, posted.state)
        ):
            # The steady state of a job submitted again (`Posted.fits`): the same plan on the start
            # queue pair, checked and posted here (`_post` inline; DOCA's WQE written again). The
            # pending entry is the plan's own while the sink is the same: nothing is made.
            key = posted.key
            pending = self._pending
            if key in pending:
                raise DocaError(DocaErrorCode.IN_USE, "this job object is already in flight")
            entry = posted.entry
            if entry is None or entry[1] is not sink:
                entry = posted.entry = (job, sink)
            pending[key] = entry
            posted.conn = None
            wr = posted.wr
            assert wr is not None
            self._posted[wr.wr_id] = posted
            try:
                if type(wr) is SendWR:
                    qp.post_send(wr)
                else:
                    qp.post_recv(wr)  # type: ignore[arg-type]
            except BaseException:
                del self._posted[wr.wr_id]
                pending.pop(key, None)
                raise
            ready = qp.ready
            if ready is None or ready:  # a flush completes into the ring at once: none, no flush
                st = qp.state
                if st is QpState.ERR or st is QpState.SQE:
                    self._reap()  # flushed at once: deliver now, before the caller arms its WorkQ
            return
        if self._state is CtxState.STARTING and isinstance(job, RdmaRecvJob):
            # Guide §5 (receive): posted before the peer's send; the QP in INIT takes it.
            self._check_not_closed()
            key = id(job)
            if key in self._pending:
                raise DocaError(DocaErrorCode.IN_USE, "this job object is already in flight")
            self._pending[key] = (job, sink)
            try:
                self._submit(job)
            except BaseException:
                self._pending.pop(key, None)
                raise
            return
        super()._dispatch(job, sink)

    def _submit(self, job: Job) -> None:
        if not isinstance(job, _OnConnection) or type(job) not in JOBS:
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{type(job).__name__} is not an RDMA job")
        srq = self._srq if isinstance(job, RdmaRecvJob) else None
        if srq is not None:
            if job.connection is not None:
                raise DocaError(
                    DocaErrorCode.INVALID_VALUE,
                    "with several connections a receive takes none: the message of any connection "
                    "completes it (get_result_rdma_connection says which)",
                    Fault.CALLER,
                )
            qp, conn = self._qp, None
        else:
            qp, conn = self._cm_route(job.connection, isinstance(job, RdmaRecvJob))
        dev, planning = self.dev, self._planning
        if qp is None or dev is None or planning is None:
            raise DocaError(DocaErrorCode.BAD_STATE, "the RDMA context has no queue pair")
        spec = self._runs.get(type(job))
        if spec is None:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"{dev.name} does not run {JOBS[type(job)].job_type.value} jobs",
                Fault.SYSTEM,
            )
        posted = job._plan
        if posted is None or not posted.fits(self._epoch):
            posted, planned = spec.plan(job, next(self._wr_ids), planning)
            posted.wr = planned
            posted.plan_for(self._epoch, spec.bufs(job))
            posted.key = id(job)
            object.__setattr__(job, "_plan", posted)  # the job's private cache, not a field
        if srq is not None:
            posted.lane = posted.conn = None  # its connection is the one whose queue pair completes it
            self._post(posted, None, srq)
        else:
            posted.lane, posted.conn = qp, conn
            self._post(posted, qp, None)

    def _post(self, posted: Posted, qp: BackendQP | None, srq: BackendSRQ | None) -> None:
        """Post `posted`'s work request to `qp`, or to `srq` (a receive of several connections)."""
        wr = posted.wr
        assert wr is not None
        self._posted[wr.wr_id] = posted
        try:
            if srq is not None and isinstance(wr, RecvWR):
                srq.post_recv(wr)
                return
            assert qp is not None
            if isinstance(wr, RecvWR):
                qp.post_recv(wr)
            else:
                qp.post_send(wr)
        except BaseException:
            del self._posted[wr.wr_id]
            raise
        if qp.state in (QpState.ERR, QpState.SQE):
            self._reap()  # flushed at once: deliver now, before the caller arms its WorkQ

    # -- completion ----------------------------------------------------------------------------

    def _progress(self) -> bool:
        """Collect this connection's completions (the device's pump did the I/O)."""
        if self._closed:
            return False
        qp = self._qp
        if self._cm_hub is None and not self._cm_conns and not self._cm_retired:
            # By descriptor (the common case): the start queue pair is the only lane; `_reap`
            # inline, one poll when it is idle.
            if qp is None:
                return False
            ready = qp.ready
            if ready is not None and not ready:
                return False  # nothing to take: the idle turn makes no call of the backend
            wcs = qp.poll(_POLL)
            if not wcs:
                return False
            for wc in wcs:
                self._on_completion(wc, qp)
            if len(wcs) == _POLL:
                self._reap()  # more may wait
            return True
        # Connection events (by address only): their callbacks run here, in progress.
        busy = self._cm_hub is not None and self._cm_progress()
        return self._reap() or busy

    def _reap(self) -> bool:
        """Completions of every connection's queue pair, the start one first."""
        got = False
        qp = self._qp
        # By descriptor (the common case) the start queue pair is the only lane: no list to build.
        lanes = self._cm_lanes() if self._cm_conns or self._cm_retired else () if qp is None else (qp,)
        for qp in lanes:
            while not self._closed:
                wcs = qp.poll(_POLL)
                if not wcs:
                    break
                got = True
                for wc in wcs:
                    self._on_completion(wc, qp)
                if len(wcs) < _POLL:
                    break  # drained: the next progress finds what the device adds meanwhile
        if self._cm_retired:
            self._cm_drop_drained(p.lane for p in self._posted.values() if p.lane is not None)
        return got

    def _on_completion(self, wc: Completion, lane: BackendQP) -> None:
        posted = self._posted.pop(wc.wr_id, None)
        if posted is None:
            return
        job = posted.job
        key = posted.key
        entry = self._pending.get(key)
        if entry is None or entry[0] is not job:
            return  # a job flushed by stop or WorkQ close: forgotten (`Ctx._in_flight`, inline)
        qp, conn = posted.lane, posted.conn
        if qp is None:  # a receive of the SRQ: it belongs to the connection it came on
            qp, conn = lane, self._cm_conn_of(lane)
        if wc.status != WcStatus.SUCCESS:
            fault = qp.transport_fault() if qp is not None else None
            cause = conn.error if conn is not None and conn.error is not None else self._error
            error = wc_error(posted, wc, cause, fault)
            if wc.status != WcStatus.WR_FLUSH_ERR:
                if self._error is None:
                    self._error = error
                if conn is not None and conn.error is None:
                    conn._error = error
            if qp is not None:
                qp.to_error()  # IBTA §10.3.1: an RC error completion leaves the QP in Error
            self._complete(job, error=error)
            return
        if isinstance(job, RdmaRecvJob):
            if wc.opcode == WcOpcode.RECV_RDMA_WITH_IMM:
                opcode = RdmaOpcode.RECV_WRITE_WITH_IMM  # the data went to memory, not dst_buf
            else:
                opcode = RdmaOpcode.RECV_SEND if wc.imm_data is None else RdmaOpcode.RECV_SEND_WITH_IMM
                left = wc.byte_len
                for buf, room in posted.parts:
                    n = min(left, room)
                    if n:
                        buf.commit_append(n)
                    left -= n
            result = RdmaResult(opcode=opcode, length=wc.byte_len, immediate=wc.imm_data, connection=conn)
            self._complete(job, result=result)
            return
        if posted.parts:  # (no iterator made for a job without local appends)
            for buf, n in posted.parts:
                buf.commit_append(n)
        if posted.remote_append is not None:
            posted.remote_append.commit_append(posted.length)
        ok = posted.ok
        if ok is None or not isinstance(ok.result, RdmaResult) or ok.result.connection is not conn:
            ok = posted.ok = Event(job=job, result=RdmaResult(length=posted.length, connection=conn))
        # `Ctx._complete(job, event=ok)` inline: `entry` is the job's, fetched above.
        del self._pending[key]
        entry[1]._deliver(ok)
        if self._state is CtxState.STOPPING:
            self._check_drained()

    def __repr__(self) -> str:
        qpn = "" if self._qp is None else f" qpn={self._qp.qpn:#x}"
        return f"<Rdma {self._state.name} {self.rdma_state.name}{qpn} inflight={len(self._pending)}>"
