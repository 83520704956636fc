"""A soft device's pump skips its driver while quiet, and wakes for what may have given it work.

``rdmakit.doca._soft_pump``: after a run that found nothing, the pump runs
its `Driver` again only when the device's bell rang (a backend call that may
give the engine work), when the driver's descriptor turned readable (a
datagram, a deadline's timer), or after `QUIET_RUNS` skipped calls. The
driver's runs are counted here, never timed.
"""

import copy
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rdmakit.doca import SoftBackendDevice, SoftBackendQP
from rdmakit.doca._soft_pump import QUIET_RUNS, SoftPump
from rdmakit.engine.types import SGE, Access, Completion, QpCaps, RecvWR, SendWR, WcStatus, WrOpcode
from rdmakit.transport import fastpath
from rdmakit.verbs.buffers import buffer_address

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


class _Pair:
    def __init__(self, new_ip: Callable[[], str]) -> None:
        self.a = SoftBackendDevice("roce-udp", new_ip())
        self.b = SoftBackendDevice("roce-udp", new_ip())
        self.qa: SoftBackendQP = self.a.create_qp(QpCaps())
        self.qb: SoftBackendQP = self.b.create_qp(QpCaps())
        self.qa.init(RW)
        self.qb.init(RW)
        self.qa.connect(self.qb.export())
        self.qb.connect(self.qa.export())
        self.buf = bytearray(64)
        view = memoryview(self.buf)
        self.reg_a = self.a.register_memory(view[:32], buffer_address(view), RW)
        self.reg_b = self.b.register_memory(view[32:], buffer_address(view) + 32, RW)

    def close(self) -> None:
        self.a.close()
        self.b.close()


@pytest.fixture
def pair(new_ip: Callable[[], str]) -> Iterator[_Pair]:
    p = _Pair(new_ip)
    yield p
    p.close()


def _settle(pump: SoftPump) -> None:
    """Run the pump until a run finds nothing (it is quiet then)."""
    for _ in range(10_000):
        if not pump.progress():
            return
    raise AssertionError("the pump never went quiet")


def _counted(pump: SoftPump, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The results of the pump's driver runs from now on."""
    runs: list[bool] = []
    inner = pump.driver.progress

    def progress() -> bool:
        runs.append(inner())
        return runs[-1]

    monkeypatch.setattr(pump.driver, "progress", progress)
    return runs


def _pump_of(dev: SoftBackendDevice) -> SoftPump:
    assert isinstance(dev.pump, SoftPump)
    return dev.pump


def test_a_quiet_pump_skips_its_driver_and_a_post_rings_it_awake(
    pair: _Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    pa, pb = _pump_of(pair.a), _pump_of(pair.b)
    _settle(pa)
    _settle(pb)
    runs = _counted(pa, monkeypatch)
    for _ in range(5):
        assert not pa.progress()
    assert runs == []  # quiet: five calls, no run

    pair.qb.post_recv(RecvWR(wr_id=1, sg_list=(SGE(pair.reg_b.addr, 32, pair.reg_b.lkey),)))
    pair.buf[:8] = b"rings!!!"
    pair.qa.post_send(
        SendWR(wr_id=2, opcode=WrOpcode.SEND, sg_list=(SGE(pair.reg_a.addr, 8, pair.reg_a.lkey),))
    )
    port = pair.a.soft.udp_port
    assert port is not None
    if port.post_clock is not None and port.codec.post_small is not None:
        # Native posting (on for every device a driver pumps): the SEND left in its post_send,
        # which rang the bell all the same; this call runs the driver, which has nothing to send.
        assert not pa.progress()
        assert runs == [False]
    else:  # RDMAKIT_PURE_PYTHON=1: the post waits for the pump
        assert pa.progress()  # the post rang: this call runs the driver, which sends the SEND
        assert runs == [True]
    # Only the far side pumps now: the SEND that left arrives.
    got: list[Completion] = []
    for _ in range(10_000):
        pb.progress()
        got += pair.qb.poll(1)
        if got:
            break
    assert [(wc.wr_id, wc.status) for wc in got] == [(1, WcStatus.SUCCESS)]
    assert pair.buf[32:40] == b"rings!!!"


def test_a_quiet_pump_runs_when_a_datagram_arrives(pair: _Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    pa = _pump_of(pair.a)
    _settle(pa)
    runs = _counted(pa, monkeypatch)
    before = pair.a.soft.counters.as_dict()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"\x00" * 40, (pair.a.soft.ip, pair.a.soft.port))  # loopback: queued before sendto returns
    assert pa.progress()
    assert len(runs) == 1
    after = pair.a.soft.counters.as_dict()
    assert sum(after.values()) > sum(before.values())  # the device read it (and refused it)


def test_a_quiet_pump_still_runs_its_driver_every_QUIET_RUNS_calls(
    pair: _Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    pa = _pump_of(pair.a)
    _settle(pa)
    runs = _counted(pa, monkeypatch)
    for _ in range(QUIET_RUNS):
        pa.progress()
    assert runs == []
    pa.progress()
    assert runs == [False]
    for _ in range(QUIET_RUNS):
        pa.progress()
    assert runs == [False]  # quiet again after that run


@pytest.mark.skipif(
    fastpath.NATIVE is None or fastpath.NATIVE.post_small is None,
    reason=f"native posting: {fastpath.describe()}",
)
@pytest.mark.parametrize("native", [True, False])
def test_a_soft_device_sends_a_post_in_the_post_itself(
    native: bool, new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SEND posted to a DOCA soft device's QP reaches the far side with no run of its own pump
    (``SoftDevice.post_with``, as ``rdmakit bench``'s engine row posts); without the native
    ``post_small`` it waits for that run."""
    assert fastpath.NATIVE is not None
    codec = copy.copy(fastpath.NATIVE)
    if not native:
        codec.post_small = None
    monkeypatch.setattr(fastpath, "CODEC", codec)
    pair = _Pair(new_ip)
    try:
        pb = _pump_of(pair.b)
        _settle(_pump_of(pair.a))  # what the connection left to do is done: a's QP is idle
        _settle(pb)
        pair.qb.post_recv(RecvWR(wr_id=1, sg_list=(SGE(pair.reg_b.addr, 32, pair.reg_b.lkey),)))
        pair.buf[:8] = b"at once!"
        pair.qa.post_send(
            SendWR(wr_id=2, opcode=WrOpcode.SEND, sg_list=(SGE(pair.reg_a.addr, 8, pair.reg_a.lkey),))
        )
        got: list[Any] = []
        for _ in range(200):  # only the far side pumps
            pb.progress()
            got += pair.qb.poll(1)
        assert [wc.wr_id for wc in got] == ([1] if native else [])
        if not native:
            _pump_of(pair.a).progress()  # the pump's run sends it
            for _ in range(200):
                pb.progress()
                got += pair.qb.poll(1)
            assert [wc.wr_id for wc in got] == [1]
        assert pair.buf[32:40] == b"at once!"
    finally:
        pair.close()
