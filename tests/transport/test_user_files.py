"""The rule for a file a user named (rdmakit.transport.user_files), one clause at a time."""

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmakit.transport.user_files import Trust, UserFileError, read_user_file, user_name
from tests.security.nobody import NOBODY_UID, as_nobody, needs_nobody

LIMIT = 4096


def refused(path: Path | str, trust: Trust = Trust.OWN, limit: int = LIMIT) -> UserFileError:
    with pytest.raises(UserFileError) as exc:
        read_user_file(path, "the file", limit, trust)
    return exc.value


def test_the_callers_regular_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b"{}")
    got = read_user_file(path, "the file", LIMIT)
    assert got.data == b"{}"
    assert (got.dev, got.ino) == (path.stat().st_dev, path.stat().st_ino)
    monkeypatch.chdir(tmp_path)
    assert read_user_file("f.json", "the file", LIMIT).data == b"{}"


@pytest.mark.parametrize("trust", list(Trust))
def test_a_link_in_the_last_component_is_never_followed(tmp_path: Path, trust: Trust) -> None:
    """Not even to the caller's own 0600 file, whatever the reader trusts."""
    target = tmp_path / "real"
    target.write_text(os.urandom(16).hex())
    target.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(target)
    err = refused(link, trust)
    assert err.kind == "unsafe"
    assert err.message == (
        f"the file {link} is a symbolic link: refused (links are not followed; name the file itself)"
    )


def test_links_above_the_last_component_are_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_bytes(b"x")
    (tmp_path / "dir").symlink_to(tmp_path / "real")
    assert read_user_file(tmp_path / "dir" / "f", "the file", LIMIT).data == b"x"


@pytest.mark.parametrize(
    ("path", "fs"),
    [
        ("/proc/self/environ", "procfs"),
        ("/proc/self/status", "procfs"),
        ("/sys/kernel/uevent_seqnum", "sysfs"),
    ],
)
def test_files_the_kernel_makes_up_are_refused(path: str, fs: str) -> None:
    err = refused(path, Trust.ANY_OWNER)
    assert err.kind == "unsafe"
    assert err.message == f"the file {path} is on {fs}, whose files the kernel makes up: refused"


def test_a_regular_file_on_the_dev_filesystem_is_refused() -> None:
    if os.geteuid() != 0 or os.stat("/dev").st_dev == os.stat("/").st_dev:
        pytest.skip("needs root and /dev mounted on its own (devtmpfs or tmpfs)")
    fd, name = tempfile.mkstemp(prefix="rdmakit-user-files-", dir="/dev")
    os.close(fd)
    try:
        err = refused(name, Trust.ANY_OWNER)
        assert (
            err.message
            == f"the file {name} is on the /dev filesystem, whose files the kernel makes up: refused"
        )
    finally:
        os.unlink(name)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "socket"])
def test_only_regular_files_are_read(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x"
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes it: opening it must not wait
        want = "a FIFO"
    elif kind == "device":
        path = Path("/dev/null")
        want = "a device"
    elif kind == "directory":
        path.mkdir()
        want = "a directory"
    else:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
        want = "a socket"
    err = refused(path, Trust.ANY_OWNER)
    assert err.message == f"the file {path} is {want}, not a regular file"


def test_reads_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * LIMIT)
    assert len(read_user_file(path, "the file", LIMIT).data) == LIMIT
    path.write_bytes(b"x" * (LIMIT + 1))
    err = refused(path)
    assert (err.kind, err.message) == ("too-large", f"the file {path} is larger than {LIMIT} bytes")


def test_at_most_one_byte_past_the_limit_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "huge"
    with path.open("wb") as f:
        f.truncate(1 << 30)  # sparse: costs no disk
    seen = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        seen.append(len(data))
        return data

    monkeypatch.setattr(os, "read", counting_read)
    assert refused(path).kind == "too-large"
    assert sum(seen) == LIMIT + 1


def test_missing_is_told_apart(tmp_path: Path) -> None:
    for path in (tmp_path / "none", tmp_path / "no-dir" / "none"):
        assert refused(path).kind == "missing"


@needs_nobody
def test_another_users_file_only_when_trusted(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"{}")
    os.chown(path, NOBODY_UID, NOBODY_UID)
    err = refused(path)
    assert err.message == (
        f"the file {path} belongs to uid {NOBODY_UID} (nobody), not to you or root: refused "
        "(another user may have planted it)"
    )
    with pytest.raises(UserFileError) as exc:
        read_user_file(path, "the file", LIMIT, override="--trust-them")
    assert exc.value.message.endswith("(another user may have planted it; --trust-them to trust it)")
    assert read_user_file(path, "the file", LIMIT, Trust.ANY_OWNER).data == b"{}"


def test_secrets_are_the_callers_alone(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("00" * 16)
    path.chmod(0o600)
    assert read_user_file(path, "secret file", LIMIT, Trust.SECRET).data == b"00" * 16
    for mode in (0o640, 0o604, 0o610):
        path.chmod(mode)
        err = refused(path, Trust.SECRET)
        assert err.kind == "unsafe"
        assert "are too open" in err.message
    path.chmod(0o400)
    assert read_user_file(path, "secret file", LIMIT, Trust.SECRET).data == b"00" * 16
    if os.geteuid() == 0:
        os.chown(path, NOBODY_UID, NOBODY_UID)
        assert "is owned by uid 65534" in refused(path, Trust.SECRET).message


# -- a caller that is not root, reading root's files ----------------------------------------


@pytest.fixture
def root_dirs() -> Iterator[Path]:
    """/tmp/X (0755, root's) holding folders of several modes, each with a root 0644 file."""
    base = Path(tempfile.mkdtemp(prefix="rdmakit-user-files-", dir="/tmp"))
    base.chmod(0o755)
    try:
        for name, mode in (("private", 0o755), ("shared", 0o777), ("sticky", 0o1777), ("group", 0o775)):
            d = base / name
            d.mkdir()
            d.chmod(mode)
            (d / "f").write_bytes(b"{}")
            (d / "f").chmod(0o644)
        (base / "private" / "open").write_bytes(b"{}")
        (base / "private" / "open").chmod(0o666)
        theirs = base / "theirs"
        theirs.mkdir(mode=0o755)
        (theirs / "f").write_bytes(b"{}")
        os.chown(theirs, 1, 1)  # another user's folder: they could have put a link to a root file there
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@needs_nobody
def test_root_files_are_taken_only_where_no_one_else_could_have_placed_them(root_dirs: Path) -> None:
    names = ["private/f", "shared/f", "sticky/f", "group/f", "private/open", "theirs/f"]

    def body(report: int) -> None:
        out = {}
        for name in names:
            try:
                read_user_file(root_dirs / name, "the file", LIMIT)
                out[name] = "read"
            except UserFileError as e:
                out[name] = e.message
        os.write(report, json.dumps(out).encode())

    child = as_nobody(body)
    got = json.loads(child.read(30))
    assert child.wait() == 0
    assert got.pop("private/f") == "read"
    why = ": refused (another user may have planted it)"
    assert got == {
        "shared/f": f"the file {root_dirs}/shared/f belongs to root but others may write its directory "
        f"(mode 0777){why}",
        "sticky/f": f"the file {root_dirs}/sticky/f belongs to root but others may write its directory "
        f"(mode 1777){why}",
        "group/f": f"the file {root_dirs}/group/f belongs to root but others may write its directory "
        f"(mode 0775){why}",
        "private/open": f"the file {root_dirs}/private/open belongs to root but others may write it{why}",
        "theirs/f": f"the file {root_dirs}/theirs/f belongs to root but its directory belongs to "
        f"{user_name(1)}{why}",
    }
