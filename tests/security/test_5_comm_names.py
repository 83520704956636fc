"""Attack 5: another user takes a comm channel name first.

Service names were abstract Unix sockets (``\\0rdmakit-comch.<uid>.NAME``),
which anyone can bind: root's server then failed with IN_USE. Names now
live in the user's own 0700 directory, where nobody else can create them; a
directory that another user made first is refused, naming its owner. Unix
channels still talk only to the same user or root, both ways.
"""

import hashlib
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from rdmakit.doca import CommChannel, CommChannelServer, DocaError, DocaErrorCode
from rdmakit.transport import comm
from tests.processes import finish
from tests.security.nobody import as_nobody, needs_nobody
from tests.security.programs import one_line, shared_dir, start

pytestmark = needs_nobody


@pytest.fixture
def name() -> str:
    return f"sec5-{uuid.uuid4().hex[:12]}"


def copy(tmp_path: Path, service: str, env: dict[str, str]) -> None:
    """A dma-copy over shared memory on `service` moves a file: the legitimate flow works."""
    host_dir, dpu_dir = tmp_path / "host", tmp_path / "dpu"
    host_dir.mkdir(exist_ok=True)
    dpu_dir.mkdir(exist_ok=True)
    data = os.urandom(50_000)
    (host_dir / "f.bin").write_bytes(data)
    (dpu_dir / "f.bin").unlink(missing_ok=True)
    args = ["dma-copy", "-f", "f.bin", "--service", service, "--timeout", "30"]
    dpu = start(dpu_dir, [*args, "--role", "dpu"], env)
    host = finish(start(host_dir, [*args, "--role", "host"], env))
    done = finish(dpu)
    assert (host.rc, done.rc) == (0, 0), (host.err, done.err)
    assert hashlib.sha256((dpu_dir / "f.bin").read_bytes()).digest() == hashlib.sha256(data).digest()


def listen_as_nobody(address: str | bytes) -> Callable[[int], None]:
    def body(report: int) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.bind(address)
            sock.listen(4)
            os.write(report, b"bound\n")
        except OSError as exc:
            os.write(report, f"refused {exc.strerror}\n".encode())
            return
        while True:
            conn, _ = sock.accept()
            conn.close()

    return body


def test_the_old_abstract_name_taken_by_nobody_does_not_stop_roots_server(tmp_path: Path, name: str) -> None:
    child = as_nobody(listen_as_nobody(f"\0rdmakit-comch.{os.getuid()}.{name}"))
    try:
        assert child.readline(30) == b"bound\n"
        copy(tmp_path, name, dict(os.environ))
    finally:
        child.kill()


def test_nobody_cannot_create_or_reach_a_name_in_roots_directory(tmp_path: Path, name: str) -> None:
    with CommChannelServer(name) as server:  # makes root's directory, and listens there
        path = comm.parse_service(name).path
        assert server.address == name
        child = as_nobody(listen_as_nobody(path + ".squat"))
        assert child.readline(30).startswith(b"refused Permission denied")
        child.wait()

        def connect(report: int) -> None:
            try:
                CommChannel.connect(name, timeout=1).close()
                os.write(report, b"connected")
            except DocaError as exc:
                os.write(report, exc.code.name.encode())

        child = as_nobody(connect)
        outcome = child.read(30)
        child.wait()
        assert outcome != b"connected"
    copy(tmp_path, name, dict(os.environ))


def test_a_directory_made_first_by_nobody_is_refused_naming_it(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with shared_dir(0o1777) as runtime:

        def squat(report: int) -> None:
            os.mkdir(runtime / "rdmakit", 0o777)
            os.chmod(runtime / "rdmakit", 0o777)
            os.write(report, b"made\n")

        child = as_nobody(squat)
        assert child.readline(30) == b"made\n"
        child.wait()
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
        dpu = finish(start(tmp_path, ["dma-copy", "--role", "dpu", "-f", "f.bin", "--service", name], env))
        error = one_line(dpu)
        assert "DOCA_ERROR_NOT_PERMITTED" in error
        assert f"{runtime / 'rdmakit'} belongs to uid 65534 (nobody)" in error
        with monkeypatch.context() as patch:
            patch.setenv("XDG_RUNTIME_DIR", str(runtime))
            with pytest.raises(DocaError) as exc:  # a client does not look for its server there either
                CommChannel.connect(name, timeout=0.5)
            assert exc.value.code is DocaErrorCode.NOT_PERMITTED
            assert "belongs to uid 65534 (nobody)" in exc.value.message
    copy(tmp_path, name, dict(os.environ))  # elsewhere (the default directory) all is well


def test_strangers_on_a_shared_unix_path_are_refused_both_ways(tmp_path: Path) -> None:
    """unix:PATH in a directory anyone can reach: each end checks the other's user."""
    with shared_dir() as where:
        service = f"unix:{where / 'sock'}"
        child = as_nobody(listen_as_nobody(str(where / "sock")))
        try:
            assert child.readline(30) == b"bound\n"
            with pytest.raises(DocaError) as exc:  # nobody listens: root's client refuses it
                CommChannel.connect(service, timeout=5)
            assert exc.value.code is DocaErrorCode.NOT_PERMITTED
            assert "runs as uid 65534 (nobody)" in exc.value.message
            with pytest.raises(DocaError) as exc:  # and root's server cannot take the path from it
                CommChannelServer(service)
            assert exc.value.code is DocaErrorCode.IN_USE
            assert "run by uid 65534 (nobody)" in exc.value.message
        finally:
            child.kill()
        os.unlink(where / "sock")
        with CommChannelServer(service) as server:
            os.chmod(where / "sock", 0o777)  # anyone may connect: the server must check who did

            def intrude(report: int) -> None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                sock.connect(str(where / "sock"))
                try:
                    sock.send(
                        b"RDMAKITCOMCH" + (2).to_bytes(2, "big") + (4080).to_bytes(4, "big") + bytes(32)
                    )
                    answer = sock.recv(100)
                except OSError:
                    answer = b""
                os.write(report, b"dropped" if answer == b"" else b"answered")

            child = as_nobody(intrude)
            with pytest.raises(DocaError) as exc:
                server.accept(1)
            assert exc.value.code is DocaErrorCode.TIME_OUT
            assert child.read(10) == b"dropped"
            assert child.wait() == 0
        copy(tmp_path, service, dict(os.environ))
