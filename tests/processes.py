"""Finishing the rdmakit programs the tests start as processes of their own."""

import subprocess
from typing import NamedTuple

WAIT = 120  # seconds a test waits for a process before calling it hung


class Done(NamedTuple):
    """How a program ended: its exit status and what it printed (``rc, out, err = done``)."""

    rc: int
    out: str
    err: str


def finish(proc: "subprocess.Popen[str]") -> Done:
    """Waits for `proc` (at most `WAIT` seconds: then it is killed and the test fails)."""
    try:
        out, err = proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"hung: {proc.args!r}\n{err}") from None
    return Done(proc.returncode, out or "", err or "")
