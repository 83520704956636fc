"""The TCP reader receives large WRITE payloads straight into the target memory.

``QueuePair.rx_place`` says where a WRITE packet's payload lands before the
packet is complete; the stream reader then reads the rest of the frame there
and hands the engine the packet with that buffer as its payload, which is
checked as usual but not copied again. Whatever the placer refuses (another
QP's memory, a bad R_Key, a WRITE with immediate, out of order) takes the
ordinary path, with the ordinary errors.
"""

import random
import socket
from collections.abc import Callable, Iterator

import pytest

from rdmakit.engine import (
    SGE,
    Access,
    Completion,
    CompletionQueue,
    QpCaps,
    RecvWR,
    SendWR,
    WcStatus,
    WrOpcode,
)
from rdmakit.testing.engine import until_completions
from rdmakit.transport import tcp
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


class _Pair:
    def __init__(self, new_ip: Callable[[], str], mtu: int, place: bool = True) -> None:
        self.a = SoftDevice(new_ip(), transport="tcp", port=0)
        self.b = SoftDevice(new_ip(), transport="tcp", port=0, bulk=place)
        for dev in (self.a, self.b):  # accepted streams inherit the listener's buffer size
            assert dev.tcp is not None
            dev.tcp.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, tcp._BUF)
        self.drv = Driver()
        self.drv.add(self.a)
        self.drv.add(self.b)
        self.cqa, self.cqb = CompletionQueue(64), CompletionQueue(64)
        caps = QpCaps(large_mtu=True)
        self.qa = self.a.create_qp(send_cq=self.cqa, recv_cq=self.cqa, caps=caps)
        self.qb = self.b.create_qp(send_cq=self.cqb, recv_cq=self.cqb, caps=caps)
        connect_qp(self.a, self.qa, 10, local_endpoint(self.b, self.qb, 20, mtu))
        connect_qp(self.b, self.qb, 20, local_endpoint(self.a, self.qa, 10, mtu))

    def write(
        self, src: bytearray, dst: bytearray, *, rkey_delta: int = 0, imm: int | None = None
    ) -> Completion:
        mra = self.a.pd.register(src, 0x10_0000, Access.LOCAL_WRITE)
        mrb = self.b.pd.register(dst, 0x900_0000, ALL)
        op = WrOpcode.RDMA_WRITE if imm is None else WrOpcode.RDMA_WRITE_WITH_IMM
        self.qa.post_send(
            SendWR(
                wr_id=1, opcode=op, sg_list=(SGE(mra.addr, len(src), mra.lkey),), remote_addr=mrb.addr,
                rkey=mrb.rkey + rkey_delta, imm_data=imm,
            )
        )  # fmt: skip
        got: list[Completion] = []
        assert self.drv.run_until(until_completions(self.cqa, got), 30)
        return got[0]

    @property
    def placed(self) -> int:
        assert self.b.tcp is not None
        return self.b.tcp.placed_frames

    def close(self) -> None:
        self.a.close()
        self.b.close()
        self.drv.close()


@pytest.fixture
def pairs(new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., _Pair]]:
    # Small socket buffers: the reader meets frames half in, as between processes
    # (in one process a whole frame would otherwise always be there already).
    monkeypatch.setattr(tcp, "_BUF", 16 << 10)
    made: list[_Pair] = []

    def make(mtu: int, place: bool = True) -> _Pair:
        made.append(_Pair(new_ip, mtu, place))
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.mark.parametrize(
    ("mtu", "size", "placed"),
    [(1 << 20, 1 << 20, 1), (1 << 20, 3 << 20, 3), (1 << 17, (1 << 20) + 12345, 8), (1 << 20, 70000, 1)],
    ids=["only", "only-x3", "first-middle-last", "just-over-the-minimum"],
)
def test_large_writes_land_in_place_and_intact(
    pairs: Callable[..., _Pair], mtu: int, size: int, placed: int
) -> None:
    """Every frame of 64 KiB or more is placed (the short LAST packet is not)."""
    rng = random.Random(size)
    p = pairs(mtu)
    src, dst = bytearray(rng.randbytes(size)), bytearray(size)
    wc = p.write(src, dst)
    assert wc.status is WcStatus.SUCCESS
    assert dst == src
    assert p.placed == placed
    assert p.b.counters.placed == placed
    stats = p.qb.stats
    assert not stats.dropped


def test_placement_changes_nothing_but_the_copies(pairs: Callable[..., _Pair]) -> None:
    size = (1 << 20) * 2 + 100
    rng = random.Random(1)
    src = bytearray(rng.randbytes(size))
    placed, plain = pairs(1 << 18), pairs(1 << 18, place=False)
    d1, d2 = bytearray(size), bytearray(size)
    assert placed.write(src, d1).status is WcStatus.SUCCESS
    assert plain.write(src, d2).status is WcStatus.SUCCESS
    assert d1 == d2 == src
    assert placed.placed > 0
    assert plain.placed == 0
    assert placed.qb.stats == plain.qb.stats


def test_what_the_placer_refuses_takes_the_ordinary_path(pairs: Callable[..., _Pair]) -> None:
    p = pairs(1 << 20)
    size = 1 << 20
    src, dst = bytearray(random.Random(2).randbytes(size)), bytearray(size)
    wc = p.write(src, dst, rkey_delta=1)  # no such R_Key: a NAK, nothing lands
    assert wc.status is WcStatus.REM_ACCESS_ERR
    assert dst == bytearray(size)
    assert p.placed == 0


def test_write_with_immediate_is_not_placed_but_arrives(pairs: Callable[..., _Pair]) -> None:
    p = pairs(1 << 20)
    p.qb.post_recv(RecvWR(wr_id=5, sg_list=()))
    size = 1 << 20
    src, dst = bytearray(random.Random(3).randbytes(size)), bytearray(size)
    assert p.write(src, dst, imm=0x1234).status is WcStatus.SUCCESS
    assert dst == src
    assert p.placed == 0
    (rwc,) = p.cqb.poll(1)
    assert rwc.imm_data == 0x1234
