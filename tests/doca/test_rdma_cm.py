"""Connect by address (DOCA 2.7+ ``doca_rdma.h``): listen, connect, accept, reject, disconnect.

Two soft RoCE-UDP devices on one `PE`; each `Rdma` context is driven by task
callbacks and connection callbacks, which must run inside ``progress`` only.
"""

import time
from collections.abc import Callable, Iterator

import pytest

from rdmakit.doca import (
    PE,
    BufInventory,
    CtxState,
    Dev,
    DocaErrorCode,
    Mmap,
    Rdma,
    RdmaAddr,
    RdmaConnection,
    RdmaTaskReceive,
    Task,
)
from tests.doca.task_harness import RW
from tests.doca.util import error_code

PORT = 7174


class Side:
    def __init__(self, pe: PE, ip: str, log: list[tuple[str, str]], name: str) -> None:
        self.name, self.log, self.pe = name, log, pe
        self.dev = Dev.open(f"udp:{ip}", pe=pe)
        self.ip = ip
        self.rdma = Rdma()
        self.rdma.add_dev(self.dev)
        self.rdma.set_permissions(RW)
        self.inv = BufInventory(16)
        self.inv.start()
        self.done: list[Task] = []
        self.conns: list[RdmaConnection] = []
        self.accept = True
        self.inside: list[bool] = []
        pe.connect_ctx(self.rdma)
        for kind in ("send", "receive"):
            getattr(self.rdma, f"task_{kind}_set_conf")(self._task, self._task, 4)
        self.rdma.set_connection_state_callbacks(
            self._request, self._established, self._failure, self._disconnect
        )

    def _note(self, what: str, conn: RdmaConnection, ctx_user_data: object) -> None:
        assert conn.rdma is self.rdma
        self.log.append((self.name, what))
        self.inside.append(Duo.progressing)

    def _request(self, conn: RdmaConnection, ud: object) -> None:
        self._note("request", conn, ud)
        self.conns.append(conn)
        if self.accept:
            conn.accept(b"welcome")
        else:
            conn.reject()

    def _established(self, conn: RdmaConnection, conn_ud: object, ud: object) -> None:
        self._note("established", conn, ud)

    def _failure(self, conn: RdmaConnection, conn_ud: object, ud: object) -> None:
        self._note("failure", conn, ud)

    def _disconnect(self, conn: RdmaConnection, conn_ud: object, ud: object) -> None:
        self._note("disconnect", conn, ud)

    def _task(self, task: Task, task_user_data: object, ctx_user_data: object) -> None:
        self.done.append(task)

    def mmap(self, size_or_bytes: int | bytes) -> tuple[Mmap, bytearray]:
        mem = bytearray(size_or_bytes)
        m = Mmap()
        m.set_permissions(RW)
        m.set_memrange(mem)
        m.add_dev(self.dev)
        m.start()
        return m, mem

    def close(self) -> None:
        self.rdma.close()  # the inventory's buffers die with the test
        self.dev.close_all()


class Duo:
    progressing = False

    def __init__(self, new_ip: Callable[[], str]) -> None:
        self.pe = PE()
        self.log: list[tuple[str, str]] = []
        self.server = Side(self.pe, new_ip(), self.log, "server")
        self.client = Side(self.pe, new_ip(), self.log, "client")

    def until(self, done: Callable[[], bool], limit: float = 20.0) -> None:
        end = time.monotonic() + limit
        while not done():
            Duo.progressing = True
            try:
                busy = self.pe.progress()
            finally:
                Duo.progressing = False
            if time.monotonic() > end:
                raise AssertionError(f"never happened; log {self.log}")
            if not busy:
                time.sleep(0.0005)

    def close(self) -> None:
        self.client.close()
        self.server.close()
        self.pe.close()


@pytest.fixture
def duo(new_ip: Callable[[], str]) -> Iterator[Duo]:
    d = Duo(new_ip)
    try:
        yield d
    finally:
        d.close()


def _connect(d: Duo) -> RdmaConnection:
    d.server.rdma.start()
    d.client.rdma.start()
    d.server.rdma.start_listen_to_port(PORT)
    conn = d.client.rdma.connect_to_addr(RdmaAddr(d.server.ip, PORT), user_data="mine")
    d.until(lambda: ("client", "established") in d.log and ("server", "established") in d.log)
    return conn


def test_connect_by_address_then_send(duo: Duo) -> None:
    """doca_rdma_connect_to_addr / start_listen_to_port: callbacks in progress, both RUNNING, data moves."""
    d = duo
    conn = _connect(d)
    assert conn.get_user_data() == "mine"
    assert conn.private_data.rstrip(b"\0") == b"welcome"  # the REP's private data
    assert d.server.rdma.state is CtxState.RUNNING
    assert d.client.rdma.state is CtxState.RUNNING
    assert all(d.server.inside + d.client.inside)  # doca_pe_progress only
    assert d.server.conns[0].peer[0] == d.client.ip
    mb, mem_b = d.server.mmap(64)
    ma, _ = d.client.mmap(b"hello over rdma_cm")
    recv = d.server.rdma.task_receive_allocate_init(d.server.inv.get_by_addr(mb, mb.addr, 64))
    recv.submit()
    send = d.client.rdma.task_send_allocate_init(d.client.inv.get_by_data(ma, ma.addr, 18))
    send.submit()
    d.until(lambda: recv in d.server.done and send in d.client.done)
    assert isinstance(recv, RdmaTaskReceive)
    assert recv.get_status() is DocaErrorCode.SUCCESS
    assert bytes(mem_b[:18]) == b"hello over rdma_cm"


@pytest.mark.parametrize("who", ["client", "server"])
def test_disconnect_from_either_side(duo: Duo, who: str) -> None:
    d = duo
    conn = _connect(d)
    side = d.client if who == "client" else d.server
    (conn if who == "client" else d.server.conns[0]).disconnect()
    d.until(lambda: ("client", "disconnect") in d.log and ("server", "disconnect") in d.log)
    assert side.rdma.error is not None


def test_rejected_and_no_listener_fail(duo: Duo) -> None:
    """connection_reject → the client's failure callback; a port nobody listens on too (REJ 8)."""
    d = duo
    d.server.accept = False
    d.server.rdma.start()
    d.client.rdma.start()
    d.server.rdma.start_listen_to_port(PORT)
    d.client.rdma.connect_to_addr(RdmaAddr(d.server.ip, PORT))
    d.until(lambda: ("client", "failure") in d.log)
    assert d.client.rdma.error is not None
    assert d.client.rdma.error.code is DocaErrorCode.CONNECTION_ABORTED
    d.client.rdma.stop()
    d.until(lambda: d.client.rdma.state is CtxState.IDLE)
    d.client.rdma.start()
    d.client.rdma.connect_to_addr(RdmaAddr(d.server.ip, PORT + 1))
    d.until(lambda: d.log.count(("client", "failure")) == 2)
    assert "no listener" in str(d.client.rdma.error)


def test_misuse(duo: Duo) -> None:
    d = duo
    addr = RdmaAddr(d.server.ip, PORT)
    assert error_code(lambda: d.client.rdma.connect_to_addr(addr)) is DocaErrorCode.BAD_STATE  # IDLE
    assert error_code(lambda: RdmaAddr("not an address", 1)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: RdmaAddr(d.server.ip, 70000)) is DocaErrorCode.INVALID_VALUE
    d.server.rdma.start()
    d.server.rdma.start_listen_to_port(PORT)
    assert error_code(lambda: d.server.rdma.start_listen_to_port(PORT)) is DocaErrorCode.IN_USE
    cb = d.server._established
    assert (
        error_code(lambda: d.server.rdma.set_connection_state_callbacks(d.server._request, cb, cb, cb))
        is DocaErrorCode.BAD_STATE
    )


def test_await_the_connection_with_trio(duo: Duo) -> None:
    """rdmakit.doca.aio.wait_connected: both sides awaited in one trio run; a refusal raises."""
    import trio

    from rdmakit.doca import aio

    d = duo
    d.server.rdma.start()
    d.client.rdma.start()
    d.server.rdma.start_listen_to_port(PORT)
    d.client.rdma.connect_to_addr(RdmaAddr(d.server.ip, PORT))
    got: dict[str, RdmaConnection] = {}

    async def main() -> None:
        async def side(name: str, rdma: Rdma) -> None:
            got[name] = await aio.wait_connected(rdma)

        with trio.fail_after(20):
            async with trio.open_nursery() as n:
                n.start_soon(side, "client", d.client.rdma)
                n.start_soon(side, "server", d.server.rdma)

    trio.run(main)
    assert got["client"].state == "established"
    assert got["server"].state == "established"


def test_await_a_refused_connection_raises(duo: Duo) -> None:
    import trio

    from rdmakit.doca import DocaError, aio

    d = duo
    d.client.rdma.start()
    d.client.rdma.connect_to_addr(RdmaAddr(d.server.ip, PORT))  # the server's device has no listener

    async def main() -> None:
        with trio.fail_after(20):
            await aio.wait_connected(d.client.rdma)

    with pytest.raises(DocaError, match="no listener"):
        trio.run(main)
