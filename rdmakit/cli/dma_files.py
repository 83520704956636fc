"""The files DMA Copy reads and writes: checked before anything starts, written only when complete.

The side that has the file (:func:`local_file`) maps it as it is; the other
writes an unnamed file (``O_TMPFILE``, :class:`Destination`) that is linked
into place only once its checksum matches, so a failed or killed copy leaves
no partial file behind.
"""

import errno
import os
import stat
import tempfile
from contextlib import suppress
from pathlib import Path

from rdmakit.cli.errors import CliError
from rdmakit.cli.status_files import boot_id


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


def local_file(path: str) -> int | None:
    """The size of `path` if it exists (a readable regular file), else None (then it can be created).

    Checked before anything is published or connected: a source that cannot
    be read, or a destination that cannot be created, fails here.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            raise CliError(f"cannot write {path}: {os.strerror(errno.ENOENT)}") from None
        if not os.access(parent, os.W_OK | os.X_OK):
            raise CliError(f"cannot write {path}: {os.strerror(errno.EACCES)}") from None
        return None
    except IsADirectoryError:
        raise CliError(f"{path} is a directory") from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        raise CliError(f"{path} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise CliError(f"{path} is not a regular file")
    return st.st_size


def file_id(path: str) -> str:
    """Which file `path` is on this machine (boot id, device, inode): both sides naming one file show."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    boot = boot_id()
    return f"{boot}:{st.st_dev}:{st.st_ino}" if boot else ""
