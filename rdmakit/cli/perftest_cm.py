"""perftest's ``-R`` (``--rdma_cm``) and ``-z`` (``--comm_rdma_cm``): the exchange and the QPs over RDMA CM.

With either flag perftest's out-of-band exchange is not TCP but an RC
connection of its own, made with ``rdma_cm`` on the exchange's port
(``rdma_client_connect``/``rdma_server_connect`` in
``perftest_communication.c``, v4.5-0.17): one SEND per message, one
receive of ``sizeof(struct pingpong_dest)`` posted at a time and reposted
once read (``post_one_recv_wqe``, ``rdma_read_data``). The key message is
the binary ``struct pingpong_dest``, its fields big-endian (``rdma_write_keys``);
every other message has the size it has over TCP.

With ``-R`` the test's QPs are connected by ``rdma_cm`` too
(``create_rdma_cm_connection``): after a barrier the server listens on the
same port again and accepts one request per QP; the client connects each
QP, retrying while nobody listens; a second barrier follows. The key
exchange then only carries the rkey and address. At the end the client
disconnects every test connection (``rdma_cm_disconnect_nodes``), and the
exchange's connection is dropped last.

What a peer sends is checked: a message must have the size the step
expects, and no more requests are accepted than there are QPs. The
exchange's connection is the first request whose sender completes it
(ESTABLISHED: it received our REP at the address it claimed and answered
with its RTU), not the first request: the server accepts up to
`ACCEPT_CANDIDATES` at once, each with a QP of its own. A test QP's request must
come from that client: its address and, where the backend reports it, the
CA GUID of its connection manager (the REQ's Local CA GUID).
"""

import contextlib
import struct
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from ipaddress import IPv6Address, ip_address
from typing import TypeVar

from rdmakit.cli.bench_qp import Memory, TestQp, pump
from rdmakit.cli.errors import CliError
from rdmakit.cli.oob_messages import OobFormatError, PerftestDest
from rdmakit.doca import DocaError
from rdmakit.doca.backend import BackendCm, BackendDevice, CmEvent, CmEventKind
from rdmakit.engine.cm_events import ACCEPT_CANDIDATES
from rdmakit.engine.types import SGE, Access, Completion, RecvWR, SendWR, WcOpcode, WrOpcode
from rdmakit.transport.oob import OobError

__all__ = ["KEY_BIN_LEN", "CmLink", "CmQps", "decode_dest", "encode_dest"]

#: ``struct pingpong_dest``: lid, out_reads, qpn, psn, rkey, (pad), vaddr, gid, srqn, gid_index.
_KEY = struct.Struct(">iiiiI4xQ16sIi")
KEY_BIN_LEN = _KEY.size  # 56: the exchange's receive size
#: After this long without the peer's DREQ (or DREP), a connection is dropped without it.
LINGER = 5.0
_WR_RECV, _WR_SEND = 1, 2
T = TypeVar("T")


def encode_dest(d: PerftestDest, gid_index: int = 0) -> bytes:
    """``rdma_write_keys``: the struct with its fields in network order."""
    return _KEY.pack(d.lid, d.out_reads, d.qpn, d.psn, d.rkey, d.vaddr, d.gid.packed, d.srqn, gid_index)


def decode_dest(raw: bytes) -> PerftestDest:
    """``rdma_read_keys``: the peer's struct, its fields bounded as the TCP key message's are."""
    if len(raw) != KEY_BIN_LEN:
        raise OobFormatError(f"perftest key message: {len(raw)} bytes, expected {KEY_BIN_LEN}")
    lid, out_reads, qpn, psn, rkey, vaddr, gid, srqn, _ = _KEY.unpack(raw)
    for name, value, bits in (("LID", lid, 16), ("outstanding reads", out_reads, 16), ("QPN", qpn, 24)):
        if not 0 <= value < 1 << bits:
            raise OobFormatError(f"perftest key message: {name} {value} is out of range")
    return PerftestDest(
        lid=lid, out_reads=out_reads, qpn=qpn, psn=psn & 0xFFFFFF, rkey=rkey, vaddr=vaddr,
        gid=IPv6Address(gid), srqn=srqn,
    )  # fmt: skip


class _Events:
    """The device's CM events, kept per connection until asked for; requests in their own queue."""

    def __init__(self, cm: BackendCm) -> None:
        self.cm = cm
        self.requests: deque[CmEvent] = deque()
        self.by_conn: dict[int, deque[CmEvent]] = {}

    def poll(self) -> bool:
        got = False
        for ev in self.cm.poll_events():
            got = True
            if ev.kind is CmEventKind.CONNECT_REQUEST:
                self.requests.append(ev)
            else:
                self.by_conn.setdefault(ev.conn, deque()).append(ev)
        return got

    def take(self, conn: int) -> CmEvent | None:
        q = self.by_conn.get(conn)
        return q.popleft() if q else None


def _fail(ev: CmEvent, what: str) -> CliError:
    return CliError(f"{what}: RDMA CM event {ev.kind.name}{f': {ev.detail}' if ev.detail else ''}")


class CmLink:
    """The exchange over an RC connection: ``OobStream``'s ``send``/``recv_exact``/``close``."""

    def __init__(self, dev: BackendDevice, port: int, timeout: float) -> None:
        self.dev, self.port, self.timeout = dev, port, timeout
        try:
            self.cm = dev.cm()
        except DocaError as e:
            raise CliError(f"{dev.name}: no RDMA CM here ({e.message}); drop -R/-z") from e
        self.events = _Events(self.cm)
        self.mem = Memory(dev, 4096, Access.LOCAL_WRITE)
        self.qp = TestQp(dev, send_depth=1, recv_depth=1)
        self.conn: int | None = None
        self.peer: str = ""
        self.peer_guid = 0  # the client's CA GUID, where the backend reports it
        self.client = False
        self._wcs: deque[Completion] = deque()
        self._post_recv()

    # -- the connection ---------------------------------------------------------------------------

    def wait(self, done: Callable[[], bool], what: str, timeout: float | None = None) -> None:
        """Progress the device and collect events and the exchange QP's completions until `done`."""

        def on_wc(_: int, wc: Completion) -> None:
            self._wcs.append(wc)

        pump([self.qp], on_wc, done, self.timeout if timeout is None else timeout, what, self.events.poll)

    def wait_for(self, take: Callable[[], T | None], what: str, timeout: float | None = None) -> T:
        """`wait` until `take` returns something; that."""
        got: list[T] = []

        def done() -> bool:
            if not got and (item := take()) is not None:
                got.append(item)
            return bool(got)

        self.wait(done, what, timeout)
        return got[0]

    def connect(self, server: str) -> None:
        """The client (``rdma_client_connect``), retrying while the server does not listen yet."""
        self.peer, self.client = str(ip_address(server)), True
        self.conn = connect_retrying(self, self.qp, self.peer, "the exchange's connection")

    def accept(self, timeout: float) -> None:
        """The server (``rdma_server_connect``): the first request that connects, then the port is
        closed. Each request is accepted with a QP of its own (the oldest of `ACCEPT_CANDIDATES` is
        dropped for a new one); the first ESTABLISHED is the exchange's, the others are dropped."""
        events = self.events
        cands: dict[int, tuple[TestQp, CmEvent]] = {}
        won: list[tuple[TestQp, CmEvent]] = []

        def drop(conn: int) -> None:
            qp, _ = cands.pop(conn)
            self.cm.disconnect(conn)
            qp.close()

        def settle() -> bool:
            while events.requests:
                req = events.requests.popleft()
                if len(cands) >= ACCEPT_CANDIDATES:
                    drop(next(iter(cands)))
                qp = TestQp(self.dev, send_depth=1, recv_depth=1)
                qp.post_recv(self._recv_wr())
                self.cm.accept(req.conn, qp.qp, b"")
                cands[req.conn] = (qp, req)
            for conn in list(cands):
                while not won and (ev := events.take(conn)) is not None:
                    if ev.kind is CmEventKind.ESTABLISHED:
                        won.append(cands.pop(conn))
                    else:  # refused, unreachable or gone before it connected
                        cands.pop(conn)[0].close()
            return bool(won)

        self.cm.listen(self.port)
        try:
            self.wait(settle, "a connection request", timeout)
        finally:
            self.cm.stop_listen(self.port)
            for conn in list(cands):
                drop(conn)
            for extra in events.requests:
                self.cm.reject(extra.conn, b"")
            events.requests.clear()
        ((qp, req),) = won
        self.qp.close()
        self.qp = qp
        self.conn, self.peer, self.peer_guid = req.conn, str(req.peer[0]) if req.peer else "", req.peer_guid

    def _check_conn(self) -> None:
        if self.conn is None:
            return
        ev = self.events.take(self.conn)
        if ev is None or ev.kind is CmEventKind.ESTABLISHED:
            return
        raise OobError(f"the exchange's connection ended: {ev.kind.name} {ev.detail}".rstrip())

    # -- OobStream's surface ----------------------------------------------------------------------

    def _recv_wr(self) -> RecvWR:
        return RecvWR(wr_id=_WR_RECV, sg_list=(SGE(self.mem.addr, KEY_BIN_LEN, self.mem.lkey),))

    def _post_recv(self) -> None:
        self.qp.post_recv(self._recv_wr())

    def _take(self, opcode: WcOpcode) -> Completion | None:
        """The next completion of `opcode`; the connection's end is only an error without one."""
        for i, wc in enumerate(self._wcs):
            if wc.opcode is opcode:
                del self._wcs[i]
                return wc
        self._check_conn()
        return None

    def send(self, data: bytes) -> None:
        if len(data) > KEY_BIN_LEN:
            raise OobError(f"an exchange message of {len(data)} bytes does not fit {KEY_BIN_LEN}")
        off = 2048  # the send half of the buffer
        self.mem.view[off : off + len(data)] = data
        sge = SGE(self.mem.addr + off, len(data), self.mem.lkey)
        self.qp.post_send(SendWR(wr_id=_WR_SEND, opcode=WrOpcode.SEND, sg_list=(sge,)))
        self.wait_for(lambda: self._take(WcOpcode.SEND), "the SEND of an exchange message")

    def recv_exact(
        self, n: int, timeout: float, what: str, service: object = None, service_fd: int = -1
    ) -> bytes:
        wc = self.wait_for(lambda: self._take(WcOpcode.RECV), what, timeout)
        if wc.byte_len != n:
            raise OobError(f"{self.peer}: {what}: a message of {wc.byte_len} bytes, expected {n}")
        data = bytes(self.mem.view[:n])
        self._post_recv()
        return data

    def close(self) -> None:
        """Drop the exchange's connection: the client sends a DREQ (perftest's ``rdma_destroy_id``
        does); the server waits a little for it, then sends its own."""
        if self.conn is not None:
            conn, self.conn = self.conn, None
            disconnect(self, [conn], ours=self.client)
        self.qp.close()
        self.mem.close()

    def __enter__(self) -> "CmLink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_retrying(link: CmLink, qp: TestQp, server: str, what: str) -> int:
    """Connect `qp` to `server` on the link's port; REJ "no listener" is retried until the timeout."""
    end = time.monotonic() + link.timeout
    while True:
        try:
            conn = link.cm.connect(qp.qp, ip_address(server), link.port, b"", link.timeout)
        except DocaError as e:
            raise CliError(f"{what}: {e.message}") from e
        ev = link.wait_for(partial(link.events.take, conn), what)  # ESTABLISHED, or why not
        if ev.kind is CmEventKind.ESTABLISHED:
            return conn
        if ev.kind is CmEventKind.REJECTED and ev.reason == 8 and time.monotonic() < end:
            time.sleep(0.1)  # the server is not listening yet: perftest's client retries every 100 ms
            continue
        raise _fail(ev, f"{what} to {server}:{link.port}")


def accept_requests(link: CmLink, qps: list[TestQp], timeout: float) -> list[CmEvent]:
    """Listen on the link's port until a request of the exchange's client is accepted for each
    of `qps`, in order; then the port is closed and requests left over are rejected."""
    events = link.events
    accepted: list[CmEvent] = []

    def next_request() -> CmEvent | None:
        return events.requests.popleft() if events.requests else None

    link.cm.listen(link.port)
    try:
        while len(accepted) < len(qps):
            req = link.wait_for(next_request, "a connection request", timeout)
            if not _from_client(link, req):
                link.cm.reject(req.conn, b"")
                continue
            link.cm.accept(req.conn, qps[len(accepted)].qp, b"")
            accepted.append(req)
    finally:
        link.cm.stop_listen(link.port)
    for extra in events.requests:
        link.cm.reject(extra.conn, b"")
    events.requests.clear()
    return accepted


def _from_client(link: CmLink, req: CmEvent) -> bool:
    """Whether `req` comes from the exchange's client: its address, and its CM's CA GUID where
    the backend reports both."""
    if req.peer is None or str(req.peer[0]) != link.peer:
        return False
    return not (link.peer_guid and req.peer_guid) or req.peer_guid == link.peer_guid


def disconnect(link: CmLink, conns: list[int], *, ours: bool) -> None:
    """End `conns`: `ours` sends the DREQs at once (the client); otherwise the peer's are awaited
    for `LINGER` seconds first. Either way each connection's DISCONNECTED is awaited that long."""
    left = set(conns)

    def gone() -> bool:
        for c in list(left):
            while (ev := link.events.take(c)) is not None:
                if ev.kind is not CmEventKind.ESTABLISHED:
                    left.discard(c)
        return not left

    if not ours:
        with contextlib.suppress(CliError):  # the peer sends none: ours follow
            link.wait(gone, "the peer's disconnect", LINGER)
    for c in left:
        link.cm.disconnect(c)
    with contextlib.suppress(CliError):  # the peer is gone: nothing more to wait for
        link.wait(gone, "the disconnect", LINGER)


class CmQps:
    """``-R``'s test connections: one per QP, made after the exchange's first barrier."""

    def __init__(self, link: CmLink, qps: list[TestQp]) -> None:
        self.link, self.qps = link, qps
        self.conns: list[int] = []

    def connect(self, server: str) -> None:
        for i, q in enumerate(self.qps):
            self.conns.append(connect_retrying(self.link, q, server, f"QP {i}'s connection"))

    def accept(self) -> None:
        """Only the exchange's peer connects the test's QPs."""
        link = self.link
        self.conns = [r.conn for r in accept_requests(link, self.qps, link.timeout)]

    def close(self, client: bool) -> None:
        """``rdma_cm_disconnect_nodes``: the client disconnects, the server waits for it."""
        conns, self.conns = self.conns, []
        if conns:
            disconnect(self.link, conns, ours=client)
