"""The programs' side of reading a file a user named: :mod:`rdmakit.transport.user_files`.

Every program reads a peer's file, a status file or a ``--json`` options
file through these functions, which apply that module's rule (no link, a
regular file on a filesystem of files, the caller's or root's where only
root could have placed it, bounded) and turn a refusal into one ``CliError``
line. ``--allow-foreign-descriptors`` (:data:`FOREIGN_FLAG`) makes a reader
take another user's file; nothing makes it follow a link.
"""

import os

from rdmakit.cli.errors import CliError
from rdmakit.transport.user_files import Trust, UserFile, UserFileError, read_user_file

#: Largest file read by default from a path a user named (a peer's file, ``--json``).
MAX_PEER_FILE = 1 << 16
#: The switch that makes the programs trust another user's files.
FOREIGN_FLAG = "--allow-foreign-descriptors"


def trust(allow_foreign: bool) -> Trust:
    """Whose files a reader takes: the caller's and root's, or anyone's with the flag."""
    return Trust.ANY_OWNER if allow_foreign else Trust.OWN


def read_peer(path: str | os.PathLike[str], what: str, limit: int, allow_foreign: bool) -> UserFile | None:
    """The file a user named, checked; None while it does not exist (a caller may wait for it)."""
    try:
        return read_user_file(path, what, limit, trust(allow_foreign), override=FOREIGN_FLAG)
    except UserFileError as e:
        if e.kind == "missing":
            return None
        raise CliError(e.message) from None


def read_peer_file(
    path: str | os.PathLike[str], what: str, limit: int = MAX_PEER_FILE, *, allow_foreign: bool = False
) -> bytes:
    """The contents of a file a user named; a missing file is an error too."""
    pf = read_peer(path, what, limit, allow_foreign)
    if pf is None:
        raise CliError(f"cannot read {what} {path}: it does not exist")
    return pf.data
