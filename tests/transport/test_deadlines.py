"""A device's poll looks only at the QPs whose timer is due (``deadlines.DeadlineHeap``), and
misses none: not every QP's ``get_timer`` on every poll, as a scan would."""

import random
import time
from collections import Counter
from collections.abc import Callable

import pytest

from rdmakit.engine import (
    SGE,
    Access,
    CompletionQueue,
    ProtectionDomain,
    QueuePair,
    SendWR,
    WcStatus,
    WrOpcode,
)
from rdmakit.transport import device as device_module
from rdmakit.transport.connect import ConnectOptions, connect_qp, local_endpoint
from rdmakit.transport.deadlines import DeadlineHeap
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.roce_udp import UdpPort

_ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE


class _Timed(QueuePair):
    """A QP whose deadline the test sets (``get_timer`` is the engine's interface to it)."""

    def __init__(self, qpn: int) -> None:
        cq = CompletionQueue(1)
        rng = random.Random(1)
        super().__init__(ProtectionDomain(rng), qpn=qpn, send_cq=cq, recv_cq=cq, rng=rng)
        self.at: float | None = None

    def get_timer(self) -> float | None:
        return self.at


def test_the_heap_hands_out_due_qps_once_in_deadline_order() -> None:
    heap = DeadlineHeap()
    qps = [_Timed(10 + i) for i in range(5)]
    for qp, t in zip(qps, (5.0, 1.0, 3.0, None, 2.0), strict=True):
        qp.at = t
        heap.note(qp)
    assert len(heap) == 4
    assert heap.earliest() == 1.0
    qps[1].at = 4.0  # moved later, noted: the entry at 1.0 is stale
    heap.note(qps[1])
    assert heap.earliest() == 2.0
    assert heap.due(3.0) == [qps[4], qps[2]]
    assert heap.due(3.0) == []  # spent
    heap.forget(qps[1])
    assert heap.earliest() == 5.0
    qps[0].at = None
    heap.note(qps[0])
    assert heap.earliest() is None
    assert heap.due(100.0) == []


def test_moving_a_deadline_back_and_forth_keeps_the_heap_bounded() -> None:
    heap = DeadlineHeap()
    qp = _Timed(7)
    for i in range(10_000):
        qp.at = float(i % 3)
        heap.note(qp)
    assert len(heap._heap) <= 2 * len(heap) + 65
    assert heap.due(0.5) == ([qp] if qp.at == 0.0 else [])


def _connect(a: SoftDevice, b: SoftDevice, n: int, **opts: int) -> list[tuple[QueuePair, QueuePair]]:
    cq_a, cq_b = CompletionQueue(4 * n), CompletionQueue(4 * n)
    pairs = []
    for i in range(n):
        qa = a.create_qp(send_cq=cq_a, recv_cq=cq_a)
        qb = b.create_qp(send_cq=cq_b, recv_cq=cq_b)
        o = ConnectOptions(**opts)
        connect_qp(a, qa, 100 + i, local_endpoint(b, qb, 900 + i), o)
        connect_qp(b, qb, 900 + i, local_endpoint(a, qa, 100 + i), o)
        pairs.append((qa, qb))
    return pairs


def _write(qa: QueuePair, a: SoftDevice, b: SoftDevice, wr_id: int) -> None:
    src, dst = bytearray(b"rdmakit!"), bytearray(8)
    mra = a.pd.register(src, 0x1000 + 0x100 * wr_id, _ALL)
    mrb = b.pd.register(dst, 0x8000 + 0x100 * wr_id, _ALL)
    qa.post_send(
        SendWR(
            wr_id=wr_id, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(mra.addr, 8, mra.lkey),),
            remote_addr=mrb.addr, rkey=mrb.rkey,
        )
    )  # fmt: skip


def _asked(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """``get_timer`` calls by QPN."""
    seen: Counter[int] = Counter()
    orig = QueuePair.get_timer

    def get_timer(self: QueuePair) -> float | None:
        seen[self.qpn] += 1
        return orig(self)

    monkeypatch.setattr(QueuePair, "get_timer", get_timer)
    return seen


def test_a_busy_poll_asks_only_the_qps_it_touched_for_their_deadline(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b:
        pairs = _connect(a, b, 128)
        a.progress(time.monotonic())  # the connections' doorbells
        asked = _asked(monkeypatch)
        qa = pairs[42][0]
        _write(qa, a, b, 1)
        assert a.progress(time.monotonic())  # busy: the WRITE leaves and its timer starts
        assert set(asked) == {qa.qpn}
        assert a.deadline_hint() == qa.get_timer() is not None


def test_timers_of_many_qps_fire_from_the_heap_alone(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the idle rescan and sweep, each QP's retransmit timer fires (b is not polled at
    first: no ACK), every WRITE then completes, and a due poll visits only the due QPs."""
    monkeypatch.setattr(device_module, "_DEADLINE_RESCAN", 1 << 40)
    monkeypatch.setattr(UdpPort, "sweep", lambda self: None)
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b:
        pairs = _connect(a, b, 64, timeout=8)  # a local ACK timeout of about 1 ms
        a.progress(time.monotonic())
        writers = [pairs[i][0] for i in (3, 30, 61)]
        for i, qa in enumerate(writers):
            _write(qa, a, b, i + 1)
        a.progress(time.monotonic())
        asked = _asked(monkeypatch)
        give_up = time.monotonic() + 30.0
        while any(q.stats.retransmits == 0 for q in writers) and time.monotonic() < give_up:
            a.progress(time.monotonic())
        assert all(q.stats.timeouts >= 1 and q.stats.retransmits >= 1 for q in writers)
        assert set(asked) == {q.qpn for q in writers}
        cq = writers[0].send_cq
        done: list[WcStatus] = []
        while len(done) < len(writers) and time.monotonic() < give_up:
            a.progress(time.monotonic())
            b.progress(time.monotonic())
            done += [wc.status for wc in cq.poll(8)]
        assert done == [WcStatus.SUCCESS] * len(writers)
