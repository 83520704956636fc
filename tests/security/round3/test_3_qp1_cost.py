"""QP1 costs what any other datagram costs: cheap checks first, the IPv4-ID solver under buckets.

A datagram to QP1 is judged by its UD header, DETH, Q_Key and the CM MAD's
common header before any CRC; then IPv4 ID 0 (an rdmakit sender) and the
sender's next ID (a kernel sender) are tried, and only then is the ID solved
for, under the sender's bucket and one for all senders. Junk from any number
of addresses, at one instant, runs the solver at most that global burst.
"""

import random
from collections.abc import Callable

import pytest

from rdmakit.transport import gsi as gsi_module
from rdmakit.transport.gsi import Gsi
from rdmakit.wire import ROCE_UDP_PORT
from rdmakit.wire.cm import CmAttr, CmMad
from tests.security.hostile import SolverCalls
from tests.security.round3.cm_peers import Side, connect, exchange, forged_req, mad_datagram


def _gsi(side: Side) -> Gsi:
    assert side.dev.gsi is not None
    return side.dev.gsi


def test_junk_from_many_addresses_runs_the_solver_at_most_the_global_burst(
    sides: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch, new_ip: Callable[[], str]
) -> None:
    a, b = sides
    solver = SolverCalls(monkeypatch)
    dst, t0 = (b.dev.ip, ROCE_UDP_PORT), 1000.0
    rng = random.Random(7)
    srcs = [(new_ip(), ROCE_UDP_PORT) for _ in range(64)]  # fed in below: no socket of theirs
    for i in range(3000):  # bad ICRCs of well-formed REQs, 64 senders
        src = srcs[i % len(srcs)]
        req = forged_req(src[0], b.dev.ip, 1 + i)
        b.dev.receive_datagram(mad_datagram(req, src, dst, spoil=True), src, t0)
    assert solver.count <= 3000 // 100  # not one run per datagram: a bucket's worth
    assert solver.count <= gsi_module.SOLVE_BURST
    g = _gsi(b).counters
    assert g.solver_runs == solver.count
    assert g.solver_limited + g.bad_icrc == 3000
    assert g.mads_in == 0
    for i in range(1000):  # lengths cycling past any cache: not a MAD, no CRC at all
        src = srcs[i % len(srcs)]
        b.dev.receive_datagram(mad_datagram(rng.randbytes(4 * (1 + i % 200)), src, dst, spoil=True), src, t0)
    assert solver.count <= gsi_module.SOLVE_BURST
    assert g.not_cm == 1000
    qa, qb, _, _ = connect(a, b)  # a real client connects and moves data
    exchange(a, b, qa, qb)


def test_a_kernel_sender_is_followed_by_its_next_id(
    sides: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel peer numbers its datagrams; after its first MAD is solved, its next ones are not."""
    a, b = sides
    solver = SolverCalls(monkeypatch)
    src, dst, t0 = (a.dev.ip, ROCE_UDP_PORT), (b.dev.ip, ROCE_UDP_PORT), 1000.0
    first = 0xBEEF
    for k in range(50):  # RTUs for no connection: checked, then dropped by the CM
        rtu = CmMad(CmAttr.RTU, k, {"local_comm_id": 5, "remote_comm_id": 1000 + k})
        b.dev.receive_datagram(mad_datagram(rtu, src, dst, ident=(first + k) & 0xFFFF), src, t0 + k * 1e-4)
    assert solver.count == 1
    g = _gsi(b).counters
    assert (g.mads_in, g.solver_runs) == (50, 1)
    qa, qb, _, _ = connect(a, b)
    exchange(a, b, qa, qb)
