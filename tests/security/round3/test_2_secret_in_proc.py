"""Attack 2: a secret file owned by the caller (root) whose bytes user nobody chose.

nobody writes a secret of its own choosing into the environment of a
non-dumpable process (its ``/proc/<pid>/environ`` is then root's, mode 0400)
and links a name to that file from a shared folder. Given that name as
``--secret-file``, root's ``dma-copy`` over a ``tcp:`` comm channel used to take
nobody's secret: nobody posed as the host and received root's 0600 file. The
conformance agent took it the same way: nobody passed the control handshake.
Now both refuse the link with one line before listening; then a legitimate
copy and a legitimate control session work.
"""

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rdmakit.conformance.control import TargetClient, client_handshake
from rdmakit.transport.comm import connect, parse_service
from tests.processes import finish
from tests.security.nobody import as_nobody, needs_nobody
from tests.security.programs import one_line, program_as_nobody, shared_dir, start
from tests.security.round3.lure import hold_in_environ

pytestmark = needs_nobody

SECRET_ENV = "RDMAKIT_COMCH_SECRET"
PORT = 47411


@pytest.fixture
def shared() -> Iterator[Path]:
    with shared_dir(0o777) as where:
        yield where


@pytest.fixture
def root_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # no default key of the real user's
    return env


def copy_args(
    role: str, file: str, service: str, device: str, secret_file: Path | None, timeout: str = "20"
) -> list[str]:
    extra = ["--secret-file", str(secret_file)] if secret_file is not None else []
    return [
        "dma-copy", "--role", role, "-f", file, "--service", service, "--device", device,
        "--timeout", timeout, *extra,
    ]  # fmt: skip


def test_dma_copy_refuses_a_secret_file_in_procfs(
    tmp_path: Path, shared: Path, root_env: dict[str, str], new_ip: Callable[[], str]
) -> None:
    dpu_dir = tmp_path / "dpu"
    dpu_dir.mkdir()
    content = os.urandom(100_000)
    (dpu_dir / "secret.bin").write_bytes(content)
    (dpu_dir / "secret.bin").chmod(0o600)
    chosen = os.urandom(32).hex()
    key = shared / "comch.key"
    holder = hold_in_environ(chosen.encode(), key)
    service = f"tcp:{new_ip()}:{PORT}"
    try:
        assert holder.readline(30).startswith(b"ready "), "nobody could not set up the lure"
        assert key.stat().st_uid == 0  # root's, mode 0400: as a secret file should be
        assert key.stat().st_mode & 0o077 == 0
        dpu = start(dpu_dir, copy_args("dpu", "secret.bin", service, new_ip(), key), root_env)
        with shared_dir() as loot:
            thief = program_as_nobody(
                loot, copy_args("host", "stolen.bin", service, new_ip(), None, "10"), {SECRET_ENV: chosen}
            )
            done = finish(dpu)
            thief.read(30)
            thief.wait()
            assert not (loot / "stolen.bin").exists(), "nobody received root's file"
        error = one_line(done)
        assert f"secret file {key} is a symbolic link" in error, error
    finally:
        holder.kill()
    # The legitimate copy, with root's own secret file.
    key.unlink()
    own = tmp_path / "comch.key"
    own.write_text(os.urandom(32).hex())
    own.chmod(0o600)
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    dpu = start(dpu_dir, copy_args("dpu", "secret.bin", service, new_ip(), own), root_env)
    host = finish(start(host_dir, copy_args("host", "secret.bin", service, new_ip(), own), root_env))
    assert (host.rc, finish(dpu).rc) == (0, 0), host.err
    assert hashlib.sha256((host_dir / "secret.bin").read_bytes()).digest() == hashlib.sha256(content).digest()


def agent(secret_file: Path, dut_ip: str) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, "-m", "rdmakit", "conformance-target", "-d", f"soft-udp:{dut_ip}",
         "--listen", "tcp:127.0.0.1:0", "--secret-file", str(secret_file)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def control(address: str, secret: bytes) -> dict[str, object]:
    """The agent's answer to ``info`` after the handshake with ``secret``."""
    client = TargetClient(connect(parse_service(address), max_msg_size=65536, timeout=10))
    try:
        client_handshake(client.sock, secret)
        return client.call("info")
    finally:
        client.close()


def test_the_conformance_agent_refuses_a_secret_file_in_procfs(
    tmp_path: Path, shared: Path, new_ip: Callable[[], str]
) -> None:
    chosen = os.urandom(32).hex()
    key = shared / "agent.key"
    holder = hold_in_environ(chosen.encode(), key)
    try:
        assert holder.readline(30).startswith(b"ready "), "nobody could not set up the lure"
        proc = agent(key, new_ip())
        try:
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            if ready:  # the agent listens: nobody, who chose its secret, takes control of it
                address = json.loads(ready)["control"]

                def take(report: int) -> None:
                    os.write(report, json.dumps(control(address, bytes.fromhex(chosen))).encode())

                thief = as_nobody(take)
                took = thief.read(30)
                thief.wait()
                assert not took, f"nobody controls root's agent: {took!r}"
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert proc.returncode != 0
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("rdmakit conformance-target: ")
        assert f"secret file {key} is a symbolic link" in lines[0], lines[0]
    finally:
        holder.kill()
    # The legitimate session, with root's own secret file.
    own = tmp_path / "agent.key"
    secret = os.urandom(32)
    own.write_text(secret.hex())
    own.chmod(0o600)
    proc = agent(own, new_ip())
    try:
        assert proc.stdout is not None
        info = control(json.loads(proc.stdout.readline())["control"], secret)
        assert info.get("device"), info
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
