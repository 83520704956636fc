"""Attack 1: ``dma-copy`` over a ``tcp:`` comm channel, by a second local user (nobody).

What user nobody did to root's ``dma-copy``, and what happens now:

- named its own read-only descriptor of a root-owned 0644 file in a forged
  shared-memory export claiming write access: root's DPU side opened
  ``/proc/PID/fd/N`` read-write and wrote its copy into the file (over
  ``--transport rdma`` and ``--transport shm``);
- posed as the host and received the DPU's 0600 file;
- listened on the port first: root's host sent it its 0600 file;
- held one silent connection: the DPU gave up at its timeout.

Each test checks that the attack fails and that the legitimate flow still
copies afterwards.
"""

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rdmakit.doca import AccessFlag, CommChannel, Dev, DocaError, Rdma, WorkQ
from tests.processes import finish
from tests.security.nobody import as_nobody, needs_nobody
from tests.security.programs import one_line, program_as_nobody, shared_dir, start

pytestmark = needs_nobody

SECRET_ENV = "RDMAKIT_COMCH_SECRET"  # spelled out: these tests also run against code without it

PORT = 47393
ROOT_CONTENT = b"root's configuration: nobody may read this, never write it\n" * 1000


@pytest.fixture
def root_env(tmp_path: Path) -> dict[str, str]:
    """Root's environment: the secret both of root's sides share."""
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    env[SECRET_ENV] = os.urandom(32).hex()
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # no default key of the real user's
    return env


@pytest.fixture
def nobody_env() -> dict[str, str]:
    """nobody's environment: a secret of its own, not root's."""
    return {"PATH": os.environ.get("PATH", ""), SECRET_ENV: os.urandom(32).hex()}


@pytest.fixture
def sides(tmp_path: Path) -> tuple[Path, Path]:
    host, dpu = tmp_path / "host", tmp_path / "dpu"
    host.mkdir()
    dpu.mkdir()
    return host, dpu


@pytest.fixture
def victim() -> Iterator[Path]:
    """A root-owned 0644 file that nobody can open, read-only."""
    with shared_dir(0o755) as where:
        path = where / "root.conf"
        path.write_bytes(ROOT_CONTENT)
        path.chmod(0o644)
        yield path


def secret_file(directory: Path, size: int) -> tuple[Path, str]:
    """Root's 0600 file of `size` random bytes, and its sha256."""
    data = os.urandom(size)
    path = directory / "secret.bin"
    path.write_bytes(data)
    path.chmod(0o600)
    return path, hashlib.sha256(data).hexdigest()


def rdma_args(role: str, file: str, service: str, device: str, *extra: str) -> list[str]:
    return [
        "dma-copy", "--role", role, "-f", file, "--service", service, "--device", device,
        "--timeout", "30", *extra,
    ]  # fmt: skip


def legit_copy(
    sides: tuple[Path, Path], env: dict[str, str], args_for: Callable[[str], list[str]], digest: str
) -> None:
    """The DPU's secret.bin reaches the host: the legitimate flow works after the attack."""
    host_dir, _ = sides
    with_dpu = start(sides[1], args_for("dpu"), env)
    host = finish(start(host_dir, args_for("host"), env))
    dpu = finish(with_dpu)
    assert (host.rc, dpu.rc) == (0, 0), (host.err, dpu.err)
    assert hashlib.sha256((host_dir / "secret.bin").read_bytes()).hexdigest() == digest


def forge_write_export(service: str, target: Path, transport: str, device: str) -> Callable[[int], None]:
    """nobody's attack: a fake host that exports its read-only descriptor of `target` as writable.

    The DPU has the file, so it copies into the "host's" memory: the forged
    export names ``/proc/<nobody's pid>/fd/<its read-only fd>``, with
    PCI_READ_WRITE. Reports "refused ..." or "wrote".
    """

    def body(report: int) -> None:
        os.environ[SECRET_ENV] = os.urandom(32).hex()  # nobody's own: it does not have root's
        fd = os.open(target, os.O_RDONLY)  # all that nobody can have of a root 0644 file
        st = os.fstat(fd)
        try:
            chan = CommChannel.connect(service, timeout=10)
            chan.send(json.dumps({
                "type": "direction", "file_in_host": False, "file_size": 0, "transport": transport,
                "connection": None, "file_id": "",
            }).encode())  # fmt: skip
            reply = json.loads(chan.recv(20))
            connection = None
            if transport == "rdma":  # a connection descriptor of its own, for the DPU to connect to
                dev = Dev.open(device)
                rdma = Rdma()
                rdma.add_dev(dev)
                rdma.set_permissions(AccessFlag.LOCAL_READ_WRITE)
                rdma.workq_add(WorkQ(4))
                rdma.start()
                connection = rdma.export().decode()
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            addr = 1 << 40
            forged = {
                "format": "rdmakit.mmap-dpu/1", "addr": addr, "length": reply["file_size"],
                "access": ["PCI_READ_WRITE"], "device": "x", "pid": os.getpid(), "fd": fd,
                "st_dev": st.st_dev, "st_ino": st.st_ino, "offset": 0, "boot_id": boot,
            }  # fmt: skip
            chan.send(json.dumps({
                "type": "export", "addr": addr, "length": reply["file_size"],
                "descriptor": json.dumps(forged), "sha256": "", "connection": connection,
            }).encode())  # fmt: skip
            while json.loads(chan.recv(20))["type"] != "copied":
                pass
            chan.send(json.dumps({"type": "status", "ok": True, "error": ""}).encode())
            os.write(report, b"wrote")
        except DocaError as exc:
            os.write(report, f"refused {exc.code.name}: {exc.message}".encode())

    return body


@pytest.mark.parametrize("transport", ["rdma", "shm"])
def test_a_forged_writable_export_of_a_read_only_fd_is_refused(
    sides: tuple[Path, Path],
    victim: Path,
    root_env: dict[str, str],
    nobody_env: dict[str, str],
    new_ip: Callable[[], str],
    transport: str,
) -> None:
    service = f"tcp:{new_ip()}:{PORT}"
    dpu_dev, host_dev, nobody_dev = new_ip(), new_ip(), new_ip()
    _, digest = secret_file(sides[1], 10_000)  # less than the victim: all would land in it
    dpu = start(
        sides[1], rdma_args("dpu", "secret.bin", service, dpu_dev, "--transport", transport), root_env
    )
    child = as_nobody(forge_write_export(service, victim, transport, nobody_dev))
    report = child.read(60).decode()
    child.wait()
    assert victim.read_bytes() == ROOT_CONTENT  # unchanged
    assert report.startswith("refused"), report
    if transport == "rdma":  # nobody could not prove it knows root's secret
        assert "did not prove that it knows the comm channel secret" in report
        host = finish(start(sides[0], rdma_args("host", "secret.bin", service, host_dev), root_env))
        assert host.rc == 0, host.err
        assert finish(dpu).rc == 0
        assert hashlib.sha256((sides[0] / "secret.bin").read_bytes()).hexdigest() == digest
    else:  # shared memory never goes over tcp: the DPU refused to start that way
        done = finish(dpu)  # (after waiting briefly to tell a host: it may have turned nobody away)
        assert done.rc == 1
        error = done.err.strip().splitlines()[-1]
        assert error.startswith("rdmakit dma-copy: --transport shm shares memory on one machine"), done.err
        (sides[0] / "secret.bin").unlink(missing_ok=True)
        name = f"sec1-{os.getpid()}-{PORT}"
        legit_copy(sides, root_env, lambda role: ["dma-copy", "--role", role, "-f", "secret.bin",
                                                  "--service", name, "--timeout", "30"], digest)  # fmt: skip
    assert victim.read_bytes() == ROOT_CONTENT


def test_nobody_posing_as_the_host_gets_nothing(
    sides: tuple[Path, Path], root_env: dict[str, str], nobody_env: dict[str, str], new_ip: Callable[[], str]
) -> None:
    service = f"tcp:{new_ip()}:{PORT}"
    dpu_dev, host_dev, nobody_dev = new_ip(), new_ip(), new_ip()
    _, digest = secret_file(sides[1], 200_000)
    dpu = start(sides[1], rdma_args("dpu", "secret.bin", service, dpu_dev), root_env)
    with shared_dir() as loot:
        child = program_as_nobody(loot, rdma_args("host", "stolen.bin", service, nobody_dev), nobody_env)
        rc = child.read(60)
        assert child.wait() == 0
        assert rc.strip() not in (b"", b"0")  # the fake host failed
        assert not (loot / "stolen.bin").exists()
    host = finish(start(sides[0], rdma_args("host", "secret.bin", service, host_dev), root_env))
    done = finish(dpu)
    assert (host.rc, done.rc) == (0, 0), (host.err, done.err)
    assert "refused the connection" in done.err  # the DPU says whom it turned away
    assert hashlib.sha256((sides[0] / "secret.bin").read_bytes()).hexdigest() == digest


def test_the_host_refuses_a_dpu_that_cannot_prove_the_secret(
    sides: tuple[Path, Path], root_env: dict[str, str], nobody_env: dict[str, str], new_ip: Callable[[], str]
) -> None:
    """nobody listens on the port first: root's host does not send it the file."""
    service = f"tcp:{new_ip()}:{PORT}"
    dpu_dev, host_dev, nobody_dev = new_ip(), new_ip(), new_ip()
    path, digest = secret_file(sides[0], 200_000)
    with shared_dir() as loot:
        child = program_as_nobody(loot, rdma_args("dpu", "secret.bin", service, nobody_dev), nobody_env)
        try:
            host = finish(start(sides[0], rdma_args("host", "secret.bin", service, host_dev), root_env))
            error = one_line(host)
            assert "DOCA_ERROR_AUTHENTICATION" in error
            assert "did not prove that it knows the comm channel secret" in error
            assert not (loot / "secret.bin").exists()
        finally:
            child.kill()
    path.rename(sides[1] / "secret.bin")  # now from the real DPU, on the same port
    dpu = start(sides[1], rdma_args("dpu", "secret.bin", service, dpu_dev), root_env)
    host = finish(start(sides[0], rdma_args("host", "secret.bin", service, host_dev), root_env))
    assert (host.rc, finish(dpu).rc) == (0, 0), host.err
    assert hashlib.sha256((sides[0] / "secret.bin").read_bytes()).hexdigest() == digest


def test_a_silent_connection_does_not_stop_the_real_host(
    sides: tuple[Path, Path], root_env: dict[str, str], new_ip: Callable[[], str]
) -> None:
    service = f"tcp:{new_ip()}:{PORT}"
    dpu_dev, host_dev = new_ip(), new_ip()
    _, digest = secret_file(sides[1], 100_000)
    host_ip, port = service[4:].rsplit(":", 1)

    def silent(report: int) -> None:
        for _ in range(200):  # until the DPU listens
            try:
                sock = socket.create_connection((host_ip, int(port)))
                break
            except OSError:
                time.sleep(0.05)
        os.write(report, b"connected\n")
        time.sleep(60)  # and says nothing
        sock.close()

    child = as_nobody(silent)
    try:
        dpu = start(sides[1], rdma_args("dpu", "secret.bin", service, dpu_dev, "--timeout", "20"), root_env)
        assert child.readline(30) == b"connected\n"
        host = finish(start(sides[0], rdma_args("host", "secret.bin", service, host_dev), root_env))
        done = finish(dpu)
    finally:
        child.kill()
    assert (host.rc, done.rc) == (0, 0), (host.err, done.err)
    assert hashlib.sha256((sides[0] / "secret.bin").read_bytes()).hexdigest() == digest
