"""The UDP receive path checks headers before the ICRC, and bounds the IPv4-ID solver.

rxe (``rxe_rcv()``, rxe_recv.c) runs ``hdr_check()`` (TVer, the QP, its
peer's address) before it computes the ICRC. The soft device does the same,
on the Python and the native path: a datagram for no QP of ours, from an
address the QP is not connected to, or with a header ``decode`` refuses
never costs a CRC, let alone the solver. The solver (which recovers a kernel
peer's IPv4 ID from the ICRC) runs only for a connected peer's address, at a
bounded rate, and a solved ID is believed only just after the sender's last.
"""

import random
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rdmakit.transport import fastpath
from rdmakit.wire import Opcode, Packet
from rdmakit.wire.ident import (
    IDENT_IDLE_RATE,
    IDENT_WINDOW,
    JUMP_INTERVAL,
    SOLVE_BURST,
    SOLVE_RATE,
    IdentWindow,
)
from tests.security.hostile import Pair, SolverCalls, connected_pair, datagram, spoil, stale_write

needs_native = pytest.mark.skipif(fastpath.native is None, reason=f"native data plane: {fastpath.describe()}")


@pytest.fixture(params=[False, pytest.param(True, marks=needs_native)], ids=["python", "native"])
def pair(new_ip: Callable[[], str], request: pytest.FixtureRequest) -> Iterator[Pair]:
    p = connected_pair(new_ip, request.param)
    yield p
    p.close()


class _CountedNative:
    """A segment codec, counting ``check_decode`` calls (where ICRCs are computed, one at a time)."""

    def __init__(self, native: Any) -> None:
        self.native, self.check_decode_calls = native, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.native, name)

    def check_decode(self, *args: Any) -> Any:
        self.check_decode_calls += 1
        return self.native.check_decode(*args)


def _pump_until(p: Pair, done: Callable[[], bool]) -> None:
    assert p.drv.run_until(done, 10)


def test_unknown_qpn_wrong_source_and_bad_tver_never_reach_the_icrc(
    pair: Pair, new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    p, n = pair, 40
    solver = SolverCalls(monkeypatch)
    port = p.b.udp_port
    assert port is not None
    counted = _CountedNative(port.codec)
    monkeypatch.setattr(port, "codec", counted)
    b_addr = (p.b.ip, p.b.port)
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other,
    ):
        peer.bind((p.a.ip, 0))  # the connected peer's address, another port (rxe does not check ports)
        other.bind((new_ip(), 0))
        for i in range(n):
            # No such QP (QPNs 0 and 1 are never given out); an ICRC no ID explains.
            unknown = Packet(Opcode.SEND_ONLY, i % 2, 1, payload=b"x" * (i * 4))
            peer.sendto(spoil(datagram(unknown, peer.getsockname(), b_addr)), b_addr)
            # The QP exists, but is connected to another address: bad ICRC, and a good one.
            wrong = datagram(stale_write(p.qb.qpn, b"y" * (i * 4)), other.getsockname(), b_addr)
            other.sendto(spoil(wrong) if i % 2 else wrong, b_addr)
            # The peer's address and the QP, but TVer 1 (rxe hdr_check(): dropped).
            bad = bytearray(datagram(stale_write(p.qb.qpn), peer.getsockname(), b_addr))
            bad[1] |= 1
            peer.sendto(spoil(bytes(bad)), b_addr)
    c = p.b.counters
    _pump_until(p, lambda: c.unknown_qp + c.wrong_source + c.malformed + c.bad_icrc >= 3 * n)
    assert (c.unknown_qp, c.wrong_source, c.malformed) == (n, n, n)
    assert c.bad_icrc == c.icrc_ok == c.icrc_solved == 0  # no ICRC was looked at
    assert solver.count == 0
    assert counted.check_decode_calls == n  # only the TVer ones, which it refused before the ICRC
    p.transfer(100_000)


def test_a_bad_icrc_flood_runs_the_solver_a_bounded_number_of_times(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a connected peer's address, to its QP, lengths cycling past any cache: a bucket of runs."""
    p = pair
    solver = SolverCalls(monkeypatch)
    rng = random.Random(3)
    src, dst = (p.a.ip, 0xC123), (p.b.ip, p.b.port)
    flood = [
        spoil(datagram(stale_write(p.qb.qpn, rng.randbytes(4 * (i % 150))), src, dst)) for i in range(1500)
    ]
    t0 = time.monotonic()
    for data in flood:
        p.b.receive_datagram(data, src, t0)  # virtual time: no token comes back
    c = p.b.counters
    assert solver.count == SOLVE_BURST
    assert c.bad_icrc == len(flood)
    assert (c.solver_runs, c.solver_limited) == (SOLVE_BURST, len(flood) - SOLVE_BURST)
    # 10.5 ms later: 10 more whole tokens (SOLVE_RATE per second), and no more. Half a token
    # of margin: t0 + 0.01 - t0 is 0.01 only up to rounding, and 9.999... tokens are 9.
    for data in flood:
        p.b.receive_datagram(data, src, t0 + 0.0105)
    assert solver.count == SOLVE_BURST + int(0.0105 * SOLVE_RATE)
    p.transfer(200_000)
    assert p.b.counters.bad_icrc == 2 * len(flood)


def test_a_corrupted_packet_from_an_rdmakit_peer_is_never_solved(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source seen to use our IPv4 IDs keeps the ICRC's full 32 bits: no ID is solved for it."""
    p = pair
    p.transfer(50_000)  # the peer's (address, port) carried our IDs
    solver = SolverCalls(monkeypatch)
    src, dst = (p.a.ip, p.a.port), (p.b.ip, p.b.port)
    # An ICRC that IPv4 ID 1234 would explain: what a corruption looks like 2^-16 of the time.
    for ident in (1234, 1235, 40000):
        p.b.receive_datagram(
            datagram(stale_write(p.qb.qpn, b"abcd"), src, dst, ident=ident), src, time.monotonic()
        )
    c = p.b.counters
    assert (c.bad_icrc, c.icrc_solved, solver.count) == (3, 0, 0)
    p.transfer(50_000, seed=2)


class _KernelSender:
    """Stale WRITEs to ``qb`` from the peer's address and a kernel rxe QP's port, with chosen IPv4 IDs."""

    def __init__(self, p: Pair) -> None:
        self.p, self.now = p, time.monotonic()
        self.src, self.dst = (p.a.ip, 0xC0DE), (p.b.ip, p.b.port)

    def send(self, ident: int, payload: bytes = b"abcdefgh") -> None:
        data = datagram(stale_write(self.p.qb.qpn, payload), self.src, self.dst, ident=ident)
        self.p.b.receive_datagram(data, self.src, self.now)


def test_a_kernel_peer_is_followed_without_solving_each_packet(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = pair
    solver = SolverCalls(monkeypatch)
    k, c = _KernelSender(p), p.b.counters
    for ident in (500, 501, 502, 503):
        k.send(ident)
    assert solver.count == 1  # solved once, then each next ID predicted
    k.send(504 + 700)  # a jump inside the window (packets lost, or sent elsewhere): solved
    k.send(505 + 700, b"12345678" * 3)
    assert (c.icrc_solved, c.bad_icrc, solver.count) == (6, 0, 2)
    p.transfer(50_000)


def test_a_solved_id_far_from_the_senders_last_is_refused(pair: Pair) -> None:
    """The false accept the solver allows: an ID it finds but the sender cannot have used now."""
    p = pair
    k, c = _KernelSender(p), p.b.counters
    for ident in (500, 501, 502):
        k.send(ident)
    assert (c.icrc_solved, c.bad_icrc) == (3, 0)
    k.send(502 + 30_000)  # a jump past the window: believed, once per JUMP_INTERVAL
    assert (c.icrc_solved, c.bad_icrc) == (4, 0)
    k.send(502 + 60_000)  # another at once: its ICRC checks with an ID the sender cannot have used now
    assert (c.icrc_solved, c.bad_icrc) == (4, 1)
    assert c.solved_out_of_window == 1
    k.send(503 + 30_000)  # the sender goes on where it was
    assert (c.icrc_solved, c.bad_icrc) == (5, 1)
    p.transfer(50_000)


def test_the_ident_window_believes_exactly_the_window() -> None:
    """Of the 2^16 IDs the solver may find for a corrupted packet, IDENT_WINDOW are believed."""
    w = IdentWindow(0.0)
    assert w.next() is None
    assert w.accept(0xFFF0, 0.0)  # the first ID of a sender: nothing to compare with
    assert w.next() == 0xFFF1

    def believed(now: float) -> int:
        n = 0
        for ident in range(0x10000):
            t = IdentWindow(0.0)
            t.accept(0x7FF0, 0.0)
            assert t.accept(0xFFF0, 0.0)  # a jump past the window: this interval's one is spent
            n += t.accept(ident, now)
        return n

    assert believed(0.0) == IDENT_WINDOW  # residual false accept: 2^-16 * 1024 / 2^16 = 2^-22
    half = JUMP_INTERVAL / 2
    assert believed(half) == IDENT_WINDOW + int(half * IDENT_IDLE_RATE)  # the kernel's jump after idling
    t = IdentWindow(0.0)
    t.accept(100, 0.0)
    assert t.accept(100 + IDENT_WINDOW, 0.0)
    assert t.accept(100 + 3 * IDENT_WINDOW, 0.0)  # one jump past the window per JUMP_INTERVAL
    assert not t.accept(100 + 5 * IDENT_WINDOW, 0.0)  # a second one within it is not believed
    assert t.last == 100 + 3 * IDENT_WINDOW
    # A jump refused is remembered: the sender's next packet resumes it.
    assert t.accept(100 + 5 * IDENT_WINDOW + 2, 0.0)
    assert t.next() == 100 + 5 * IDENT_WINDOW + 3
    assert not t.accept(100 + 9 * IDENT_WINDOW, 0.0)
    assert t.accept(100 + 12 * IDENT_WINDOW, JUMP_INTERVAL)  # the next interval: one more


def test_the_solver_bucket_refills_at_its_rate() -> None:
    t = IdentWindow(5.0)
    assert sum(t.may_solve(5.0) for _ in range(10 * SOLVE_BURST)) == SOLVE_BURST
    assert not t.may_solve(5.0)
    assert sum(t.may_solve(5.0 + 3.5 / SOLVE_RATE) for _ in range(10)) == 3
    assert sum(t.may_solve(100.0) for _ in range(10 * SOLVE_BURST)) == SOLVE_BURST  # never more than a burst


def test_the_solver_finds_one_id_in_2_to_the_16_random_icrcs() -> None:
    """Its basis has rank 16 for every length: 2^16 of the 2^32 ICRC values are explained."""
    from rdmakit.wire.ident import _solver

    for n in (12, 13, 16, 100, 1036, 4108, 65503):
        assert len(_solver(n, True)) == 16
