"""Running a DOCA RDMA sample pair through the real CLI: two processes, crossed descriptor files."""

import subprocess
import sys
from pathlib import Path

TIMEOUT = "20"


def rdmakit(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rdmakit", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(p: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=60)
    return p.returncode, out.strip(), err.strip()


def pair(
    tmp: Path, ips: tuple[str, str], transport: str, requester: list[str], responder: list[str]
) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """Run responder then requester with crossed descriptor paths; both results."""
    pre = "tcp:" if transport == "tcp" else ""
    paths = {k: str(tmp / f"{k}.json") for k in ("req", "resp", "mmap")}
    resp = rdmakit(
        *responder,
        "-d",
        pre + ips[0],
        "-ld",
        paths["resp"],
        "-re",
        paths["req"],
        "-m",
        paths["mmap"],
        "--timeout",
        TIMEOUT,
    )
    req = rdmakit(
        *requester,
        "-d",
        pre + ips[1],
        "-ld",
        paths["req"],
        "-re",
        paths["resp"],
        "-m",
        paths["mmap"],
        "--timeout",
        TIMEOUT,
    )
    r = finish(req)
    s = finish(resp)
    # Each side removes the descriptor files it wrote, and its status file.
    assert not any(Path(p).exists() for p in paths.values())
    assert sorted(tmp.iterdir()) == []
    return r, s
