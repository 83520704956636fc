"""The second-user helper really changes user (the security tests depend on it)."""

import os

from tests.security.nobody import NOBODY_UID, as_nobody, needs_nobody


@needs_nobody
def test_child_runs_as_nobody() -> None:
    def body(report: int) -> None:
        os.write(report, f"{os.getuid()} {os.geteuid()} {os.getgid()} {os.getgroups()}".encode())

    child = as_nobody(body)
    out = child.read()
    assert child.wait() == 0
    uid, euid, gid, groups = out.decode().split(" ", 3)
    assert (int(uid), int(euid), int(gid)) == (NOBODY_UID, NOBODY_UID, NOBODY_UID)
    assert groups == "[]"


@needs_nobody
def test_nobody_cannot_read_a_root_only_file(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "secret")
    with open(path, "w") as f:
        f.write("x")
    os.chmod(path, 0o600)

    def body(report: int) -> None:
        try:
            open(path).read()  # noqa: SIM115
            os.write(report, b"read")
        except PermissionError:
            os.write(report, b"denied")

    child = as_nobody(body)
    assert child.read() == b"denied"
    assert child.wait() == 0
