"""DOCA RDMA (DOCA RDMA guide ch. 4-5, ``doca_rdma.h``): RC connections as a DOCA context.

Lifecycle (guide §4, "Configuring DOCA RDMA instances")::

    Rdma() -> add_dev -> set_* (IDLE) -> start            ctx STARTING, rdma_state INIT
           -> export() (send to the peer out of band)
           -> connect(peer's descriptor)                   ctx RUNNING,  rdma_state CONNECTED
           -> jobs ...                                     a failed job: rdma_state ERROR
           -> stop                                         ctx IDLE,     rdma_state RESET

As in DOCA 2.5 and later, ``start`` leaves the context STARTING (C
``doca_ctx_start`` returns ``DOCA_ERROR_IN_PROGRESS``) and ``connect`` moves
it to RUNNING. Receive jobs may be submitted while STARTING: they are posted
to the queue pair in INIT, so a peer's first send finds them. Every other job
needs RUNNING (BAD_STATE).

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
from enum import IntEnum

from rdmakit.doca.backend import BackendQP, JobType
from rdmakit.doca.ctx import CtxState, Job, _Sink
from rdmakit.doca.descriptor import ConnectionDescriptor
from rdmakit.doca.device import Dev, DevInfo
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.mmap import AccessFlag
from rdmakit.doca.rdma_cm import RdmaCmApi
from rdmakit.doca.rdma_jobs import (
    JOBS,
    U32,
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
    check_uint,
    wc_error,
)
from rdmakit.engine.states import QpState
from rdmakit.engine.types import Access, Completion, QpCaps, RecvWR, WcOpcode, WcStatus

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


class RdmaState(IntEnum):
    """``enum doca_rdma_state`` (``doca_rdma.h``): the connection's state."""

    RESET = 0  # not started, or stopped
    INIT = 1  # started; receives may be posted; not connected yet
    CONNECTED = 2  # connected: jobs run
    ERROR = 3  # a job failed (QP in the Error state, IBTA §10.3.1); recover with stop/start


class RdmaTransportType(IntEnum):
    """``enum doca_rdma_transport_type``."""

    RC = 0  # reliable connection
    DC = 1  # dynamically connected: not supported (as in DOCA without a DC-capable NIC)


#: The permissions an Rdma context may grant (``doca_rdma_set_permissions``).
RDMA_PERMISSIONS = (
    AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC
)


class Rdma(RdmaCmApi):
    """A DOCA RDMA context (``doca_rdma``): RC connections, one by descriptor or several by address."""

    def __init__(self) -> None:
        super().__init__()
        self._permissions = AccessFlag.LOCAL_READ_WRITE  # DOCA's default: no remote access
        self._gid_index: int | None = None  # None: the device's own
        self._send_queue_size = 64
        self._recv_queue_size = 64
        self._recv_buf_chain_len = 1
        self._transport_type = RdmaTransportType.RC
        self._qp: BackendQP | None = None
        self._qp_key: tuple[QpCaps, int] | None = None  # what the QP was created with
        self._posted: dict[int, Posted] = {}
        self._wr_ids = itertools.count(1)
        self._error: DocaError | None = None

    # -- capabilities -------------------------------------------------------------------------

    @staticmethod
    def job_get_supported(devinfo: DevInfo, job_type: JobType) -> None:
        """NOT_SUPPORTED unless the device runs `job_type` (``doca_rdma_job_get_supported``)."""
        if not devinfo.is_job_supported(job_type):
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"{devinfo.name} does not support {job_type.value} jobs",
                Fault.SYSTEM,
            )

    # -- configuration (IDLE only) -------------------------------------------------------------

    @property
    def dev(self) -> Dev | None:
        return self._devs[0] if self._devs else None

    @property
    def permissions(self) -> AccessFlag:
        """What the peer may do through this connection (the responder QP's access flags)."""
        return self._permissions

    def set_permissions(self, permissions: int) -> None:
        """Grant RDMA access flags (``doca_rdma_set_permissions``); non-RDMA flags are INVALID_VALUE."""
        self._require_idle("set_permissions")
        if type(permissions) is not int and not isinstance(permissions, AccessFlag):
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"permissions must be AccessFlag, got {permissions!r}"
            )
        if permissions < 0 or permissions & ~RDMA_PERMISSIONS:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"permissions {permissions:#x} include flags other than LOCAL_READ_WRITE, RDMA_READ, "
                "RDMA_WRITE, RDMA_ATOMIC",
            )
        self._permissions = AccessFlag(permissions)

    @property
    def gid_index(self) -> int:
        """The GID index set with `set_gid_index`, else the device's (0 without a device)."""
        if self._gid_index is None:
            dev = self.dev
            return 0 if dev is None or dev.closed else dev.backend.gid_index
        return self._gid_index

    def set_gid_index(self, gid_index: int) -> None:
        """Select the port GID the connection uses (``doca_rdma_set_gid_index``).

        The queue pair's address vector (source GID index) and the exported
        connection descriptor use the GID at this index of the device's table;
        INVALID_VALUE unless it holds a RoCE v2 GID. The default is the
        device's own (`BackendDevice.gid_index`).
        """
        self._require_idle("set_gid_index")
        check_uint("gid_index", gid_index, U32)
        dev = self.dev
        if dev is not None:
            self._check_gid(dev, gid_index)
        self._gid_index = gid_index

    @staticmethod
    def _check_gid(dev: Dev, gid_index: int) -> None:
        if dev.backend.gid_at(gid_index) is None:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"{dev.name} has no RoCE v2 GID at index {gid_index} "
                f"(it has {len(dev.backend.gids)}, at index 0 to {len(dev.backend.gids) - 1})",
            )

    @property
    def send_queue_size(self) -> int:
        return self._send_queue_size

    @property
    def recv_queue_size(self) -> int:
        return self._recv_queue_size

    @staticmethod
    def _queue_size(name: str, size: int) -> int:
        if type(size) is not int or not 1 <= size <= U32:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{name} must be a positive integer, got {size!r}")
        return 1 << (size - 1).bit_length()  # DOCA rounds up to a power of two

    def set_send_queue_size(self, size: int) -> None:
        """Send queue depth, rounded up to a power of two (``doca_rdma_set_send_queue_size``)."""
        self._require_idle("set_send_queue_size")
        self._send_queue_size = self._queue_size("send queue size", size)

    def set_recv_queue_size(self, size: int) -> None:
        """Receive queue depth, rounded up to a power of two (``doca_rdma_set_recv_queue_size``)."""
        self._require_idle("set_recv_queue_size")
        self._recv_queue_size = self._queue_size("receive queue size", size)

    @property
    def recv_buf_chain_len(self) -> int:
        return self._recv_buf_chain_len

    def set_recv_buf_chain_len(self, length: int) -> None:
        """Longest buffer chain a receive job may use (``doca_rdma_set_recv_buf_chain_len``)."""
        self._require_idle("set_recv_buf_chain_len")
        if type(length) is not int or length < 1:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"recv_buf_chain_len must be positive, got {length!r}"
            )
        self._recv_buf_chain_len = length

    @property
    def transport_type(self) -> RdmaTransportType:
        return self._transport_type

    def set_transport_type(self, transport_type: int) -> None:
        """RC only; DC is NOT_SUPPORTED (``doca_rdma_set_transport_type``)."""
        self._require_idle("set_transport_type")
        try:
            t = RdmaTransportType(transport_type)
        except ValueError:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"unknown transport type {transport_type!r}"
            ) from None
        if t is not RdmaTransportType.RC:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, f"{t.name} transport is not supported; use RC", Fault.SYSTEM
            )
        self._transport_type = t

    def _check_dev(self, dev: Dev) -> None:
        if self._devs:
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, "an RDMA context uses exactly one device")
        caps = dev.backend.caps
        if JobType.RDMA_SEND not in caps.job_types:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"{dev.name} ({dev.info.kind}) cannot run RDMA jobs",
                Fault.CALLER,
            )

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

    def _qp_access(self) -> Access:
        access = Access.NONE
        if AccessFlag.RDMA_READ in self._permissions:
            access |= Access.REMOTE_READ
        if AccessFlag.RDMA_WRITE in self._permissions:
            access |= Access.REMOTE_WRITE
        if AccessFlag.RDMA_ATOMIC in self._permissions:
            access |= Access.REMOTE_ATOMIC
        return access

    def _start(self) -> bool:
        dev = self.dev
        if dev is None:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "no device: add_dev before start")
        backend = dev.backend
        caps = backend.caps
        for name, size in (("send", self._send_queue_size), ("receive", self._recv_queue_size)):
            if size > caps.max_qp_wr:
                raise DocaError(
                    DocaErrorCode.NOT_SUPPORTED,
                    f"{name} queue size {size} exceeds {dev.name}'s {caps.max_qp_wr}",
                    Fault.CALLER,
                )
        if self._recv_buf_chain_len > caps.max_sge:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"recv_buf_chain_len {self._recv_buf_chain_len} exceeds {dev.name}'s {caps.max_sge}",
                Fault.CALLER,
            )
        gid_index = backend.gid_index if self._gid_index is None else self._gid_index
        self._check_gid(dev, gid_index)
        qp_caps = QpCaps(
            max_send_wr=self._send_queue_size,
            max_recv_wr=self._recv_queue_size,
            max_send_sge=caps.max_sge,
            max_recv_sge=self._recv_buf_chain_len,
        )
        key = (qp_caps, gid_index)
        if self._qp is not None and self._qp_key != key:
            self._qp.close()
            self._qp = None
        if self._qp is None:
            self._qp = backend.create_qp(qp_caps, gid_index)
            self._qp_key = key
        # IBTA §10.6.3.1: the responder's remote-access rights are the QP's access flags.
        self._qp.init(self._qp_access())
        self._error = None
        self._by_descriptor = False
        return False  # STARTING until connect()

    def _new_qp(self) -> BackendQP:
        """The queue pair of a further connection by address: made like the start one, in INIT."""
        dev = self.dev
        if dev is None or self._qp_key is None:
            raise DocaError(DocaErrorCode.BAD_STATE, "the RDMA context is not started")
        qp = dev.backend.create_qp(*self._qp_key)
        try:
            qp.init(self._qp_access())
        except BaseException:
            qp.close()
            raise
        return qp

    def export(self) -> bytes:
        """This side's connection descriptor, ``rdmakit.connection/1`` (``doca_rdma_export``)."""
        self._check_not_closed()
        if self._qp is None or self._state not in (CtxState.STARTING, CtxState.RUNNING):
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"export needs a started context; it is {self._state.name}"
            )
        return ConnectionDescriptor.from_backend(self._qp.export()).to_bytes()

    def connect(self, remote: bytes | bytearray | memoryview | ConnectionDescriptor) -> None:
        """Connect to the peer that exported `remote` (``doca_rdma_connect``): RUNNING, CONNECTED.

        A malformed descriptor is INVALID_VALUE naming the field; connecting
        twice, or before ``start``, is BAD_STATE.
        """
        self._check_not_closed()
        if self._state is CtxState.RUNNING:
            raise DocaError(DocaErrorCode.BAD_STATE, "already connected (stop and start to reconnect)")
        if self._qp is None or self._state is not CtxState.STARTING:
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"connect needs a started context; it is {self._state.name}"
            )
        if self.rdma_state is not RdmaState.INIT or self._cm_conns:
            raise DocaError(
                DocaErrorCode.BAD_STATE,
                f"the connection is {self.rdma_state.name} (by address: {len(self._cm_conns)}); "
                "stop and start again",
            )
        desc = remote if isinstance(remote, ConnectionDescriptor) else ConnectionDescriptor.from_bytes(remote)
        self._qp.connect(desc.to_backend())
        self._by_descriptor = True
        self._connected()

    def _stop(self) -> None:
        self._cm_release()  # every connection by address disconnected
        self._flush("RDMA context stopped")
        self._cm_close_qps()
        if self._qp is not None:
            self._qp.reset()  # back to RESET; start() re-initialises it with a fresh PSN

    def _cancel(self) -> None:
        self._posted.clear()
        for qp in self._cm_lanes():
            qp.to_error()  # the buffers of flushed jobs are the caller's again

    def _close(self) -> None:
        self._cm_release()
        self._cm_close_qps()
        if self._qp is not None:
            self._qp.close()
            self._qp = None

    # -- submission ----------------------------------------------------------------------------

    def _dispatch(self, job: Job, sink: _Sink) -> None:
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
        dev = self.dev
        spec = JOBS.get(type(job))
        if spec is None or not isinstance(job, _OnConnection):
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{type(job).__name__} is not an RDMA job")
        qp, conn = self._cm_route(job.connection, isinstance(job, RdmaRecvJob))
        if qp is None or dev is None:
            raise DocaError(DocaErrorCode.BAD_STATE, "the RDMA context has no queue pair")
        caps = dev.backend.caps
        if spec.job_type not in caps.job_types:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"{dev.name} does not run {spec.job_type.value} jobs",
                Fault.SYSTEM,
            )
        wr_id = next(self._wr_ids)
        posted, wr = spec.plan(job, wr_id, Planning(dev, caps.max_sge, self._recv_buf_chain_len))
        posted.lane, posted.conn = qp, conn
        self._posted[wr_id] = posted
        try:
            if isinstance(wr, RecvWR):
                qp.post_recv(wr)
            else:
                qp.post_send(wr)
        except BaseException:
            del self._posted[wr_id]
            raise
        if qp.state in (QpState.ERR, QpState.SQE):
            self._reap()  # flushed at once: deliver now, before the caller arms its WorkQ

    # -- completion ----------------------------------------------------------------------------

    def _progress(self) -> bool:
        """Collect this connection's completions (the device's pump did the I/O)."""
        if self._closed:
            return False
        busy = self._cm_progress()  # connection events: their callbacks run here, in progress
        return self._reap() or busy

    def _reap(self) -> bool:
        """Completions of every connection's queue pair, the start one first."""
        got = False
        for qp in self._cm_lanes():
            while not self._closed and (wcs := qp.poll(64)):
                got = True
                for wc in wcs:
                    self._on_completion(wc)
        if self._cm_retired:
            self._cm_drop_drained(p.lane for p in self._posted.values() if p.lane is not None)
        return got

    def _on_completion(self, wc: Completion) -> None:
        posted = self._posted.pop(wc.wr_id, None)
        if posted is None or not self._in_flight(posted.job):
            return  # a job flushed by stop or WorkQ close: forgotten
        job, qp, conn = posted.job, posted.lane, posted.conn
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
        for buf, n in posted.parts:
            buf.commit_append(n)
        if posted.remote_append is not None:
            posted.remote_append.commit_append(posted.length)
        self._complete(job, result=RdmaResult(length=posted.length, connection=conn))

    def __repr__(self) -> str:
        qpn = "" if self._qp is None else f" qpn={self._qp.qpn:#x}"
        return f"<Rdma {self._state.name} {self.rdma_state.name}{qpn} inflight={len(self._pending)}>"
