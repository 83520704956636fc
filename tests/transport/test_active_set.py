"""The UDP port's transmit visits only the QPs with work (its active set), and misses none.

A QP joins the set when a user call rings its doorbell (``post_send``, ``modify``),
a segment reaches it or a timer of it fires, and leaves once ``may_transmit``
says it has nothing to send. ``sweep`` (every few dozen idle polls) puts every
QP back as a safety net; the tests that show nothing is missed switch it off.
"""

import time
from collections import Counter
from collections.abc import Callable

import pytest

from rdmakit.engine import SGE, Access, CompletionQueue, QueuePair, RecvWR, SendWR, WcStatus, WrOpcode
from rdmakit.transport.connect import ConnectOptions, connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.transport.roce_udp import UdpPort

_ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


def _connect(
    a: SoftDevice, b: SoftDevice, n: int, cq_a: CompletionQueue, cq_b: CompletionQueue, **opts: int
) -> list[tuple[QueuePair, QueuePair]]:
    pairs = []
    for i in range(n):
        qa = a.create_qp(send_cq=cq_a, recv_cq=cq_a)
        qb = b.create_qp(send_cq=cq_b, recv_cq=cq_b)
        o = ConnectOptions(**opts)
        connect_qp(a, qa, 100 + i, local_endpoint(b, qb, 900 + i), o)
        connect_qp(b, qb, 900 + i, local_endpoint(a, qa, 100 + i), o)
        pairs.append((qa, qb))
    return pairs


def _visits(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Count ``may_transmit`` calls by QPN (the port asks it of each QP it visits)."""
    seen: Counter[int] = Counter()
    orig = QueuePair.may_transmit

    def may_transmit(self: QueuePair) -> bool:
        seen[self.qpn] += 1
        return orig(self)

    monkeypatch.setattr(QueuePair, "may_transmit", may_transmit)
    return seen


def _no_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    def sweep(self: UdpPort) -> None:
        return None

    monkeypatch.setattr(UdpPort, "sweep", sweep)


def test_idle_polls_visit_no_qp_and_a_post_visits_one(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b:
        cq_a, cq_b = CompletionQueue(64), CompletionQueue(64)
        pairs = _connect(a, b, 64, cq_a, cq_b)
        a.progress(time.monotonic())  # the connections' doorbells: each QP once, then not again
        seen = _visits(monkeypatch)
        for _ in range(10):
            a.progress(time.monotonic())
        assert not seen
        src, dst = bytearray(8), bytearray(8)
        mra = a.pd.register(src, 0x1000, _ALL)
        mrb = b.pd.register(dst, 0x2000, _ALL)
        qa = pairs[17][0]
        qa.post_send(
            SendWR(
                wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000, 8, mra.lkey),), remote_addr=0x2000,
                rkey=mrb.rkey,
            )
        )  # fmt: skip
        a.progress(time.monotonic())
        assert set(seen) == {qa.qpn}


def test_interleaved_work_on_many_qps_completes_without_the_sweep(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_sweep(monkeypatch)
    n = 32
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b, Driver() as drv:
        drv.add(a)
        drv.add(b)
        cq_a, cq_b = CompletionQueue(4096), CompletionQueue(4096)
        pairs = _connect(a, b, n, cq_a, cq_b)
        ma = bytearray(bytes(range(256)) * 64)
        mb = bytearray(len(ma))
        orig = bytes(ma)
        mra = a.pd.register(ma, 0x10000, _ALL)
        mrb = b.pd.register(mb, 0x90000, _ALL)
        chunk = len(ma) // n
        posted = 0
        for i, (qa, qb) in enumerate(pairs):
            off = i * chunk
            half = chunk // 2
            qb.post_recv(RecvWR(wr_id=i, sg_list=(SGE(0x90000 + off + half, half, mrb.lkey),)))
            for wr_id, op, lo, length in (
                (3 * i, WrOpcode.RDMA_WRITE, 0, half),  # several packets at the default MTU
                (3 * i + 1, WrOpcode.SEND, half, half),
                (3 * i + 2, WrOpcode.RDMA_READ, 0, 8),
            ):
                local = lo if op is not WrOpcode.RDMA_READ else chunk - 8
                sge = SGE(0x10000 + off + local, length, mra.lkey)
                qa.post_send(
                    SendWR(
                        wr_id=wr_id, opcode=op, sg_list=(sge,), remote_addr=0x90000 + off + lo, rkey=mrb.rkey
                    )
                )
                posted += 1
        done: list[WcStatus] = []

        def finished() -> bool:
            done.extend(wc.status for wc in cq_a.poll(4096))
            cq_b.poll(4096)
            return len(done) == posted

        assert drv.run_until(finished, 30.0)
        assert set(done) == {WcStatus.SUCCESS}
        for i in range(n):
            off = i * chunk
            assert mb[off : off + chunk] == orig[off : off + chunk], i  # the WRITE, then the SEND
            assert ma[off + chunk - 8 : off + chunk] == orig[off : off + 8], i  # the READ


def test_a_retransmit_timer_wakes_its_qp_without_the_sweep(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_sweep(monkeypatch)
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b:
        cq_a, cq_b = CompletionQueue(64), CompletionQueue(64)
        ((qa, _qb),) = _connect(a, b, 1, cq_a, cq_b, timeout=8)  # a local ACK timeout of about 1 ms
        src, dst = bytearray(b"rdmakit!"), bytearray(8)
        mra = a.pd.register(src, 0x1000, _ALL)
        mrb = b.pd.register(dst, 0x2000, _ALL)
        qa.post_send(
            SendWR(
                wr_id=7, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000, 8, mra.lkey),), remote_addr=0x2000,
                rkey=mrb.rkey,
            )
        )  # fmt: skip
        give_up = time.monotonic() + 20.0
        while qa.stats.retransmits == 0 and time.monotonic() < give_up:  # b is not polled: no ACK
            a.progress(time.monotonic())
        assert qa.stats.timeouts >= 1
        assert qa.stats.retransmits >= 1
        while len(cq_a) == 0 and time.monotonic() < give_up:
            a.progress(time.monotonic())
            b.progress(time.monotonic())
        (wc,) = cq_a.poll(1)
        assert wc.status is WcStatus.SUCCESS
        assert dst == src
