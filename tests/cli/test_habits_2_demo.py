"""The demo says what its time column is: not a latency, the time per checked operation in one thread."""

import subprocess
import sys
from collections.abc import Callable

from rdmakit.cli.demo import LEGEND


def test_the_column_is_named_for_what_it_measures(new_ip: Callable[[], str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rdmakit", "demo", "--max-size", "1",
         "--device-a", new_ip(), "--device-b", new_ip()],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = next(line for line in lines if line.startswith("operation"))
    assert header.split() == ["operation", "size", "runs", "result", "time/op", "throughput"]
    assert "latency" not in header
    assert LEGEND in out.stdout
    assert "both ends in this one thread" in LEGEND
    assert "not a round trip" in LEGEND
