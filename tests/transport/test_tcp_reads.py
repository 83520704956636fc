"""How many system calls the TCP link's reader spends per frame, counted exactly.

Everything a poll could read is already in the socket before it runs (the
kernel's own count, ``FIONREAD``, says so), so the counts do not depend on
timing: large WRITE frames go straight into place with one read each, which
also takes the next frame's headers, the link reads on while frames keep
being placed, and a short read ends the poll without asking again for an
``EAGAIN``.
"""

import fcntl
import socket
import termios
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rdmakit.engine import SGE, Access, Completion, CompletionQueue, QpCaps, SendWR, WcStatus, WrOpcode
from rdmakit.testing.engine import until_completions
from rdmakit.transport import tcp
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.transport.tcp import TcpLink
from rdmakit.transport.tcp_limits import DIRECT_MIN, READ_TURN, Placed, Route
from rdmakit.wire import BTH_LEN, RETH, Opcode, Packet, decode

QPN = 0x21
#: BTH and RETH: the headers of a WRITE ONLY frame.
_HLEN = BTH_LEN + 16


def _write(psn: int, size: int) -> Packet:
    return Packet(Opcode.RDMA_WRITE_ONLY, QPN, psn, reth=RETH(0x1000, 7, size), payload=bytes([psn]) * size)


class _Counted:
    """A socket whose reads are counted (the calls, and those that found nothing)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reads = 0
        self.empty = 0

    def _count(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.reads += 1
        try:
            return fn(*args)
        except BlockingIOError:
            self.empty += 1
            raise

    def recv_into(self, *args: Any) -> Any:
        return self._count(self.sock.recv_into, *args)

    def recvmsg_into(self, *args: Any) -> Any:
        return self._count(self.sock.recvmsg_into, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _Links:
    def __init__(self, new_ip: Callable[[], str]) -> None:
        self.a, self.b = TcpLink(new_ip(), 0), TcpLink(new_ip(), 0)
        # Room in the receiving socket for everything a test sends before it reads.
        self.b.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, tcp._BUF)
        self.route = Route(self.b.ip, self.b.port, QPN, self.b.issue(QPN, 1 << 20))
        self.homes: list[bytearray] = []
        self.b.place = self._place
        # One large frame opens and authenticates the stream (after it, the reader
        # takes a frame's headers first, so that the next large one may go into place).
        self.a.send_packets([_write(0, DIRECT_MIN)], self.route)
        end = time.monotonic() + 10
        got: list[object] = []
        while not got and time.monotonic() < end:
            got += [f for frames, _, _ in self.b.poll(time.monotonic()) for f in frames]
            time.sleep(0.001)
        assert len(got) == 1
        assert self.b.streams == 1
        self.homes.clear()
        (self.stream,) = [s for s in self.b._by_fd.values() if s.grant is not None]
        self.counted = _Counted(self.stream.sock)

    def _place(self, ip: str, head: memoryview, n: int) -> tuple[int, memoryview] | None:
        if head[0] != Opcode.RDMA_WRITE_ONLY:
            return None
        self.homes.append(bytearray(n - _HLEN))
        return _HLEN, memoryview(self.homes[-1])

    def send_and_wait(self, pkts: list[Packet]) -> None:
        """Send ``pkts`` and wait until every byte of them sits in the receiving socket."""
        want = sum(4 + _HLEN - (16 if p.reth is None else 0) + len(p.payload) for p in pkts)
        self.a.send_packets(pkts, self.route)
        end = time.monotonic() + 30
        while self._queued() < want:
            assert time.monotonic() < end, f"{self._queued()} of {want} bytes arrived"
            list(self.a.poll(time.monotonic()))  # flushes what the socket did not take yet
            time.sleep(0.001)
        assert self._queued() == want

    def _queued(self) -> int:
        got = bytearray(4)
        fcntl.ioctl(self.stream.sock.fileno(), termios.FIONREAD, got)
        return int.from_bytes(got, "little")

    def poll_once(self) -> list[list[memoryview | Placed]]:
        """One poll of the receiving link, its reads counted; the batches of frames it gave."""
        self.stream.sock = self.counted  # type: ignore[assignment]
        try:
            return [list(frames) for frames, _, dead in self.b.poll(time.monotonic()) if dead is None]
        finally:
            self.stream.sock = self.counted.sock

    def close(self) -> None:
        self.a.close()
        self.b.close()


@pytest.fixture
def links(new_ip: Callable[[], str]) -> Iterator[_Links]:
    got = _Links(new_ip)
    yield got
    got.close()


def test_large_frames_cost_one_read_each_in_one_poll(links: _Links) -> None:
    n = READ_TURN - 2
    size = 4 * DIRECT_MIN
    links.send_and_wait([_write(psn, size) for psn in range(1, n + 1)])
    batches = links.poll_once()
    # Every frame placed in this one poll, each handed over on its own.
    assert [len(b) for b in batches] == [1] * n
    assert all(type(b[0]) is Placed for b in batches)
    assert [bytes(h) for h in links.homes] == [bytes([psn]) * size for psn in range(1, n + 1)]
    # The first frame's headers, then one read per frame (which takes the next headers too).
    assert links.counted.reads == n + 1
    assert links.counted.empty == 0


def test_a_poll_reads_on_for_at_most_read_turn_frames(links: _Links) -> None:
    n = READ_TURN + 3
    links.send_and_wait([_write(psn, DIRECT_MIN) for psn in range(1, n + 1)])
    assert len(links.poll_once()) == READ_TURN  # the other ready streams get their turn
    assert len(links.poll_once()) == n - READ_TURN
    assert len(links.homes) == n


def test_a_short_read_ends_the_poll_without_an_empty_read(links: _Links) -> None:
    small = [Packet(Opcode.SEND_ONLY, QPN, psn, payload=b"x" * 40) for psn in range(34)]
    links.send_and_wait(small[:1])
    links.poll_once()  # (after a small frame, the reader no longer takes headers first)
    links.counted = _Counted(links.stream.sock)
    links.send_and_wait(small[1:])
    (batch,) = links.poll_once()
    assert [decode(f).psn for f in batch if isinstance(f, memoryview)] == list(range(1, 34))
    assert links.counted.reads == 1  # everything was there: the read was short, so nothing more is
    assert links.counted.empty == 0


def test_a_placed_frame_is_answered_before_the_next_is_read(new_ip: Callable[[], str]) -> None:
    """The responder's ACKs leave between the placed frames of one poll, not after all of them."""
    a = SoftDevice(new_ip(), transport="tcp", port=0)
    b = SoftDevice(new_ip(), transport="tcp", port=0, bulk=True)
    try:
        assert a.tcp is not None
        assert b.tcp is not None
        for link in (a.tcp, b.tcp):  # accepted streams inherit the listener's buffer size
            link.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, tcp._BUF)
        cqa, cqb = CompletionQueue(64), CompletionQueue(64)
        caps = QpCaps(large_mtu=True)
        qa = a.create_qp(send_cq=cqa, recv_cq=cqa, caps=caps)
        qb = b.create_qp(send_cq=cqb, recv_cq=cqb, caps=caps)
        connect_qp(a, qa, 10, local_endpoint(b, qb, 20, 1 << 20))
        connect_qp(b, qb, 20, local_endpoint(a, qa, 10, 1 << 20))
        size, n = 4 * DIRECT_MIN, READ_TURN - 2
        src = bytearray(size)
        dst = bytearray(size * (n + 1))
        mra = a.pd.register(src, 0x10_0000, Access.LOCAL_WRITE)
        mrb = b.pd.register(dst, 0x900_0000, Access.LOCAL_WRITE | Access.REMOTE_WRITE)

        def post(i: int) -> None:
            sge = (SGE(mra.addr, size, mra.lkey),)
            wr = SendWR(
                wr_id=i,
                opcode=WrOpcode.RDMA_WRITE,
                sg_list=sge,
                remote_addr=mrb.addr + i * size,
                rkey=mrb.rkey,
            )
            qa.post_send(wr)

        def pump(until: Callable[[], bool], *devs: SoftDevice) -> None:
            end = time.monotonic() + 30
            while not until():
                assert time.monotonic() < end
                for d in devs:
                    d.progress(time.monotonic())

        got: list[Completion] = []
        post(0)  # opens the stream; after it the reader takes headers first
        pump(until_completions(cqa, got), a, b)
        (stream,) = [s for s in b.tcp._by_fd.values() if s.grant is not None]
        want = n * (4 + _HLEN + size)
        for i in range(1, n + 1):
            post(i)

        def queued() -> int:
            buf = bytearray(4)
            fcntl.ioctl(stream.sock.fileno(), termios.FIONREAD, buf)
            return int.from_bytes(buf, "little")

        pump(lambda: queued() >= want, a)
        assert queued() == want
        out0, placed0 = b.counters.packets_out, b.counters.placed
        b.progress(time.monotonic())
        assert b.counters.placed - placed0 == n  # every frame of this poll went into place
        acks = b.counters.packets_out - out0
        assert acks >= n // 2  # one per frame that asked for one (not one for the whole poll)
        pump(until_completions(cqa, got, n + 1), a, b)
        assert all(wc.status is WcStatus.SUCCESS for wc in got)
    finally:
        a.close()
        b.close()


class _CountedPoll:
    """An epoll object whose ``poll`` calls are counted."""

    def __init__(self, ep: Any) -> None:
        self.ep = ep
        self.polls = 0

    def poll(self, *args: Any) -> Any:
        self.polls += 1
        return self.ep.poll(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ep, name)


def test_an_idle_pump_turn_looks_at_no_socket_of_the_link(new_ip: Callable[[], str]) -> None:
    """The driver's own poll already says the link has nothing: no second ``epoll_wait``."""
    dev = SoftDevice(new_ip(), transport="tcp", port=0)
    drv = Driver()
    try:
        drv.add(dev)
        link = dev.tcp
        assert link is not None
        counted = _CountedPoll(link._ep)
        link._ep = counted  # type: ignore[assignment]
        for _ in range(50):
            drv.progress()
        assert counted.polls == 0
        # Once the link is readable, its poll does look (a peer connects).
        with socket.create_connection((link.ip, link.port)):
            end = time.monotonic() + 10
            while link.pending == 0:
                assert time.monotonic() < end
                drv.progress()
        assert counted.polls > 0
        link._ep = counted.ep
    finally:
        dev.close()
        drv.close()
