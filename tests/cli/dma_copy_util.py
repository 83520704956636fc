"""Both sides of ``rdmakit dma-copy`` as processes: starting, finishing, and killing one mid-copy."""

import hashlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.processes import WAIT, Done, finish

MIB = 1 << 20


def start(cwd: Path, *args: str, stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rdmakit", *args], cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=stderr, text=True,
    )  # fmt: skip


def one_line_error(done: Done) -> str:
    """The process failed with exactly one line on stderr, the program's own."""
    assert done.rc != 0, done
    lines = done.err.strip().splitlines()
    assert len(lines) == 1, done.err
    assert lines[0].startswith("rdmakit dma-copy: "), lines[0]
    return lines[0]


def random_file(path: Path, size: int) -> str:
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def wait_for_line(proc: subprocess.Popen[str], needle: str) -> None:
    """Read `proc`'s stderr until a line contains `needle` (the process keeps running)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + WAIT
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 1)
        if ready:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return
    raise AssertionError(f"never saw {needle!r}:\n{''.join(seen)}")


#: How a test's CLI arguments are made: (role, file, *extra flags) -> argv.
ArgsFor = Callable[..., list[str]]


def killed_mid_copy(sides: tuple[Path, Path], args_for: ArgsFor, victim: str) -> None:
    """The copier's peer dies in the middle of an 8 MiB copy (128 jobs, 10 ms apart).

    ``victim`` "dpu": DPU -> host, the DPU dies; "host": host -> DPU, the host
    dies. The survivor stops, says so in one line and leaves no file.
    """
    host_dir, dpu_dir = sides
    slow = ("--chunk-size", "65536", "--pause", "0.01")
    if victim == "dpu":
        random_file(dpu_dir / "f.bin", 8 * MIB)
        dead = start(dpu_dir, *args_for("dpu", "f.bin", "-l", "60", *slow))
        survivor = start(host_dir, *args_for("host", "f.bin"))
        wait_for_line(dead, "copy: ")  # the copier's progress: the copy is under way
        gone, survivor_dir = "DPU", host_dir
    else:
        random_file(host_dir / "f.bin", 8 * MIB)
        survivor = start(dpu_dir, *args_for("dpu", "f.bin", *slow))
        dead = start(host_dir, *args_for("host", "f.bin", "-l", "60"))
        wait_for_line(dead, "the DPU: copy ")  # the host hears the DPU's progress
        gone, survivor_dir = "host", dpu_dir
    dead.kill()
    dead.communicate()
    error = one_line_error(finish(survivor))
    assert error == (
        f"rdmakit dma-copy: the {gone} went away before the copy was complete (DOCA_ERROR_CONNECTION_RESET)"
    )
    assert os.listdir(survivor_dir) == []
