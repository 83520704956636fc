"""DOCA RDMA (DOCA RDMA guide ch. 4-5, ``doca_rdma.h``): one RC connection as a DOCA context.

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

The connection state (`Rdma.rdma_state`, ``enum doca_rdma_state``) follows the
backend queue pair: RESET before ``start`` and after ``stop``, INIT once
started, CONNECTED once connected, ERROR once a job failed (IBTA Vol. 1
§10.3.1: the QP moved to the Error state). In ERROR every job in flight and
every later job completes with IO_FAILED (flushed) until the recovery flow:
``workq_rm``, ``stop``, ``start``, ``export``, ``connect`` again, on both
sides (the peer's QP is in ERROR too when it refused a request).

Jobs (guide §5, ``struct doca_rdma_job_*``): a source buffer contributes its
data section, a chain of buffers one gather entry per element; a destination
buffer is appended to (its data length grows by what landed, element by
element along a chain). A remote buffer is a `Buf` of an `Mmap` made with
``Mmap.create_from_export``.

=======================  ====================================================================
job                      what it does
=======================  ====================================================================
`RdmaRecvJob`            receive the peer's next send / send-imm / write-imm into ``dst_buf``
`RdmaSendJob`            send ``src_buf`` (None: an empty message)
`RdmaSendImmJob`         the same, with a 32-bit ``immediate``
`RdmaReadJob`            read ``min(src data length, dst room)`` bytes of remote ``src_buf``
                         into local ``dst_buf``
`RdmaWriteJob`           write local ``src_buf`` at the end of remote ``dst_buf``'s data
`RdmaWriteImmJob`        the same, consuming a receive at the peer that gets ``immediate``
`RdmaAtomicCmpSwpJob`    if remote u64 at ``dst_buf.data`` == ``cmp``: set it to ``swap``
`RdmaAtomicFetchAddJob`  add ``add`` to the remote u64 at ``dst_buf.data``
=======================  ====================================================================

Atomics append the remote word's original value (8 bytes, the CPU's byte
order, like verbs) to ``result_buf``. A job's `Event` carries an `RdmaResult`:
the received opcode (receive jobs), the byte count and the immediate.

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

Event-driven mode: the context watches its backend queue pair's descriptor
(`Ctx._watch_fd`), so ``WorkQ(event_driven=True)`` wakes on packets and
engine timers. The soft backend pumps every soft device of the process at
once; whichever context pumps then also collects the completions of the
others sharing that pump and hands their events to their work queues, so a
wait on another WorkQ is never lost. Like DOCA, contexts are not thread-safe,
and contexts sharing the soft driver must be driven from one thread.
"""

import dataclasses
import itertools
import os
import weakref
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from rdmakit.doca.backend import BackendQP, JobType
from rdmakit.doca.buf import Buf
from rdmakit.doca.ctx import Ctx, CtxState, Job, _Sink
from rdmakit.doca.descriptor import ConnectionDescriptor
from rdmakit.doca.device import Dev, DevInfo
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault, error_from_wc_status
from rdmakit.doca.mmap import AccessFlag, MmapDescriptor
from rdmakit.engine.states import QpState
from rdmakit.engine.types import SGE, Access, Completion, QpCaps, RecvWR, SendWR, WcOpcode, WcStatus, WrOpcode

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


class RdmaOpcode(IntEnum):
    """``enum doca_rdma_opcode_t``: what a receive job received."""

    RECV_SEND = 0
    RECV_SEND_WITH_IMM = 1
    RECV_WRITE_WITH_IMM = 2


#: The permissions an Rdma context may grant (``doca_rdma_set_permissions``).
RDMA_PERMISSIONS = (
    AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC
)
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaResult:
    """The result of an RDMA job (``struct doca_rdma_result``), in ``Event.result``.

    ``opcode`` is set for receive jobs only. ``length`` is the byte count:
    received (for a write with immediate, the bytes the peer wrote), read,
    written, sent, or 8 for an atomic. ``immediate`` is the ImmDt u32 exactly
    as on the wire (``doca_be32_t``: big-endian there), so the value a sender
    passes arrives unchanged; `immediate_bytes` gives the four wire bytes.
    """

    opcode: RdmaOpcode | None = None
    length: int = 0
    immediate: int | None = None

    @property
    def immediate_bytes(self) -> bytes | None:
        return None if self.immediate is None else self.immediate.to_bytes(4, "big")


# -- jobs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaRecvJob(Job):
    """Receive the peer's next message (``DOCA_RDMA_JOB_RECV``).

    The message is appended to ``dst_buf`` (a chain of at most
    ``recv_buf_chain_len`` buffers). ``dst_buf`` may be None when the peer
    sends an empty message or writes with immediate.
    """

    dst_buf: Buf | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaSendJob(Job):
    """Send ``src_buf``'s data (``DOCA_RDMA_JOB_SEND``); None sends an empty message."""

    src_buf: Buf | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaSendImmJob(Job):
    """Send with a 32-bit immediate (``DOCA_RDMA_JOB_SEND_IMM``)."""

    src_buf: Buf | None = None
    immediate: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaReadJob(Job):
    """Read remote ``src_buf``'s data into local ``dst_buf`` (``DOCA_RDMA_JOB_READ``).

    The length is ``min(src_buf.data_len, room of dst_buf)``; the bytes are
    appended to ``dst_buf`` (scattered along its chain).
    """

    src_buf: Buf
    dst_buf: Buf


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaWriteJob(Job):
    """Write local ``src_buf``'s data after remote ``dst_buf``'s data (``DOCA_RDMA_JOB_WRITE``).

    It must fit in ``dst_buf``'s tailroom; on success ``dst_buf`` (this
    side's descriptor of the remote bytes) grows by the length.
    """

    src_buf: Buf
    dst_buf: Buf


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaWriteImmJob(Job):
    """Write with immediate (``DOCA_RDMA_JOB_WRITE_IMM``): also consumes a receive at the peer."""

    src_buf: Buf
    dst_buf: Buf
    immediate: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaAtomicCmpSwpJob(Job):
    """Compare and swap the remote u64 at ``dst_buf.data`` (``DOCA_RDMA_JOB_ATOMIC_CMP_SWP``).

    The word must be 8-byte aligned; its original value is appended to ``result_buf``.
    """

    dst_buf: Buf
    result_buf: Buf
    cmp: int
    swap: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaAtomicFetchAddJob(Job):
    """Add to the remote u64 at ``dst_buf.data`` (``DOCA_RDMA_JOB_ATOMIC_FETCH_ADD``).

    The original value is appended to ``result_buf``.
    """

    dst_buf: Buf
    result_buf: Buf
    add: int


RdmaJob = (
    RdmaRecvJob
    | RdmaSendJob
    | RdmaSendImmJob
    | RdmaReadJob
    | RdmaWriteJob
    | RdmaWriteImmJob
    | RdmaAtomicCmpSwpJob
    | RdmaAtomicFetchAddJob
)

_JOB_TYPE: dict[type[Job], JobType] = {
    RdmaRecvJob: JobType.RDMA_RECV,
    RdmaSendJob: JobType.RDMA_SEND,
    RdmaSendImmJob: JobType.RDMA_SEND_IMM,
    RdmaReadJob: JobType.RDMA_READ,
    RdmaWriteJob: JobType.RDMA_WRITE,
    RdmaWriteImmJob: JobType.RDMA_WRITE_IMM,
    RdmaAtomicCmpSwpJob: JobType.RDMA_ATOMIC_CMP_SWP,
    RdmaAtomicFetchAddJob: JobType.RDMA_ATOMIC_FETCH_ADD,
}

# The permission a remote operation needs on the responder's mmap and context (guide §5.1.4).
_NEEDS: dict[type[Job], AccessFlag] = {
    RdmaReadJob: AccessFlag.RDMA_READ,
    RdmaWriteJob: AccessFlag.RDMA_WRITE,
    RdmaWriteImmJob: AccessFlag.RDMA_WRITE,
    RdmaAtomicCmpSwpJob: AccessFlag.RDMA_ATOMIC,
    RdmaAtomicFetchAddJob: AccessFlag.RDMA_ATOMIC,
}


def _flag_names(flags: AccessFlag) -> str:
    names = [f.name for f in AccessFlag if f and f in flags and f.name]
    return "|".join(n for n in names if n) or "LOCAL_READ_ONLY"


def _check_uint(name: str, value: object, hi: int) -> int:
    if type(value) is not int or not 0 <= value <= hi:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE, f"{name} {value!r} is not an unsigned {hi.bit_length()}-bit integer"
        )
    return value


@dataclass(slots=True)
class _Posted:
    """A work request in flight: its job and what to do with the buffers when it succeeds."""

    job: Job
    what: str  # names the job in error messages: a format string for ``what_args``
    what_args: tuple[object, ...] = ()
    length: int = 0
    parts: list[tuple[Buf, int]] = dataclasses.field(default_factory=list)  # local appends
    remote_append: Buf | None = None  # a write's remote destination
    remote: MmapDescriptor | None = None


# -- backend queue-pair helpers ------------------------------------------------------------------
# BackendQP has no "init with access flags" and no "reset"; the soft QP has both
# (options + init(), reset()). Other backends get the closest fallback.


def _qp_init(qp: BackendQP, access: Access) -> None:
    """Set the responder access flags (IBTA §10.6.3.1: the QP's remote-access rights), RESET -> INIT."""
    options: Any = getattr(qp, "options", None)
    if isinstance(options, type) or not dataclasses.is_dataclass(options) or not hasattr(options, "access"):
        raise DocaError(
            DocaErrorCode.NOT_SUPPORTED, f"{type(qp).__name__} does not take QP access flags", Fault.SYSTEM
        )
    new = dataclasses.replace(options, access=int(access))  # type: ignore[type-var]
    # The soft QP's options are an attribute; the verbs glue exposes its QP's read-only.
    for holder in (qp, getattr(qp, "verbs", None)):
        try:
            holder.options = new  # type: ignore[union-attr]
            break
        except AttributeError:
            continue
    else:
        raise DocaError(
            DocaErrorCode.NOT_SUPPORTED, f"cannot set the access flags of {type(qp).__name__}", Fault.SYSTEM
        )
    init = getattr(qp, "init", None)
    if callable(init):
        init()


def _qp_break(qp: BackendQP) -> None:
    """Move the QP to the Error state (its outstanding work requests flush)."""
    engine = getattr(qp, "engine_qp", None)
    if engine is not None and engine.state not in (QpState.RESET, QpState.ERR):
        engine.modify(QpState.ERR)


# Every live Rdma context: a pump shared by several (the soft driver) collects for all of them.
_live: "weakref.WeakSet[Rdma]" = weakref.WeakSet()
# Bumped when a context joins, leaves or takes a pump: each context's list of the ones
# sharing its pump (built at its next progress) is then out of date.
_live_gen = 0


def _live_changed() -> None:
    global _live_gen
    _live_gen += 1


class Rdma(Ctx[Job]):
    """A DOCA RDMA context (``doca_rdma``): one RC connection to one peer."""

    def __init__(self) -> None:
        super().__init__()
        self._permissions = AccessFlag.LOCAL_READ_WRITE  # DOCA's default: no remote access
        self._gid_index = 0
        self._send_queue_size = 64
        self._recv_queue_size = 64
        self._recv_buf_chain_len = 1
        self._transport_type = RdmaTransportType.RC
        self._qp: BackendQP | None = None
        self._qp_caps: QpCaps | None = None
        self._pump = -1  # the backend QP's descriptor: contexts with equal ones share a pump
        self._fd = -1  # our duplicate of it, watched by the WorkQ
        self._posted: dict[int, _Posted] = {}
        self._wr_ids = itertools.count(1)
        self._error: DocaError | None = None
        self._peers: tuple[int, tuple[weakref.ref[Rdma], ...]] = (-1, ())
        _live.add(self)
        _live_changed()

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
        return self._gid_index

    def set_gid_index(self, gid_index: int) -> None:
        """Select the port GID to use (``doca_rdma_set_gid_index``)."""
        self._require_idle("set_gid_index")
        _check_uint("gid_index", gid_index, _U32)
        dev = self.dev
        if dev is not None and gid_index >= len(dev.backend.gids):
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"{dev.name} has {len(dev.backend.gids)} GIDs, no index {gid_index}",
            )
        self._gid_index = gid_index

    @property
    def send_queue_size(self) -> int:
        return self._send_queue_size

    @property
    def recv_queue_size(self) -> int:
        return self._recv_queue_size

    @staticmethod
    def _queue_size(name: str, size: int) -> int:
        if type(size) is not int or not 1 <= size <= _U32:
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
        """The connection state (``doca_rdma_get_state``)."""
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
        if self._gid_index >= len(backend.gids):
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"{dev.name} has {len(backend.gids)} GIDs, no index {self._gid_index}",
            )
        qp_caps = QpCaps(
            max_send_wr=self._send_queue_size,
            max_recv_wr=self._recv_queue_size,
            max_send_sge=caps.max_sge,
            max_recv_sge=self._recv_buf_chain_len,
        )
        if self._qp is not None and self._qp_caps != qp_caps:
            self._qp.close()
            self._qp = None
        if self._qp is None:
            self._qp = backend.create_qp(qp_caps)
            self._qp_caps = qp_caps
        _qp_init(self._qp, self._qp_access())
        if self._fd < 0:
            _live_changed()
            try:
                self._pump = self._qp.fileno()
            except DocaError:
                self._pump = -2 - id(self) % (1 << 30)  # no descriptor: polling only, our own pump
            else:
                self._fd = os.dup(self._pump)  # the WorkQ's epoll needs a descriptor of its own
                self._watch_fd(self._fd)
        self._error = None
        return False  # STARTING until connect()

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
        if self.rdma_state is not RdmaState.INIT:
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"the connection is {self.rdma_state.name}; stop and start again"
            )
        desc = remote if isinstance(remote, ConnectionDescriptor) else ConnectionDescriptor.from_bytes(remote)
        self._qp.connect(desc.to_backend())
        self._connected()

    def _stop(self) -> None:
        self._flush("RDMA context stopped")
        qp = self._qp
        if qp is not None:
            reset = getattr(qp, "reset", None)
            if callable(reset):
                reset()  # back to RESET; start() re-initialises it with a fresh PSN
            else:
                qp.close()
                self._qp = None

    def _cancel(self) -> None:
        self._posted.clear()
        if self._qp is not None:
            _qp_break(self._qp)  # the buffers of flushed jobs are the caller's again

    def _close(self) -> None:
        _live.discard(self)
        _live_changed()
        if self._qp is not None:
            self._qp.close()
            self._qp = None
        if self._fd >= 0:
            os.close(self._fd)  # Ctx.close already unwatched it
            self._fd = -1

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
        qp = self._qp
        dev = self.dev
        job_type = _JOB_TYPE.get(type(job))
        if job_type is None:
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{type(job).__name__} is not an RDMA job")
        if qp is None or dev is None:
            raise DocaError(DocaErrorCode.BAD_STATE, "the RDMA context has no queue pair")
        if job_type not in dev.backend.caps.job_types:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, f"{dev.name} does not run {job_type.value} jobs", Fault.SYSTEM
            )
        wr_id = next(self._wr_ids)
        if isinstance(job, RdmaRecvJob):
            posted, rwr = self._plan_recv(job, wr_id)
            self._posted[wr_id] = posted
            try:
                qp.post_recv(rwr)
            except BaseException:
                del self._posted[wr_id]
                raise
        else:
            posted, swr = self._plan_send(job, wr_id)
            self._posted[wr_id] = posted
            try:
                qp.post_send(swr)
            except BaseException:
                del self._posted[wr_id]
                raise
        if self.rdma_state is RdmaState.ERROR:
            self._reap()  # flushed at once: deliver now, before the caller arms its WorkQ

    # Local and remote buffers -------------------------------------------------------------

    def _lkey(self, buf: Buf, role: str, *, write: bool) -> int:
        mmap = buf.mmap
        if mmap.from_export:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"{role} must be local memory, not a buffer of a remote mmap"
            )
        if write and AccessFlag.LOCAL_READ_WRITE not in mmap.permissions:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                f"{role}: its mmap lacks LOCAL_READ_WRITE permission, so nothing may be written into it "
                "(RDMA guide §5.1.4)",
            )
        dev = self.dev
        assert dev is not None
        try:
            return mmap.registration(dev).lkey
        except DocaError as exc:
            raise DocaError(exc.code, f"{role}: {exc.message}", exc.fault) from exc

    @staticmethod
    def _remote(buf: Buf, role: str) -> MmapDescriptor:
        desc = buf.mmap.descriptor
        if desc is None:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"{role} must be a buffer of a remote mmap (Mmap.create_from_export), not local memory",
            )
        if not isinstance(desc, MmapDescriptor):
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"{role} is in an mmap exported for PCI (export_pci), which RDMA cannot reach; "
                "the peer must export_rdma",
            )
        return desc

    def _gather(self, head: Buf | None, role: str) -> tuple[list[SGE], int]:
        """A source: one SGE per non-empty data section along the chain."""
        if head is None:
            return [], 0
        bufs = list(head)
        dev = self.dev
        assert dev is not None
        limit = dev.backend.caps.max_sge
        if len(bufs) > limit:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"{role} is a list of {len(bufs)} buffers; at most {limit}"
            )
        sges: list[SGE] = []
        total = 0
        for buf in bufs:
            lkey = self._lkey(buf, role, write=False)
            if buf.data_len:
                sges.append(SGE(buf.data, buf.data_len, lkey))
                total += buf.data_len
        return sges, total

    def _scatter(
        self, head: Buf, role: str, limit: int | None, max_len: int
    ) -> tuple[list[SGE], list[tuple[Buf, int]], int]:
        """A destination: the tailroom of each element, up to `limit` bytes in all."""
        bufs = list(head)
        if len(bufs) > max_len:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"{role} is a list of {len(bufs)} buffers; at most {max_len}"
            )
        sges: list[SGE] = []
        parts: list[tuple[Buf, int]] = []
        total = 0
        for buf in bufs:
            lkey = self._lkey(buf, role, write=True)
            take = buf.tailroom if limit is None else min(buf.tailroom, limit - total)
            if take:
                sges.append(SGE(buf.data + buf.data_len, take, lkey))
                parts.append((buf, take))
                total += take
        return sges, parts, total

    # Work requests ----------------------------------------------------------------------------

    def _plan_recv(self, job: RdmaRecvJob, wr_id: int) -> tuple[_Posted, RecvWR]:
        if job.dst_buf is None:
            return _Posted(job, "RDMA receive (no buffer)"), RecvWR(wr_id=wr_id)
        sges, parts, room = self._scatter(job.dst_buf, "RdmaRecvJob.dst_buf", None, self._recv_buf_chain_len)
        posted = _Posted(job, "RDMA receive (room for {} bytes)", (room,), parts=parts)
        return posted, RecvWR(wr_id=wr_id, sg_list=tuple(sges))

    def _plan_send(self, job: Job, wr_id: int) -> tuple[_Posted, SendWR]:
        name = type(job).__name__
        match job:
            case RdmaSendJob() | RdmaSendImmJob():
                sges, total = self._gather(job.src_buf, f"{name}.src_buf")
                imm: int | None = None
                opcode = WrOpcode.SEND
                if isinstance(job, RdmaSendImmJob):
                    imm = _check_uint("immediate", job.immediate, _U32)
                    opcode = WrOpcode.SEND_WITH_IMM
                posted = _Posted(job, "RDMA send of {} bytes", (total,), length=total)
                return posted, SendWR(wr_id=wr_id, opcode=opcode, sg_list=tuple(sges), imm_data=imm)
            case RdmaWriteJob() | RdmaWriteImmJob():
                desc = self._remote(job.dst_buf, f"{name}.dst_buf")
                sges, total = self._gather(job.src_buf, f"{name}.src_buf")
                dst = job.dst_buf
                if total > dst.tailroom:
                    raise DocaError(
                        DocaErrorCode.INVALID_VALUE,
                        f"{name}: {total} bytes do not fit in dst_buf's {dst.tailroom} bytes of room",
                    )
                addr = dst.data + dst.data_len
                imm = None
                opcode = WrOpcode.RDMA_WRITE
                if isinstance(job, RdmaWriteImmJob):
                    imm = _check_uint("immediate", job.immediate, _U32)
                    opcode = WrOpcode.RDMA_WRITE_WITH_IMM
                posted = _Posted(
                    job,
                    "RDMA write of {} bytes to {:#x} (rkey {:#x})",
                    (total, addr, desc.rkey),
                    length=total,
                    remote_append=dst,
                    remote=desc,
                )
                wr = SendWR(
                    wr_id=wr_id,
                    opcode=opcode,
                    sg_list=tuple(sges),
                    remote_addr=addr,
                    rkey=desc.rkey,
                    imm_data=imm,
                )
                return posted, wr
            case RdmaReadJob():
                desc = self._remote(job.src_buf, f"{name}.src_buf")
                src = job.src_buf
                dev = self.dev
                assert dev is not None
                limit = dev.backend.caps.max_sge
                # Room first: the destination decides how much of the source fits.
                _, _, room = self._scatter(job.dst_buf, f"{name}.dst_buf", None, limit)
                length = min(src.data_len, room)
                sges, parts, _ = self._scatter(job.dst_buf, f"{name}.dst_buf", length, limit)
                posted = _Posted(
                    job,
                    "RDMA read of {} bytes from {:#x} (rkey {:#x})",
                    (length, src.data, desc.rkey),
                    length=length,
                    parts=parts,
                    remote=desc,
                )
                wr = SendWR(
                    wr_id=wr_id,
                    opcode=WrOpcode.RDMA_READ,
                    sg_list=tuple(sges),
                    remote_addr=src.data,
                    rkey=desc.rkey,
                )
                return posted, wr
            case RdmaAtomicCmpSwpJob() | RdmaAtomicFetchAddJob():
                desc = self._remote(job.dst_buf, f"{name}.dst_buf")
                dst, result = job.dst_buf, job.result_buf
                if dst.data & 7:
                    raise DocaError(
                        DocaErrorCode.INVALID_VALUE,
                        f"{name}: the remote word {dst.data:#x} is not 8-byte aligned",
                    )
                if dst.dataroom < 8:
                    raise DocaError(
                        DocaErrorCode.INVALID_VALUE, f"{name}: dst_buf has no 8-byte word at its data"
                    )
                if result.is_in_list:
                    raise DocaError(
                        DocaErrorCode.INVALID_VALUE, f"{name}: result_buf must be a single buffer"
                    )
                lkey = self._lkey(result, f"{name}.result_buf", write=True)
                if result.tailroom < 8:
                    raise DocaError(
                        DocaErrorCode.INVALID_VALUE,
                        f"{name}: result_buf has {result.tailroom} bytes of room, needs 8",
                    )
                sge = SGE(result.data + result.data_len, 8, lkey)
                if isinstance(job, RdmaAtomicCmpSwpJob):
                    opcode = WrOpcode.ATOMIC_CMP_AND_SWP
                    compare_add = _check_uint("cmp", job.cmp, _U64)
                    swap = _check_uint("swap", job.swap, _U64)
                    what = "compare-and-swap"
                else:
                    opcode = WrOpcode.ATOMIC_FETCH_AND_ADD
                    compare_add = _check_uint("add", job.add, _U64)
                    swap = 0
                    what = "fetch-and-add"
                posted = _Posted(
                    job,
                    "RDMA atomic {} at {:#x} (rkey {:#x})",
                    (what, dst.data, desc.rkey),
                    length=8,
                    parts=[(result, 8)],
                    remote=desc,
                )
                wr = SendWR(
                    wr_id=wr_id,
                    opcode=opcode,
                    sg_list=(sge,),
                    remote_addr=dst.data,
                    rkey=desc.rkey,
                    compare_add=compare_add,
                    swap=swap,
                )
                return posted, wr
        raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{name} is not an RDMA job")  # pragma: no cover

    # -- completion ----------------------------------------------------------------------------

    def _progress(self) -> bool:
        qp = self._qp
        if qp is None or self._closed:
            return False
        busy = qp.progress()
        gen, peers = self._peers
        if gen != _live_gen:
            pump = self._pump
            peers = tuple(weakref.ref(c) for c in list(_live) if c._pump == pump)
            self._peers = (_live_gen, peers)
        for ref in peers:
            ctx = ref()
            if ctx is not None and ctx._qp is not None and not ctx._closed and ctx._reap():
                busy = True
        return busy

    def _reap(self) -> bool:
        qp = self._qp
        got = False
        while qp is not None:
            wcs = qp.poll(64)
            if not wcs:
                break
            got = True
            for wc in wcs:
                self._on_completion(wc)
            qp = self._qp
        return got

    def _on_completion(self, wc: Completion) -> None:
        posted = self._posted.pop(wc.wr_id, None)
        if posted is None or not self._in_flight(posted.job):
            return  # a job flushed by stop or WorkQ close: forgotten
        job = posted.job
        if wc.status != WcStatus.SUCCESS:
            error = self._wc_error(posted, wc)
            if self._error is None and wc.status != WcStatus.WR_FLUSH_ERR:
                self._error = error
            if self._qp is not None:
                _qp_break(self._qp)  # IBTA §10.3.1: an RC error completion leaves the QP in Error
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
            self._complete(job, result=RdmaResult(opcode=opcode, length=wc.byte_len, immediate=wc.imm_data))
            return
        for buf, n in posted.parts:
            buf.commit_append(n)
        if posted.remote_append is not None:
            posted.remote_append.commit_append(posted.length)
        self._complete(job, result=RdmaResult(length=posted.length))

    def _wc_error(self, posted: _Posted, wc: Completion) -> DocaError:
        status = wc.status
        need = _NEEDS.get(type(posted.job))
        hint = ""
        if status == WcStatus.WR_FLUSH_ERR:
            cause = f": {self._error.message}" if self._error is not None else ""
            hint = (
                f"flushed, the RDMA connection is in ERROR{cause}; recover with stop, start, export "
                "and connect on both sides"
            )
        elif status == WcStatus.REM_ACCESS_ERR:
            hint = "the responder refused access to its memory (bad rkey or range"
            if need is not None:
                hint += f", or its mmap does not grant {need.name}, RDMA guide §5.1.4"
            hint += ")"
            if posted.remote is not None:
                hint += f"; the remote mmap descriptor claims {_flag_names(posted.remote.access)}"
        elif status == WcStatus.REM_INV_REQ_ERR:
            if need is not None:
                hint = (
                    f"the responder rejected the request as invalid: its RDMA context must grant {need.name} "
                    "(RDMA guide §5.1.4)"
                )
                if isinstance(posted.job, RdmaWriteImmJob):
                    hint += ", and it needs a posted receive"
            else:
                hint = "the responder rejected the message: it does not fit the receive buffer it posted"
        elif status == WcStatus.REM_OP_ERR:
            hint = "the responder could not place the data (is its receive buffer's mmap writable?)"
        elif status == WcStatus.LOC_LEN_ERR:
            hint = "the message is longer than the destination buffer's room"
        elif status in (WcStatus.LOC_PROT_ERR, WcStatus.LOC_ACCESS_ERR):
            hint = "a local buffer is not registered with the access the job needs"
        elif status in (WcStatus.RETRY_EXC_ERR, WcStatus.RNR_RETRY_EXC_ERR):
            hint = "the peer stopped answering (retries exhausted)"
        message = f"{posted.what.format(*posted.what_args)} failed" + (f": {hint}" if hint else "")
        return error_from_wc_status(status, message)

    def __repr__(self) -> str:
        qpn = "" if self._qp is None else f" qpn={self._qp.qpn:#x}"
        return f"<Rdma {self._state.name} {self.rdma_state.name}{qpn} inflight={len(self._pending)}>"
