"""The MIDDLE-packet fast paths change nothing: hostile runs replay identically without them.

``QueuePair.receive`` places in-order WRITE/SEND MIDDLE packets and READ
RESPONSE MIDDLE packets through ``resp_runs.fast_middle`` and
``completer.fast_read_middle``, skipping the generic dispatch; the requester
and the READ responder emit runs of MIDDLE packets in tight loops of their own. Each seeded
hostile workload here runs twice, with the fast paths on and off; the two runs
must agree on every packet count, drop reason, completion, byte of memory and
the virtual time, and the fast paths must actually have been taken.
"""

import random
from typing import Any

import pytest

from rdmakit.engine import QpCaps, completer, qp, resp_runs
from rdmakit.testing.engine import Workload, fill, make_pair
from rdmakit.testing.faults import ALL_AT_ONCE, CLEAN, DUPLICATE_REORDER, Faults
from rdmakit.wire import Packet, Train

CONFIGS = {
    "clean": CLEAN,
    "all_at_once": ALL_AT_ONCE,
    "dup_reorder": DUPLICATE_REORDER,
}


def fingerprint(seed: int, faults: Faults, bulk: bool = False, fast: bool = True) -> tuple[Any, ...]:
    # Messages of up to 80 packets: some MIDDLE packets carry AckReq (every 65th).
    n, max_len, mtu = 8, 20000, 256
    half = 1 << max(14, (2 * n * (max_len + 16)).bit_length())
    p = make_pair(seed, faults, mtu=mtu, mem_size=2 * half, bulk=bulk, caps=QpCaps(fast_paths=fast))
    rng = random.Random(seed ^ 0xFA57)
    fill(p.a.mem, rng)
    fill(p.b.mem, rng)
    w1 = Workload(p.a, p.b, rng, n, max_len, 0, half)
    w1.post()
    w2 = Workload(p.b, p.a, rng, n, max_len, 0, half)
    w2.post()

    def done() -> bool:
        p.drain()
        return len(p.a.sent) >= w1.n_signaled and len(p.b.sent) >= w2.n_signaled

    assert p.net.run(until=done, max_time=600.0), f"seed={seed}"
    p.net.run(max_time=p.net.now + 1.0)  # let the last ACKs and duplicates settle
    p.drain()
    w1.check()
    w2.check()
    return (
        p.net.now,
        bytes(p.a.mem),
        bytes(p.b.mem),
        p.a.sent,
        p.a.received,
        p.b.sent,
        p.b.received,
        p.a.qp.stats,
        p.b.qp.stats,
        p.net.trace_digest(),
    )


@pytest.mark.parametrize("name", CONFIGS)
def test_fast_path_equals_generic_path(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = {"middle": 0, "read": 0}
    real_middle, real_read = resp_runs.fast_middle, completer.fast_read_middle

    def counting_middle(*a: Any) -> bool:
        ok = real_middle(*a)
        taken["middle"] += ok
        return ok

    def counting_read(*a: Any) -> bool:
        ok = real_read(*a)
        taken["read"] += ok
        return ok

    monkeypatch.setattr(qp, "fast_middle", counting_middle)
    monkeypatch.setattr(qp, "fast_read_middle", counting_read)
    for seed in range(12):
        print(f"seed={seed} faults={name}")
        fast = fingerprint(seed, CONFIGS[name])
        off = dict(taken)
        slow = fingerprint(seed, CONFIGS[name], fast=False)
        assert taken == off  # QpCaps(fast_paths=False): no fast path at all
        assert fast == slow
    assert taken["middle"] > 0
    assert taken["read"] > 0


@pytest.mark.parametrize("name", CONFIGS)
def test_trains_and_runs_equal_packets(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bulk interfaces of the native data plane (``poll_transmit_trains``, ``rx_run``/
    ``rx_run_done``) leave the same trace, memory, completions and counters as packets."""
    taken = {"trains": 0, "train_packets": 0, "runs": 0}
    real_packets, real_done = Train.packets, qp.QueuePair.rx_run_done

    def counting_packets(self: Train) -> list[Packet]:
        taken["trains"] += 1
        taken["train_packets"] += self.npkts
        return real_packets(self)

    def counting_done(self: qp.QueuePair, opcode: int, count: int, *a: Any) -> None:
        taken["runs"] += count
        real_done(self, opcode, count, *a)

    monkeypatch.setattr(Train, "packets", counting_packets)
    monkeypatch.setattr(qp.QueuePair, "rx_run_done", counting_done)
    for seed in range(12):
        print(f"seed={seed} faults={name}")
        assert fingerprint(seed, CONFIGS[name], bulk=True) == fingerprint(seed, CONFIGS[name])
    assert taken["trains"] > 0
    assert taken["train_packets"] > taken["trains"]
    assert taken["runs"] > 0
