"""Files read from a peer: a regular file, at most the limit, owned by the caller or root."""

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cli.cli_util import run_once
from tests.security.nobody import NOBODY_UID, as_nobody, needs_nobody

IPS = Callable[[], str]

DESCRIPTOR = json.dumps(
    {
        "format": "rdmakit.connection/1",
        "transport": "roce-udp",
        "gid": "::ffff:127.0.0.9",
        "ip": "127.0.0.9",
        "port": 4791,
        "qpn": 7,
        "psn": 1,
        "mtu": 4096,
    }
).encode()


def read_as_peer(path: Path, tmp: Path, new_ip: IPS, *extra: str) -> tuple[int, str, str]:
    return run_once(
        "rdma-send", "-d", new_ip(), "-ld", str(tmp / "l.json"), "-re", str(path), "--timeout", "5", *extra
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "link-to-dev-zero", "proc", "directory", "huge"])
def test_a_descriptor_that_is_not_one_is_refused_at_once(kind: str, tmp_path: Path, new_ip: IPS) -> None:
    """A FIFO no one writes, /dev/zero (or a link to it), a file of procfs, a directory, a 1 GiB file:
    one line, well within --timeout."""
    if kind == "fifo":
        path = tmp_path / "peer.json"
        os.mkfifo(path)
        want = "is a FIFO, not a regular file"
    elif kind == "dev-zero":
        path = Path("/dev/zero")
        want = "is a device, not a regular file"
    elif kind == "link-to-dev-zero":
        path = tmp_path / "peer.json"
        path.symlink_to("/dev/zero")
        want = "is a symbolic link: refused (links are not followed; name the file itself)"
    elif kind == "proc":
        path = Path("/proc/self/environ")
        want = "is on procfs, whose files the kernel makes up: refused"
    elif kind == "directory":
        path = tmp_path / "peer.json"
        path.mkdir()
        want = "is a directory, not a regular file"
    else:
        path = tmp_path / "peer.json"
        with path.open("wb") as f:
            f.truncate(1 << 30)  # sparse: costs no disk
        want = "is larger than 4096 bytes"
    rc, _out, err = read_as_peer(path, tmp_path, new_ip)
    assert rc == 1  # an error, not the timeout (3)
    assert err == f"rdmakit rdma-send: the peer's connection descriptor {path} {want}"
    assert not (tmp_path / "l.json").exists()


def test_an_options_file_that_is_a_fifo_is_refused(tmp_path: Path, new_ip: IPS) -> None:
    fifo = tmp_path / "opts.json"
    os.mkfifo(fifo)
    rc, _out, err = run_once("rdma-send", "-d", new_ip(), "--json", str(fifo))
    assert rc == 1
    assert err == f"rdmakit rdma-send: the options file {fifo} is a FIFO, not a regular file"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A sticky world-writable directory that user nobody can reach (pytest's tmp is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="rdmakit-shared-", dir="/tmp"))
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@needs_nobody
def test_a_descriptor_planted_by_another_user_is_refused(shared_dir: Path, new_ip: IPS) -> None:
    """As in /tmp: a sticky, world-writable directory where user nobody got there first."""
    shared = shared_dir
    planted = shared / "resp.json"

    def plant(report: int) -> None:
        planted.write_bytes(DESCRIPTOR)
        os.write(report, b"planted\n")

    child = as_nobody(plant)
    assert child.readline() == b"planted\n"
    assert child.wait() == 0
    assert planted.stat().st_uid == NOBODY_UID

    rc, out, err = run_once(
        "rdma-write-requester", "-d", new_ip(), "-w", "SECRET", "-ld", str(shared / "req.json"),
        "-re", str(planted), "-m", str(shared / "mmap.json"), "--timeout", "5",
    )  # fmt: skip
    assert rc == 1
    assert err == (
        f"rdmakit rdma-write-requester: the peer's connection descriptor {planted} belongs to "
        f"uid {NOBODY_UID} (nobody), not to you or root: refused (another user may have planted it; "
        "--allow-foreign-descriptors to trust it)"
    )
    assert "SECRET" not in out
    assert sorted(p.name for p in shared.iterdir()) == ["resp.json"]


@needs_nobody
def test_allow_foreign_descriptors_trusts_another_owner(tmp_path: Path, new_ip: IPS) -> None:
    """With the flag the file is read: here it names no live peer, so the wait ends in a field error."""
    planted = tmp_path / "resp.json"
    planted.write_bytes(b'{"format": "rdmakit.connection/1"}')
    os.chown(planted, NOBODY_UID, NOBODY_UID)
    rc, _out, err = read_as_peer(planted, tmp_path, new_ip)
    assert rc == 1
    assert "belongs to uid 65534 (nobody)" in err
    rc, _out, err = read_as_peer(planted, tmp_path, new_ip, "--allow-foreign-descriptors")
    assert rc == 1
    assert "belongs to" not in err
    assert "connection descriptor field 'transport': missing" in err
