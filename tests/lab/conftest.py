"""The soft-RoCE lab tests: a qemu guest with the kernel's rdma_rxe (scripts/lab-*.sh)."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "lab: needs the soft-RoCE VM lab (scripts/lab-build-vm.sh); skipped when it cannot run",
    )
    if not config.pluginmanager.hasplugin("timeout"):
        # The lab tests raise pytest-timeout's limit; without the plugin the mark is inert.
        config.addinivalue_line("markers", "timeout(seconds): pytest-timeout's per-test limit")
