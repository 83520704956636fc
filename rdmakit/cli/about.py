"""What this rdmakit is: its version and which UDP data plane it runs (``--version``)."""

import os
import sys
from pathlib import Path

from rdmakit import __version__
from rdmakit.transport import fastpath


def data_plane() -> str:
    """Which UDP data plane this process runs: native (and its CRC-32) or pure Python (and why)."""
    return fastpath.describe()


def notice_pure_python() -> None:
    """Say once per user (a marker in the cache directory) that the native data plane did not build."""
    if fastpath.native is not None or os.environ.get("RDMAKIT_PURE_PYTHON", "") not in ("", "0"):
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rdmakit"
    marker = cache / "pure-python-noticed"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError:
        return  # said before, or nowhere to note it: stay quiet
    os.close(fd)
    print(
        "rdmakit: the native UDP data plane is not built; the pure-Python path is in use "
        "(slower; reinstall with a C compiler to build it; 'rdmakit --version' tells which runs)",
        file=sys.stderr,
    )


def version_line() -> str:
    return f"rdmakit {__version__} (UDP data plane: {data_plane()})"
