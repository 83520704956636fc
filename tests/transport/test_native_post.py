"""Native posting between two UDP devices, posting with their driver's clock (``UdpPort._post_now``).

The seeded equivalence runs (``tests/engine/test_engine_native_post.py``) show that
``post_small`` leaves every run as the engine's ``tx_post`` does. Here, on real sockets: a
WRITE ping (with READs and SENDs beside it) gives the same memory, completions and requester
state with native posting on and off, and the WRITEs and SENDs left in their posts (all but
the first in ``post_send``'s one native call, ``QueuePair.poster``); hostile
work requests (a bad L_Key, a range past the region, a bad remote address) are refused or
failed exactly as the engine refuses and fails them.
"""

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest

from rdmakit.engine import SGE, CompletionQueue, EngineError, RecvWR, SendWR, WcStatus, WrOpcode
from rdmakit.testing.engine import ALL_ACCESS
from rdmakit.transport import fastpath
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver

pytestmark = pytest.mark.skipif(fastpath.NATIVE is None, reason=f"native data plane: {fastpath.describe()}")


def _codec(on: bool, took: list[int]) -> Any:
    """The native codec, counting the posts that left natively in ``took``: [0] in the
    doorbell's ``post_small``, [1] in ``post_send``'s one call; ``on`` False: neither."""
    assert fastpath.NATIVE is not None
    codec = copy.copy(fastpath.NATIVE)
    real, whole = fastpath.NATIVE.post_small, fastpath.NATIVE.post_send
    assert real is not None
    assert whole is not None

    def post_small(*a: Any) -> Any:
        got = real(*a)
        took[0] += got is not None
        return got

    def post_send(*a: Any) -> Any:
        got = whole(*a)
        took[1] += got is not None
        return got

    codec.post_small = post_small if on else None
    codec.post_send = post_send if on else None
    return codec


def _ping(new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch, on: bool) -> tuple[Any, ...]:
    """120 round trips from a at b (WRITEs, a READ and a SEND now and then), then hostile posts;
    what both memories, the completions and a's requester say, and how many posts left natively."""
    took = [0, 0]
    monkeypatch.setattr(fastpath, "CODEC", _codec(on, took))
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b, Driver() as drv:
        drv.add(a)
        drv.add(b)
        a.post_with(drv.clock)
        cqa, cqb = CompletionQueue(256), CompletionQueue(256)
        qa = a.create_qp(send_cq=cqa, recv_cq=cqa)
        qb = b.create_qp(send_cq=cqb, recv_cq=cqb)
        ma, mb = bytearray(random.Random(3).randbytes(4096)), bytearray(4096)
        mra = a.pd.register(ma, 0x1000, ALL_ACCESS)
        mrb = b.pd.register(mb, 0x9000, ALL_ACCESS)
        connect_qp(a, qa, 10, local_endpoint(b, qb, 20))
        connect_qp(b, qb, 20, local_endpoint(a, qa, 10))
        done: list[Any] = []

        def wait() -> None:
            assert drv.run_until(lambda: len(cqa) > 0, 10.0)
            done.extend((wc.wr_id, wc.status, wc.opcode) for wc in cqa.poll())
            done.extend((wc.wr_id, wc.status, wc.opcode) for wc in cqb.poll())

        for i in range(120):
            off = (i * 8) % 2048
            if i % 20 == 19:
                qb.post_recv(RecvWR(wr_id=i, sg_list=(SGE(0x9000 + 3000, 64, mrb.lkey),)))
                wr = SendWR(
                    wr_id=i, opcode=WrOpcode.SEND_WITH_IMM, sg_list=(SGE(0x1000 + off, 8, mra.lkey),),
                    imm_data=i,
                )  # fmt: skip
            elif i % 10 == 9:
                wr = SendWR(
                    wr_id=i, opcode=WrOpcode.RDMA_READ, sg_list=(SGE(0x1000 + 2048 + off, 8, mra.lkey),),
                    remote_addr=0x9000 + off, rkey=mrb.rkey,
                )  # fmt: skip
            else:
                wr = SendWR(
                    wr_id=i, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000 + off, 8, mra.lkey),),
                    remote_addr=0x9000 + off, rkey=mrb.rkey,
                )  # fmt: skip
            qa.post_send(wr)
            wait()
        refused = []
        for bad in (
            SendWR(
                wr_id=900, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000, 8, mra.lkey),), remote_addr=-1
            ),
            SendWR(wr_id=901, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000, -8, mra.lkey),)),
            SendWR(wr_id=902, opcode=WrOpcode.SEND_WITH_IMM, sg_list=(SGE(0x1000, 8, mra.lkey),)),
        ):
            with pytest.raises(EngineError) as e:
                qa.post_send(bad)
            refused.append(e.value.args)
        r = qa.req
        state = (r.comp_psn, r.req_psn, r.sent_hwm, r.next_idx, len(r.sq), r.rd_out)
        # A range past the region, then a bad L_Key: each fails locally and the QP goes to ERR.
        qa.post_send(
            SendWR(wr_id=903, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000 + 4090, 8, mra.lkey),))
        )
        wait()
        qa.post_send(SendWR(wr_id=904, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000, 8, mra.lkey ^ 1),)))
        wait()
        return bytes(ma), bytes(mb), tuple(done), tuple(refused), state, qa.state, tuple(took)


def test_native_posting_equals_posting_at_the_pump(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    on = _ping(new_ip, monkeypatch, True)
    off = _ping(new_ip, monkeypatch, False)
    assert on[:-1] == off[:-1]
    assert off[-1] == (0, 0)
    # the 108 WRITEs and SENDs, but for a stalled host's retry; the first post to b only
    # rings the doorbell (which caches the path), the rest are post_send's one call
    assert sum(on[-1]) >= 0.8 * 108, on[-1]
    assert on[-1][1] >= 0.75 * 108, on[-1]
    assert on[2][-2:] == (
        (903, WcStatus.LOC_PROT_ERR, on[2][-2][2]),
        (904, WcStatus.WR_FLUSH_ERR, on[2][-1][2]),
    )
