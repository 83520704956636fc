"""``doca_rdma.h`` (2.5, and the newer connection-aware header): connecting, connections,
capabilities and properties."""

from functools import partial

import pytest

from rdmakit.doca import (
    MTU_SIZES,
    ConnectionDescriptor,
    CtxState,
    DocaErrorCode,
    Rdma,
    RdmaAddr,
    RdmaConnection,
    RdmaTransportType,
)
from rdmakit.doca.rdma_tasks import RdmaTaskReceive
from tests.doca.fidelity.conftest import DuoFactory
from tests.doca.task_harness import Duo
from tests.doca.util import error_code


def _done(d: Duo, task: object) -> bool:
    return any(t is task for t in d.done)


def _started(d: Duo) -> None:
    for s in d.sides:
        s.rdma.start()


def test_connect_leaves_the_context_starting_until_progress(make_duo: DuoFactory) -> None:
    """doca_rdma_connect: "Once called, doca_pe_progress() should be called, in order to transition the
    ctx to DOCA_CTX_STATE_RUNNING state. Only after that can tasks be allocated and submitted." """
    d = make_duo("task")
    seen: list[tuple[CtxState, bool]] = []
    d.a.rdma.set_state_changed_cb(lambda _ud, _c, _prev, nxt: seen.append((nxt, d.pe.in_progress)))
    _started(d)
    d.a.rdma.connect(d.b.rdma.export())
    d.b.rdma.connect(d.a.rdma.export())
    assert d.a.rdma.state is CtxState.STARTING
    ma, _ = d.a.mmap(b"early")
    assert error_code(lambda: d.a.rdma.task_send_allocate_init(d.a.data(ma, 0, 5))) is DocaErrorCode.BAD_STATE
    d.progress()
    assert d.a.rdma.state is CtxState.RUNNING  # type: ignore[comparison-overlap]  # progress changed it
    assert seen == [(CtxState.STARTING, False), (CtxState.RUNNING, True)]


@pytest.mark.parametrize(
    "blob",
    [b"", b"not json", b'{"format": "rdmakit.connection/1"}', b"\xff" * 64],
    ids=["empty", "garbage", "fields-missing", "binary"],
)
def test_a_corrupt_blob_is_connection_aborted(make_duo: DuoFactory, blob: bytes) -> None:
    """doca_rdma_connect: "DOCA_ERROR_CONNECTION_ABORTED - if connection failed or connection details
    object was corrupted"; the context stays STARTING and can still connect."""
    d = make_duo("task")
    _started(d)
    assert error_code(lambda: d.a.rdma.connect(blob)) is DocaErrorCode.CONNECTION_ABORTED
    assert d.a.rdma.state is CtxState.STARTING
    d.a.rdma.connect(d.b.rdma.export())


def test_two_connections_through_export_and_connect(make_duo: DuoFactory) -> None:
    """Connection-aware doca_rdma_export: "@param [out] rdma_connection Connection related data required
    for doca_rdma to connect"; doca_rdma_connect names it; doca_rdma_task_receive_get_result_rdma_connection
    says which connection a message came on; doca_rdma_connection_set_user_data is kept with it."""
    d = make_duo("task")
    for s in d.sides:
        s.rdma.set_max_num_connections(2)
    _started(d)
    a, b = d.a.rdma, d.b.rdma
    pairs = []
    for i in range(2):
        blob_a, conn_a = a.export_connection()
        blob_b, conn_b = b.export_connection()
        conn_b.set_user_data(f"b{i}")
        pairs.append((blob_a, conn_a, blob_b, conn_b))
    assert len({id(p[1]) for p in pairs}) == 2
    assert {p[1].get_id() for p in pairs} == {0, 1}
    for blob_a, conn_a, blob_b, conn_b in pairs:
        a.connect(blob_b, conn_a)
        b.connect(blob_a, conn_b)
    d._until(lambda: a.state is CtxState.RUNNING and b.state is CtxState.RUNNING, lambda: "RUNNING")
    mb, mem = d.b.mmap(16)
    ma, _ = d.a.mmap(b"zero one")
    sends = [
        a.task_send_allocate_init(d.a.data(ma, 5 * i, 4 - i), rdma_connection=p[1])
        for i, p in enumerate(pairs)
    ]
    for i in (1, 0):  # one message at a time, the second connection's first
        recv = b.task_receive_allocate_init(d.b.room(mb, 8 * i, 8))
        recv.submit()
        sends[i].submit()
        d._until(partial(_done, d, recv), lambda: "the message")
        assert recv.get_status() is DocaErrorCode.SUCCESS
        assert isinstance(recv, RdmaTaskReceive)
        conn = recv.get_result_rdma_connection()
        assert isinstance(conn, RdmaConnection)
        assert conn is pairs[i][3]
        assert conn.get_user_data() == f"b{i}"
    assert bytes(mem[0:4]) == b"zero"
    assert bytes(mem[8:11]) == b"one"


def test_export_beyond_max_num_connections_is_full(make_duo: DuoFactory) -> None:
    """Connection-aware doca_rdma_export: "DOCA_ERROR_FULL - if all connections are being used"."""
    d = make_duo("task")
    _started(d)
    d.a.rdma.export_connection()
    assert error_code(d.a.rdma.export_connection) is DocaErrorCode.FULL


def test_a_connection_is_named_once(make_duo: DuoFactory) -> None:
    """doca_rdma_connect: "DOCA_ERROR_BAD_STATE - if context was not started or rdma instance is already
    connected"."""
    d = make_duo("task")
    _started(d)
    _, conn = d.a.rdma.export_connection()
    blob_b, _ = d.b.rdma.export_connection()
    d.a.rdma.connect(blob_b, conn)
    assert error_code(lambda: d.a.rdma.connect(blob_b, conn)) is DocaErrorCode.BAD_STATE


def test_create_with_a_device(make_duo: DuoFactory) -> None:
    """doca_rdma_create: "@param [in] dev The device to attach to the RDMA instance"."""
    d = make_duo("task")
    with Rdma(d.a.dev) as rdma:
        assert rdma.dev is d.a.dev


def test_capabilities_are_the_backends(make_duo: DuoFactory) -> None:
    """doca_rdma_cap_get_max_send_queue_size, _max_recv_queue_size, _max_message_size,
    _max_send_buf_list_len, _gid_table_size, _gid, _transport_type_is_supported: the device's values."""
    d = make_duo("task")
    info = d.a.dev.info
    caps = d.a.dev.backend.caps
    assert Rdma.cap_get_max_send_queue_size(info) == caps.max_qp_wr
    assert Rdma.cap_get_max_recv_queue_size(info) == caps.max_qp_wr
    assert Rdma.cap_get_max_send_buf_list_len(info) == caps.max_sge
    assert Rdma.cap_get_max_message_size(info) == caps.max_buf_size <= 1 << 31  # IBTA §9.4.3
    assert Rdma.cap_get_gid_table_size(info) == len(info.gids) >= 1
    assert Rdma.cap_get_gid(info, 0, len(info.gids)) == list(info.gids)
    assert error_code(lambda: Rdma.cap_get_gid(info, len(info.gids), 1)) is DocaErrorCode.INVALID_VALUE
    Rdma.cap_transport_type_is_supported(info, RdmaTransportType.RC)
    assert (
        error_code(lambda: Rdma.cap_transport_type_is_supported(info, RdmaTransportType.DC))
        is DocaErrorCode.NOT_SUPPORTED
    )
    Rdma.cap_task_send_is_supported(info)
    # A queue deeper than the device's is refused at start, as its capability says.
    with Rdma(d.a.dev) as rdma:
        d.pe.connect_ctx(rdma)
        rdma.set_send_queue_size(caps.max_qp_wr * 2)
        assert error_code(rdma.start) is DocaErrorCode.NOT_SUPPORTED


def test_properties_the_backend_cannot_honour_are_not_supported(make_duo: DuoFactory) -> None:
    """doca_rdma_set_grh_enabled: "If using ETH device, GRH must be enabled"; doca_rdma_set_sl;
    doca_rdma_set_mtu: "DOCA_ERROR_NOT_SUPPORTED - if the given MTU is not supported"."""
    d = make_duo("task")
    rdma = d.a.rdma
    assert error_code(lambda: rdma.set_grh_enabled(False)) is DocaErrorCode.NOT_SUPPORTED
    rdma.set_grh_enabled(True)
    assert error_code(lambda: rdma.set_sl(3)) is DocaErrorCode.NOT_SUPPORTED
    assert error_code(lambda: rdma.set_sl(16)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: rdma.set_mtu(1500)) is DocaErrorCode.INVALID_VALUE
    if d.a.dev.info.mtu < max(MTU_SIZES):
        assert error_code(lambda: rdma.set_mtu(max(MTU_SIZES))) is DocaErrorCode.NOT_SUPPORTED
    assert error_code(lambda: rdma.set_rnr_retry_count(8)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: rdma.set_connection_request_timeout(0)) is DocaErrorCode.INVALID_VALUE
    big = d.a.dev.backend.caps.max_sge + 1
    assert error_code(lambda: rdma.set_max_send_buf_list_len(big)) is DocaErrorCode.NOT_SUPPORTED


def test_properties_reach_the_connection(make_duo: DuoFactory) -> None:
    """doca_rdma_set_mtu ("MTU to use in context"), doca_rdma_set_rnr_retry_count and
    doca_rdma_set_connection_request_timeout: the exported path MTU, the queue pair's RNR retry count,
    the timeout in milliseconds; a message longer than the MTU still arrives whole."""
    d = make_duo("task")
    a = d.a.rdma
    a.set_mtu(256)
    a.set_rnr_retry_count(3)
    a.set_connection_request_timeout(1500)
    assert a.connection_request_timeout == 1500
    d.up()
    assert ConnectionDescriptor.from_bytes(a.export()).mtu == 256
    assert a._qp is not None
    assert a._qp.connect_attrs.rnr_retry == 3
    mb, mem = d.b.mmap(1000)
    ma, _ = d.a.mmap(bytes(range(250)) * 4)
    recv = d.b.rdma.task_receive_allocate_init(d.b.room(mb, 0, 1000))
    recv.submit()
    send = a.task_send_allocate_init(d.a.data(ma, 0, 1000))
    send.submit()
    d._until(lambda: any(t is recv for t in d.done), lambda: "the receive")
    assert recv.get_status() is DocaErrorCode.SUCCESS
    assert bytes(mem) == bytes(range(250)) * 4
    assert error_code(lambda: a.set_mtu(512)) is DocaErrorCode.BAD_STATE  # "if context is already started"


def test_export_connect_and_cm_on_one_context(make_duo: DuoFactory, transport: str) -> None:
    """Connection-aware doca_rdma.h: one context holds connections made by doca_rdma_export/
    doca_rdma_connect and by doca_rdma_connect_to_addr, up to doca_rdma_set_max_num_connections; the
    established callback gets the connection and its user data, the one connect_to_addr was given
    (doca_rdma_connection_established_cb_t: "connection_user_data The doca_data supplied to the
    connection by the application (during connection or by a setter)")."""
    if transport == "tcp":
        pytest.skip("rdma_cm runs over RoCE UDP (QP1); a TCP soft device has no connection manager")
    d = make_duo("task")
    a, b = d.a.rdma, d.b.rdma
    a.set_max_num_connections(2)
    b.set_max_num_connections(2)
    established: list[tuple[object, object]] = []

    def request(conn: RdmaConnection, ud: object) -> None:
        conn.accept()

    def done(conn: RdmaConnection, conn_ud: object, ud: object) -> None:
        established.append((conn, conn_ud))

    def failed(conn: RdmaConnection, conn_ud: object, ud: object) -> None:
        pytest.fail(f"the connection by address failed: {conn.error}")

    for rdma in (a, b):
        rdma.set_connection_state_callbacks(request, done, failed, failed)
    _started(d)
    blob_a, conn_a = a.export_connection()
    blob_b, conn_b = b.export_connection()
    a.connect(blob_b, conn_a)
    b.connect(blob_a, conn_b)
    d._until(lambda: a.state is CtxState.RUNNING and b.state is CtxState.RUNNING, lambda: "RUNNING")
    port = 18515
    b.start_listen_to_port(port)
    ip = str(d.b.dev.info.ip_addrs[0]) if d.b.dev.info.ip_addrs else d.b.dev.name.split(":")[-1]
    by_addr = a.connect_to_addr(RdmaAddr(ip, port), user_data="by address")
    d._until(lambda: len(established) == 2, lambda: "the connection by address")
    assert (by_addr, "by address") in established
    assert len(a.connections) == 2
    assert {c.get_id() for c in a.connections} == {0, 1}
    # one message on each connection, each received on its own connection
    server_side = next(c for c, _ in established if c is not by_addr)
    mb, mem = d.b.mmap(16)
    ma, _ = d.a.mmap(b"desc" + b"cm!!")
    r1 = b.task_receive_allocate_init(d.b.room(mb, 0, 8))
    r1.submit()
    a.task_send_allocate_init(d.a.data(ma, 0, 4), rdma_connection=conn_a).submit()
    d._until(lambda: any(t is r1 for t in d.done), lambda: "the receive by descriptor")
    r2 = b.task_receive_allocate_init(d.b.room(mb, 8, 8))
    r2.submit()
    a.task_send_allocate_init(d.a.data(ma, 4, 4), rdma_connection=by_addr).submit()
    d._until(lambda: any(t is r2 for t in d.done), lambda: "the receive by address")
    assert (bytes(mem[0:4]), bytes(mem[8:12])) == (b"desc", b"cm!!")
    assert isinstance(r1, RdmaTaskReceive)
    assert isinstance(r2, RdmaTaskReceive)
    assert r1.get_result_rdma_connection() is conn_b
    assert r2.get_result_rdma_connection() is server_side


def test_a_receive_takes_no_connection_and_names_the_one_the_message_came_on(
    make_duo: DuoFactory,
) -> None:
    """Connection-aware doca_rdma_task_receive_allocate_init(rdma, dst_buf, user_data, task) takes no
    connection: with several connections, a receive is completed by the message of whichever arrives;
    doca_rdma_task_receive_get_result_rdma_connection returns the connection it was received on. A
    receive naming a connection there is INVALID_VALUE (the receives are one queue, IBTA §10.2.9)."""
    d = make_duo("task")
    for s in d.sides:
        s.rdma.set_max_num_connections(3)
    _started(d)
    a, b = d.a.rdma, d.b.rdma
    conns = []
    for i in range(3):
        blob_a, conn_a = a.export_connection()
        blob_b, conn_b = b.export_connection()
        conn_b.set_user_data(i)
        a.connect(blob_b, conn_a)
        b.connect(blob_a, conn_b)
        conns.append((conn_a, conn_b))
    d._until(lambda: a.state is CtxState.RUNNING and b.state is CtxState.RUNNING, lambda: "RUNNING")
    mb, mem = d.b.mmap(3 * 16)
    named = b.task_receive_allocate_init(d.b.room(mb, 0, 16), rdma_connection=conns[0][1])
    assert error_code(named.submit) is DocaErrorCode.INVALID_VALUE
    named.free()
    recvs = [b.task_receive_allocate_init(d.b.room(mb, 16 * j, 16)) for j in range(3)]
    for r in recvs:
        r.submit()  # posted before any message: each may take any connection's
    ma, _ = d.a.mmap(b"".join(f"message {i}".encode().ljust(16, b".") for i in range(3)))
    for i in (2, 0, 1):
        a.task_send_allocate_init(d.a.data(ma, 16 * i, 16), rdma_connection=conns[i][0]).submit()
    d._until(lambda: all(any(t is r for t in d.done) for r in recvs), lambda: "three messages")
    senders = []
    for j, r in enumerate(recvs):
        assert r.get_status() is DocaErrorCode.SUCCESS
        conn = r.get_result_rdma_connection()
        assert isinstance(conn, RdmaConnection)
        k = conn.get_user_data()
        assert isinstance(k, int)
        assert conn is conns[k][1]
        assert bytes(mem[16 * j : 16 * j + 16]) == f"message {k}".encode().ljust(16, b".")
        senders.append(k)
    assert sorted(senders) == [0, 1, 2]
