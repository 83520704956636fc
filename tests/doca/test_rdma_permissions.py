"""The RDMA permission table (RDMA guide §5.1.4), each row allowed and denied, on both sides.

=============  =====================  ===================  ====================
job            requester local mmap   responder mmap       responder Rdma ctx
=============  =====================  ===================  ====================
receive        LOCAL_READ_WRITE       -                    -
send           any                    -                    -
read           LOCAL_READ_WRITE       RDMA_READ            RDMA_READ
write(-imm)    any                    RDMA_WRITE           RDMA_WRITE
atomics        LOCAL_READ_WRITE       RDMA_ATOMIC          RDMA_ATOMIC
=============  =====================  ===================  ====================

A local denial is raised at submit (NOT_PERMITTED) and the connection stays
up. A responder denial is the responding engine's (IBTA Vol. 1 §9.7.5.2,
NAK codes): its memory key (the mmap permissions) gives a remote access error
(NOT_PERMITTED), its queue pair's access flags (the context permissions) an
invalid request (INVALID_VALUE); the job fails with IO_FAILED, fault PEER, a
message naming the permission, and both connections are in ERROR.
"""

import json
import sys
from dataclasses import dataclass
from typing import Literal

import pytest

from rdmakit.doca import (
    AccessFlag,
    DocaError,
    DocaErrorCode,
    Fault,
    Job,
    Mmap,
    RdmaAtomicCmpSwpJob,
    RdmaAtomicFetchAddJob,
    RdmaReadJob,
    RdmaRecvJob,
    RdmaSendJob,
    RdmaState,
    RdmaWriteImmJob,
    RdmaWriteJob,
)
from tests.doca.rdma_harness import ALL_RDMA, Pair, PairFactory, result

RW = AccessFlag.LOCAL_READ_WRITE
Op = Literal["read", "write", "write_imm", "cmp_swp", "fetch_add"]
Denial = Literal["allowed", "responder_mmap", "responder_ctx", "local_mmap"]
NEEDS: dict[Op, AccessFlag] = {
    "read": AccessFlag.RDMA_READ,
    "write": AccessFlag.RDMA_WRITE,
    "write_imm": AccessFlag.RDMA_WRITE,
    "cmp_swp": AccessFlag.RDMA_ATOMIC,
    "fetch_add": AccessFlag.RDMA_ATOMIC,
}
RDMA_FLAGS = AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC


@dataclass
class Setup:
    pair: Pair
    job: Job
    remote_mem: bytearray
    local_mem: bytearray
    recv: RdmaRecvJob | None


def _setup(make_pair: PairFactory, op: Op, denial: Denial) -> Setup:
    need = NEEDS[op]
    ctx_perms = ALL_RDMA & ~need if denial == "responder_ctx" else ALL_RDMA
    mmap_perms = RW | (RDMA_FLAGS & ~need if denial == "responder_mmap" else RDMA_FLAGS)
    # The requester's own memory: its destination must be writable, a source need not be.
    local_perms = AccessFlag.LOCAL_READ_ONLY if denial == "local_mmap" else RW
    p = make_pair(perms_b=ctx_perms).up()
    mb, mem_b = p.b.mmap(bytes(range(1, 17)), mmap_perms)
    remote = p.share(mb)
    ma, mem_a = p.a.mmap(bytes(16), local_perms)
    r = p.a.rdma
    recv = None
    job: Job
    if op == "read":
        job = RdmaReadJob(ctx=r, src_buf=p.a.data(remote, 0, 8), dst_buf=p.a.room(ma, 0, 8))
    elif op == "write":
        job = RdmaWriteJob(ctx=r, src_buf=p.a.data(ma, 0, 8), dst_buf=p.a.room(remote, 0, 16))
    elif op == "write_imm":
        recv = RdmaRecvJob(ctx=p.b.rdma)
        p.submit(recv)
        job = RdmaWriteImmJob(ctx=r, src_buf=p.a.data(ma, 0, 8), dst_buf=p.a.room(remote, 0, 16), immediate=5)
    elif op == "cmp_swp":
        job = RdmaAtomicCmpSwpJob(
            ctx=r, dst_buf=p.a.data(remote, 8, 8), result_buf=p.a.room(ma, 0, 8), cmp=0, swap=1
        )
    else:
        job = RdmaAtomicFetchAddJob(
            ctx=r, dst_buf=p.a.data(remote, 8, 8), result_buf=p.a.room(ma, 0, 8), add=1
        )
    return Setup(p, job, mem_b, mem_a, recv)


ROWS = [
    pytest.param(op, denial, id=f"{op}-{denial}")
    for op in ("read", "write", "write_imm", "cmp_swp", "fetch_add")
    for denial in ("allowed", "responder_mmap", "responder_ctx", "local_mmap")
]


@pytest.mark.parametrize(("op", "denial"), ROWS)
def test_permission_table_row(make_pair: PairFactory, op: Op, denial: Denial) -> None:
    """Guide §5.1.4: the job runs when every side grants its permission, and fails clearly otherwise."""
    s = _setup(make_pair, op, denial)
    p, job = s.pair, s.job
    before = bytes(s.remote_mem)
    writes_locally = op in ("read", "cmp_swp", "fetch_add")
    if denial == "local_mmap" and writes_locally:
        with pytest.raises(DocaError) as exc:
            p.submit(job)
        assert exc.value.code is DocaErrorCode.NOT_PERMITTED
        assert exc.value.fault is Fault.CALLER
        assert "LOCAL_READ_WRITE" in exc.value.message
        assert p.a.rdma.rdma_state is RdmaState.CONNECTED  # nothing was sent
        return
    (ev,) = p.run(job)
    if denial in ("allowed", "local_mmap"):  # a read-only source is fine for a write
        assert ev.ok, ev.error
        if op == "read":
            assert bytes(s.local_mem[:8]) == bytes(range(1, 9))
        elif op in ("write", "write_imm"):
            assert bytes(s.remote_mem[:8]) == bytes(s.local_mem[:8]) == bytes(8)
        else:
            word = int.from_bytes(before[8:16], sys.byteorder)
            assert int.from_bytes(s.local_mem[:8], sys.byteorder) == word
            expected = word + 1 if op == "fetch_add" else word  # cmp=0 never matches: unchanged
            assert int.from_bytes(s.remote_mem[8:16], sys.byteorder) == expected
        if s.recv is not None:
            (ev_recv,) = p.collect([s.recv]).values()
            assert ev_recv.ok
            assert result(ev_recv).immediate == 5
        return
    assert ev.status is DocaErrorCode.IO_FAILED
    assert ev.error is not None
    assert ev.error.fault is Fault.PEER
    if denial == "responder_mmap":
        assert ev.error.code is DocaErrorCode.NOT_PERMITTED
        assert "REM_ACCESS_ERR" in ev.error.message
    else:
        assert ev.error.code is DocaErrorCode.INVALID_VALUE
        assert "RDMA context must grant" in ev.error.message
    assert str(NEEDS[op].name) in ev.error.message
    assert bytes(s.remote_mem) == before  # the responder's memory is untouched
    assert p.a.rdma.rdma_state is RdmaState.ERROR
    assert p.b.rdma.rdma_state is RdmaState.ERROR
    assert p.a.rdma.error is ev.error


def test_receive_needs_a_writable_destination(make_pair: PairFactory) -> None:
    """Guide §5.1.4 (receive): the destination mmap needs LOCAL_READ_WRITE; refused at submit."""
    p = make_pair().up()
    mb, _ = p.b.mmap(8, AccessFlag.LOCAL_READ_ONLY)
    with pytest.raises(DocaError) as exc:
        p.submit(RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 8)))
    assert exc.value.code is DocaErrorCode.NOT_PERMITTED
    assert p.b.rdma.rdma_state is RdmaState.CONNECTED
    assert p.b.rdma.num_inflight == 0
    mb2, _ = p.b.mmap(8, RW)
    evs = p.run(
        RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb2, 0, 8)), RdmaSendJob(ctx=p.a.rdma, src_buf=None)
    )
    assert all(ev.ok for ev in evs)


def test_send_from_read_only_memory(make_pair: PairFactory) -> None:
    """Guide §5.1.4 (send): the source mmap needs no write permission, and no context permission."""
    p = make_pair(perms_a=RW, perms_b=RW).up()
    ma, _ = p.a.mmap(b"read-only source", AccessFlag.LOCAL_READ_ONLY)
    mb, mem_b = p.b.mmap(16)
    evs = p.run(
        RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 16)),
        RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 16)),
    )
    assert all(ev.ok for ev in evs)
    assert bytes(mem_b) == b"read-only source"


def test_descriptor_claims_grant_nothing(make_pair: PairFactory) -> None:
    """A tampered descriptor claiming RDMA_WRITE cannot write: the responder's key decides."""
    p = make_pair().up()
    mb, mem_b = p.b.mmap(16, RW | AccessFlag.RDMA_READ)
    desc = json.loads(mb.export_rdma(p.b.dev))
    desc["access"] = ["LOCAL_READ_WRITE", "RDMA_READ", "RDMA_WRITE"]
    remote = Mmap.create_from_export(json.dumps(desc).encode(), p.a.dev)
    ma, _ = p.a.mmap(b"intruder")
    (ev,) = p.run(RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 8), dst_buf=p.a.room(remote, 0, 16)))
    assert ev.status is DocaErrorCode.IO_FAILED
    assert ev.error is not None
    assert ev.error.code is DocaErrorCode.NOT_PERMITTED
    assert "claims LOCAL_READ_WRITE|RDMA_READ|RDMA_WRITE" in ev.error.message
    assert bytes(mem_b) == bytes(16)


def test_default_context_grants_no_remote_access(make_pair: PairFactory) -> None:
    """doca_rdma_set_permissions: the default is LOCAL_READ_WRITE only: a peer can neither read nor write."""
    p = make_pair(perms_b=AccessFlag.LOCAL_READ_WRITE).up()
    mb, mem_b = p.b.mmap(8, RW | RDMA_FLAGS)
    remote = p.share(mb)
    ma, _ = p.a.mmap(b"12345678")
    (ev,) = p.run(RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 8), dst_buf=p.a.room(remote, 0, 8)))
    assert ev.error is not None
    assert ev.error.code is DocaErrorCode.INVALID_VALUE
    assert bytes(mem_b) == bytes(8)
