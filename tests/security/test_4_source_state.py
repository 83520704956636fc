"""What the UDP device keeps per source address is bounded, whatever the sources.

Datagrams from addresses no QP is connected to leave nothing behind; sources
that pass the header checks (a connected peer's address, any port) share a
table of fixed size. Measured with real sockets for a sample of sources, and
through ``SoftDevice.receive_datagram`` for 200,000 of them (and 50,000 ports
of a connected peer's address).
"""

import gc
import random
import socket
import sys
import time
import types
from collections.abc import Callable, Iterator

import pytest

from rdmakit.transport import fastpath
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.roce_sources import MAX_IDENT_PEERS, MAX_RX_FLOWS
from rdmakit.wire import Opcode, Packet
from tests.security.hostile import Pair, connected_pair, datagram, spoil, stale_write

needs_native = pytest.mark.skipif(fastpath.native is None, reason=f"native data plane: {fastpath.describe()}")

SOURCES = 200_000
SPOOFED_PORTS = 50_000
BUDGET = 16 << 20


@pytest.fixture(params=[False, pytest.param(True, marks=needs_native)], ids=["python", "native"])
def pair(new_ip: Callable[[], str], request: pytest.FixtureRequest) -> Iterator[Pair]:
    p = connected_pair(new_ip, request.param)
    yield p
    p.close()


def _tables(dev: SoftDevice) -> dict[str, int]:
    """The sizes of the device's dicts (wherever per-source state would live)."""
    return {name: len(v) for name, v in vars(dev).items() if isinstance(v, dict)}


def _state_bytes(dev: SoftDevice) -> int:
    """The memory held by the device's dicts, everything they reach included (not types or modules)."""
    seen: set[int] = set()
    stack: list[object] = [v for v in vars(dev).values() if isinstance(v, dict)]
    total = 0
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, type | types.ModuleType | types.FunctionType | SoftDevice):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        stack.extend(gc.get_referents(o))
    return total


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_real_sources_no_qp_is_connected_to_leave_no_state(pair: Pair, new_ip: Callable[[], str]) -> None:
    p = pair
    p.transfer(20_000)  # the legitimate flow's state is there already
    before = _tables(p.b)
    n = 300
    b_addr = (p.b.ip, p.b.port)
    for _ in range(n):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((new_ip(), 0))
            me = s.getsockname()
            s.sendto(datagram(stale_write(p.qb.qpn), me, b_addr), b_addr)  # a good ICRC, the wrong source
            s.sendto(datagram(Packet(Opcode.SEND_ONLY, 0x777777, 1), me, b_addr), b_addr)  # no such QP
    c = p.b.counters
    assert p.drv.run_until(lambda: c.wrong_source + c.unknown_qp >= 2 * n, 10)
    assert (c.wrong_source, c.unknown_qp) == (n, n)
    assert _tables(p.b) == before
    p.transfer(20_000, seed=2)


def test_200k_sources_add_at_most_16_mib_and_the_tables_stay_bounded(pair: Pair) -> None:
    p = pair
    p.transfer(20_000)
    rng = random.Random(4)
    b, qpn, dst = p.b, p.qb.qpn, (p.b.ip, p.b.port)
    to_qp = datagram(stale_write(qpn, b"z" * 16), ("127.1.2.3", 4791), dst)
    to_none = datagram(Packet(Opcode.SEND_ONLY, 0x777777, 1, payload=b"q" * 8), ("127.1.2.3", 4791), dst)
    junk = rng.randbytes(64)
    spoofed = spoil(datagram(stale_write(qpn, b"s" * 32), (p.a.ip, 1), dst))  # the peer's address, any port
    before_tables = _tables(b)
    now = time.monotonic()
    rss0, state0 = _rss(), _state_bytes(b)
    for i in range(SOURCES):
        # 127.x.y.z: a distinct address for each: to our QP, to none, or junk.
        src = (f"127.{64 + (i >> 16)}.{(i >> 8) & 0xFF}.{i & 0xFF}", 1024 + i % 50_000)
        b.receive_datagram((to_qp, to_none, junk)[i % 3], src, now)
    for port in range(1024, 1024 + SPOOFED_PORTS):
        b.receive_datagram(spoofed, (p.a.ip, port), now)  # the peer's address: a flow each
    grew, rss_grew = _state_bytes(b) - state0, _rss() - rss0
    print(f"200k sources: device state +{grew / 1024:.0f} KiB, RSS +{rss_grew / 1024:.0f} KiB, {_tables(b)}")
    assert grew <= BUDGET
    assert rss_grew <= BUDGET
    after = _tables(b)
    for name, size in after.items():
        assert size <= max(before_tables[name], MAX_RX_FLOWS, MAX_IDENT_PEERS), name
    c = b.counters
    wrong = (SOURCES + 2) // 3
    assert (c.wrong_source, c.unknown_qp, c.bad_icrc) == (wrong, SOURCES - wrong, SPOOFED_PORTS)
    p.transfer(100_000, seed=3)
