"""Running rdmakit's programs in the security tests: as root (a subprocess) or as nobody (a fork)."""

import encodings.idna  # noqa: F401 - socket names host strings through it, in the child too
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from rdmakit.cli.main import build_parser, main
from tests.processes import Done
from tests.security.nobody import Child, as_nobody

# A child that became nobody cannot import modules from root's own Python (under a 0700 home):
# everything the programs use is imported here, before the fork.
build_parser()


def start(cwd: Path, args: Sequence[str], env: Mapping[str, str]) -> "subprocess.Popen[str]":
    """``rdmakit ARGS`` as this (root) user."""
    return subprocess.Popen(
        [sys.executable, "-m", "rdmakit", *args], cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def one_line(done: Done, program: str = "dma-copy") -> str:
    """The single error line a failed program printed."""
    assert done.rc != 0, done
    lines = done.err.strip().splitlines()
    assert len(lines) == 1, done.err
    assert lines[0].startswith(f"rdmakit {program}: "), lines[0]
    return lines[0]


def program_as_nobody(cwd: Path, args: Sequence[str], env: Mapping[str, str]) -> Child:
    """``rdmakit ARGS`` as user nobody, in `cwd`; the child reports its exit status on the pipe."""

    def body(report: int) -> None:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)  # its error line is not the test's output
        os.write(report, f"{main(list(args))}\n".encode())

    return as_nobody(body)


@contextmanager
def shared_dir(mode: int = 0o777) -> Iterator[Path]:
    """A directory in /tmp that nobody can reach (``tmp_path`` lies under root's 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="rdmakit-sec-", dir="/tmp"))
    try:
        path.chmod(mode)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
