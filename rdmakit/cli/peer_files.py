"""Files a program reads from a peer or from a path the user named (``--json``).

Such a file must be a regular file, at most a size limit (never read past
it), owned by the caller or root unless the user allows another owner
(``--allow-foreign-descriptors``), as OpenSSH's ``StrictModes`` refuses a
file another user could have planted. It is opened without blocking, so a
FIFO planted in its place cannot hang the reader.
"""

import os
import stat
from dataclasses import dataclass

from rdmakit.cli.errors import CliError

#: Largest file read by default from a path a user named (a peer's file, ``--json``).
MAX_PEER_FILE = 1 << 16


def _owner_name(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


@dataclass(frozen=True, slots=True)
class PeerFile:
    """What was read from a peer's file, and which file (device, inode) it was."""

    data: bytes
    dev: int
    ino: int
    mtime: float


def open_checked(path: str | os.PathLike[str], what: str, allow_foreign: bool) -> tuple[int, os.stat_result]:
    """A descriptor of ``path`` opened without blocking, checked to be a regular file we may trust.

    FileNotFoundError propagates (the caller may wait); anything else is a CliError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CliError(f"cannot read {what} {path}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a directory" if stat.S_ISDIR(st.st_mode)
                else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file"
            )  # fmt: skip
            raise CliError(f"{what} {path} is {kind}, not a regular file")
        if st.st_uid not in (os.getuid(), 0) and not allow_foreign:
            raise CliError(
                f"{what} {path} belongs to {_owner_name(st.st_uid)}, not to you or root: refused "
                "(another user may have planted it; --allow-foreign-descriptors to trust it)"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_limited(fd: int, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``fd``: one more than ``limit`` tells the file is larger."""
    out = bytearray()
    while len(out) <= limit:
        chunk = os.read(fd, limit + 1 - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def read_peer_file(
    path: str | os.PathLike[str], what: str, limit: int = MAX_PEER_FILE, *, allow_foreign: bool = False
) -> bytes:
    """The contents of a file a user named: checked for type, owner and size (never read past it)."""
    try:
        return read_peer(path, what, limit, allow_foreign).data
    except FileNotFoundError as e:
        raise CliError(f"cannot read {what} {path}: it does not exist") from e


def read_peer(path: str | os.PathLike[str], what: str, limit: int, allow_foreign: bool) -> PeerFile:
    """:func:`read_peer_file`, and which file it was; FileNotFoundError propagates (a caller may wait)."""
    fd, st = open_checked(path, what, allow_foreign)
    try:
        data = read_limited(fd, limit)
    except OSError as e:
        raise CliError(f"cannot read {what} {path}: {e.strerror}") from e
    finally:
        os.close(fd)
    if len(data) > limit:
        raise CliError(f"{what} {path} is larger than {limit} bytes: not one")
    return PeerFile(data, st.st_dev, st.st_ino, st.st_mtime)
