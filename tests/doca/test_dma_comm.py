"""The comm channel (doca_comm_channel / doca_comch) that DMA Copy's control path runs on."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rdmakit.doca import (
    COMCH_MAX_MSG_LIMIT,
    COMCH_MAX_MSG_SIZE,
    CommChannel,
    CommChannelServer,
    DocaError,
    DocaErrorCode,
    Fault,
)
from rdmakit.transport import comm, comm_auth
from rdmakit.transport.comm_auth import SECRET_ENV
from tests.doca.util import error_code


@pytest.fixture(autouse=True)
def own_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tcp: channels use a default key made for this test (not the user's own)."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "rdmakit" / "comch.key"


@pytest.fixture
def service() -> str:
    return f"test-comch-{uuid.uuid4().hex[:12]}"


def pair(server: CommChannelServer, **connect: object) -> tuple[CommChannel, CommChannel]:
    """(client, server-side) channels; the client connects from a thread while the server accepts."""
    box: list[CommChannel] = []
    errors: list[BaseException] = []

    def client() -> None:
        try:
            box.append(CommChannel.connect(server.address, timeout=10, **connect))  # type: ignore[arg-type]
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    accepted = server.accept(10)
    thread.join()
    assert not errors, errors
    return box[0], accepted


@pytest.fixture
def channels(service: str) -> Iterator[tuple[CommChannel, CommChannel]]:
    with CommChannelServer(service) as server:
        client, accepted = pair(server)
        with client, accepted:
            yield client, accepted


# -- messages -------------------------------------------------------------------------------------


def test_messages_arrive_whole_and_in_order_both_ways(channels: tuple[CommChannel, CommChannel]) -> None:
    client, server = channels
    sizes = [1, 2, 100, COMCH_MAX_MSG_SIZE - 1, COMCH_MAX_MSG_SIZE]
    for i, size in enumerate(sizes):
        client.send(bytes([i]) * size)
    for i, size in enumerate(sizes):
        assert server.recv(5) == bytes([i]) * size
    server.send(b"reply")
    assert client.recv(5) == b"reply"
    assert client.max_msg_size == server.max_msg_size == COMCH_MAX_MSG_SIZE
    assert client.connected
    assert client.fd_passing


def test_message_size_rules(channels: tuple[CommChannel, CommChannel]) -> None:
    client, _ = channels
    assert error_code(lambda: client.send(bytes(COMCH_MAX_MSG_SIZE + 1))) is DocaErrorCode.TOO_BIG
    assert error_code(lambda: client.send(b"")) is DocaErrorCode.INVALID_VALUE


def test_max_msg_size_is_the_smaller_offer(service: str) -> None:
    with CommChannelServer(service, max_msg_size=20000) as server:
        client, accepted = pair(server, max_msg_size=9000)
        assert client.max_msg_size == accepted.max_msg_size == 9000
        client.send(bytes(9000))
        assert len(accepted.recv(5)) == 9000
        client.close()
        accepted.close()
    assert error_code(lambda: CommChannelServer(service, max_msg_size=COMCH_MAX_MSG_LIMIT + 1)) is (
        DocaErrorCode.INVALID_VALUE
    )


def test_waiting(channels: tuple[CommChannel, CommChannel], service: str) -> None:
    """Nothing to read: try_recv is None (DOCA_ERROR_AGAIN), recv times out; no server: connect times out."""
    client, server = channels
    assert server.try_recv() is None
    assert error_code(lambda: server.recv(0.05)) is DocaErrorCode.TIME_OUT
    client.send(b"now")
    assert server.recv(5) == b"now"
    assert error_code(lambda: CommChannel.connect(service + "-nobody", timeout=0.1)) is DocaErrorCode.TIME_OUT
    with CommChannelServer(service + "-idle") as idle:
        assert error_code(lambda: idle.accept(0.05)) is DocaErrorCode.TIME_OUT


def test_client_may_start_before_the_server(service: str) -> None:
    """Start order does not matter: connect waits for the server to appear."""
    box: list[CommChannel] = []
    thread = threading.Thread(target=lambda: box.append(CommChannel.connect(service, timeout=20)))
    thread.start()
    try:
        with CommChannelServer(service) as server, server.accept(20) as accepted:
            thread.join()
            box[0].send(b"late server")
            assert accepted.recv(5) == b"late server"
    finally:
        thread.join()
        for chan in box:
            chan.close()


def test_file_descriptors_travel_with_a_message(channels: tuple[CommChannel, CommChannel]) -> None:
    client, server = channels
    read_end, write_end = os.pipe()
    try:
        client.send(b"here is a pipe", fds=(write_end,))
        data, fds = server.recv_fds(5)
        assert data == b"here is a pipe"
        assert len(fds) == 1
        assert fds[0] not in (read_end, write_end)
        os.write(fds[0], b"through the passed fd")
        os.close(fds[0])
        assert os.read(read_end, 100) == b"through the passed fd"
        client.send(b"again", fds=(write_end,))
        assert server.recv(5) == b"again"  # recv closes descriptors nobody asked for
    finally:
        os.close(read_end)
        os.close(write_end)


# -- the peer goes away --------------------------------------------------------------------------


def test_peer_closing_is_connection_reset_then_not_connected(
    channels: tuple[CommChannel, CommChannel],
) -> None:
    client, server = channels
    client.send(b"last words")
    client.close()
    assert server.recv(5) == b"last words"  # what was sent before the close still arrives
    with pytest.raises(DocaError) as exc:
        server.recv(5)
    assert exc.value.code is DocaErrorCode.CONNECTION_RESET
    assert exc.value.fault is Fault.PEER
    assert not server.connected
    assert error_code(lambda: server.send(b"anyone?")) is DocaErrorCode.NOT_CONNECTED
    assert error_code(lambda: client.send(b"x")) is DocaErrorCode.NOT_CONNECTED  # closed here
    client.close()  # idempotent


def test_try_recv_notices_the_peer_is_gone(channels: tuple[CommChannel, CommChannel]) -> None:
    client, server = channels
    server.close()
    assert error_code(client.try_recv) is DocaErrorCode.CONNECTION_RESET


def test_send_to_a_closed_peer_is_connection_reset(channels: tuple[CommChannel, CommChannel]) -> None:
    client, server = channels
    server.close()
    assert error_code(lambda: client.send(b"hello?")) is DocaErrorCode.CONNECTION_RESET


_PEER = textwrap.dedent(
    """
    import sys, time
    from rdmakit.doca import CommChannel
    chan = CommChannel.connect(sys.argv[1], timeout=30)
    chan.send(b"ready")
    time.sleep(60)
    """
)


def test_a_killed_peer_process_is_connection_reset(service: str) -> None:
    with CommChannelServer(service) as server:
        child = subprocess.Popen([sys.executable, "-c", _PEER, service])
        try:
            with server.accept(30) as chan:
                assert chan.recv(30) == b"ready"
                child.send_signal(signal.SIGKILL)
                assert error_code(lambda: chan.recv(30)) is DocaErrorCode.CONNECTION_RESET
        finally:
            child.kill()
            child.wait()


# -- names and sockets -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["", "has space", "slash/y", "x" * 81, "tcp:nohostport", "tcp:h:99999", "unix:"]
)
def test_malformed_service_names(name: str) -> None:
    assert error_code(lambda: CommChannelServer(name)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: CommChannel.connect(name, timeout=0.1)) is DocaErrorCode.INVALID_VALUE


def test_a_service_name_has_one_server(service: str, tmp_path: Path) -> None:
    with CommChannelServer(service):
        assert error_code(lambda: CommChannelServer(service)) is DocaErrorCode.IN_USE
    with CommChannelServer(service):  # the name is free again once closed
        pass
    path = f"unix:{tmp_path / 'sock'}"
    with CommChannelServer(path):
        assert error_code(lambda: CommChannelServer(path)) is DocaErrorCode.IN_USE
    assert not (tmp_path / "sock").exists()  # removed on close


def test_unix_path_left_by_a_dead_server_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "stale"
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    leftover.bind(str(path))
    leftover.close()  # the file stays, nobody listens
    with CommChannelServer(f"unix:{path}") as server:
        client, accepted = pair(server)
        client.send(b"over a path")
        assert accepted.recv(5) == b"over a path"
        client.close()
        accepted.close()


def test_tcp_between_machines() -> None:
    """tcp:HOST:PORT: the same messages, framed on a stream; no descriptor passing."""
    with CommChannelServer("tcp:127.0.0.1:0") as server:
        assert server.address.startswith("tcp:127.0.0.1:")
        assert not server.address.endswith(":0")
        client, accepted = pair(server)
        with client, accepted:
            assert not client.fd_passing
            for size in (1, 3000, COMCH_MAX_MSG_SIZE):
                client.send(b"t" * size)
            assert [len(accepted.recv(5)) for _ in range(3)] == [1, 3000, COMCH_MAX_MSG_SIZE]
            accepted.send(b"back")
            assert client.recv(5) == b"back"
            assert error_code(lambda: client.send(b"fd", fds=(0,))) is DocaErrorCode.NOT_SUPPORTED
            accepted.close()
            assert error_code(lambda: client.recv(5)) is DocaErrorCode.CONNECTION_RESET


def test_local_ip_names_the_address_a_tcp_channel_uses(service: str) -> None:
    """What dma-copy's RDMA path opens its soft device on when --device is not given."""
    with CommChannelServer("tcp:127.0.0.1:0") as server:
        client, accepted = pair(server)
        with client, accepted:
            assert client.local_ip == accepted.local_ip == "127.0.0.1"
    with CommChannelServer(service) as server:
        client, accepted = pair(server)
        with client, accepted:
            assert client.local_ip is None


def test_a_client_that_is_not_a_comm_channel_is_refused_and_the_server_goes_on(service: str) -> None:
    with CommChannelServer(service) as server:
        address = comm.parse_service(service)
        raw = comm.connect(address, max_msg_size=100, timeout=5)
        raw.send(b"GET / HTTP/1.0\r\n")
        with pytest.raises(DocaError) as exc:
            server.accept(0.5)
        assert exc.value.code is DocaErrorCode.TIME_OUT
        assert "does not speak the rdmakit comm channel" in exc.value.message
        raw.close()
        client, accepted = pair(server)
        client.close()
        accepted.close()


def test_named_services_live_in_a_private_directory(service: str) -> None:
    """A NAME is a socket file in this user's 0700 directory, removed when the server closes."""
    path = Path(comm.parse_service(service).path)
    assert path.parent == comm.runtime_dir()
    with CommChannelServer(service):
        assert path.is_socket()
        st = path.parent.lstat()
        assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)
    assert not path.exists()


def test_a_named_service_left_by_a_killed_server_is_taken_over(service: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from rdmakit.doca import CommChannelServer as S; "
         "s = S(sys.argv[1]); print('up', flush=True); time.sleep(60)", service],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "up\n"
        assert error_code(lambda: CommChannelServer(service)) is DocaErrorCode.IN_USE
    finally:
        child.kill()
        child.communicate()
    with CommChannelServer(service) as server:
        client, accepted = pair(server)
        client.close()
        accepted.close()


def test_a_peer_sending_too_much_breaks_the_channel(service: str) -> None:
    with CommChannelServer(service, max_msg_size=100) as server:
        client, accepted = pair(server)
        sock = client._sock  # the raw socket underneath, to break the rules on purpose
        assert sock is not None
        sock.max_msg_size = 1000
        sock.send(bytes(200))
        with pytest.raises(DocaError) as exc:
            accepted.recv(5)
        assert exc.value.code is DocaErrorCode.TOO_BIG
        assert exc.value.fault is Fault.PEER
        client.close()
        accepted.close()


def test_closed_server_and_repr(service: str) -> None:
    server = CommChannelServer(service)
    assert "listening" in repr(server)
    server.close()
    server.close()
    assert error_code(lambda: server.accept(0.1)) is DocaErrorCode.NOT_CONNECTED
    assert "closed" in repr(server)


# -- tcp: authentication ---------------------------------------------------------------------------


def tcp_pair(
    server: CommChannelServer, **connect: object
) -> tuple[CommChannel | BaseException, CommChannel | BaseException]:
    """(client or its error, accepted channel or the server's error) over tcp."""
    box: list[CommChannel | BaseException] = []

    def client() -> None:
        try:
            box.append(CommChannel.connect(server.address, timeout=10, **connect))  # type: ignore[arg-type]
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        accepted: CommChannel | BaseException = server.accept(2)
    except DocaError as exc:
        accepted = exc
    thread.join()
    return box[0], accepted


def test_the_default_key_is_made_once_private_and_shared_by_both_ends(own_secret: Path) -> None:
    assert not own_secret.exists()
    with CommChannelServer("tcp:127.0.0.1:0") as server:
        client, accepted = pair(server)
        client.send(b"authenticated")
        assert accepted.recv(5) == b"authenticated"
        client.close()
        accepted.close()
    st = own_secret.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o600)
    assert len(bytes.fromhex(own_secret.read_text())) == 32
    assert (own_secret.parent.stat().st_mode & 0o777) == 0o700


def test_a_different_secret_is_refused_both_ways(own_secret: Path) -> None:
    """The server proves first: a client with another secret refuses it; the server goes on."""
    with CommChannelServer("tcp:127.0.0.1:0") as server:
        client, accepted = tcp_pair(server, secret=b"another secret, 16+ bytes")
        assert isinstance(client, DocaError)
        assert client.code is DocaErrorCode.AUTHENTICATION
        assert client.fault is Fault.PEER
        assert isinstance(accepted, DocaError)
        assert accepted.code is DocaErrorCode.TIME_OUT
        assert "refused 1 connection" in accepted.message
        good, chan = pair(server)
        good.close()
        chan.close()
    with CommChannelServer("tcp:127.0.0.1:0", secret=b"the server's own secret") as server:
        client, accepted = tcp_pair(server)  # the default key
        assert isinstance(client, DocaError)
        assert client.code is DocaErrorCode.AUTHENTICATION


def _raw_hello(address: str) -> tuple[comm.MessageSocket, bytes, bytes]:
    """A raw TCP connection that sends a well-formed hello: (socket, hello sent, server's answer)."""
    sock = comm.connect(comm.parse_service(address), max_msg_size=200, timeout=5)
    hello = b"RDMAKITCOMCH" + (2).to_bytes(2, "big") + (4080).to_bytes(4, "big") + os.urandom(32)
    sock.send(hello)
    got = sock.recv(5)
    assert got is not None
    return sock, hello, got[0]


def test_reflecting_the_servers_proof_does_not_get_in() -> None:
    with CommChannelServer("tcp:127.0.0.1:0") as server:
        box: list[bytes] = []

        def reflect() -> None:
            sock, _, answer = _raw_hello(server.address)
            sock.send(answer[-32:])  # the server's own proof, sent back as the client's
            try:
                got = sock.recv(2)
                box.append(b"" if got is None else got[0])
            except OSError:
                box.append(b"closed")
            sock.close()

        thread = threading.Thread(target=reflect)
        thread.start()
        with pytest.raises(DocaError) as exc:
            server.accept(1)
        thread.join()
        assert "did not prove that it knows the comm channel secret" in exc.value.message
        assert box == [b"closed"]


def test_a_relay_fails_the_handshake(new_ip: Callable[[], str]) -> None:
    """Bytes forwarded through a relay: the ends see different addresses, so the proofs do not match."""
    with CommChannelServer(f"tcp:{new_ip()}:0") as server:
        target = comm.parse_service(server.address)
        relay = socket.create_server((new_ip(), 0))
        relay.settimeout(10)

        def forward(a: socket.socket, b: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := a.recv(65536):
                    b.sendall(data)
            with contextlib.suppress(OSError):
                b.shutdown(socket.SHUT_WR)

        def run_relay() -> None:
            inbound, _ = relay.accept()
            outbound = socket.create_connection((target.host, target.port))
            threads = [
                threading.Thread(target=forward, args=p) for p in ((inbound, outbound), (outbound, inbound))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(15)
            inbound.close()
            outbound.close()

        relay_thread = threading.Thread(target=run_relay)
        relay_thread.start()
        host, port = relay.getsockname()
        errors: list[BaseException] = []

        def connect_through_relay() -> None:
            try:
                CommChannel.connect(f"tcp:{host}:{port}", timeout=10).close()
            except DocaError as err:
                errors.append(err)

        client = threading.Thread(target=connect_through_relay)
        client.start()
        with pytest.raises(DocaError) as exc:
            server.accept(2)
        client.join()
        relay_thread.join(20)
        relay.close()
        assert exc.value.code is DocaErrorCode.TIME_OUT
        assert isinstance(errors[0], DocaError)
        assert errors[0].code is DocaErrorCode.AUTHENTICATION


def test_a_silent_connection_does_not_hold_up_the_next() -> None:
    with CommChannelServer("tcp:127.0.0.1:0", handshake_timeout=0.3) as server:
        target = comm.parse_service(server.address)
        silent = socket.create_connection((target.host, target.port))
        try:
            client, accepted = pair(server)  # while the silent one is pending
            client.close()
            accepted.close()
        finally:
            silent.close()
        silent = socket.create_connection((target.host, target.port))
        try:
            with pytest.raises(DocaError) as exc:
                server.accept(1)
            assert "no handshake within 0.3 s" in exc.value.message
        finally:
            silent.close()


def test_before_the_handshake_only_a_hello_fits() -> None:
    with CommChannelServer("tcp:127.0.0.1:0") as server:
        target = comm.parse_service(server.address)
        big = socket.create_connection((target.host, target.port))
        big.sendall((60000).to_bytes(4, "big") + bytes(1000))
        with pytest.raises(DocaError) as exc:
            server.accept(1)
        assert "peer framed a message of 60000 bytes" in exc.value.message
        big.close()


def test_messages_after_the_handshake_carry_a_mac() -> None:
    """Injected, replayed or reordered messages break the channel (AUTHENTICATION), never arrive."""
    with CommChannelServer("tcp:127.0.0.1:0") as server:
        for attack in ("inject", "replay"):
            client, accepted = pair(server)
            client.send(b"first")
            assert accepted.recv(5) == b"first"
            raw = client._sock
            assert raw is not None
            if attack == "inject":  # a frame written into the stream by someone without the keys
                raw._sock.sendall((4 + 16).to_bytes(4, "big") + b"evil" + bytes(16))
            else:  # the sender's counter set back: the same sequence number again
                assert raw._mac is not None
                raw._mac._send_seq -= 1
                client.send(b"first")
            with pytest.raises(DocaError) as exc:
                accepted.recv(5)
            assert exc.value.code is DocaErrorCode.AUTHENTICATION
            assert exc.value.fault is Fault.PEER
            assert error_code(lambda ch=accepted: ch.recv(1)) is DocaErrorCode.NOT_CONNECTED  # type: ignore[misc]
            client.close()
            accepted.close()


def test_secret_files_are_checked_as_openssh_checks_keys(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(os.urandom(32).hex())
    key.chmod(0o600)
    assert len(comm_auth.load_secret(secret_file=key)) == 32
    key.chmod(0o640)
    with pytest.raises(DocaError) as exc:
        CommChannelServer("tcp:127.0.0.1:0", secret_file=key)
    assert exc.value.code is DocaErrorCode.NOT_PERMITTED
    assert f"permissions 0640 for secret file {key}" in exc.value.message
    assert "uid " in exc.value.message
    key.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(key, 65534, 65534)
        with pytest.raises(DocaError) as exc:
            CommChannel.connect("tcp:127.0.0.1:1", timeout=0.1, secret_file=key)
        assert exc.value.code is DocaErrorCode.NOT_PERMITTED
        assert "owned by uid 65534" in exc.value.message
        os.chown(key, 0, 0)
    key.write_text("not hex")
    assert error_code(lambda: CommChannelServer("tcp:127.0.0.1:0", secret_file=key)) is (
        DocaErrorCode.INVALID_VALUE
    )
    missing = tmp_path / "missing"
    assert error_code(lambda: CommChannelServer("tcp:127.0.0.1:0", secret_file=missing)) is (
        DocaErrorCode.NOT_FOUND
    )
    assert error_code(lambda: CommChannelServer("tcp:127.0.0.1:0", secret=b"short")) is (
        DocaErrorCode.INVALID_VALUE
    )


def test_the_environment_secret(monkeypatch: pytest.MonkeyPatch, own_secret: Path) -> None:
    monkeypatch.setenv(SECRET_ENV, os.urandom(16).hex())
    with CommChannelServer("tcp:127.0.0.1:0") as server:
        client, accepted = pair(server)
        client.close()
        accepted.close()
    assert not own_secret.exists()  # the environment's secret was used, no key file made
    monkeypatch.setenv(SECRET_ENV, "zz")
    assert error_code(lambda: CommChannelServer("tcp:127.0.0.1:0")) is DocaErrorCode.INVALID_VALUE
