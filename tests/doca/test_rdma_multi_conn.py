"""Several connections per `Rdma` context (DOCA 2.9 ``doca_rdma_set_max_num_connections``).

Soft RoCE-UDP devices on fresh loopback addresses, one `PE`: a listener
holding up to n connections, clients that are one context each or one
context with n connections. Every connection has its own queue pair; data is
checked per connection, with its own pattern, through the task API and the
job API; a disconnect of one connection leaves the others working.
"""

import time
from collections.abc import Callable, Iterator
from functools import partial

import pytest

from rdmakit.doca import (
    MAX_NUM_CONNECTIONS,
    PE,
    AccessFlag,
    Buf,
    BufInventory,
    CtxState,
    Dev,
    DocaErrorCode,
    Event,
    Job,
    Mmap,
    Rdma,
    RdmaAddr,
    RdmaConnection,
    RdmaReadJob,
    RdmaRecvJob,
    RdmaResult,
    RdmaSendJob,
    RdmaTaskRead,
    RdmaTaskReceive,
    RdmaTaskSend,
    RdmaTaskWrite,
    RdmaWriteJob,
    Task,
    TaskState,
    WorkQ,
    local_devinfo,
)
from tests.doca.util import error_code, started_mmap

PORT = 7175
RW = AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE
SLOT = 64  # bytes of a shared mmap each connection owns


def pattern(tag: int, n: int = 32) -> bytes:
    """Distinct bytes per connection and direction."""
    return bytes((tag * 37 + i * 11 + 5) & 0xFF for i in range(n))


class Peer:
    """One `Rdma` context on its own soft device; its connection callbacks are logged."""

    def __init__(self, net: "Net", name: str, max_conns: int, api: str) -> None:
        self.net, self.name, self.api = net, name, api
        self.ip = net.new_ip()
        self.dev = Dev.open(f"udp:{self.ip}", pe=net.pe)
        self.rdma = Rdma()
        self.rdma.add_dev(self.dev)
        self.rdma.set_permissions(RW)
        self.rdma.set_max_num_connections(max_conns)
        self.inv = BufInventory(128)
        self.inv.start()
        self.mmaps: list[Mmap] = []
        self.done: list[Task] = []
        self.events: dict[int, Event] = {}
        self.requests: list[RdmaConnection] = []
        self.log: list[tuple[str, RdmaConnection]] = []
        self.accept: bool | None = True  # None: leave the request for the test
        self.wq: WorkQ | None = None
        if api == "task":
            net.pe.connect_ctx(self.rdma)
            for kind in ("send", "receive", "read", "write"):
                getattr(self.rdma, f"task_{kind}_set_conf")(self._task, self._task, 16)
        else:
            self.wq = WorkQ(32, pe=net.pe)
            self.rdma.workq_add(self.wq)
        self.rdma.set_connection_state_callbacks(
            self._request, self._note("established"), self._note("failure"), self._note("disconnect")
        )

    def _note(self, what: str) -> Callable[[RdmaConnection, object, object], None]:
        def cb(conn: RdmaConnection, conn_ud: object, ud: object) -> None:
            assert conn.rdma is self.rdma
            self.log.append((what, conn))

        return cb

    def _request(self, conn: RdmaConnection, ud: object) -> None:
        self.requests.append(conn)
        if self.accept is True:
            conn.accept()
        elif self.accept is False:
            conn.reject()

    def _task(self, task: Task, task_user_data: object, ctx_user_data: object) -> None:
        self.done.append(task)

    def seen(self, what: str) -> list[RdmaConnection]:
        return [c for w, c in self.log if w == what]

    def mmap(self, size_or_bytes: int | bytes) -> tuple[Mmap, bytearray]:
        m, mem = started_mmap(self.dev, size_or_bytes, RW)
        self.mmaps.append(m)
        return m, mem

    def remote(self, owner: "Peer", m: Mmap) -> Mmap:
        r = Mmap.create_from_export(m.export_rdma(owner.dev), self.dev)
        self.mmaps.append(r)
        return r

    def src(self, m: Mmap, offset: int, length: int) -> Buf:
        return self.inv.get_by_data(m, m.addr + offset, length)

    def dst(self, m: Mmap, offset: int, length: int) -> Buf:
        return self.inv.get_by_addr(m, m.addr + offset, length)

    def submit(self, *jobs: Job) -> None:
        assert self.wq is not None
        for job in jobs:
            self.wq.submit(job)

    def drain(self) -> None:
        if self.wq is not None:
            while (ev := self.wq.progress_retrieve()) is not None:
                self.events[id(ev.job)] = ev

    def close(self) -> None:
        self.rdma.close()
        if self.wq is not None:
            self.wq.close()
        self.dev.close_all()  # teardown: the mmaps a test made go with the device


class Net:
    def __init__(self, new_ip: Callable[[], str]) -> None:
        self.new_ip = new_ip
        self.pe = PE()
        self.peers: list[Peer] = []

    def peer(self, name: str, max_conns: int = 1, api: str = "task") -> Peer:
        p = Peer(self, name, max_conns, api)
        self.peers.append(p)
        return p

    def until(self, done: Callable[[], bool], limit: float = 20.0) -> None:
        end = time.monotonic() + limit
        while True:
            for p in self.peers:
                p.drain()
            if done():
                return
            busy = self.pe.progress()
            if time.monotonic() > end:
                logs = {p.name: [(w, c.get_id()) for w, c in p.log] for p in self.peers}
                raise AssertionError(f"never happened; {logs}")
            if not busy:
                time.sleep(0.0005)

    def jobs(self, peer: Peer, *jobs: Job) -> list[Event]:
        peer.submit(*jobs)
        self.until(lambda: all(id(j) in peer.events for j in jobs))
        return [peer.events.pop(id(j)) for j in jobs]

    def tasks(self, *tasks: Task) -> None:
        for t in tasks:
            t.submit()
        self.until(lambda: all(any(t is d for p in self.peers for d in p.done) for t in tasks))

    def close(self) -> None:
        for p in reversed(self.peers):
            p.close()
        self.pe.close()


@pytest.fixture
def net(new_ip: Callable[[], str]) -> Iterator[Net]:
    n = Net(new_ip)
    try:
        yield n
    finally:
        n.close()


def listen(net: Net, server: Peer) -> None:
    server.rdma.start()
    server.rdma.start_listen_to_port(PORT)


def connect(net: Net, client: Peer, server: Peer, user_data: object = None) -> RdmaConnection:
    if client.rdma.state is CtxState.IDLE:
        client.rdma.start()
    conn = client.rdma.connect_to_addr(RdmaAddr(server.ip, PORT), user_data)
    net.until(lambda: conn.state == "established")
    return conn


def server_has(server: Peer, established: int) -> bool:
    return len(server.seen("established")) >= established


def pair_up(
    net: Net, server: Peer, clients: list[Peer], per_client: int
) -> list[tuple[RdmaConnection, RdmaConnection]]:
    """Connect one at a time: (client end, server end) of each connection."""
    pairs: list[tuple[RdmaConnection, RdmaConnection]] = []
    for client in clients:
        for _ in range(per_client):
            want = len(server.seen("established")) + 1
            conn = connect(net, client, server, user_data=len(pairs))
            net.until(partial(server_has, server, want))
            pairs.append((conn, server.seen("established")[-1]))
    return pairs


# -- configuration ------------------------------------------------------------------------------


def test_max_num_connections_is_configured_and_bounded(net: Net) -> None:
    """doca_rdma_set_max_num_connections: 1 by default, 1..cap, IDLE only; hostile values refused."""
    p = net.peer("p")
    rdma = Rdma()
    assert rdma.get_max_num_connections() == 1
    assert rdma.max_num_connections == 1
    cap = Rdma.cap_get_max_num_connections(p.dev.info)
    assert cap == MAX_NUM_CONNECTIONS
    assert (
        error_code(lambda: Rdma.cap_get_max_num_connections(local_devinfo())) is DocaErrorCode.NOT_SUPPORTED
    )
    hostile: list[object] = [0, -1, cap + 1, 1 << 16, 1 << 64, True, 2.0, "3", None]
    for bad in hostile:
        call = partial(rdma.set_max_num_connections, bad)  # type: ignore[arg-type]
        assert error_code(call) is DocaErrorCode.INVALID_VALUE, bad
    rdma.set_max_num_connections(cap)
    assert rdma.get_max_num_connections() == cap
    rdma.close()
    p.rdma.start()
    assert error_code(lambda: p.rdma.set_max_num_connections(2)) is DocaErrorCode.BAD_STATE
    assert p.rdma.get_max_num_connections() == 1


# -- data on every connection ---------------------------------------------------------------------


def _check_tasks(net: Net, server: Peer, pairs: list[tuple[RdmaConnection, RdmaConnection]]) -> None:
    """SEND/RECV, WRITE and READ from each client end, WRITE from each server end; own patterns each."""
    n = len(pairs)
    srv_m, srv_mem = server.mmap(SLOT * n)
    for i in range(n):
        srv_mem[i * SLOT + 32 : (i + 1) * SLOT] = pattern(100 + i)  # what client i reads
    recv_m, recv_mem = server.mmap(SLOT * n)
    recvs: list[RdmaTaskReceive] = []
    sends: list[RdmaTaskSend] = []
    writes: list[RdmaTaskWrite] = []
    reads: list[RdmaTaskRead] = []
    pushes: list[RdmaTaskWrite] = []  # the server end writes to the client
    client_mems = []
    for i, (cc, sc) in enumerate(pairs):
        client: Peer = next(p for p in net.peers if p.rdma is cc.rdma)
        recvs.append(server.rdma.task_receive_allocate_init(server.dst(recv_m, i * SLOT, SLOT), i))
        cm, cmem = client.mmap(pattern(i) + bytes(SLOT))
        client_mems.append(cmem)
        remote = client.remote(server, srv_m)
        sends.append(client.rdma.task_send_allocate_init(client.src(cm, 0, 32), i, rdma_connection=cc))
        writes.append(
            client.rdma.task_write_allocate_init(
                client.src(cm, 0, 32), client.dst(remote, i * SLOT, 32), i, rdma_connection=cc
            )
        )
        reads.append(
            client.rdma.task_read_allocate_init(
                client.src(remote, i * SLOT + 32, 32), client.dst(cm, 32, 32), i, rdma_connection=cc
            )
        )
        assert sends[-1].get_rdma_connection() is cc
        pm, _ = server.mmap(pattern(200 + i))
        into_client = server.remote(client, cm)
        pushes.append(
            server.rdma.task_write_allocate_init(
                server.src(pm, 0, 32), server.dst(into_client, 64, 32), i, rdma_connection=sc
            )
        )
    for t in recvs:
        t.submit()
    net.tasks(*sends, *writes, *reads, *pushes)
    net.until(lambda: all(any(t is d for d in server.done) for t in recvs))
    # The receives take no connection: each completes with the message of whichever came first.
    slot_of = {id(r.get_result_rdma_connection()): j for j, r in enumerate(recvs)}
    assert sorted(slot_of.values()) == list(range(n))
    for i, (_, sc) in enumerate(pairs):
        for task in (recvs[i], sends[i], writes[i], reads[i], pushes[i]):
            assert task.get_status() is DocaErrorCode.SUCCESS, task.error
        j = slot_of[id(sc)]
        assert bytes(recv_mem[j * SLOT : j * SLOT + 32]) == pattern(i)
        assert bytes(srv_mem[i * SLOT : i * SLOT + 32]) == pattern(i)
        assert bytes(client_mems[i][32:64]) == pattern(100 + i)
        assert bytes(client_mems[i][64:96]) == pattern(200 + i)
    for done in (*recvs, *sends, *writes, *reads, *pushes):
        done.free()


def test_three_clients_on_one_listener(net: Net) -> None:
    """A listener of max 3 connections, three client contexts: three queue pairs, data kept apart."""
    server = net.peer("server", 3)
    clients = [net.peer(f"client{i}") for i in range(3)]
    listen(net, server)
    pairs = pair_up(net, server, clients, 1)
    assert sorted(sc.get_id() for _, sc in pairs) == [0, 1, 2]
    assert len({sc.qpn for _, sc in pairs}) == 3
    assert server.rdma.qpn in {sc.qpn for _, sc in pairs}  # the start queue pair serves the first
    assert all(cc.get_id() == 0 for cc, _ in pairs)
    _check_tasks(net, server, pairs)


def test_one_client_context_with_three_connections(net: Net) -> None:
    """connect_to_addr three times from one context (max 3): each connection its own queue pair."""
    server = net.peer("server", 3)
    client = net.peer("client", 3)
    listen(net, server)
    pairs = pair_up(net, server, [client], 3)
    assert [cc.get_id() for cc, _ in pairs] == [0, 1, 2]
    assert len({cc.qpn for cc, _ in pairs}) == 3
    assert client.rdma.connections == tuple(cc for cc, _ in pairs)
    _check_tasks(net, server, pairs)
    # Without a connection named, a context of several refuses the task's job.
    m, _ = client.mmap(8)
    task = client.rdma.task_send_allocate_init(client.src(m, 0, 8))
    assert error_code(task.submit) is DocaErrorCode.INVALID_VALUE
    task.set_rdma_connection(pairs[2][0])
    rm, _ = server.mmap(8)
    named = server.rdma.task_receive_allocate_init(server.dst(rm, 0, 8), rdma_connection=pairs[2][1])
    assert error_code(named.submit) is DocaErrorCode.INVALID_VALUE  # a receive takes any connection
    named.free()
    recv = server.rdma.task_receive_allocate_init(server.dst(rm, 0, 8))
    recv.submit()
    net.tasks(task)
    net.until(lambda: recv in server.done)
    assert task.get_status() is DocaErrorCode.SUCCESS
    assert recv.get_result_rdma_connection() is pairs[2][1]


def test_jobs_name_their_connection(net: Net) -> None:
    """The job API: connection= per job, completions of every queue pair through one WorkQ."""
    server = net.peer("server", 3, api="job")
    client = net.peer("client", 3, api="job")
    listen(net, server)
    pairs = pair_up(net, server, [client], 3)
    srv_m, srv_mem = server.mmap(SLOT * 3)
    remote = client.remote(server, srv_m)
    jobs: list[RdmaWriteJob | RdmaReadJob | RdmaSendJob] = []
    recvs: list[RdmaRecvJob] = []
    cmems = []
    for i, (cc, _) in enumerate(pairs):
        srv_mem[i * SLOT + 32 : (i + 1) * SLOT] = pattern(50 + i)
        cm, cmem = client.mmap(pattern(10 + i) + bytes(32))
        cmems.append(cmem)
        recvs.append(RdmaRecvJob(ctx=server.rdma, dst_buf=server.dst(srv_m, i * SLOT + 16, 16)))
        into, outof = client.dst(remote, i * SLOT, 16), client.src(remote, i * SLOT + 32, 32)
        jobs += [
            RdmaWriteJob(ctx=client.rdma, connection=cc, src_buf=client.src(cm, 0, 16), dst_buf=into),
            RdmaReadJob(ctx=client.rdma, connection=cc, src_buf=outof, dst_buf=client.dst(cm, 32, 32)),
            RdmaSendJob(ctx=client.rdma, connection=cc, src_buf=client.src(cm, 16, 16)),
        ]
    server.submit(*recvs)
    for job, ev in zip(jobs, net.jobs(client, *jobs), strict=True):
        assert ev.ok, ev.error
        assert isinstance(ev.result, RdmaResult)
        assert ev.result.connection is job.connection
    net.until(lambda: all(id(j) in server.events for j in recvs))
    came_on = [sc for _, sc in pairs]
    seen = set()
    for j in range(len(pairs)):
        ev = server.events.pop(id(recvs[j]))
        assert ev.ok
        assert isinstance(ev.result, RdmaResult)
        i = next(k for k, sc in enumerate(came_on) if sc is ev.result.connection)  # the sender
        seen.add(i)
        assert bytes(srv_mem[j * SLOT + 16 : j * SLOT + 32]) == pattern(10 + i)[16:32]  # sent
        assert bytes(srv_mem[i * SLOT : i * SLOT + 16]) == pattern(10 + i)[:16]  # written
        assert bytes(cmems[i][32:64]) == pattern(50 + i)
    assert seen == set(range(len(pairs)))
    # Bad connection arguments are refused at submit: none named among several, not a
    # connection, the server's.
    m, _ = client.mmap(8)
    for bad in (None, "conn", pairs[0][1]):
        job = RdmaSendJob(ctx=client.rdma, connection=bad, src_buf=client.src(m, 0, 8))  # type: ignore[arg-type]
        assert error_code(partial(client.submit, job)) is DocaErrorCode.INVALID_VALUE


# -- one connection goes, the others stay ------------------------------------------------------------


@pytest.mark.parametrize("who", ["client", "server"])
def test_disconnect_of_one_connection_leaves_the_others(net: Net, who: str) -> None:
    """Disconnect connection 1 from either side: 0 and 2 carry on, and the receives, which take any
    connection (one queue shared by the connections), stay for them."""
    server = net.peer("server", 3)
    client = net.peer("client", 3)
    listen(net, server)
    pairs = pair_up(net, server, [client], 3)
    recv_m, recv_mem = server.mmap(SLOT * 3)
    recvs = [server.rdma.task_receive_allocate_init(server.dst(recv_m, i * SLOT, SLOT)) for i in range(3)]
    for t in recvs:
        t.submit()
    gone_c, gone_s = pairs[1]
    (gone_c if who == "client" else gone_s).disconnect()
    net.until(lambda: gone_s in server.seen("disconnect") and gone_c in client.seen("disconnect"))
    assert not [r for r in recvs if r in server.done]  # the SRQ's receives are not the connection's
    assert server.seen("disconnect") == [gone_s]
    assert client.seen("disconnect") == [gone_c]
    assert gone_s.state == gone_c.state == "closed"
    assert gone_s.error is not None
    assert gone_s.error.code is DocaErrorCode.CONNECTION_RESET
    assert server.rdma.state is CtxState.RUNNING
    assert client.rdma.state is CtxState.RUNNING
    m, _ = client.mmap(pattern(7) + pattern(9))
    dead = client.rdma.task_send_allocate_init(client.src(m, 0, 32), rdma_connection=gone_c)
    assert error_code(dead.submit) is DocaErrorCode.NOT_CONNECTED
    sends = [
        client.rdma.task_send_allocate_init(client.src(m, 32 * (i // 2), 32), rdma_connection=pairs[i][0])
        for i in (0, 2)
    ]
    net.tasks(*sends)
    net.until(lambda: len([r for r in recvs if r in server.done]) == 2)
    got = {id(r.get_result_rdma_connection()): j for j, r in enumerate(recvs) if r in server.done}
    j0, j2 = got[id(pairs[0][1])], got[id(pairs[2][1])]
    assert bytes(recv_mem[j0 * SLOT : j0 * SLOT + 32]) == pattern(7)
    assert bytes(recv_mem[j2 * SLOT : j2 * SLOT + 32]) == pattern(9)
    # The freed place takes a new connection, with the freed id.
    again = connect(net, client, server, user_data="again")
    assert again.get_id() == 1
    assert len(client.rdma.connections) == 3


def test_stop_disconnects_every_connection(net: Net) -> None:
    server = net.peer("server", 3)
    clients = [net.peer(f"client{i}") for i in range(3)]
    listen(net, server)
    pair_up(net, server, clients, 1)
    server.rdma.stop()
    net.until(lambda: all(len(c.seen("disconnect")) == 1 for c in clients))
    assert server.rdma.connections == ()
    net.until(lambda: server.rdma.state is CtxState.IDLE)


# -- the limit ---------------------------------------------------------------------------------------


def test_requests_beyond_the_limit_are_rejected(net: Net) -> None:
    """Max 3: the fourth client's REQ is rejected (its failure callback); the server never sees it."""
    server = net.peer("server", 3)
    clients = [net.peer(f"client{i}") for i in range(4)]
    listen(net, server)
    pairs = pair_up(net, server, clients[:3], 1)
    clients[3].rdma.start()
    fourth = clients[3].rdma.connect_to_addr(RdmaAddr(server.ip, PORT))
    net.until(lambda: fourth in clients[3].seen("failure"))
    assert fourth.error is not None
    assert fourth.error.code is DocaErrorCode.CONNECTION_ABORTED
    assert clients[3].rdma.error is fourth.error
    assert len(server.requests) == 3
    assert len(server.rdma.connections) == 3
    assert clients[3].rdma.state is CtxState.STARTING
    # The three stay usable.
    _check_tasks(net, server, pairs)


def test_default_is_one_connection_per_context(net: Net) -> None:
    server = net.peer("server")
    clients = [net.peer(f"client{i}") for i in range(2)]
    listen(net, server)
    connect(net, clients[0], server)
    clients[1].rdma.start()
    refused = clients[1].rdma.connect_to_addr(RdmaAddr(server.ip, PORT))
    net.until(lambda: refused in clients[1].seen("failure"))
    assert len(server.requests) == 1


def test_connects_beyond_the_limit_are_refused(net: Net) -> None:
    server = net.peer("server", 3)
    client = net.peer("client", 2)
    listen(net, server)
    pair_up(net, server, [client], 2)
    addr = RdmaAddr(server.ip, PORT)
    assert error_code(lambda: client.rdma.connect_to_addr(addr)) is DocaErrorCode.FULL
    assert error_code(lambda: client.rdma.connect_to_addr(("x", 1))) is DocaErrorCode.INVALID_VALUE  # type: ignore[arg-type]


def test_a_requested_connection_takes_no_tasks_until_accepted(net: Net) -> None:
    """The request callback may leave a request for later; it has no queue pair until accepted."""
    server = net.peer("server", 2)
    clients = [net.peer(f"client{i}") for i in range(2)]
    listen(net, server)
    ((_, first),) = pair_up(net, server, clients[:1], 1)
    server.accept = None
    clients[1].rdma.start()
    cc = clients[1].rdma.connect_to_addr(RdmaAddr(server.ip, PORT))
    net.until(lambda: len(server.requests) == 2)
    sc = server.requests[1]
    assert sc.state == "requested"
    assert sc.qpn is None
    assert sc.get_id() == 1
    m, mem = server.mmap(16)
    early = server.rdma.task_send_allocate_init(server.src(m, 0, 1), rdma_connection=sc)
    assert error_code(early.submit) is DocaErrorCode.BAD_STATE
    early.free()
    recv = server.rdma.task_receive_allocate_init(server.dst(m, 0, 16))  # any connection: posted now
    recv.submit()
    sc.accept()
    net.until(lambda: cc.state == "established" and sc.state == "established")
    assert sc.qpn is not None
    assert sc.qpn not in (first.qpn, server.rdma.qpn)
    src_m, _ = clients[1].mmap(pattern(3, 16))
    net.tasks(clients[1].rdma.task_send_allocate_init(clients[1].src(src_m, 0, 16)))
    net.until(lambda: recv in server.done)
    assert recv.get_status() is DocaErrorCode.SUCCESS
    assert recv.get_result_rdma_connection() is sc
    assert bytes(mem) == pattern(3, 16)


def test_task_connection_arguments_are_checked(net: Net) -> None:
    server = net.peer("server", 2)
    client = net.peer("client", 2)
    other = net.peer("other")
    listen(net, server)
    (cc, sc), _ = pair_up(net, server, [client], 2)
    other.rdma.start()
    m, _ = client.mmap(8)
    for bad in ("conn", 3, sc, other.rdma):

        def call(bad: object = bad) -> object:
            return client.rdma.task_send_allocate_init(client.src(m, 0, 8), rdma_connection=bad)

        assert error_code(call) is DocaErrorCode.INVALID_VALUE
    task = client.rdma.task_send_allocate_init(client.src(m, 0, 8), rdma_connection=client.rdma)
    assert task.get_rdma_connection() is client.rdma  # none named: the context's only one
    assert error_code(lambda: task.set_rdma_connection(sc)) is DocaErrorCode.INVALID_VALUE
    task.set_rdma_connection(cc)
    assert task.get_rdma_connection() is cc


# -- trio -------------------------------------------------------------------------------------------------


def test_await_each_connection_with_trio(net: Net) -> None:
    """aio.wait_connected per connection, aio.wait_connections on the listener, wait_disconnected."""
    import trio

    from rdmakit.doca import aio

    server = net.peer("server", 3)
    client = net.peer("client", 3)
    listen(net, server)
    client.rdma.start()
    conns = [client.rdma.connect_to_addr(RdmaAddr(server.ip, PORT), user_data=i) for i in range(3)]
    got: dict[str, object] = {}
    recv_m, recv_mem = server.mmap(SLOT * 3)
    src_m, _ = client.mmap(pattern(20) + pattern(21) + pattern(22))

    async def settle(task: Task) -> None:
        if task.state is TaskState.SUBMITTED:  # its callback may have run in an earlier progress
            await aio.wait_task(task)

    async def main() -> None:
        with trio.fail_after(30):
            async with trio.open_nursery() as n:

                async def accept_all() -> None:
                    got["server"] = await aio.wait_connections(server.rdma, 3)

                n.start_soon(accept_all)
                for c in conns:
                    assert await aio.wait_connected(client.rdma, c) is c
            srv = got["server"]
            assert isinstance(srv, tuple)
            assert len(srv) == 3
            for i, sc in enumerate(server.requests):
                sc.set_user_data(i)
            for i, cc in enumerate(conns):
                sc = next(s for s in srv if s.get_user_data() == i)
                recv = server.rdma.task_receive_allocate_init(server.dst(recv_m, i * SLOT, 32))
                recv.submit()
                send = client.rdma.task_send_allocate_init(client.src(src_m, 32 * i, 32), rdma_connection=cc)
                await aio.run_task(send)
                await settle(recv)
                assert recv.get_status() is DocaErrorCode.SUCCESS
                assert send.get_status() is DocaErrorCode.SUCCESS
                assert recv.get_result_rdma_connection() is sc
            conns[0].disconnect()
            err = await aio.wait_disconnected(conns[0])
            assert err is not None
            assert err.code is DocaErrorCode.CONNECTION_RESET
            send = client.rdma.task_send_allocate_init(client.src(src_m, 64, 32), rdma_connection=conns[2])
            sc2 = next(s for s in srv if s.get_user_data() == 2)
            recv = server.rdma.task_receive_allocate_init(server.dst(recv_m, 2 * SLOT + 32, 32))
            recv.submit()
            await aio.run_task(send)
            await settle(recv)
            assert recv.get_status() is DocaErrorCode.SUCCESS
            assert recv.get_result_rdma_connection() is sc2
            with pytest.raises(Exception, match="disconnected"):
                await aio.wait_connected(client.rdma, conns[0])

    trio.run(main)
    for i in range(3):
        assert bytes(recv_mem[i * SLOT : i * SLOT + 32]) == pattern(20 + i)
    assert bytes(recv_mem[2 * SLOT + 32 : 2 * SLOT + 64]) == pattern(22)
