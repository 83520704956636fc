"""Reading a file a user named: the one way every program and layer does it.

Descriptors (``-re``, ``-m``, ``--descriptor-path``), their status files,
``--json`` option files, ``--secret-file`` and the default comm channel key,
a conformance ``--deviations`` file, the file ``dma-copy`` sends: whatever a
program reads by a path it was given is opened and checked here, and nowhere
else (``tests/test_file_readers.py``
lists every other place rdmakit opens a file, and why that one is not such a
path). It lives in ``transport``, the lowest layer allowed I/O, so that every
reader can import it downward: ``transport.comm_auth`` (secret files), the
conformance agent, ``doca.descriptor`` and the programs in ``cli``.

The rule, for every such file:

- The last component of the path must not be a symbolic link
  (``O_NOFOLLOW``, relative to the directory opened first). Another user who
  may write the folder could otherwise point the name at any file the caller
  can read, e.g. at ``/proc/<pid>/environ`` of a process of theirs, which the
  kernel hands to root once that process is non-dumpable
  (``prctl(PR_SET_DUMPABLE, 0)``; ``task_dump_owner`` in ``fs/proc/base.c``)
  although its bytes are theirs.
- The file must be a regular file (a FIFO would block, a device never end),
  and not on a filesystem whose files the kernel makes up: procfs, sysfs,
  devpts, cgroup, debugfs and the like (``fstatfs(2)`` of the opened file,
  ``f_type`` as in ``linux/magic.h``), nor on the filesystem mounted at
  ``/dev`` (devtmpfs says it is a tmpfs, so it is told by its device).
- Its owner (``fstat`` of the opened file, never of the name):

  ``Trust.OWN``
      the caller's own file; or root's, when neither the file nor its
      directory may be written by anyone but root or the caller: no
      group or other write bits, a directory owned by root or the caller
      (OpenSSH's ``StrictModes`` asks the same of each directory of a path).
      In a folder others may write, only a link could have brought a root
      file there, and for a caller that is not root such a file says
      nothing about who chose its bytes.
  ``Trust.ANY_OWNER``
      any owner: the user said they trust another user's files
      (``--allow-foreign-descriptors``). Every other check still holds.
  ``Trust.SECRET``
      the caller's own file, with no permission for group or others (as
      OpenSSH asks of a private key).

- At most ``limit`` bytes are read (one more tells it is larger).

A refusal is a :class:`UserFileError` with one line that names the file and
the reason; each layer turns it into its own error (``CliError``,
``DocaError``, ``SecretError``).
"""

import contextlib
import ctypes
import enum
import errno
import os
import pwd
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

__all__ = ["Trust", "UserFile", "UserFileError", "opened", "read_bounded", "read_user_file", "user_name"]

#: ``f_type`` of filesystems whose files the kernel makes up (``include/uapi/linux/magic.h``).
PSEUDO_FILESYSTEMS = {
    0x9FA0: "procfs",  # PROC_SUPER_MAGIC
    0x62656572: "sysfs",  # SYSFS_MAGIC
    0x1CD1: "devpts",  # DEVPTS_SUPER_MAGIC
    0x27E0EB: "cgroup",  # CGROUP_SUPER_MAGIC
    0x63677270: "cgroup2",  # CGROUP2_SUPER_MAGIC
    0x64626720: "debugfs",  # DEBUGFS_MAGIC
    0x74726163: "tracefs",  # TRACEFS_MAGIC
    0x73636673: "securityfs",  # SECURITYFS_MAGIC
    0x62656570: "configfs",  # CONFIGFS_MAGIC
    0xCAFE4A11: "bpffs",  # BPF_FS_MAGIC
    0xDE5E81E4: "efivarfs",  # EFIVARFS_MAGIC
    0x6165676C: "pstore",  # PSTOREFS_MAGIC
    0x42494E4D: "binfmt_misc",  # BINFMTFS_MAGIC
    0x6E736673: "nsfs",  # NSFS_MAGIC
}

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_GROUP_OTHERS = stat.S_IRWXG | stat.S_IRWXO


class Trust(enum.Enum):
    """Whose file a reader takes (the module docstring has the rule of each)."""

    OWN = "own"
    ANY_OWNER = "any owner"
    SECRET = "secret"


class UserFileError(Exception):
    """A file a user named that is missing, unreadable, not safe to trust, or too large.

    ``missing``: the file (or its directory) does not exist, which a caller may
    wait out; ``unreadable``: the system refused (``errno`` says why);
    ``unsafe``: this module refused; ``too-large``: larger than the limit.
    """

    def __init__(
        self,
        message: str,
        kind: Literal["missing", "unreadable", "unsafe", "too-large"],
        errno: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.errno = errno


@dataclass(frozen=True, slots=True)
class UserFile:
    """What was read from a file, and which file (device, inode) it was."""

    data: bytes
    dev: int
    ino: int
    mtime: float


def user_name(uid: int) -> str:
    """``uid N (name)``, for messages about who owns or holds something."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _fs_type(fd: int) -> int:
    """``f_type`` of the filesystem of ``fd`` (``fstatfs(2)``; it is the first field of ``struct statfs``)."""
    buf = ctypes.create_string_buffer(256)  # larger than struct statfs on every Linux ABI
    if _fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


_libc = ctypes.CDLL(None, use_errno=True)
_fstatfs = _libc.fstatfs
_fstatfs.argtypes = (ctypes.c_int, ctypes.c_void_p)
_fstatfs.restype = ctypes.c_int


def _dev_filesystem() -> int | None:
    """The device of the filesystem mounted at ``/dev``; None when /dev is a plain directory of ``/``."""
    try:
        dev, root = os.stat("/dev").st_dev, os.stat("/").st_dev
    except OSError:
        return None
    return dev if dev != root else None


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _not_regular(what: str, path: str, mode: int) -> UserFileError:
    if stat.S_ISLNK(mode):
        why = "links are not followed; name the file itself"
        return UserFileError(f"{what} {path} is a symbolic link: refused ({why})", "unsafe")
    return UserFileError(f"{what} {path} is {_kind(mode)}, not a regular file", "unsafe")


def _check_place(what: str, path: str, fd: int, st: os.stat_result) -> None:
    """A regular file on a filesystem of files, not one the kernel makes up."""
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(what, path, st.st_mode)
    fs = PSEUDO_FILESYSTEMS.get(_fs_type(fd))
    if fs is None and st.st_dev == _dev_filesystem():
        fs = "the /dev filesystem"
    if fs is not None:
        raise UserFileError(f"{what} {path} is on {fs}, whose files the kernel makes up: refused", "unsafe")


def _check_owner(
    what: str, path: str, st: os.stat_result, dir_st: os.stat_result, trust: Trust, override: str
) -> None:
    me = os.geteuid()
    if trust is Trust.ANY_OWNER:
        return
    if trust is Trust.SECRET:
        if st.st_uid != me:
            owner, caller = user_name(st.st_uid), user_name(me)
            raise UserFileError(f"{what} {path} is owned by {owner}, not by this user ({caller})", "unsafe")
        if st.st_mode & _GROUP_OTHERS:
            mode, owner = stat.S_IMODE(st.st_mode), user_name(st.st_uid)
            raise UserFileError(
                f"permissions {mode:04o} for {what} {path} (owner {owner}) are too open: "
                "it must not be accessible by others (chmod 600)",
                "unsafe",
            )
        return
    if st.st_uid == me:
        return
    why = "another user may have planted it" + (f"; {override} to trust it" if override else "")
    if st.st_uid != 0:
        raise UserFileError(
            f"{what} {path} belongs to {user_name(st.st_uid)}, not to you or root: refused ({why})", "unsafe"
        )
    if st.st_mode & _OTHERS_WRITE:
        where = "others may write it"
    elif dir_st.st_uid not in (0, me):
        where = f"its directory belongs to {user_name(dir_st.st_uid)}"
    elif dir_st.st_mode & _OTHERS_WRITE:
        where = f"others may write its directory (mode {stat.S_IMODE(dir_st.st_mode):04o})"
    else:
        return
    raise UserFileError(f"{what} {path} belongs to root but {where}: refused ({why})", "unsafe")


def _os_error(what: str, path: str, exc: OSError) -> UserFileError:
    if isinstance(exc, FileNotFoundError):
        return UserFileError(f"cannot read {what} {path}: it does not exist", "missing")
    return UserFileError(f"cannot read {what} {path}: {exc.strerror}", "unreadable", exc.errno)


@contextlib.contextmanager
def opened(
    path: str | os.PathLike[str], what: str, trust: Trust = Trust.OWN, *, override: str = ""
) -> Iterator[tuple[int, os.stat_result]]:
    """``path`` opened read-only and checked (the module's rule): its descriptor and ``fstat``.

    ``what`` names the file in messages ("the peer's connection descriptor");
    ``override`` names what would make the reader trust another owner (a flag).
    UserFileError otherwise; the descriptor is closed on leaving.
    """
    name = os.fspath(path)
    parent, base = os.path.split(name)
    if base in ("", ".", ".."):
        raise UserFileError(f"{what} {name} is a directory, not a regular file", "unsafe")
    try:
        dir_fd = os.open(parent or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _os_error(what, name, exc) from None
    try:
        try:  # what the name is, before opening it: never open a device or a link at all
            before = os.stat(base, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            raise _os_error(what, name, exc) from None
        if not stat.S_ISREG(before.st_mode):
            raise _not_regular(what, name, before.st_mode)
        try:
            fd = os.open(base, _OPEN_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # replaced by a link since
                raise _not_regular(what, name, stat.S_IFLNK) from None
            raise _os_error(what, name, exc) from None
        try:
            st = os.fstat(fd)
            _check_place(what, name, fd, st)
            _check_owner(what, name, st, os.fstat(dir_fd), trust, override)
        except OSError as exc:
            os.close(fd)
            raise _os_error(what, name, exc) from None
        except BaseException:
            os.close(fd)
            raise
    finally:
        os.close(dir_fd)
    try:
        yield fd, st
    finally:
        os.close(fd)


def read_bounded(fd: int, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``fd``: one more than ``limit`` tells the file is larger."""
    out = bytearray()
    while len(out) <= limit:
        chunk = os.read(fd, limit + 1 - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def read_user_file(
    path: str | os.PathLike[str], what: str, limit: int, trust: Trust = Trust.OWN, *, override: str = ""
) -> UserFile:
    """The contents of a file a user named, checked by the module's rule; at most ``limit`` bytes."""
    name = os.fspath(path)
    with opened(name, what, trust, override=override) as (fd, st):
        try:
            data = read_bounded(fd, limit)
        except OSError as exc:
            raise _os_error(what, name, exc) from None
    if len(data) > limit:
        raise UserFileError(f"{what} {name} is larger than {limit} bytes", "too-large")
    return UserFile(data, st.st_dev, st.st_ino, st.st_mtime)
