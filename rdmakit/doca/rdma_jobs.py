"""DOCA RDMA jobs (DOCA RDMA guide §5, ``struct doca_rdma_job_*``) and how each becomes a work request.

A source buffer contributes its data section, a chain of buffers one gather
entry per element; a destination buffer is appended to (its data length grows
by what landed, element by element along a chain). A remote buffer is a `Buf`
of an `Mmap` made with ``Mmap.create_from_export``.

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

Every job takes ``connection=``, the `RdmaConnection` of its context it runs
on; without it, the context's only connection (or the queue pair of a
context connected by descriptor). Atomics append the remote word's original
value (8 bytes, the CPU's byte order, like verbs) to ``result_buf``. A job's
`Event` carries an `RdmaResult`: the received opcode (receive jobs), the
byte count, the immediate and the connection.

`JOBS` is the table the context consults: per job class, its `JobType`
(the device capability it needs), the permission the responder must grant
(guide §5.1.4), the buffers it names and its planner, which checks the job
against this side's buffers and device and returns the work request with
what to do with the buffers when it completes (`Posted`). A job class the
table does not list is not an RDMA job. `wc_error` says why a work
completion failed, in the terms of the job.

A plan is the job's work-queue entry, as a NIC driver writes one into a slot
of its ring: the context keeps it on the job (`Posted.epoch`, `Posted.bufs`
and `Posted.state` say what it was checked against) and posts it again while
the context's start and every buffer of the job's lists (`plan_state`) are
the same, so resubmitting a job, or a task, allocates no job, work request or
event.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from operator import attrgetter
from typing import Any, NamedTuple

from rdmakit.doca.backend import BackendQP, JobType
from rdmakit.doca.buf import Buf, plan_holds, plan_state
from rdmakit.doca.ctx import Event, Job, _Sink
from rdmakit.doca.device import Dev
from rdmakit.doca.errors import DocaError, DocaErrorCode, error_from_wc_status
from rdmakit.doca.mmap import AccessFlag, MmapDescriptor
from rdmakit.doca.rdma_conns import RdmaConnection
from rdmakit.engine.types import SGE, Completion, RecvWR, SendWR, WcStatus, WrOpcode

__all__ = [
    "RdmaAtomicCmpSwpJob",
    "RdmaAtomicFetchAddJob",
    "RdmaJob",
    "RdmaOpcode",
    "RdmaReadJob",
    "RdmaRecvJob",
    "RdmaResult",
    "RdmaSendImmJob",
    "RdmaSendJob",
    "RdmaWriteImmJob",
    "RdmaWriteJob",
]

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1


class RdmaOpcode(IntEnum):
    """``enum doca_rdma_opcode_t``: what a receive job received."""

    RECV_SEND = 0
    RECV_SEND_WITH_IMM = 1
    RECV_WRITE_WITH_IMM = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaResult:
    """The result of an RDMA job (``struct doca_rdma_result``), in ``Event.result``.

    ``opcode`` is set for receive jobs only. ``length`` is the byte count:
    received (for a write with immediate, the bytes the peer wrote), read,
    written, sent, or 8 for an atomic. ``connection`` is the connection the job
    ran on (a receive: the one the message came on). ``immediate`` is the ImmDt u32 exactly
    as on the wire (``doca_be32_t``: big-endian there), so the value a sender
    passes arrives unchanged; `immediate_bytes` gives the four wire bytes.
    """

    opcode: RdmaOpcode | None = None
    length: int = 0
    immediate: int | None = None
    connection: RdmaConnection | None = None  # the connection it ran on (None: not by address)

    @property
    def immediate_bytes(self) -> bytes | None:
        return None if self.immediate is None else self.immediate.to_bytes(4, "big")


# -- jobs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _OnConnection(Job):
    """An RDMA job names the connection it runs on; None: the context's only one."""

    connection: RdmaConnection | None = None
    #: The context's plan of this job (`Posted`), reused while it fits (`Posted.fits`); not a field.
    _plan: "Posted | None" = dataclasses.field(default=None, init=False, repr=False, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaRecvJob(_OnConnection):
    """Receive the peer's next message (``DOCA_RDMA_JOB_RECV``).

    The message is appended to ``dst_buf`` (a chain of at most
    ``recv_buf_chain_len`` buffers). ``dst_buf`` may be None when the peer
    sends an empty message or writes with immediate.
    """

    dst_buf: Buf | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaSendJob(_OnConnection):
    """Send ``src_buf``'s data (``DOCA_RDMA_JOB_SEND``); None sends an empty message."""

    src_buf: Buf | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaSendImmJob(_OnConnection):
    """Send with a 32-bit immediate (``DOCA_RDMA_JOB_SEND_IMM``)."""

    src_buf: Buf | None = None
    immediate: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaReadJob(_OnConnection):
    """Read remote ``src_buf``'s data into local ``dst_buf`` (``DOCA_RDMA_JOB_READ``).

    The length is ``min(src_buf.data_len, room of dst_buf)``; the bytes are
    appended to ``dst_buf`` (scattered along its chain).
    """

    src_buf: Buf
    dst_buf: Buf


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaWriteJob(_OnConnection):
    """Write local ``src_buf``'s data after remote ``dst_buf``'s data (``DOCA_RDMA_JOB_WRITE``).

    It must fit in ``dst_buf``'s tailroom; on success ``dst_buf`` (this
    side's descriptor of the remote bytes) grows by the length.
    """

    src_buf: Buf
    dst_buf: Buf


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaWriteImmJob(_OnConnection):
    """Write with immediate (``DOCA_RDMA_JOB_WRITE_IMM``): also consumes a receive at the peer."""

    src_buf: Buf
    dst_buf: Buf
    immediate: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaAtomicCmpSwpJob(_OnConnection):
    """Compare and swap the remote u64 at ``dst_buf.data`` (``DOCA_RDMA_JOB_ATOMIC_CMP_SWP``).

    The word must be 8-byte aligned; its original value is appended to ``result_buf``.
    """

    dst_buf: Buf
    result_buf: Buf
    cmp: int
    swap: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaAtomicFetchAddJob(_OnConnection):
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


def check_uint(name: str, value: object, hi: int) -> int:
    if type(value) is not int or not 0 <= value <= hi:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE, f"{name} {value!r} is not an unsigned {hi.bit_length()}-bit integer"
        )
    return value


def _flag_names(flags: AccessFlag) -> str:
    names = [f.name for f in AccessFlag if f and f in flags and f.name]
    return "|".join(n for n in names if n) or "LOCAL_READ_ONLY"


@dataclass(slots=True)
class Posted:
    """A job's plan: its work request and what to do with the buffers when it succeeds."""

    job: Job
    what: str  # names the job in error messages: a format string for ``what_args``
    what_args: tuple[object, ...] = ()
    length: int = 0
    parts: list[tuple[Buf, int]] = dataclasses.field(default_factory=list)  # local appends
    remote_append: Buf | None = None  # a write's remote destination
    remote: MmapDescriptor | None = None
    lane: BackendQP | None = None  # the queue pair it was posted to
    conn: RdmaConnection | None = None  # the connection of that queue pair, if by address
    wr: "SendWR | RecvWR | None" = None  # what is posted; its wr_id is the plan's
    ok: Event | None = None  # its success event, made at the first success on `conn`
    entry: "tuple[Job, _Sink] | None" = None  # its context's pending entry (job, sink), reused
    key: int = 0  # its context's pending key, ``id(job)``, computed once (an address is a new int)
    # What it was planned against: the context's start, every buffer of the job's lists (a job is
    # frozen, so these are its buffers for good) and what each one was then (`plan_state`).
    epoch: int = -1
    bufs: tuple[Buf, ...] = ()
    state: tuple[tuple[object, ...], ...] = ()

    def fits(self, epoch: int) -> bool:
        """Whether the plan still holds in the context's start `epoch` (the steady state of a
        resubmitted job: DOCA's work-queue entry written again as it was)."""
        return self.epoch == epoch and plan_holds(self.bufs, self.state)

    def plan_for(self, epoch: int, named: tuple[Buf | None, ...]) -> None:
        """Record what the plan was made against: the start `epoch` and the `named` buffers' lists."""
        self.epoch = epoch
        self.bufs = tuple(b for head in named if head is not None for b in head)
        self.state = tuple(map(plan_state, self.bufs))


@dataclass(frozen=True, slots=True)
class Planning:
    """What a planner checks a job against: the context's device and receive chain limit."""

    dev: Dev
    max_sge: int
    recv_buf_chain_len: int

    def lkey(self, buf: Buf, role: str, *, write: bool) -> int:
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
        try:
            return mmap.registration(self.dev).lkey
        except DocaError as exc:
            raise DocaError(exc.code, f"{role}: {exc.message}", exc.fault) from exc

    @staticmethod
    def remote(buf: Buf, role: str) -> MmapDescriptor:
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

    def gather(self, head: Buf | None, role: str) -> tuple[list[SGE], int]:
        """A source: one SGE per non-empty data section along the chain."""
        if head is None:
            return [], 0
        bufs = list(head)
        limit = self.max_sge
        if len(bufs) > limit:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"{role} is a list of {len(bufs)} buffers; at most {limit}"
            )
        sges: list[SGE] = []
        total = 0
        for buf in bufs:
            lkey = self.lkey(buf, role, write=False)
            if buf.data_len:
                sges.append(SGE(buf.data, buf.data_len, lkey))
                total += buf.data_len
        return sges, total

    def scatter(
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
            lkey = self.lkey(buf, role, write=True)
            take = buf.tailroom if limit is None else min(buf.tailroom, limit - total)
            if take:
                sges.append(SGE(buf.data + buf.data_len, take, lkey))
                parts.append((buf, take))
                total += take
        return sges, parts, total


Plan = tuple[Posted, SendWR | RecvWR]


def _plan_recv(job: RdmaRecvJob, wr_id: int, p: Planning) -> Plan:
    if job.dst_buf is None:
        return Posted(job, "RDMA receive (no buffer)"), RecvWR(wr_id=wr_id)
    sges, parts, room = p.scatter(job.dst_buf, "RdmaRecvJob.dst_buf", None, p.recv_buf_chain_len)
    posted = Posted(job, "RDMA receive (room for {} bytes)", (room,), parts=parts)
    return posted, RecvWR(wr_id=wr_id, sg_list=tuple(sges))


def _plan_send(job: "RdmaSendJob | RdmaSendImmJob", wr_id: int, p: Planning) -> Plan:
    sges, total = p.gather(job.src_buf, f"{type(job).__name__}.src_buf")
    imm: int | None = None
    opcode = WrOpcode.SEND
    if isinstance(job, RdmaSendImmJob):
        imm = check_uint("immediate", job.immediate, U32)
        opcode = WrOpcode.SEND_WITH_IMM
    posted = Posted(job, "RDMA send of {} bytes", (total,), length=total)
    return posted, SendWR(wr_id=wr_id, opcode=opcode, sg_list=tuple(sges), imm_data=imm)


def _plan_write(job: "RdmaWriteJob | RdmaWriteImmJob", wr_id: int, p: Planning) -> Plan:
    name = type(job).__name__
    desc = p.remote(job.dst_buf, f"{name}.dst_buf")
    sges, total = p.gather(job.src_buf, f"{name}.src_buf")
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
        imm = check_uint("immediate", job.immediate, U32)
        opcode = WrOpcode.RDMA_WRITE_WITH_IMM
    posted = Posted(
        job,
        "RDMA write of {} bytes to {:#x} (rkey {:#x})",
        (total, addr, desc.rkey),
        length=total,
        remote_append=dst,
        remote=desc,
    )
    wr = SendWR(
        wr_id=wr_id, opcode=opcode, sg_list=tuple(sges), remote_addr=addr, rkey=desc.rkey, imm_data=imm
    )
    return posted, wr


def _plan_read(job: RdmaReadJob, wr_id: int, p: Planning) -> Plan:
    name = type(job).__name__
    desc = p.remote(job.src_buf, f"{name}.src_buf")
    src = job.src_buf
    # Room first: the destination decides how much of the source fits.
    _, _, room = p.scatter(job.dst_buf, f"{name}.dst_buf", None, p.max_sge)
    length = min(src.data_len, room)
    sges, parts, _ = p.scatter(job.dst_buf, f"{name}.dst_buf", length, p.max_sge)
    posted = Posted(
        job,
        "RDMA read of {} bytes from {:#x} (rkey {:#x})",
        (length, src.data, desc.rkey),
        length=length,
        parts=parts,
        remote=desc,
    )
    wr = SendWR(
        wr_id=wr_id, opcode=WrOpcode.RDMA_READ, sg_list=tuple(sges), remote_addr=src.data, rkey=desc.rkey
    )
    return posted, wr


def _plan_atomic(job: "RdmaAtomicCmpSwpJob | RdmaAtomicFetchAddJob", wr_id: int, p: Planning) -> Plan:
    name = type(job).__name__
    desc = p.remote(job.dst_buf, f"{name}.dst_buf")
    dst, result = job.dst_buf, job.result_buf
    if dst.data & 7:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE, f"{name}: the remote word {dst.data:#x} is not 8-byte aligned"
        )
    if dst.dataroom < 8:
        raise DocaError(DocaErrorCode.INVALID_VALUE, f"{name}: dst_buf has no 8-byte word at its data")
    if result.is_in_list:
        raise DocaError(DocaErrorCode.INVALID_VALUE, f"{name}: result_buf must be a single buffer")
    lkey = p.lkey(result, f"{name}.result_buf", write=True)
    if result.tailroom < 8:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE, f"{name}: result_buf has {result.tailroom} bytes of room, needs 8"
        )
    sge = SGE(result.data + result.data_len, 8, lkey)
    if isinstance(job, RdmaAtomicCmpSwpJob):
        opcode = WrOpcode.ATOMIC_CMP_AND_SWP
        compare_add = check_uint("cmp", job.cmp, U64)
        swap = check_uint("swap", job.swap, U64)
        what = "compare-and-swap"
    else:
        opcode = WrOpcode.ATOMIC_FETCH_AND_ADD
        compare_add = check_uint("add", job.add, U64)
        swap = 0
        what = "fetch-and-add"
    posted = Posted(
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


class JobSpec(NamedTuple):
    """One row of `JOBS`."""

    job_type: JobType  # the device capability the job needs
    needs: AccessFlag | None  # what the responder's mmap and context must grant (guide §5.1.4)
    plan: Callable[[Any, int, Planning], Plan]  # the job (of this row's class), its wr_id
    bufs: Callable[[Any], tuple[Buf | None, ...]]  # the buffers the job names, for `Posted.plan_for`


def _bufs(*names: str) -> Callable[[Any], tuple[Buf | None, ...]]:
    get: Callable[[Any], Any] = attrgetter(*names)
    return (lambda job: (get(job),)) if len(names) == 1 else get


_DST = _bufs("dst_buf")
_SRC = _bufs("src_buf")
_SRC_DST = _bufs("src_buf", "dst_buf")
_ATOMIC = _bufs("dst_buf", "result_buf")
JOBS: dict[type[Job], JobSpec] = {
    RdmaRecvJob: JobSpec(JobType.RDMA_RECV, None, _plan_recv, _DST),
    RdmaSendJob: JobSpec(JobType.RDMA_SEND, None, _plan_send, _SRC),
    RdmaSendImmJob: JobSpec(JobType.RDMA_SEND_IMM, None, _plan_send, _SRC),
    RdmaReadJob: JobSpec(JobType.RDMA_READ, AccessFlag.RDMA_READ, _plan_read, _SRC_DST),
    RdmaWriteJob: JobSpec(JobType.RDMA_WRITE, AccessFlag.RDMA_WRITE, _plan_write, _SRC_DST),
    RdmaWriteImmJob: JobSpec(JobType.RDMA_WRITE_IMM, AccessFlag.RDMA_WRITE, _plan_write, _SRC_DST),
    RdmaAtomicCmpSwpJob: JobSpec(JobType.RDMA_ATOMIC_CMP_SWP, AccessFlag.RDMA_ATOMIC, _plan_atomic, _ATOMIC),
    RdmaAtomicFetchAddJob: JobSpec(
        JobType.RDMA_ATOMIC_FETCH_ADD, AccessFlag.RDMA_ATOMIC, _plan_atomic, _ATOMIC
    ),
}


def wc_error(posted: Posted, wc: Completion, cause: DocaError | None, fault: str | None = None) -> DocaError:
    """The `DocaError` of a failed work completion, saying what the job needed.

    `cause` is the error that moved the connection to ERROR, for flushed ones;
    `fault` what the transport knows of a lost peer (``BackendQP.transport_fault``).
    """
    status = wc.status
    spec = JOBS.get(type(posted.job))
    need = None if spec is None else spec.needs
    hint = ""
    if status == WcStatus.WR_FLUSH_ERR:
        because = f": {cause.message}" if cause is not None else ""
        hint = (
            f"flushed, the RDMA connection is in ERROR{because}; recover with stop, start, export "
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
    elif status == WcStatus.RETRY_EXC_ERR and fault is not None:
        hint = fault  # the transport knows better than the engine's retry count
    elif status in (WcStatus.RETRY_EXC_ERR, WcStatus.RNR_RETRY_EXC_ERR):
        hint = "the peer stopped answering (retries exhausted)"
    message = f"{posted.what.format(*posted.what_args)} failed" + (f": {hint}" if hint else "")
    return error_from_wc_status(status, message)
