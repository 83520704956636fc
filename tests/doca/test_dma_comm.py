"""The comm channel (doca_comm_channel / doca_comch) that DMA Copy's control path runs on."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
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
from rdmakit.transport import comm

from .util import error_code


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


def test_a_client_that_is_not_a_comm_channel_is_refused(service: str) -> None:
    with CommChannelServer(service) as server:
        address = comm.parse_service(service)
        raw = comm.connect(address, max_msg_size=100, timeout=5)
        raw.send(b"GET / HTTP/1.0\r\n")
        assert error_code(lambda: server.accept(5)) is DocaErrorCode.UNSUPPORTED_VERSION
        raw.close()


def test_a_peer_sending_too_much_breaks_the_channel(service: str) -> None:
    with CommChannelServer(service, max_msg_size=64) as server:
        client, accepted = pair(server)
        sock = client._sock  # the raw socket underneath, to break the rules on purpose
        assert sock is not None
        sock.max_msg_size = 1000
        sock.send(bytes(100))
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


# -- other users --------------------------------------------------------------------------------

NOBODY = 65534


def as_nobody(body: Callable[[int], None]) -> tuple[int, int]:
    """Fork a child that becomes user nobody and runs ``body(write_fd)``; returns (pid, read_fd)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exec, nobody could not run /root's python anyway
        status = 1
        try:
            os.close(read_fd)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            body(write_fd)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    return pid, read_fd


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")
def test_a_listener_of_another_user_is_refused(service: str) -> None:
    """Someone else took our service name first: the client refuses to talk to them."""
    name = "\0" + comm.parse_service(service).path

    def squat(report: int) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.bind(name)
        sock.listen(1)
        os.write(report, b"bound")
        sock.accept()
        time.sleep(30)

    pid, report = as_nobody(squat)
    try:
        assert os.read(report, 5) == b"bound"
        with pytest.raises(DocaError) as exc:
            CommChannel.connect(service, timeout=5)
        assert exc.value.code is DocaErrorCode.NOT_PERMITTED
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(report)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")
def test_a_client_of_another_user_is_dropped(service: str) -> None:
    """A stranger's connection is closed unanswered; the server keeps waiting for its own client."""
    name = "\0" + comm.parse_service(service).path
    hello = b"RDMAKITCOMCH" + (1).to_bytes(2, "big") + (4080).to_bytes(4, "big")

    def intrude(report: int) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.connect(name)
        try:
            sock.send(hello)
            answer = sock.recv(100)
        except (BrokenPipeError, ConnectionResetError):  # closed before or with our hello unread
            answer = b""
        os.write(report, b"dropped" if answer == b"" else b"answered")

    with CommChannelServer(service) as server:
        pid, report = as_nobody(intrude)
        try:
            assert error_code(lambda: server.accept(0.5)) is DocaErrorCode.TIME_OUT
            assert os.read(report, 8) == b"dropped"
            assert os.waitpid(pid, 0)[1] == 0
        finally:
            os.close(report)
        client, accepted = pair(server)  # our own client still gets in
        client.close()
        accepted.close()
