"""Seeded sweeps run every seed, or a fixed sample of them (``RDMAKIT_SLOW_SAMPLE``)."""

import random
from collections.abc import Sequence

import pytest


class SeedSample:
    """The seeds a sweep runs (all, or a fixed sample), and how many of them passed."""

    def __init__(self, node: pytest.Item, k: int | None, seed: int) -> None:
        self.node, self.k, self.seed = node, k, seed

    def seeds(self, seeds: Sequence[int], cap: int | None = None) -> list[int]:
        """All of ``seeds``, or the sample: ``k`` of them (at most ``cap``, for costly sweeps)."""
        k = self.k if cap is None or self.k is None else min(self.k, cap)
        if k is None or k >= len(seeds):
            return list(seeds)
        rng = random.Random(f"{self.seed}:{self.node.nodeid}")
        return sorted(rng.sample(list(seeds), k))

    def passed(self, n: int = 1) -> None:
        self.node.user_properties.append(("seeded_runs", n))
