"""Attack 1: a descriptor owned by root whose bytes user nobody chose (``/proc/<pid>/environ``).

nobody binds a UDP socket, writes a connection descriptor naming it and a
memory descriptor into the environment of non-dumpable processes of its own
(so that their ``/proc/<pid>/environ`` is owned by root), and links names to
those files from a shared folder. Root's ``rdma-write-requester`` is given the
names as ``-re`` and ``-m``. It used to accept them ("owned by root") and send
its string to nobody's socket. Now it refuses the link with one line and sends
nothing; then a legitimate pair in the same folder works.
"""

import json
import os
import select
import socket
from collections.abc import Callable, Iterator
from ipaddress import IPv6Address, ip_address
from pathlib import Path

import pytest

from tests.processes import finish
from tests.security.nobody import Child, as_nobody, needs_nobody
from tests.security.programs import one_line, shared_dir, start
from tests.security.round3.lure import hold_in_environ

pytestmark = needs_nobody

SECRET = "root's string, for root's responder only"


def _gid(ip: str) -> str:
    return str(IPv6Address(b"\0" * 10 + b"\xff\xff" + ip_address(ip).packed))


def catcher(ip: str) -> Child:
    """nobody's socket: reports ``port N``, then ``stolen`` when a datagram carries root's string."""

    def body(report: int) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
            os.write(report, f"port {s.getsockname()[1]}\n".encode())
            while select.select([s], [], [], 120)[0]:
                if SECRET.encode() in s.recv(65536):
                    os.write(report, b"stolen\n")

    return as_nobody(body)


def lures(ip: str, port: int) -> tuple[bytes, bytes]:
    """(connection, memory) descriptors that send a write to nobody's socket."""
    connection = {
        "format": "rdmakit.connection/1", "transport": "roce-udp", "gid": _gid(ip), "ip": ip,
        "port": port, "qpn": 0x1234, "psn": 0, "mtu": 1024,
    }  # fmt: skip
    memory = {
        "format": "rdmakit.mmap/1", "addr": 0x10000, "length": 4096, "rkey": 0x1234,
        "access": ["RDMA_WRITE"], "device": "nobody", "gid": _gid(ip), "mtu": 1024,
    }  # fmt: skip
    return json.dumps(connection).encode(), json.dumps(memory).encode()


@pytest.fixture
def shared() -> Iterator[Path]:
    with shared_dir(0o777) as where:
        yield where


def requester(shared: Path, device: str, remote: Path, mmap: Path) -> list[str]:
    return [
        "rdma-write-requester", "-d", device, "-w", SECRET, "-ld", str(shared / "req.json"),
        "-re", str(remote), "-m", str(mmap), "--timeout", "10",
    ]  # fmt: skip


def attack(shared: Path, new_ip: Callable[[], str], linked: tuple[str, ...]) -> tuple[str, str]:
    """Root's requester against nobody's lures (names in ``linked`` link to procfs, others are
    root's own copies): (its one error line, what nobody's socket saw)."""
    ip = new_ip()
    sock = catcher(ip)
    holders: list[Child] = []
    try:
        line = sock.readline(30)
        assert line.startswith(b"port "), line
        connection, memory = lures(ip, int(line.split()[1]))
        for name, data in (("resp.json", connection), ("mmap.json", memory)):
            if name in linked:
                holders.append(hold_in_environ(data, shared / name))
                assert holders[-1].readline(30).startswith(b"ready "), "nobody could not set up the lure"
                assert (shared / name).is_symlink()
                assert (shared / name).stat().st_uid == 0  # the kernel says root owns it
            else:
                (shared / name).write_bytes(data)
        done = finish(start(shared, requester(shared, new_ip(), shared / "resp.json", shared / "mmap.json"),
                            os.environ))  # fmt: skip
        seen = sock.readline(1).decode()
        assert "stolen" not in seen, "root's requester sent its string to nobody's socket"
        assert SECRET not in done.out
        return one_line(done, "rdma-write-requester"), seen
    finally:
        for child in (sock, *holders):
            child.kill()


@pytest.mark.parametrize("sticky", [False, True], ids=["shared-folder", "sticky-like-tmp"])
def test_a_descriptor_in_procfs_linked_from_a_shared_folder_is_refused(
    shared: Path, new_ip: Callable[[], str], sticky: bool
) -> None:
    """``-re`` and ``-m`` both nobody's; in a sticky folder as /tmp where fs.protected_symlinks=0."""
    if sticky:
        shared.chmod(0o1777)
    error, _ = attack(shared, new_ip, ("resp.json", "mmap.json"))
    assert f"{shared / 'resp.json'} is a symbolic link" in error, error
    legitimate_pair(shared, new_ip)


def test_the_memory_descriptor_alone_in_procfs_is_refused(shared: Path, new_ip: Callable[[], str]) -> None:
    """``-m`` the same way, with ``-re`` a regular file of root's."""
    error, _ = attack(shared, new_ip, ("mmap.json",))
    assert f"{shared / 'mmap.json'} is a symbolic link" in error, error
    legitimate_pair(shared, new_ip)


def legitimate_pair(shared: Path, new_ip: Callable[[], str]) -> None:
    """Root's own responder and requester, with their files in the same folder: the string arrives."""
    for leftover in shared.iterdir():
        leftover.unlink()
    files = ["-ld", "resp.json", "-re", "req.json", "-m", "mmap.json", "--timeout", "30"]
    resp = start(shared, ["rdma-write-responder", "-d", new_ip(), *files], os.environ)
    req = finish(start(shared, requester(shared, new_ip(), shared / "resp.json", shared / "mmap.json"),
                       os.environ))  # fmt: skip
    got = finish(resp)
    assert (req.rc, got.rc) == (0, 0), (req.err, got.err)
    assert f"Remote write: {SECRET}" in got.out
