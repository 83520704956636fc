"""The files DMA Copy reads and writes: checked before anything starts, written only when complete.

The side that has the file (:func:`local_file`) maps it as it is; the other
writes an unnamed file (``O_TMPFILE``, :class:`Destination`) that is linked
into place only once its checksum matches, so a failed or killed copy leaves
no partial file behind.
"""

import errno
import os
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from rdmakit.cli.errors import CliError
from rdmakit.cli.status_files import boot_id
from rdmakit.transport.user_files import Trust, UserFileError, opened


class Destination:
    """A file that appears under its name only when `commit` is called: ``O_TMPFILE``, linked in.

    Where ``O_TMPFILE`` is not supported, a hidden ``.NAME.*.partial`` file
    in the same directory (removed by `discard`; a process killed outright
    leaves it behind, under that name only).
    """

    def __init__(self, path: str, size: int) -> None:
        self.path = Path(path)
        parent = self.path.parent
        self._tmp: str | None = None
        self.fd = self._dir = -1
        try:
            self._dir = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            self.fd = os.open(parent, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            if self._dir < 0 or exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                self.discard()
                raise CliError(f"cannot write {path}: {exc.strerror}") from exc
            try:
                self.fd, self._tmp = tempfile.mkstemp(
                    prefix=f".{self.path.name}.", suffix=".partial", dir=parent
                )
            except OSError as exc2:
                self.discard()
                raise CliError(f"cannot write {path}: {exc2.strerror}") from exc2
        fd = self.fd
        try:
            if size:
                os.posix_fallocate(fd, 0, size)  # ENOSPC now, not SIGBUS in the middle of the copy
        except OSError as exc:
            self.discard()
            raise CliError(f"cannot write {path}: {exc.strerror}") from exc

    def commit(self) -> None:
        """Flush and link the file in; never replaces a file that appeared meanwhile."""
        try:
            os.fsync(self.fd)
            # linkat(AT_SYMLINK_FOLLOW) (a dir fd makes os.link use linkat), in the directory opened first
            if self._tmp is None:
                os.link(
                    f"/proc/self/fd/{self.fd}", self.path.name, dst_dir_fd=self._dir, follow_symlinks=True
                )
            else:
                os.link(self._tmp, self.path.name, dst_dir_fd=self._dir)
                os.unlink(self._tmp)
                self._tmp = None
        except OSError as exc:
            raise CliError(f"cannot create {self.path}: {exc.strerror}") from exc
        self.discard()

    def discard(self) -> None:
        """Close and forget the unnamed file; idempotent."""
        for fd in (self.fd, self._dir):
            if fd >= 0:
                os.close(fd)
        self.fd = self._dir = -1
        if self._tmp is not None:
            with suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = None


def close_fds(fds: list[int]) -> None:
    """Close the file descriptors a peer sent."""
    for fd in fds:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class LocalFile:
    """The file this side copies from: open (read-only) from the check on, so the name cannot be
    swapped for another file between the check and the copy."""

    fd: int
    size: int
    #: Which file it is on this machine (boot id, device, inode): both sides naming one file show.
    ident: str


def local_file(path: str) -> LocalFile | None:
    """`path` opened if it exists, else None (then it can be created).

    Checked before anything is published or connected: a source that cannot
    be read, or a destination that cannot be created, fails here. A source is
    opened by the rule of ``rdmakit.transport.user_files`` with any owner (the
    user may copy any file they can read), but never through a link and never
    a file of procfs or sysfs: in a folder another user may write, a link
    there would pick what this side sends.
    """
    if os.path.isdir(path):
        raise CliError(f"{path} is a directory")
    try:
        with opened(path, "the file to copy", Trust.ANY_OWNER) as (fd, st):
            own = os.dup(fd)
    except UserFileError as exc:
        if exc.kind != "missing":
            raise CliError(exc.message) from None
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            raise CliError(f"cannot write {path}: {os.strerror(errno.ENOENT)}") from None
        if not os.access(parent, os.W_OK | os.X_OK):
            raise CliError(f"cannot write {path}: {os.strerror(errno.EACCES)}") from None
        return None
    boot = boot_id()
    return LocalFile(own, st.st_size, f"{boot}:{st.st_dev}:{st.st_ino}" if boot else "")
