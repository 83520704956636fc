"""Engine tests: ``@pytest.mark.slow`` sweeps run only when selected (``-m slow``).

Without a ``-m`` expression that mentions ``slow``, they are deselected (the
run reports them as such), not skipped: nothing about them was tried.
"""

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr", "") or ""):
        return
    keep: list[pytest.Item] = []
    slow: list[pytest.Item] = []
    for item in items:
        engine = "tests/engine" in str(item.path).replace("\\", "/")
        (slow if engine and "slow" in item.keywords else keep).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep
