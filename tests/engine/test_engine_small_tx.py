"""The requester's one-packet send path, ``QueuePair.tx_small``, equals ``poll_transmit``.

``tx_small`` gives the one request a QP's requester has when that is its
whole work (``rdmakit.engine.small_tx``); the UDP port and ``SimNet(small=)``
send it through the segment codec's ``send_packet`` (native: headers, ICRC
and the send in C). The proofs:

- seeded hostile networks, every fault profile, operations from both sides
  at once, one round at a time: with and without the one-packet paths, the
  same trace (every packet's size, ICRC and fate), memory, completions,
  counters, requester and responder state and virtual time; every one-packet
  request opcode was sent by ``tx_small`` from both QPs;
- the same with a window of 2 PSNs, and CNPs every fourth round (DCQCN paces
  the requester): the path steps aside whenever the window or the rate holds
  a request back;
- a request posted while the responder has output queued (what a port meets
  and ``SimNet``'s pump cannot): the same packets in the same order, and state;
- mutants of ``small_tx`` (each a plausible slip: a check left out, a field
  not updated) are all caught by those runs, and mutants of ``_fastpath.c``
  (``-m slow``: each built in a temporary directory) by the native paths'
  equivalence tests.

These run on the segment codec devices use: native when built, else the
pure-Python one (``RDMAKIT_PURE_PYTHON=1``), whose ``tx_small`` path is the same.
"""

import shutil
from collections import Counter
from pathlib import Path

import pytest

from rdmakit.testing.faults import MIXED, PROFILES, Faults
from rdmakit.transport import fastpath
from tests.engine.native_mutants import C_MUTANTS, PY_MUTANTS, caught_c, planted_py
from tests.engine.seeds import SeedSample
from tests.engine.small_run import TX_OPCODES, TX_WRS, counting_tx, fingerprint, port_order


def _compare(seeds: list[int], faults: Faults, **kw: int) -> Counter[tuple[str, int]]:
    """Assert each seed's runs with and without the one-packet paths equal; what tx_small sent
    (by side and opcode)."""
    total: Counter[tuple[str, int]] = Counter()
    for seed in seeds:
        ref = fingerprint(seed, faults, None, **kw)
        assert (ref[-1]["small"], ref[-1]["small_resp"], ref[-1]["small_tx"]) == (0, 0, 0)
        with counting_tx() as taken:
            got = fingerprint(seed, faults, fastpath.CODEC, **kw)
        assert got[:-1] == ref[:-1], f"seed={seed} faults={faults} {kw}"
        assert got[-1]["small_tx"] == sum(taken.values())
        side = got[-1]["qpns"]
        total += Counter({(side[q], op): n for (q, op), n in taken.items()})
    return total


def _coverage(taken: Counter[tuple[str, int]]) -> None:
    for side in "ab":
        assert {op for s, op in taken if s == side} == TX_OPCODES, f"side {side}: every one-packet opcode"


@pytest.mark.parametrize("name", PROFILES)
def test_tx_small_equals_the_engine(name: str) -> None:
    taken = _compare(list(range(8)), PROFILES[name])
    _coverage(taken)


@pytest.mark.parametrize(
    ("faults", "cnp_every"),
    [(PROFILES["clean"], 0), (MIXED, 0), (MIXED, 4)],
    ids=["clean", "mixed", "mixed-cnp"],
)
def test_tx_small_steps_aside_for_the_window_and_the_rate(faults: Faults, cnp_every: int) -> None:
    taken = _compare(list(range(6)), faults, window=2, cnp_every=cnp_every)
    assert sum(taken.values()) > 6


@pytest.mark.slow
@pytest.mark.parametrize("name", PROFILES)
def test_tx_small_equals_the_engine_many_seeds(name: str, seed_sample: SeedSample) -> None:
    seeds = seed_sample.seeds(range(2000, 2200))
    _compare(seeds, PROFILES[name])
    _compare(seeds, PROFILES[name], window=2, cnp_every=4)
    seed_sample.passed(2 * len(seeds))


@pytest.mark.parametrize("seed", range(4))
def test_tx_small_sends_after_queued_responses_as_the_engine(seed: int) -> None:
    ref = port_order(seed, False)
    got = port_order(seed, True)
    assert got == ref
    assert len(ref[0]) == 2 * len(TX_WRS)  # each response went out with the request after it


#: Where a mutant of small_tx is looked for: (seed, profile, fingerprint options).
_HUNT = [
    (seed, name, kw)
    for kw in ({}, {"window": 2, "cnp_every": 4})
    for name in ("clean", "loss10", "all_at_once")
    for seed in range(3)
]


@pytest.mark.parametrize("mutant", PY_MUTANTS)
def test_every_small_tx_mutant_is_caught(mutant: str) -> None:
    for seed, name, kw in _HUNT:
        ref = fingerprint(seed, PROFILES[name], None, **kw)
        with planted_py(mutant):
            try:
                got = fingerprint(seed, PROFILES[name], fastpath.CODEC, **kw)
            except AssertionError:
                return  # a workload's own check failed, or the run did not finish
        if got[:-1] != ref[:-1]:
            return
    for seed in range(4):
        with planted_py(mutant):
            got_order = port_order(seed, True)
        if got_order != port_order(seed, False):
            return
    pytest.fail(f"mutant {mutant} survived {len(_HUNT)} runs")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")
@pytest.mark.parametrize("mutant", C_MUTANTS)
def test_every_native_mutant_is_caught(mutant: str, tmp_path: Path) -> None:
    """The native data plane built with one bug: the equivalence tests named beside it fail."""
    assert caught_c(mutant, tmp_path), f"native mutant {mutant} survived"
