"""Value types, verbs enum values, the package façade, memory registration and CQs."""

import dataclasses
import random

import pytest

import rdmakit.engine as engine
from rdmakit.engine import (
    SGE,
    Access,
    Completion,
    CompletionQueue,
    EngineError,
    ProtectionDomain,
    RecvWR,
    SendWR,
    WcOpcode,
    WcStatus,
    WrOpcode,
)


def test_facade_exports_exist() -> None:
    for name in engine.__all__:
        assert hasattr(engine, name), name
    assert {"QueuePair", "ProtectionDomain", "CompletionQueue", "EngineError", "QpState"} <= set(
        engine.__all__
    )


def test_verbs_values() -> None:
    # infiniband/verbs.h
    assert [Access.LOCAL_WRITE, Access.REMOTE_WRITE, Access.REMOTE_READ, Access.REMOTE_ATOMIC] == [1, 2, 4, 8]
    wr_opcodes = [WrOpcode.RDMA_WRITE, WrOpcode.SEND, WrOpcode.RDMA_READ]
    assert [*wr_opcodes, WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD] == [0, 2, 4, 5, 6]
    assert [WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM, WcOpcode.FETCH_ADD] == [128, 129, 4]
    expected = {
        "SUCCESS": 0, "LOC_LEN_ERR": 1, "LOC_QP_OP_ERR": 2, "LOC_PROT_ERR": 4, "WR_FLUSH_ERR": 5,
        "BAD_RESP_ERR": 7, "LOC_ACCESS_ERR": 8, "REM_INV_REQ_ERR": 9, "REM_ACCESS_ERR": 10,
        "REM_OP_ERR": 11, "RETRY_EXC_ERR": 12, "RNR_RETRY_EXC_ERR": 13, "FATAL_ERR": 19, "GENERAL_ERR": 21,
    }  # fmt: skip
    for name, value in expected.items():
        assert WcStatus[name] == value


@pytest.mark.parametrize("cls", [SendWR, RecvWR, Completion])
def test_value_types_are_frozen_kw_only_slots(cls: type) -> None:
    params = dataclasses.fields(cls)
    assert all(f.kw_only for f in params)
    assert hasattr(cls, "__slots__")
    obj = cls(wr_id=1, opcode=WrOpcode.SEND) if cls is SendWR else (
        cls(wr_id=1) if cls is RecvWR else cls(wr_id=1, status=WcStatus.SUCCESS, opcode=WcOpcode.SEND)
    )  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        obj.wr_id = 2  # type: ignore[misc]  # the assignment a frozen dataclass refuses


def test_sge_is_positional() -> None:
    assert SGE(1, 2, 3) == SGE(addr=1, length=2, lkey=3)


def test_keys_random_unique_nonzero_and_seeded() -> None:
    def keys(seed: int) -> list[tuple[int, int]]:
        pd = ProtectionDomain(random.Random(seed))
        return [(mr.lkey, mr.rkey) for mr in (pd.register(bytearray(8), 0, Access.NONE) for _ in range(200))]

    k = keys(1)
    flat = [x for pair in k for x in pair]
    assert len(set(flat)) == len(flat)
    assert 0 not in flat
    assert keys(1) == k
    assert keys(2) != k


def test_readonly_buffers_only_without_write_access() -> None:
    pd = ProtectionDomain(random.Random(0))
    pd.register(b"abc", 0x1000, Access.REMOTE_READ)
    for acc in (
        Access.LOCAL_WRITE,
        Access.LOCAL_WRITE | Access.REMOTE_WRITE,
        Access.LOCAL_WRITE | Access.REMOTE_ATOMIC,
    ):
        with pytest.raises(EngineError) as e:
            pd.register(b"abc", 0x1000, acc)
        assert e.value.code == "INVALID_VALUE"
    with pytest.raises(EngineError):
        pd.register(memoryview(b"abc"), 0x1000, Access.LOCAL_WRITE)


def test_remote_write_needs_local_write() -> None:
    pd = ProtectionDomain(random.Random(0))
    with pytest.raises(EngineError):
        pd.register(bytearray(8), 0, Access.REMOTE_WRITE)
    with pytest.raises(EngineError):
        pd.register(bytearray(8), 0, Access(16))
    with pytest.raises(EngineError):
        pd.register(object(), 0, Access.NONE)  # type: ignore[arg-type]


def _bytes(view: memoryview | None) -> bytes | None:
    return None if view is None else bytes(view)


def test_lookups() -> None:
    pd = ProtectionDomain(random.Random(0))
    buf = bytearray(range(64))
    mr = pd.register(buf, 0x5000, Access.LOCAL_WRITE | Access.REMOTE_READ)
    ro = pd.register(bytes(16), 0x9000, Access.REMOTE_READ)
    assert _bytes(pd.local_slice(SGE(0x5010, 4, mr.lkey), True)) == bytes([16, 17, 18, 19])
    assert pd.local_slice(SGE(0x5000, 65, mr.lkey), False) is None  # out of range
    assert pd.local_slice(SGE(0x4FFF, 2, mr.lkey), False) is None
    assert pd.local_slice(SGE(0x5000, 4, mr.rkey), False) is None  # rkey is not an lkey
    assert pd.local_slice(SGE(0x9000, 4, ro.lkey), True) is None  # no LOCAL_WRITE
    assert pd.local_slice(SGE(0x9000, 4, ro.lkey), False) is not None
    assert _bytes(pd.local_slice(SGE(0, 0, 12345), True)) == b""  # zero length touches nothing
    view = pd.remote_slice(mr.rkey, 0x5020, 8, Access.REMOTE_READ)
    assert view is not None
    view[0] = 0xAA
    assert buf[0x20] == 0xAA  # zero copy
    assert pd.remote_slice(mr.rkey, 0x5020, 8, Access.REMOTE_WRITE) is None
    assert pd.remote_slice(mr.rkey, 0x5039, 8, Access.REMOTE_READ) is None
    assert pd.remote_slice(mr.lkey, 0x5020, 8, Access.REMOTE_READ) is None
    pd.deregister(mr)
    pd.deregister(mr)  # idempotent
    assert pd.remote_slice(mr.rkey, 0x5020, 8, Access.REMOTE_READ) is None
    assert len(pd) == 1


def test_multidimensional_buffers_are_bytes() -> None:
    import numpy as np

    pd = ProtectionDomain(random.Random(0))
    arr = np.zeros((4, 4), dtype=np.uint32)
    mr = pd.register(arr.data, 0, Access.LOCAL_WRITE)
    assert mr.length == 64
    view = pd.local_slice(SGE(4, 4, mr.lkey), True)
    assert view is not None
    view[:] = b"\x01\x00\x00\x00"
    assert arr[0, 1] == 1
    with pytest.raises(EngineError):
        pd.register(arr[:, 1].data, 0, Access.NONE)  # not contiguous


def test_cq_fifo_and_overflow_flag() -> None:
    cq = CompletionQueue(2)
    wcs = [Completion(wr_id=i, status=WcStatus.SUCCESS, opcode=WcOpcode.SEND) for i in range(3)]
    assert cq.push(wcs[0])
    assert cq.push(wcs[1])
    assert not cq.push(wcs[2])
    assert cq.overflowed
    assert cq.lost == 1
    assert len(cq) == 2
    assert cq.poll(5) == wcs[:2]
    assert cq.poll() == []
    with pytest.raises(EngineError):
        CompletionQueue(0)
