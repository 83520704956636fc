"""Running rdmakit programs as separate processes, for the CLI tests."""

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

SIDE_FILES = ("-ld", "-re", "-m")


def spawn(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-m", "rdmakit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def finish(p: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    """The exit status and output of `p`; past `timeout` it is killed (not left to a later test)."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    return p.returncode, out.strip(), err.strip()


def run_once(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    return finish(spawn(*args), timeout)


def wait_until(cond: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll ``cond`` (bounded in time); fail the test naming ``what`` if it never holds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"never happened within {timeout} s: {what}")
        time.sleep(0.02)


def paths(tmp: Path) -> dict[str, str]:
    return {k: str(tmp / f"{k}.json") for k in ("req", "resp", "mmap")}


def side(cmd: list[str], device: str, ld: str, re: str, mmap: str, timeout: str = "20") -> list[str]:
    return [*cmd, "-d", device, "-ld", ld, "-re", re, "-m", mmap, "--timeout", timeout]


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(c) for c in text.split()]


def env_without_pythonpath() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def tcp_listening(port: int) -> bool:
    """Whether some socket of this machine listens on TCP `port` (``/proc/net/tcp``, ``tcp6``)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # TCP_LISTEN
                return True
    return False


def wait_listening(port: int, proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    """Until `proc` (a server) listens on TCP `port`, or exits: the C tools' clients, and rdmakit's,
    connect once and fail at once when nothing listens."""
    wait_until(lambda: tcp_listening(port) or proc.poll() is not None, timeout, f"a server on TCP {port}")
