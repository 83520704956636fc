"""perftest's latency loop runs the engine as the bench does: it polls before it sleeps.

``rdmakit bench`` times its round trips with both ends polling for 200 µs
(``--spin-us``) before they block; the C perftest polls its CQ without end.
perftest's pump used to block in epoll at every idle turn, so each half of a
``ib_write_lat`` iteration paid a wake-up (and ``ib_read_lat``'s server, which
serves READs while it waits for the client's closing message, paid one per
READ). A clock that moves 1 µs per reading makes the checks exact: never a
time asserted, only whether the pump blocked.
"""

import itertools
import socket
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest

from rdmakit.cli import bench_qp, perftest
from rdmakit.cli.bench_qp import SPIN, open_device, pump
from rdmakit.cli.bench_qp import TestQp as Qp
from rdmakit.transport.oob import OobStream


@pytest.fixture
def idle_qp(new_ip: Callable[[], str]) -> Iterator[Qp]:
    dev = open_device(new_ip(), None)
    tq = Qp(dev, send_depth=1, recv_depth=1)
    yield tq
    tq.close()
    dev.close()


def _fake_clock() -> SimpleNamespace:
    ticks = itertools.count()
    return SimpleNamespace(monotonic=lambda: next(ticks) * 1e-6, perf_counter=lambda: next(ticks) * 1e-6)


def test_the_pump_polls_before_it_blocks(idle_qp: Qp, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_qp, "time", _fake_clock())
    blocked: list[float] = []

    def wait_readable(_fd: int, timeout: float) -> bool:
        blocked.append(timeout)
        return False

    monkeypatch.setattr(bench_qp, "wait_readable", wait_readable)
    turns = itertools.count()
    # Done after 20 idle turns: well inside the 200 µs of polling (a few clock readings a turn).
    pump([idle_qp], lambda _i, _wc: None, lambda: next(turns) >= 20, 60.0, "test")
    assert blocked == []
    # Idle past the polling window, it blocks (and the time it waits is bounded).
    turns = itertools.count()
    pump([idle_qp], lambda _i, _wc: None, lambda: next(turns) >= 2000, 60.0, "test")
    assert blocked
    assert all(t <= 0.05 for t in blocked)


def test_the_exchange_serves_the_device_polling(idle_qp: Qp, monkeypatch: pytest.MonkeyPatch) -> None:
    """While ib_read_lat's server waits for the client's closing message, it polls the device
    for the polling window after each bit of work, not once per wake-up."""
    monkeypatch.setattr(perftest, "time", _fake_clock())
    with socket.create_server(("127.0.0.1", 0)) as listener:
        b = socket.create_connection(listener.getsockname())
        a, _ = listener.accept()
    with OobStream(a, "peer") as stream:
        ex = perftest.Exchange(stream, client=False)
        ex.qps = [idle_qp]
        calls = itertools.count()
        real = idle_qp.dev.pump.progress
        monkeypatch.setattr(idle_qp.dev.pump, "progress", lambda: (next(calls), real())[1])
        ex._service()
        n = next(calls)
    b.close()
    assert n > 10  # polled through the window (1 µs a clock reading), then back to the socket
    assert n < SPIN * 1e6 * 2
