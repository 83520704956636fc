"""Work requests and completions between the engine's types and libibverbs': immediates, wr_ids."""

import struct

import pytest

from rdmakit.engine.types import SGE, SendWR, WcOpcode, WcStatus, WrOpcode
from rdmakit.verbs import WrTracker, imm_from_verbs, imm_to_verbs
from rdmakit.verbs.wr import WC_WITH_IMM, wc_opcode_for

WIRE = 0x1234_5678  # the ImmDt as on the wire: bytes 12 34 56 78


def test_imm_is_be32_in_memory() -> None:
    """ibv_send_wr.imm_data is __be32: its memory bytes are the wire bytes; pyverbs reads it native."""
    raw_le = imm_to_verbs(WIRE, "little")
    assert struct.pack("<I", raw_le) == bytes.fromhex("12345678")
    assert raw_le == 0x7856_3412
    assert imm_to_verbs(WIRE, "big") == WIRE
    for order in ("little", "big"):
        assert imm_from_verbs(imm_to_verbs(WIRE, order), order) == WIRE
    assert imm_to_verbs(0x1_0000_0001, "big") == 1  # masked to u32


def test_requester_opcodes() -> None:
    assert [wc_opcode_for(op) for op in WrOpcode] == [
        WcOpcode.RDMA_WRITE, WcOpcode.RDMA_WRITE, WcOpcode.SEND, WcOpcode.SEND, WcOpcode.RDMA_READ,
        WcOpcode.COMP_SWAP, WcOpcode.FETCH_ADD,
    ]  # fmt: skip


def _send(wr_id: int, op: WrOpcode = WrOpcode.SEND, *, signaled: bool = True) -> SendWR:
    return SendWR(wr_id=wr_id, opcode=op, sg_list=(SGE(0x1000, 8, 1),), signaled=signaled)


def _wc(t: WrTracker, iid: int, status: WcStatus = WcStatus.SUCCESS, opcode: int = 0, **kw: int):  # type: ignore[no-untyped-def]
    fields = {"byte_len": 0, "imm_data": 0, "wc_flags": 0, "qp_num": 7, "src_qp": 0, "vendor_err": 0}
    fields.update(kw)
    return t.completion(wr_id=iid, status=int(status), opcode=opcode, byteorder="little", **fields)


def test_wr_ids_map_back_and_internal_ids_are_unique() -> None:
    t = WrTracker()
    # The caller may reuse a wr_id on both queues; the internal ids still differ.
    s = t.post_send(_send(5, WrOpcode.RDMA_READ))
    r = t.post_recv(5)
    assert s != r
    c = _wc(t, r, opcode=WcOpcode.RECV, byte_len=3)
    assert (c.wr_id, c.opcode, c.byte_len, c.qp_num) == (5, WcOpcode.RECV, 3, 7)
    c = _wc(t, s, opcode=WcOpcode.RDMA_READ)
    assert (c.wr_id, c.opcode) == (5, WcOpcode.RDMA_READ)
    assert len(t) == 0


def test_failed_completions_name_the_posted_operation() -> None:
    """verbs leaves ibv_wc.opcode undefined on error (rxe: 0 on flushed receives)."""
    t = WrTracker()
    read = t.post_send(_send(1, WrOpcode.RDMA_READ))
    cas = t.post_send(_send(2, WrOpcode.ATOMIC_CMP_AND_SWP))
    recv = t.post_recv(3)
    c1 = _wc(t, read, WcStatus.REM_ACCESS_ERR, opcode=0)
    c2 = _wc(t, cas, WcStatus.WR_FLUSH_ERR, opcode=0)
    c3 = _wc(t, recv, WcStatus.WR_FLUSH_ERR, opcode=0)
    assert [(c.wr_id, c.status, c.opcode) for c in (c1, c2, c3)] == [
        (1, WcStatus.REM_ACCESS_ERR, WcOpcode.RDMA_READ),
        (2, WcStatus.WR_FLUSH_ERR, WcOpcode.COMP_SWAP),
        (3, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV),
    ]


def test_unsignaled_sends_retire_with_the_next_completion() -> None:
    t = WrTracker()
    ids = [t.post_send(_send(i, signaled=i == 3)) for i in range(4)]
    assert len(t) == 4
    c = _wc(t, ids[3])
    assert c.wr_id == 3
    assert len(t) == 0  # 0..2 completed before 3: an RC send queue completes in order


def test_immediate_only_on_receive_completions() -> None:
    t = WrTracker()
    raw = imm_to_verbs(WIRE, "little")
    r = t.post_recv(1)
    c = _wc(t, r, opcode=WcOpcode.RECV_RDMA_WITH_IMM, imm_data=raw, wc_flags=WC_WITH_IMM, byte_len=64)
    assert (c.opcode, c.imm_data, c.byte_len) == (WcOpcode.RECV_RDMA_WITH_IMM, WIRE, 64)
    r = t.post_recv(2)
    assert _wc(t, r, opcode=WcOpcode.RECV, imm_data=raw).imm_data is None  # flag not set
    # rxe flags a requester's SEND_WITH_IMM completion too, with imm_data 0: not an ImmDt.
    s = t.post_send(_send(3, WrOpcode.SEND_WITH_IMM))
    assert _wc(t, s, opcode=WcOpcode.SEND, wc_flags=WC_WITH_IMM).imm_data is None


def test_unpost_and_unknown_ids() -> None:
    t = WrTracker()
    s = t.post_send(_send(1))
    r = t.post_recv(2)
    t.unpost(s)
    t.unpost(r)
    assert len(t) == 0
    assert t.complete(s) is None
    c = _wc(t, 999, WcStatus.GENERAL_ERR)
    assert c.wr_id == 999  # not ours: passed through as is


@pytest.mark.parametrize("status", [77, 1 << 20])
def test_unknown_status_is_general_err(status: int) -> None:
    t = WrTracker()
    s = t.post_send(_send(1))
    c = t.completion(
        wr_id=s, status=status, opcode=0, byte_len=0, imm_data=0, wc_flags=0, qp_num=0, src_qp=0, vendor_err=9
    )
    assert (c.status, c.opcode, c.vendor_err) == (WcStatus.GENERAL_ERR, WcOpcode.SEND, 9)
