"""Files a program publishes for a peer, and the registry that removes them when it ends.

A published file (:func:`publish`) is written atomically (:func:`write_atomic`)
and listed in one registry; :func:`cleanup_published` removes every listed
file, and closes what was held until then (:func:`hold`, the run's status
files), however the program ends short of SIGKILL (``rdmakit.cli.lifecycle``
turns SIGTERM and SIGHUP into an exception so that the same clean-up runs).
A path that is something other than a regular file (a device, a FIFO) is
refused, never replaced.
"""

import contextlib
import errno
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Protocol

from rdmakit.cli.errors import CliError

log = logging.getLogger("rdmakit")


class Held(Protocol):
    """A file this process holds until it ends (closing it removes it)."""

    @property
    def path(self) -> Path: ...

    def close(self) -> None: ...


#: Files this process published for a peer, removed by :func:`cleanup_published` (once each).
_PUBLISHED: list[Path] = []
#: Files this process holds (status files), closed by :func:`cleanup_published`.
_HELD: list[Held] = []


def writable_target(p: Path, what: str) -> None:
    """``p`` can be published: its directory exists, and it is not something other than a file."""
    parent = p.parent
    if not parent.is_dir():
        raise CliError(f"cannot write {what} {p}: the directory {parent} does not exist")
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(p.lstat().st_mode):
            raise CliError(f"cannot write {what} {p}: something other than a file is there")


def open_output(path: str, what: str) -> BinaryIO:
    """``path`` opened to be written from its start (created 0644 if missing): a regular file only.

    A FIFO, device or directory there is refused with one line rather than
    opened (a FIFO without a reader would block the open forever).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.EISDIR):
            raise CliError(f"cannot write {what} {path}: something other than a file is there") from None
        raise CliError(f"cannot write {what} {path}: {e.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CliError(f"cannot write {what} {path}: something other than a file is there")
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing (rename).

    Errors name ``path``, never the temporary file beside it.
    """
    p = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(p)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OSError(e.errno, e.strerror, str(p)) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def publish(path: str | os.PathLike[str], data: bytes, what: str = "file") -> Path:
    """Write ``data`` atomically to ``path`` and list it for removal when the program ends."""
    p = Path(path)
    writable_target(p, what)
    try:
        write_atomic(p, data)
    except OSError as e:
        raise CliError(f"cannot write {what} {p}: {e.strerror}") from e
    if p not in _PUBLISHED:
        _PUBLISHED.append(p)
    return p


def hold(held: Held) -> None:
    """Close ``held`` when the program ends, after the published files are removed."""
    _HELD.append(held)


def cleanup_published() -> None:
    """Remove every published file and close every held one; errors are logged, never raised."""
    while _PUBLISHED:
        p = _PUBLISHED.pop()
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("could not remove %s: %s", p, e.strerror)
    while _HELD:
        s = _HELD.pop()
        try:
            s.close()
        except OSError as e:
            log.warning("could not remove %s: %s", s.path, e.strerror)
