"""A file owned by root whose bytes user nobody chose: its own ``/proc/<pid>/environ``.

A process that makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``) gets
its ``/proc/<pid>/environ`` owned by root (``task_dump_owner`` in
``fs/proc/base.c`` hands the files of a non-dumpable task to root), yet the
bytes are the process's own:
whatever it writes over its environment block (``env_start`` to ``env_end``
of ``/proc/<pid>/stat``). `hold_in_environ` forks such a process as nobody,
writes chosen bytes there and links a name to the file from a shared folder.
"""

import ctypes
import os
import select
from pathlib import Path

from tests.security.nobody import Child, as_nobody

_PR_SET_DUMPABLE = 4


def environ_block() -> tuple[int, int]:
    """(start, end) of this process's environment block (``/proc/self/stat`` fields 50 and 51)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[47]), int(fields[48])  # the list starts at field 3


def hold_in_environ(payload: bytes, link: Path, hold: float = 120.0) -> Child:
    """nobody: its environ holds ``payload`` (padded with spaces), ``link`` points at it.

    The child reports ``ready <pid>`` once the link is there, then stays (until
    killed or ``hold`` seconds) so that the file stays readable.
    """

    def body(report: int) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")
        start, end = environ_block()
        if len(payload) > end - start:
            raise RuntimeError(f"the environment block holds {end - start} bytes, not {len(payload)}")
        ctypes.memmove(start, payload.ljust(end - start), end - start)  # the trailing NUL too
        environ = f"/proc/{os.getpid()}/environ"
        os.symlink(environ, link)
        os.write(report, f"ready {os.getpid()}\n".encode())
        select.select([], [], [], hold)

    return as_nobody(body)
