"""Run code as a second local user (``nobody``), for the attacks that need one.

``setpriv --reuid nobody`` cannot start this interpreter when it lives under a
0700 home (as root's pyenv does), so the child is forked instead and drops
privileges the way ``setpriv --clear-groups --regid --reuid`` does: supplementary
groups, then the group, then the user. The child runs with rdmakit already
imported, which is what an attacking process of that user could do too.
"""

import contextlib
import os
import pwd
import select
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

NOBODY_UID = 65534
NOBODY_GID = 65534


def nobody_reason() -> str | None:
    """Why the tests that need a second user cannot run here, or None when they can."""
    if os.getuid() != 0:
        return "needs root, to become user nobody"
    try:
        pwd.getpwuid(NOBODY_UID)
    except KeyError:
        return "this machine has no user nobody (uid 65534)"
    return None


needs_nobody = pytest.mark.skipif(nobody_reason() is not None, reason=nobody_reason() or "")


@dataclass
class Child:
    """A forked child running as nobody: its pid and the read end of its report pipe."""

    pid: int
    report: int
    _done: bool = field(default=False, repr=False)

    def read(self, timeout: float = 30.0, limit: int = 1 << 16) -> bytes:
        """What the child wrote to its report pipe until it closed it (or the timeout)."""
        out = bytearray()
        while len(out) < limit:
            ready, _, _ = select.select([self.report], [], [], timeout)
            if not ready:
                break
            chunk = os.read(self.report, limit - len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def readline(self, timeout: float = 30.0) -> bytes:
        """One line of the child's report (without blocking past the timeout)."""
        out = bytearray()
        while not out.endswith(b"\n"):
            ready, _, _ = select.select([self.report], [], [], timeout)
            if not ready:
                break
            chunk = os.read(self.report, 1)
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def wait(self, timeout: float = 30.0) -> int:
        """The child's exit status; it is killed if it has not exited within the timeout."""
        if self._done:
            raise RuntimeError("already waited for")
        fd = os.pidfd_open(self.pid)
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                os.kill(self.pid, signal.SIGKILL)
        finally:
            os.close(fd)
        _, status = os.waitpid(self.pid, 0)
        self._done = True
        os.close(self.report)
        return os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        if not self._done:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.wait(5)


def as_nobody(body: Callable[[int], None]) -> Child:
    """Fork a child that becomes user nobody and runs ``body(report_fd)``.

    The child exits 0 when ``body`` returns and 1 when it raises; it never runs
    the parent's clean-up code (``os._exit``).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(NOBODY_GID)
            os.setuid(NOBODY_UID)
            body(write_fd)
            status = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(write_fd)
    return Child(pid, read_fd)
