"""``rdmakit demo``, the README's main job, and the tools/ wrappers."""

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = (
    "send",
    "send with immediate",
    "write",
    "write with immediate",
    "read",
    "atomic compare-swap",
    "atomic fetch-add",
)


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_demo_runs_and_verifies_every_operation(transport: str, new_ip: Callable[[], str]) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rdmakit",
            "demo",
            "--transport",
            transport,
            "--max-size",
            str(1 << 20),
            "--device-a",
            new_ip(),
            "--device-b",
            new_ip(),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "all operations verified"
    rows = [line for line in lines if line[:22].strip() in OPERATIONS]
    seen = {line[:22].strip() for line in rows}
    assert seen == set(OPERATIONS)
    assert all("  ok  " in line for line in rows), out.stdout
    # Sizes from 1 byte to 1 MiB for the data operations.
    assert any(" 1 MiB " in line for line in rows)
    assert any(" 1 B " in line for line in rows)


def test_tools_wrappers_run_the_samples() -> None:
    tools = sorted((ROOT / "tools").iterdir())
    assert len(tools) >= 12
    out = subprocess.run(
        [str(ROOT / "tools" / "rdma_write_requester"), "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHON": sys.executable},
    )
    assert out.returncode == 0
    assert "--write-string" in out.stdout
