"""``doca_comch.h`` (DOCA 2.5+): the comm channel as a server and a client context on a progress engine.

Each test names the function and the sentence of its documentation it checks. They run over a Unix
socket (one machine) and over TCP (two machines, authenticated with a shared secret).
"""

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmakit.doca import (
    COMCH_MAX_MSG_LIMIT,
    COMCH_MAX_RECV_QUEUE_SIZE,
    ComchClient,
    ComchCounter,
    ComchServer,
    CtxState,
    DocaErrorCode,
)
from rdmakit.transport.comm_auth import SECRET_ENV
from tests.doca.comch_harness import Comch
from tests.doca.util import error_code


@pytest.fixture(autouse=True)
def own_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tcp: channels use a default key made for this test (not the user's own)."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture(params=["unix", "tcp"])
def service(request: pytest.FixtureRequest) -> str:
    return f"fid-comch-{uuid.uuid4().hex[:12]}" if request.param == "unix" else "tcp:127.0.0.1:0"


@pytest.fixture
def comch(service: str) -> Iterator[Comch]:
    c = Comch(service)
    yield c
    c.close()


def test_server_starts_at_once_and_the_client_in_progress(comch: Comch) -> None:
    """doca_ctx_start on a comch client returns DOCA_ERROR_IN_PROGRESS and the context is RUNNING once
    doca_pe_progress completed the handshake (DOCA's sync_event samples wait for exactly this); a server
    starts synchronously. doca_comch_client_get_connection: "Can only be called after starting the ctx"
    (DOCA_ERROR_BAD_STATE - cc instance is not started)."""
    assert comch.server.start() is DocaErrorCode.SUCCESS
    assert comch.server.state is CtxState.RUNNING
    c, _ = comch.client(start=False)
    assert error_code(c.get_connection) is DocaErrorCode.BAD_STATE
    assert c.start() is DocaErrorCode.IN_PROGRESS
    assert c.state is CtxState.STARTING
    assert error_code(c.get_connection) is DocaErrorCode.BAD_STATE
    comch.until(lambda: c.state is CtxState.RUNNING, "the client runs")
    assert c.get_connection().get_client_ctx() is c


def test_properties_are_set_in_idle_only(comch: Comch) -> None:
    """doca_comch_server_set_max_msg_size / set_recv_queue_size: "DOCA_ERROR_BAD_STATE - cc instance is
    already active"; "DOCA_ERROR_INVALID_VALUE - in case of invalid input", the limits being
    doca_comch_cap_get_max_msg_size and doca_comch_cap_get_max_recv_queue_size."""
    s = comch.server
    info = comch.dev.info
    assert ComchServer.cap_get_max_msg_size(info) == COMCH_MAX_MSG_LIMIT
    assert error_code(lambda: s.set_max_msg_size(COMCH_MAX_MSG_LIMIT + 1)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: s.set_recv_queue_size(0)) is DocaErrorCode.INVALID_VALUE
    limit = ComchServer.cap_get_max_recv_queue_size(info)
    assert limit == COMCH_MAX_RECV_QUEUE_SIZE
    assert error_code(lambda: s.set_recv_queue_size(limit + 1)) is DocaErrorCode.INVALID_VALUE
    s.set_max_msg_size(8000)
    s.set_recv_queue_size(limit)
    assert (s.get_max_msg_size(), s.get_recv_queue_size()) == (8000, limit)
    s.start()
    assert error_code(lambda: s.set_max_msg_size(4096)) is DocaErrorCode.BAD_STATE
    assert error_code(lambda: s.set_recv_queue_size(4)) is DocaErrorCode.BAD_STATE
    assert error_code(lambda: s.event_msg_recv_register(lambda *a: None)) is DocaErrorCode.BAD_STATE


def test_connection_events_run_inside_progress_with_the_server_ctx(comch: Comch) -> None:
    """doca_comch_event_connection_status_changed_cb_t: "Pointer to the peer which triggered the
    connection event"; doca_comch_server_get_server_ctx gives the server, doca_comch_client_get_client_ctx
    "NULL if the connection is related to a server context". Callbacks run inside doca_pe_progress."""
    comch.server.start()
    _c, _ = comch.client()
    assert comch.s.connects == []  # nothing happens outside progress
    comch.until(lambda: bool(comch.s.connects), "a connect event")
    conn = comch.s.connects[0]
    assert conn.get_server_ctx() is comch.server
    assert conn.get_client_ctx() is None
    assert comch.server.connections == (conn,)


def test_each_message_names_the_connection_it_came_on(comch: Comch) -> None:
    """doca_comch_event_msg_recv_cb_t: "Pointer to the connection instance that generated the message
    event", with the message and its length; doca_comch_connection_set_user_data /get_user_data."""
    c1, _, conn1 = comch.connected()
    c2, _, conn2 = comch.connected()
    conn1.set_user_data("one")
    conn2.set_user_data("two")
    for c, text in ((c1, b"from one"), (c2, b"from two"), (c1, b"one again")):
        c.task_send_alloc_init(c.get_connection(), text).submit()
    comch.until(lambda: len(comch.s.msgs) == 3, "three messages")
    seen = sorted((data, n, conn.get_user_data()) for data, n, conn in comch.s.msgs)
    assert seen == [(b"from one", 8, "one"), (b"from two", 8, "two"), (b"one again", 9, "one")]


def test_send_tasks_complete_in_progress_and_come_from_a_bounded_pool(comch: Comch) -> None:
    """doca_comch_server_task_send_alloc_init: "DOCA_ERROR_NO_MEMORY - no available tasks to allocate",
    "DOCA_ERROR_INVALID_VALUE - in case of invalid input" (an empty message, one over the connection's
    size, a connection of another context); the completion callback runs in doca_pe_progress."""
    c, side, conn = comch.connected()
    s = comch.server
    tasks = [s.task_send_alloc_init(conn, b"%d" % i) for i in range(8)]
    assert error_code(lambda: s.task_send_alloc_init(conn, b"x")) is DocaErrorCode.NO_MEMORY
    for t in tasks[1:]:
        t.free()
    assert error_code(lambda: s.task_send_alloc_init(conn, b"")) is DocaErrorCode.INVALID_VALUE
    big = b"x" * (conn.max_msg_size + 1)
    assert error_code(lambda: s.task_send_alloc_init(conn, big)) is DocaErrorCode.INVALID_VALUE
    foreign = c.get_connection()
    assert error_code(lambda: s.task_send_alloc_init(foreign, b"x")) is DocaErrorCode.INVALID_VALUE
    tasks[0].submit()
    assert comch.s.sent == []
    comch.until(lambda: bool(side.msgs) and bool(comch.s.sent), "the send completes and arrives")
    assert side.msgs[0][0] == b"0"
    assert side.msgs[0][2] is foreign


def test_the_recv_queue_size_bounds_the_messages_of_one_progress(service: str) -> None:
    """doca_comch_server_set_recv_queue_size: the receive queue of a connection; rdmakit delivers at most
    that many messages per connection in one doca_pe_progress, so one peer cannot starve the others."""
    comch = Comch(service, tasks=16)
    try:
        comch.server.set_recv_queue_size(2)
        c, _, _ = comch.connected()
        for i in range(6):
            c.task_send_alloc_init(c.get_connection(), b"m%d" % i).submit()
        comch.until(lambda: all(ct.num_inflight == 0 for ct, _ in comch.clients), "sent")
        counts = []
        while len(comch.s.msgs) < 6:
            before = len(comch.s.msgs)
            comch.progress()
            counts.append(len(comch.s.msgs) - before)
        assert max(counts) <= 2
        assert [m[0] for m in comch.s.msgs] == [b"m%d" % i for i in range(6)]  # in order
    finally:
        comch.close()


def test_disconnect_notifies_the_peer(comch: Comch) -> None:
    """doca_comch_server_disconnect: "This function will notify the peer of the disconnection." The
    client's connection ends and its send tasks fail; the server's disconnect event fires when a
    client goes away."""
    c, side, conn = comch.connected()
    comch.server.disconnect(conn)
    assert error_code(lambda: comch.server.disconnect(conn)) is DocaErrorCode.INVALID_VALUE
    cconn = c.get_connection()
    comch.until(lambda: not cconn.connected, "the client sees the disconnection")
    c.task_send_alloc_init(cconn, b"late").submit()
    comch.until(lambda: bool(side.failed), "the send fails")
    assert side.failed[0].get_status() is DocaErrorCode.NOT_CONNECTED
    c2, _, conn2 = comch.connected()
    c2.stop()
    comch.until(lambda: bool(comch.s.disconnects), "a disconnect event")
    assert comch.s.disconnects[0][0] is conn2


def test_counters_follow_update_info(comch: Comch) -> None:
    """doca_comch_connection_get_counter: statistics "updated to the last time
    doca_comch_connection_update_info() was called"; update_info: "DOCA_ERROR_CONNECTION_ABORTED if the
    connection failed"."""
    c, side, conn = comch.connected()
    comch.server.task_send_alloc_init(conn, b"12345").submit()
    comch.until(lambda: bool(side.msgs), "the message")
    assert conn.get_counter(ComchCounter.SENT_MESSAGES) == 0
    conn.update_info()
    assert conn.get_counter(ComchCounter.SENT_MESSAGES) == 1
    assert conn.get_counter(ComchCounter.SENT_BYTES) == 5
    cconn = c.get_connection()
    cconn.update_info()
    assert cconn.get_counter(ComchCounter.RECV_MESSAGES) == 1
    assert cconn.get_counter(ComchCounter.RECV_BYTES) == 5
    c.stop()
    comch.until(lambda: bool(comch.s.disconnects), "the disconnect event")
    assert error_code(conn.update_info) is DocaErrorCode.CONNECTION_ABORTED


def test_stop_waits_for_allocated_tasks(comch: Comch) -> None:
    """doca_ctx_stop: DOCA_ERROR_IN_PROGRESS while tasks are allocated ("All tasks MUST be freed in order
    for a context to be stopped", doca_task_free); IDLE comes inside progress."""
    _c, _, conn = comch.connected()
    kept = comch.server.task_send_alloc_init(conn, b"kept")
    assert comch.server.stop() is DocaErrorCode.IN_PROGRESS
    assert comch.server.state is CtxState.STOPPING
    kept.free()
    comch.progress()
    assert comch.server.state is CtxState.IDLE  # type: ignore[comparison-overlap]  # progress changed it


def test_the_device_stays_open_while_a_comch_context_uses_it(comch: Comch) -> None:
    """doca_dev_close: "DOCA_ERROR_IN_USE" while a context still uses the device, naming it."""
    with pytest.raises(Exception) as exc:
        comch.dev.close()
    assert "ComchServer" in str(exc.value)


# -- what a hostile peer gets ---------------------------------------------------------------------


def test_a_peer_that_does_not_speak_comch_never_becomes_a_connection() -> None:
    """doca_comch_event_connection_status_changed_cb_t fires for peers that completed the handshake only:
    garbage from a raw TCP socket is refused, and a real client connects meanwhile."""
    comch = Comch("tcp:127.0.0.1:0")
    try:
        comch.server.start()
        host, port = comch.server.address.removeprefix("tcp:").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(b"\x00\x00\x00\x40" + b"GET / HTTP/1.0\r\n" * 4)
            _c, _, _ = comch.connected()
            assert len(comch.s.connects) == 1
            assert comch.server.connections[0].get_server_ctx() is comch.server
    finally:
        comch.close()


def test_an_oversized_message_ends_that_connection_only(comch: Comch) -> None:
    """doca_comch_server_set_max_msg_size bounds what a peer may send: a peer that sends more breaks the
    protocol, its connection ends (disconnect event) and the others carry on."""
    bad, _, bad_conn = comch.connected()
    good, _, _ = comch.connected()
    chan = bad.get_connection().channel
    chan._live().max_msg_size = COMCH_MAX_MSG_LIMIT  # a peer that ignores the agreed size
    chan.send(b"x" * (bad_conn.max_msg_size + 1))
    comch.until(lambda: bool(comch.s.disconnects), "the bad peer is dropped")
    assert comch.s.disconnects[0][0] is bad_conn
    good.task_send_alloc_init(good.get_connection(), b"still here").submit()
    comch.until(lambda: any(m[0] == b"still here" for m in comch.s.msgs), "the good peer's message")


def test_a_client_with_the_wrong_secret_goes_back_to_idle(tmp_path: Path) -> None:
    """doca_ctx_start of a client that cannot complete the handshake: the context leaves STARTING inside
    progress (to IDLE, with its state callback) and says why."""
    comch = Comch("tcp:127.0.0.1:0", secret=b"s" * 32)
    try:
        comch.server.start()
        c, _ = comch.client(secret=b"t" * 32)
        comch.until(lambda: c.state is CtxState.IDLE, "the client gives up")
        assert c.error is not None
        assert c.error.code is DocaErrorCode.AUTHENTICATION
        assert comch.s.connects == []
    finally:
        comch.close()


def test_names_are_bounded(comch: Comch) -> None:
    """doca_comch_server_create: "Max length, including terminating '\\0', is obtained by
    doca_comch_cap_get_max_name_len()"; a name that is no service name is INVALID_VALUE."""
    limit = ComchClient.cap_get_max_name_len(comch.dev.info)
    assert error_code(lambda: ComchClient(comch.dev, "x" * limit)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: ComchClient(comch.dev, "bad name")) is DocaErrorCode.INVALID_VALUE
