"""Random RC workloads in both directions over seeded hostile networks.

Each configuration runs many seeds inside one test (print the seed on
failure; replay it with ``scenario(seed, faults)``). Checked every time: data
intact, completions in posting order and all successful, receive completions
in order with the right length and immediate, every FETCH_ADD executed exactly
once (the responder's counter equals the number posted, and the requesters saw
distinct original values), compare-and-swap results.
"""

import random
from typing import Unpack

import pytest

from rdmakit.testing.engine import ConnectOptions, Workload, fill, make_pair
from rdmakit.testing.faults import LONG_REORDER, PROFILES, Faults

CI_SEEDS = 200
SLOW_SEEDS = 2000


def scenario(
    seed: int, faults: Faults, *, n: int = 12, max_len: int = 700, **conn: Unpack[ConnectOptions]
) -> float:
    """One bidirectional workload; returns the virtual time it took."""
    half = 1 << max(14, (2 * n * (max_len + 16)).bit_length())
    conn.setdefault("mtu", 256)
    p = make_pair(seed, faults, mem_size=2 * half, **conn)
    rng = random.Random(seed ^ 0x5EED)
    fill(p.a.mem, rng)
    fill(p.b.mem, rng)
    w1 = Workload(p.a, p.b, rng, n, max_len, 0, half)
    w1.post()
    w2 = Workload(p.b, p.a, rng, n, max_len, 0, half)
    w2.post()

    def done() -> bool:
        p.drain()
        return (
            len(p.a.sent) >= w1.n_signaled
            and len(p.b.received) >= len(w1.expect_recv)
            and len(p.b.sent) >= w2.n_signaled
            and len(p.a.received) >= len(w2.expect_recv)
        )

    assert p.net.run(until=done, max_time=600.0), (p.a.qp.stats, p.b.qp.stats, p.net.stats)
    w1.check()
    w2.check()
    return p.net.now


class ScenarioOptions(ConnectOptions, total=False):
    n: int
    max_len: int


def sweep(seeds: range, faults: Faults, **kw: Unpack[ScenarioOptions]) -> None:
    for seed in seeds:
        try:
            scenario(seed, faults, **kw)
        except BaseException:
            print(f"FAILED seed={seed} faults={faults} {kw}")
            raise


CONFIGS = PROFILES


@pytest.mark.parametrize("name", CONFIGS)
def test_hostile_network(name: str) -> None:
    sweep(range(CI_SEEDS), CONFIGS[name])


SLOW_CONFIGS = {
    **CONFIGS,
    "long_reorder": LONG_REORDER,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_CONFIGS)
def test_hostile_network_many_seeds(name: str) -> None:
    sweep(range(CI_SEEDS, SLOW_SEEDS), SLOW_CONFIGS[name])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("label", "kw"),
    [
        ("max_rd_atomic_1", {"max_rd_atomic": 1}),
        ("mtu_4096_big", {"mtu": 4096, "max_len": 9000}),
        ("short_timeout", {"timeout": 5}),
        ("finite_retries", {"retry_cnt": 6}),
        ("many_wrs", {"n": 60}),
    ],
)
def test_hostile_variants(label: str, kw: ScenarioOptions) -> None:
    sweep(range(300), Faults(loss=0.1, reorder=0.2, duplicate=0.02), **kw)
