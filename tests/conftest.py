"""Shared fixtures: unique loopback addresses so parallel tests never share a port.

Tests marked ``slow`` (long hostile-network sweeps, the lab's lossy-tap run) run
only when a ``-m`` expression names the marker (``-m slow``, or ``-m "slow or
not slow"`` for everything); otherwise they are deselected, and the summary
counts them as such: not skipped, since nothing about them was tried.
"""

import itertools
import os
from collections.abc import Callable

import pytest

_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
_WORKER_NO = int(_worker[2:]) if _worker[2:].isdigit() else 0
_counter = itertools.count(1)


def _next_ip() -> str:
    # 127.<pid-spread>.<worker>.<n>: every test gets its own addresses in 127/8.
    n = next(_counter)
    return f"127.{100 + os.getpid() % 100}.{(_WORKER_NO * 8 + n // 250) % 256}.{1 + n % 250}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr", "") or ""):
        return
    keep: list[pytest.Item] = []
    slow: list[pytest.Item] = []
    for item in items:
        (slow if item.get_closest_marker("slow") else keep).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep


@pytest.fixture(scope="session")
def ip_source() -> Callable[[], str]:
    """`new_ip` for fixtures of a wider scope. Never import ``_next_ip``: a second copy of
    this module would count from 1 again and hand out addresses already in use."""
    return _next_ip


@pytest.fixture
def new_ip(ip_source: Callable[[], str]) -> Callable[[], str]:
    """Returns a function that gives a fresh loopback address at each call."""
    return ip_source
