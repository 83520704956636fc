"""The engine's seeded sweeps (marker ``slow``; deselection is in ``tests/conftest.py``).

``RDMAKIT_SLOW_SAMPLE=K`` (with ``-m slow``) runs each sweep on ``K`` of its
seeds, drawn by a fixed seed (``RDMAKIT_SLOW_SAMPLE_SEED``, default 1) from
the sweep's own range, so the same sample runs every time; CI runs such a
sample. Without it, every seed runs (the full sweep). Either way the run ends
with a line counting the seeded runs that passed.
"""

import os

import pytest

from tests.engine.seeds import SeedSample


@pytest.fixture
def seed_sample(request: pytest.FixtureRequest) -> SeedSample:
    k = os.environ.get("RDMAKIT_SLOW_SAMPLE")
    seed = int(os.environ.get("RDMAKIT_SLOW_SAMPLE_SEED", "1"))
    node = request.node
    assert isinstance(node, pytest.Item)
    return SeedSample(node, int(k) if k else None, seed)


_totals = {"runs": 0, "tests": 0}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Runs where the reports arrive: the only process, or xdist's controller.
    if report.when != "call" or not report.passed:
        return
    runs = sum(v for k, v in report.user_properties if k == "seeded_runs" and isinstance(v, int))
    if runs:
        _totals["runs"] += runs
        _totals["tests"] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _totals["tests"]:
        return
    k = os.environ.get("RDMAKIT_SLOW_SAMPLE")
    how = (
        f"a sample of {k} seeds per sweep (seed {os.environ.get('RDMAKIT_SLOW_SAMPLE_SEED', '1')})"
        if k
        else "every seed"
    )
    terminalreporter.write_line(
        f"seeded sweeps: {_totals['runs']} seeded runs passed in {_totals['tests']} tests, {how}"
    )
