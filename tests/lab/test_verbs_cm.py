"""The verbs backend's connection manager (``rdmakit.verbs.cm``, librdmacm) on a real device (rxe0).

Runs where pyverbs, librdmacm, ``rdma_ucm`` and a RoCE device with a RoCE v2
GID are present; skipped elsewhere with the reason. In the lab,
``test_verbs_cm_interop.py::test_verbs_cm_on_rxe`` runs this file in the
guest. Both ends are on one device (rxe loops back): connect and accept with
private data both ways, a message across, disconnect seen by both sides, the
REJ reasons the kernel's CM sends (8: nobody listens, 28: the consumer
rejected), the connect timeout, and librdmacm's own ``rdma_server`` and
``rdma_client`` (``rdma_create_ep``, a librdmacm-managed QP) as the peer of a
user-managed QP.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address, ip_address
from typing import Any

import pytest

from rdmakit.engine.types import SGE, Access, QpCaps, RecvWR, SendWR, WcStatus, WrOpcode
from tests.lab.verbs_env import NAME, marks

pytestmark = marks(rdma_cm=True)
LIMIT = 60.0


class Side:
    """One end: a device, its CM and one QP with a 4 KiB registered buffer."""

    def __init__(self) -> None:
        from rdmakit.verbs.cm import VerbsCm
        from rdmakit.verbs.device import VerbsDevice

        self.dev = VerbsDevice(NAME)
        self.cm = VerbsCm(self.dev)
        self.qp = self.dev.create_qp(QpCaps())
        self.qp.init()  # receives can be posted before the connection exists
        self.buf = bytearray(4096)
        self.mr = self.dev.register(self.buf, Access.LOCAL_WRITE)
        self.events: list[Any] = []
        self.done: list[Any] = []

    @property
    def ip(self) -> IPv4Address:
        return IPv4Address(self.cm.ip)

    def pump(self) -> None:
        self.events += self.cm.poll()
        self.qp.progress()
        self.done += self.qp.poll(16)

    def kinds(self) -> list[str]:
        return [e.kind.name for e in self.events]

    def close(self) -> None:
        self.cm.close()
        self.dev.close()


@pytest.fixture
def pair() -> Iterator[tuple[Side, Side]]:
    a, b = Side(), Side()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _until(pred: Callable[[], bool], *sides: Side, limit: float = LIMIT) -> None:
    end = time.monotonic() + limit
    while not pred():
        assert time.monotonic() < end, [s.kinds() for s in sides]
        for s in sides:
            s.pump()
        time.sleep(0.001)


def _port() -> int:
    return 20000 + os.getpid() % 20000


def test_connect_accept_send_disconnect(pair: tuple[Side, Side]) -> None:
    """REQ/REP/RTU with private data both ways, a SEND across, DREQ/DREP: both sides see it all."""
    server, client = pair
    port = _port()
    server.cm.listen(port)
    handle = client.cm.connect(client.qp, server.ip, port, b"hello from the client", 20)
    _until(lambda: "CONNECT_REQUEST" in server.kinds(), server, client)
    req = server.events[-1]
    assert req.private_data[:21] == b"hello from the client"
    assert len(req.private_data) <= 56
    assert req.local_port == port
    assert req.peer is not None
    assert req.peer[0] == client.ip
    server.qp.post_recv(RecvWR(wr_id=1, sg_list=(SGE(server.mr.addr, 4096, server.mr.lkey),)))
    server.cm.accept(req.conn, server.qp, b"welcome")
    _until(lambda: "ESTABLISHED" in server.kinds() and "ESTABLISHED" in client.kinds(), server, client)
    est = client.events[-1]
    assert est.conn == handle
    assert est.private_data[:7] == b"welcome"
    from rdmakit.engine.states import QpState

    assert (client.qp.state, server.qp.state) == (QpState.RTS, QpState.RTS)
    msg = b"across the rdma_cm connection"
    client.buf[: len(msg)] = msg
    client.qp.post_send(
        SendWR(wr_id=2, opcode=WrOpcode.SEND, sg_list=(SGE(client.mr.addr, len(msg), client.mr.lkey),))
    )
    _until(lambda: bool(server.done) and bool(client.done), server, client)
    assert [c.status for c in server.done + client.done] == [WcStatus.SUCCESS] * 2
    assert bytes(server.buf[: len(msg)]) == msg
    assert server.done[0].byte_len == len(msg)
    client.cm.disconnect(handle)
    assert client.qp.state is QpState.ERR
    _until(lambda: "DISCONNECTED" in server.kinds() and "DISCONNECTED" in client.kinds(), server, client)
    assert server.qp.state is QpState.ERR
    client.cm.disconnect(handle)  # idempotent


def test_nobody_listening_is_rej_reason_8(pair: tuple[Side, Side]) -> None:
    _, client = pair
    client.cm.connect(client.qp, client.ip, _port() + 1, b"", 20)
    _until(lambda: bool(client.events), client)
    ev = client.events[-1]
    assert (ev.kind.name, ev.reason) == ("REJECTED", 8), ev


def test_a_rejection_is_reason_28_with_the_private_data(pair: tuple[Side, Side]) -> None:
    server, client = pair
    port = _port() + 2
    server.cm.listen(port)
    client.cm.connect(client.qp, server.ip, port, b"", 20)
    _until(lambda: "CONNECT_REQUEST" in server.kinds(), server, client)
    server.cm.reject(server.events[-1].conn, b"go away")
    _until(lambda: "REJECTED" in client.kinds(), server, client)
    ev = client.events[-1]
    assert (ev.reason, ev.private_data[:7]) == (28, b"go away"), ev


def test_listening_twice_is_in_use(pair: tuple[Side, Side]) -> None:
    from rdmakit.verbs import VerbsError

    server, other = pair
    port = _port() + 3
    server.cm.listen(port)
    with pytest.raises(VerbsError) as e:
        server.cm.listen(port)
    assert e.value.code == "IN_USE"
    with pytest.raises(VerbsError) as e:
        other.cm.listen(port)  # the kernel's: another ID has the address
    assert e.value.code == "IN_USE"
    server.cm.stop_listen(port)
    other.cm.listen(port)


def test_private_data_bounds(pair: tuple[Side, Side]) -> None:
    from rdmakit.verbs import VerbsError

    _, client = pair
    with pytest.raises(VerbsError, match="at most 56"):
        client.cm.connect(client.qp, client.ip, _port(), bytes(57), 5)


def test_the_connect_timeout_is_kept(pair: tuple[Side, Side]) -> None:
    """Nobody answers ARP for a lab address nobody has: UNREACHABLE, within the timeout."""
    _, client = pair
    start = time.monotonic()
    client.cm.connect(client.qp, IPv4Address(int(client.ip) ^ 0x7E), _port(), b"", 3)
    _until(lambda: bool(client.events), client, limit=30)
    assert client.kinds() == ["UNREACHABLE"], client.events
    assert time.monotonic() - start < 15


# -- librdmacm's examples as the peer ---------------------------------------------------------------

MSG = 16


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (rdmacm-utils)")
    return path


def test_against_rdma_server(pair: tuple[Side, Side]) -> None:
    """rdma_server (rdma_create_ep, its own QP); we connect a user-managed QP, SEND 16, receive 16."""
    _, client = pair
    port = _port() + 4
    server = subprocess.Popen([_tool("rdma_server"), "-s", str(client.ip), "-p", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        time.sleep(2)
        client.buf[:MSG] = b"rdmakit verbs cm"
        client.qp.post_recv(RecvWR(wr_id=1, sg_list=(SGE(client.mr.addr + 2048, MSG, client.mr.lkey),)))
        handle = client.cm.connect(client.qp, client.ip, port, b"", 20)
        _until(lambda: bool(client.events), client)
        assert client.kinds() == ["ESTABLISHED"], client.events
        client.qp.post_send(
            SendWR(wr_id=2, opcode=WrOpcode.SEND, sg_list=(SGE(client.mr.addr, MSG, client.mr.lkey),))
        )
        _until(lambda: len(client.done) >= 2, client)
        assert [c.status for c in client.done] == [WcStatus.SUCCESS] * 2, client.done
        _until(lambda: "DISCONNECTED" in client.kinds(), client)  # rdma_server disconnects
        client.cm.disconnect(handle)
        out, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, out
    assert "end 0" in out, out


def test_rdma_client_against_us(pair: tuple[Side, Side]) -> None:
    """We listen and accept with a user-managed QP; rdma_client SENDs 16, gets 16 back, disconnects."""
    server, _ = pair
    port = _port() + 5
    server.cm.listen(port)
    client = subprocess.Popen([_tool("rdma_client"), "-s", str(server.ip), "-p", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        _until(lambda: bool(server.events), server)
        assert server.kinds() == ["CONNECT_REQUEST"], server.events
        assert server.events[0].peer[0] == ip_address(str(server.ip))
        server.qp.post_recv(RecvWR(wr_id=1, sg_list=(SGE(server.mr.addr, MSG, server.mr.lkey),)))
        server.cm.accept(server.events[0].conn, server.qp, b"")
        _until(lambda: bool(server.done), server)
        assert server.done[0].status is WcStatus.SUCCESS
        assert server.done[0].byte_len == MSG
        server.buf[2048 : 2048 + MSG] = b"verbs cm replies"
        server.qp.post_send(
            SendWR(wr_id=2, opcode=WrOpcode.SEND, sg_list=(SGE(server.mr.addr + 2048, MSG, server.mr.lkey),))
        )
        _until(lambda: "DISCONNECTED" in server.kinds(), server)
        assert server.kinds() == ["CONNECT_REQUEST", "ESTABLISHED", "DISCONNECTED"]
        out, _ = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    assert client.returncode == 0, out
    assert "end 0" in out, out
