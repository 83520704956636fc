"""Random RC workloads in both directions over seeded hostile networks.

Each configuration runs many seeds inside one test (print the seed on
failure; replay it with ``scenario(seed, faults)``). Checked every time: data
intact, completions in posting order and all successful, receive completions
in order with the right length and immediate, every FETCH_ADD executed exactly
once (the responder's counter equals the number posted, and the requesters saw
distinct original values), compare-and-swap results.

The ``slow`` sweeps take their seeds through the ``seed_sample`` fixture
(``conftest.py``): all of them, or CI's fixed sample (``RDMAKIT_SLOW_SAMPLE``).
"""

import random
from collections.abc import Iterable, Sequence
from typing import Unpack

import pytest

from rdmakit.engine import QpCaps, WrOpcode
from rdmakit.testing.engine import ConnectOptions, Pair, both_ways, connect, finished, make_pair, make_side
from rdmakit.testing.faults import LONG_REORDER, PROFILES, Faults
from rdmakit.transport.simnet import SimNet
from tests.engine.seeds import SeedSample

CI_SEEDS = 200
SLOW_SEEDS = 12_600  # with the other sweeps, about 100,000 seeded runs in all


def _half(n: int, max_len: int) -> int:
    return 1 << max(14, (2 * n * (max_len + 16)).bit_length())


def scenario(
    seed: int,
    faults: Faults,
    *,
    n: int = 12,
    max_len: int = 700,
    ops: tuple[WrOpcode, ...] = tuple(WrOpcode),
    bulk: bool = False,
    partitions: Sequence[tuple[float, float]] = (),
    **conn: Unpack[ConnectOptions],
) -> float:
    """One bidirectional workload; returns the virtual time it took.

    ``partitions``: (start, end) virtual-time windows in which every packet
    between the two ends is dropped (each heals at its end)."""
    half = _half(n, max_len)
    conn.setdefault("mtu", 256)
    p = make_pair(seed, faults, mem_size=2 * half, bulk=bulk, **conn)
    for start, end in partitions:
        p.net.partition(start, end, between=("a", "b"))
    w1, w2 = both_ways(p, random.Random(seed ^ 0x5EED), n, max_len, half, ops)
    assert p.net.run(until=lambda: finished(p, w1, w2), max_time=600.0), (
        p.a.qp.stats,
        p.b.qp.stats,
        p.net.stats,
    )
    w1.check()
    w2.check()
    return p.net.now


def shared_link_scenario(
    seed: int, faults: Faults, *, qps: int = 4, n: int = 10, max_len: int = 3000
) -> float:
    """``qps`` connected QP pairs between the same two addresses of one SimNet (one link, its
    bandwidth and faults shared), random mixed work in both directions on every pair at once."""
    rng = random.Random(seed)
    net = SimNet(seed, faults)
    half = _half(n, max_len)
    pairs = []
    for _ in range(qps):
        a = make_side("a", rng, 2 * half, QpCaps(), 4096)
        b = make_side("b", rng, 2 * half, QpCaps(), 4096)
        connect(a.qp, b.qp, rng, mtu=1024)
        net.attach("a", a.qp)
        net.attach("b", b.qp)
        pairs.append(Pair(net, a, b))
    work = [(p, *both_ways(p, rng, n, max_len, half)) for p in pairs]
    assert net.run(until=lambda: all(finished(*w) for w in work), max_time=600.0), net.stats
    for _p, w1, w2 in work:
        w1.check()
        w2.check()
    return net.now


class ScenarioOptions(ConnectOptions, total=False):
    """`scenario`'s own keyword arguments, beside the connection's."""

    n: int
    max_len: int
    ops: tuple[WrOpcode, ...]
    bulk: bool
    partitions: Sequence[tuple[float, float]]


def sweep(
    seeds: Iterable[int], faults: Faults, sample: SeedSample | None = None, **kw: Unpack[ScenarioOptions]
) -> None:
    for seed in seeds:
        try:
            scenario(seed, faults, **kw)
        except BaseException:
            print(f"FAILED seed={seed} faults={faults} {kw}")
            raise
        if sample is not None:
            sample.passed()


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
def test_hostile_network_many_seeds(name: str, seed_sample: SeedSample) -> None:
    sweep(seed_sample.seeds(range(CI_SEEDS, SLOW_SEEDS)), SLOW_CONFIGS[name], seed_sample)


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
def test_hostile_variants(label: str, kw: ScenarioOptions, seed_sample: SeedSample) -> None:
    sweep(seed_sample.seeds(range(300)), Faults(loss=0.1, reorder=0.2, duplicate=0.02), seed_sample, **kw)


HOSTILE = Faults(loss=0.05, reorder=0.2, duplicate=0.02, jitter=20e-6)


@pytest.mark.slow
@pytest.mark.parametrize("bulk", [False, True], ids=["packets", "bulk"])
def test_several_mib_messages_at_mtu_4096(bulk: bool, seed_sample: SeedSample) -> None:
    """Messages of up to 3 MiB (768 packets each) at MTU 4096, data and atomics checked. Rare
    faults: with go-back-N every loss resends the rest of a message (seconds per seed here)."""
    faults = Faults(loss=0.002, reorder=0.01, duplicate=0.002, jitter=5e-6)
    seeds = seed_sample.seeds(range(30), cap=3)
    sweep(seeds, faults, seed_sample, n=3, mtu=4096, max_len=3 << 20, bulk=bulk)


@pytest.mark.slow
@pytest.mark.parametrize("qps", [3, 8])
def test_mixed_operations_on_qps_sharing_one_link(qps: int, seed_sample: SeedSample) -> None:
    for seed in seed_sample.seeds(range(150)):
        try:
            shared_link_scenario(seed, HOSTILE, qps=qps)
        except BaseException:
            print(f"FAILED seed={seed} qps={qps}")
            raise
        seed_sample.passed()


def _healing_partitions(seed: int, count: int) -> list[tuple[float, float]]:
    """``count`` partitions in the first few ms, each healing well inside the retry budget
    (timeout 8: about 1 ms per try, 7 retries)."""
    rng = random.Random(seed ^ 0xBAD)
    out, t = [], 0.0
    for _ in range(count):
        t += rng.uniform(0.0, 2e-3)
        length = rng.uniform(0.2e-3, 3e-3)
        out.append((t, t + length))
        t += length
    return out


@pytest.mark.slow
@pytest.mark.parametrize("count", [1, 3])
def test_partitions_that_heal(count: int, seed_sample: SeedSample) -> None:
    for seed in seed_sample.seeds(range(300)):
        cuts = _healing_partitions(seed, count)
        try:
            scenario(seed, Faults(loss=0.02, reorder=0.1), n=30, partitions=cuts)
        except BaseException:
            print(f"FAILED seed={seed} partitions={cuts}")
            raise
        seed_sample.passed()


STORM_OPS = (WrOpcode.RDMA_READ, WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP)


@pytest.mark.slow
@pytest.mark.parametrize("max_rd_atomic", [1, 4, 16])
def test_read_and_atomic_storms_at_max_rd_atomic(max_rd_atomic: int, seed_sample: SeedSample) -> None:
    """Many more READs and atomics posted than ``max_rd_atomic`` lets out at once, both ways."""
    sweep(
        seed_sample.seeds(range(300)),
        Faults(loss=0.1, reorder=0.2, duplicate=0.05),
        seed_sample,
        n=80,
        max_len=2000,
        ops=STORM_OPS,
        max_rd_atomic=max_rd_atomic,
    )
