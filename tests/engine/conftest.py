"""Engine tests: ``@pytest.mark.slow`` sweeps run only when selected (``-m slow``)."""

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason="slow sweep: run with -m slow")
    for item in items:
        if "slow" in item.keywords and "tests/engine" in str(item.path).replace("\\", "/"):
            item.add_marker(skip)
