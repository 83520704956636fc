"""``rdmakit rping``: rdma-core's ``rping``, over rdmakit's ``rdma_cm`` on a soft RoCE-UDP device.

Follows ``librdmacm/examples/rping.c``. The client connects by address
(port 7174, the TCP port space), then each ping is:

1. the client fills its start buffer with ``rdma-ping-N: `` and a rolling
   run of the letters A..z, and SENDs its address, rkey and size (the 16-byte
   ``struct rping_rdma_info``, big-endian);
2. the server RDMA READs that buffer, then SENDs a "go ahead";
3. the client SENDs the same for its sink buffer;
4. the server RDMA WRITEs what it read (up to its NUL) into the sink, and
   SENDs a "go ahead"; the client compares the two buffers (``-V``) and
   prints the sink (``-v``).

The server serves one connection, until the client disconnects; it acts
only on its own connection's events and refuses every other request once
it has one (REJ "consumer reject", 28). Until then it accepts each request
with a QP of its own (at most `ACCEPT_CANDIDATES`, the oldest dropped for a new
one) and keeps the first that becomes ESTABLISHED: a request from an
address where nobody answers our REP never connects, so it can neither
end a run nor keep the real client out. Flags are
rping's: ``-s``/``-c``, ``-a ADDR``, ``-I ADDR`` (the client's source),
``-p PORT``, ``-C COUNT``, ``-S SIZE``, ``-v``, ``-V``, ``-d``. A server
needs ``-a``: a soft device is bound to one address. What the peer
advertises is checked: a SEND must be exactly 16 bytes, and a buffer the
server is asked to read must fit its own ``-S``.
"""

import argparse
import contextlib
import errno
import ipaddress
import struct
import sys
import time
from collections.abc import Callable

from rdmakit.cli.errors import EXIT_USAGE, CliError
from rdmakit.cli.lifecycle import run
from rdmakit.cli.options import int_in
from rdmakit.cli.tool_flags import RPING_FLAGS, add_unimplemented, refuse_given
from rdmakit.engine import (
    SGE,
    Access,
    Completion,
    CompletionQueue,
    EngineError,
    QueuePair,
    RecvWR,
    SendWR,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from rdmakit.engine.cm_events import ACCEPT_CANDIDATES
from rdmakit.transport.cma import CmaEvent, CmaEventKind, RdmaCm, route_source
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import wait_readable
from rdmakit.transport.in_use import address_in_use
from rdmakit.wire import ROCE_UDP_PORT

__all__ = ["register"]

DEFAULT_PORT = 7174
INFO = struct.Struct(">QII")  # struct rping_rdma_info: buf, rkey, size
MIN_SIZE = len("2147483647") + 1 + len("rdma-ping-%d: ") + 1  # RPING_MIN_BUFSIZE
MAX_SIZE = 64 * 1024 - 1
#: Where rping's buffers sit in the soft device's address space.
RECV_ADDR, SEND_ADDR, RDMA_ADDR, START_ADDR = 0x10000, 0x20000, 0x100000, 0x200000
CONNECT_TIMEOUT = 60.0
#: The longest block without looking at the device again (a deadline set by our own posts).
_MAX_WAIT = 0.05
#: rping.c's ``cb->state`` after a DISCONNECTED event (``enum test_state``).
_DISCONNECTED = 10
_REASONS = {8: "no listener (invalid service ID)", 28: "rejected by the peer", 10: "stale connection"}


class Rping:
    """One side: the device, its rdma_cm, the QP's buffers and the event pump."""

    def __init__(self, args: argparse.Namespace, ip: str) -> None:
        self.args = args
        self.dev = SoftDevice(ip)
        self.cm = RdmaCm(self.dev, mtu=1024)
        self.cq = CompletionQueue(64)
        self.size: int = args.size
        self.recv_buf, self.send_buf = bytearray(INFO.size), bytearray(INFO.size)
        self.rdma_buf, self.start_buf = bytearray(self.size), bytearray(self.size)
        pd, rw = self.dev.pd, Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE
        self.recv_mr = pd.register(self.recv_buf, RECV_ADDR, Access.LOCAL_WRITE)
        self.send_mr = pd.register(self.send_buf, SEND_ADDR, Access(0))
        self.rdma_mr = pd.register(self.rdma_buf, RDMA_ADDR, rw)
        self.start_mr = pd.register(self.start_buf, START_ADDR, rw)
        self.qp: QueuePair = self.dev.create_qp(send_cq=self.cq, recv_cq=self.cq)
        self.conn: int | None = None  # this side's connection, once it asked for or connected one
        self.candidates: dict[int, QueuePair] = {}  # server: accepted requests, not yet connected
        self.disconnected = False
        self.wcs: list[Completion] = []
        self.events: list[CmaEvent] = []

    def debug(self, text: str) -> None:
        if self.args.debug:
            print(text, flush=True)

    def close(self) -> None:
        self.dev.close()

    # -- pumping ------------------------------------------------------------------------------------

    def pump(self) -> None:
        """Progress the device; keep connection events (`events`) and completions (`wcs`)."""
        now = time.monotonic()
        self.dev.progress(now)
        while (ev := self.cm.poll_event(now)) is not None:
            self.debug(f"cma_event type {ev.kind.name}")
            if ev.conn in self.candidates:
                pass  # the server's accept loop decides
            elif ev.conn != self.conn:  # another connection's event: not this run's business
                if ev.kind is not CmaEventKind.CONNECT_REQUEST:
                    continue
                if self.conn is not None:  # one connection at a time
                    self.refuse(ev.conn, now)
                    continue
            elif ev.kind is CmaEventKind.DISCONNECTED:
                print(f"{'server' if self.args.server else 'client'} DISCONNECT EVENT...", file=sys.stderr)
                self.disconnected = True
            elif ev.kind in (CmaEventKind.REJECTED, CmaEventKind.UNREACHABLE):
                why = _REASONS.get(ev.reason or 0, "")
                raise CliError(f"cma event {ev.kind.name}, error {ev.reason}{f': {why}' if why else ''}")
            self.events.append(ev)
        for wc in self.cq.poll(16):
            if wc.status is WcStatus.WR_FLUSH_ERR or (self.conn is not None and wc.qp_num != self.qp.qpn):
                continue
            if wc.status is not WcStatus.SUCCESS:
                raise CliError(f"cq completion failed status {wc.status.value} ({wc.status.name})")
            self.wcs.append(wc)

    def refuse(self, conn: int, now: float) -> None:
        """REJ "consumer reject" (28) to a request this side will not take; one already gone is fine."""
        with contextlib.suppress(EngineError):
            self.cm.reject(conn, now)

    def wait_for(self, what: str, done: Callable[[], bool], limit: float | None = None) -> bool:
        """Pump until `done`; False if the peer disconnected first."""
        end = None if limit is None else time.monotonic() + limit
        while not done():
            self.pump()
            if self.disconnected and not done():
                return False
            now = time.monotonic()
            if end is not None and now > end:
                raise CliError(f"timed out after {limit:.0f} s waiting for {what}")
            # Block until a datagram or the engines' next deadline (rping sleeps in sem_wait).
            deadline = self.dev.next_deadline()
            left = _MAX_WAIT if deadline is None else min(max(deadline - now, 0.0), _MAX_WAIT)
            if end is not None:
                left = min(left, max(end - now, 0.0))
            if left > 0:
                wait_readable(self.dev.fileno(), left)
        return True

    def wait_events(self, what: str, limit: float | None = None) -> list[CmaEvent]:
        """Pump until a connection event (a CONNECT_REQUEST or ESTABLISHED) comes; the events so far."""
        self.wait_for(what, lambda: bool(self.events), limit)
        events, self.events = self.events, []
        return events

    def wait_wc(self, opcode: WcOpcode, state: str) -> bool:
        """Wait for a completion of `opcode` (rping's `state` next); False, said as rping says it,
        if the peer disconnected first."""

        def got() -> bool:
            for i, wc in enumerate(self.wcs):
                if wc.opcode is opcode:
                    del self.wcs[i]
                    if opcode is WcOpcode.RECV and wc.byte_len != INFO.size:
                        raise CliError(f"Received bogus data, size {wc.byte_len}")
                    return True
            return False

        if self.wait_for(opcode.name, got):
            return True
        print(f"wait for {state} state {_DISCONNECTED}", file=sys.stderr)
        return False

    # -- verbs ---------------------------------------------------------------------------------------

    def post_recv(self, qp: QueuePair | None = None) -> None:
        (qp or self.qp).post_recv(RecvWR(wr_id=1, sg_list=(SGE(RECV_ADDR, INFO.size, self.recv_mr.lkey),)))

    def send_info(self, addr: int, rkey: int, size: int) -> None:
        self.send_buf[:] = INFO.pack(addr, rkey, size)
        self.debug(f"RDMA addr {addr:x} rkey {rkey:x} len {size}")
        self.send_go()

    def send_go(self) -> None:
        sge = SGE(SEND_ADDR, INFO.size, self.send_mr.lkey)
        self.qp.post_send(SendWR(wr_id=2, opcode=WrOpcode.SEND, sg_list=(sge,)))

    def rdma(self, opcode: WrOpcode, length: int, remote: tuple[int, int]) -> None:
        addr, rkey = remote
        sge = SGE(RDMA_ADDR, length, self.rdma_mr.lkey)
        self.qp.post_send(SendWR(wr_id=3, opcode=opcode, sg_list=(sge,), remote_addr=addr, rkey=rkey))


def _cstr(buf: bytearray) -> str:
    end = buf.find(0)
    return bytes(buf[: end if end >= 0 else len(buf)]).decode("ascii", errors="replace")


def _accept(r: Rping) -> None:
    """Accept requests, each with a QP of its own, until one is ESTABLISHED; that one is the run's."""
    cands = r.candidates
    while r.conn is None:
        events = r.wait_events("a connection request")
        now = time.monotonic()
        for ev in events:
            if ev.kind is CmaEventKind.CONNECT_REQUEST and r.conn is None:
                if len(cands) >= ACCEPT_CANDIDATES:  # the oldest has had its chance
                    _drop(r, next(iter(cands)), now)
                qp = cands[ev.conn] = r.dev.create_qp(send_cq=r.cq, recv_cq=r.cq)
                r.cm.accept(ev.conn, qp, now)  # RTS now; the REP leaves at the next pump
                r.post_recv(qp)
            elif ev.kind is CmaEventKind.CONNECT_REQUEST:
                r.refuse(ev.conn, now)
            elif ev.kind is CmaEventKind.ESTABLISHED and r.conn is None:
                r.debug(f"connected to {ev.peer_ip}")
                r.dev.destroy_qp(r.qp)
                r.conn, r.qp = ev.conn, cands.pop(ev.conn)
                r.wcs = [wc for wc in r.wcs if wc.qp_num == r.qp.qpn]
            elif ev.conn in cands:  # refused, timed out or gone before it connected
                r.dev.destroy_qp(cands.pop(ev.conn))
    for conn in list(cands):
        _drop(r, conn, time.monotonic())


def _drop(r: Rping, conn: int, now: float) -> None:
    """Forget a request the server accepted but will not serve (a DREQ tells its sender)."""
    with contextlib.suppress(EngineError):
        r.cm.disconnect(conn, now)
    r.dev.destroy_qp(r.candidates.pop(conn))


def _server(r: Rping) -> int:
    r.cm.listen(r.args.port)
    _accept(r)
    while True:
        if not r.wait_wc(WcOpcode.RECV, "RDMA_READ_ADV"):
            return 0
        addr, rkey, length = INFO.unpack(r.recv_buf)
        r.post_recv()
        if not 0 < length <= r.size:
            raise CliError(f"the client advertised {length} bytes to read; this server's -S is {r.size}")
        r.rdma(WrOpcode.RDMA_READ, length, (addr, rkey))
        if not r.wait_wc(WcOpcode.RDMA_READ, "RDMA_READ_COMPLETE"):
            return 0
        if r.args.verbose:
            print(f"server ping data: {_cstr(r.rdma_buf)}", flush=True)
        r.send_go()
        if not r.wait_wc(WcOpcode.RECV, "RDMA_WRITE_ADV"):
            return 0
        addr, rkey, length = INFO.unpack(r.recv_buf)
        r.post_recv()
        n = min(len(_cstr(r.rdma_buf)) + 1, r.size, length)
        r.rdma(WrOpcode.RDMA_WRITE, n, (addr, rkey))
        if not r.wait_wc(WcOpcode.RDMA_WRITE, "RDMA_WRITE_COMPLETE"):
            return 0
        r.send_go()


def _fill(buf: bytearray, ping: int, start: int) -> None:
    head = f"rdma-ping-{ping}: ".encode()[: len(buf)]
    buf[: len(head)] = head
    c = start
    for i in range(len(head), len(buf)):
        buf[i] = c
        c = 65 if c >= 122 else c + 1
    buf[-1] = 0


def _client(r: Rping, peer: str) -> int:
    r.conn = r.cm.connect(peer, r.args.port, r.qp, time.monotonic())  # the QP is in INIT from here
    r.post_recv()
    events = r.wait_events("the connection", CONNECT_TIMEOUT)
    start, ping = 65, 0
    while not r.args.count or ping < r.args.count:
        _fill(r.start_buf, ping, start)
        start = 65 if start >= 122 else start + 1
        r.send_info(START_ADDR, r.start_mr.rkey, r.size)
        if not r.wait_wc(WcOpcode.RECV, "RDMA_WRITE_ADV"):
            return 0  # rping: the peer disconnected, not an error
        r.post_recv()
        r.send_info(RDMA_ADDR, r.rdma_mr.rkey, r.size)
        if not r.wait_wc(WcOpcode.RECV, "RDMA_WRITE_COMPLETE"):
            return 0
        r.post_recv()
        if r.args.validate and r.start_buf != r.rdma_buf:
            raise CliError("data mismatch!")
        if r.args.verbose:
            print(f"ping data: {_cstr(r.rdma_buf)}", flush=True)
        ping += 1
    r.cm.disconnect(next(iter([e.conn for e in events])), time.monotonic())
    r.wait_for("the disconnection", lambda: r.disconnected, 30)
    return 0


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from None


_integer = int_in(-(1 << 31), (1 << 31) - 1)  # rping's atoi() into an int


def _size(text: str) -> int:
    n = _integer(text)
    if not MIN_SIZE <= n <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"Invalid size {n} (valid range is {MIN_SIZE} to {MAX_SIZE})")
    return n


def _count(text: str) -> int:
    n = _integer(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"Invalid count {n}")
    return n


def run_args(args: argparse.Namespace) -> int:
    refuse_given(args, RPING_FLAGS)
    if args.server:
        if args.addr is None:
            raise CliError("rping -s needs -a ADDR: the soft device's address to listen on", EXIT_USAGE)
        ip = args.addr
    else:
        if args.addr is None:
            raise CliError("rping -c needs -a ADDR: the server's address", EXIT_USAGE)
        ip = args.source or route_source(args.addr)
    try:
        r = Rping(args, ip)
    except (EngineError, OSError) as e:
        if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
            raise CliError(address_in_use(ip, ROCE_UDP_PORT)) from None
        raise CliError(f"cannot open a soft RoCE device on {ip}: {e}") from None
    try:
        return _server(r) if args.server else _client(r, args.addr)
    except EngineError as e:
        raise CliError(str(e)) from None
    finally:
        r.close()


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "rping",
        help="rping: RDMA READ/WRITE ping over an rdma_cm connection, compatible with rdma-core's",
        description="rdma-core's rping (-s | -c) [-vVd] [-S size] [-C count] [-a addr] [-I addr] [-p port]",
        allow_abbrev=False,
    )
    role = p.add_mutually_exclusive_group(required=True)
    role.add_argument("-s", dest="server", action="store_true", help="server side")
    role.add_argument("-c", dest="client", action="store_true", help="client side")
    p.add_argument(
        "-a", dest="addr", type=_address, metavar="ADDR", help="address (the server's, or to listen on)"
    )
    p.add_argument(
        "-I", dest="source", type=_address, metavar="ADDR", help="source address to bind to for client"
    )
    p.add_argument(
        "-p", dest="port", type=int_in(0, 65535), default=DEFAULT_PORT, metavar="PORT", help="port (7174)"
    )
    p.add_argument(
        "-C", dest="count", type=_count, default=0, metavar="COUNT", help="ping count times (0: forever)"
    )
    p.add_argument("-S", dest="size", type=_size, default=64, metavar="SIZE", help="ping data size (64)")
    p.add_argument("-v", dest="verbose", action="count", default=0, help="display ping data to stdout")
    p.add_argument("-V", dest="validate", action="count", default=0, help="validate ping data")
    p.add_argument("-d", dest="debug", action="count", default=0, help="debug printfs")
    add_unimplemented(p, RPING_FLAGS)
    p.set_defaults(handler=run(p, run_args))
