"""The native wait (``Driver.run_until``'s idle spin and block in ``_nativeloop.c``) against the Python loop.

Two UDP devices on loopback, each pumped by its own driver (the far side in a thread, as
``rdmakit bench``'s far side is a process of its own), run one seeded sequence of mixed
operations with the native wait on and off: WRITEs (armed, taken in C), READs, both
atomics, SENDs with immediate data and multi-packet WRITEs (which only Python takes, handed
back mid-wait), then a WRITE to a bad R_Key (a NAK). Both memories, every completion in
order, the devices' and QPs' counters, the requester and responder state (times reduced to
whether they are set) and the wire (every datagram's payload but its ICRC, captured on
``lo``) must be identical. Then the wake-ups: a retransmit timer that comes due while the
wait blocks, a second QP on a second CQ, and SIGINT during a blocking wait.
"""

import ctypes
import os
import random
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from rdmakit.engine import SGE, CompletionQueue, QpCaps, QueuePair, RecvWR, SendWR, WrOpcode
from rdmakit.testing.engine import ALL_ACCESS
from rdmakit.transport import fastpath
from rdmakit.transport.codec import WaitLoop
from rdmakit.transport.connect import ConnectOptions, connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from tests.engine.qp_state import requester_state, responder_state

pytestmark = pytest.mark.skipif(
    fastpath.NATIVE is None or fastpath.CODEC.wait_loop is None,
    reason=f"native data plane: {fastpath.describe()}",
)

_MEM = 1 << 16
_SO_RCVBUFFORCE, _SO_ATTACH_FILTER = 33, 26


def _timeless(x: Any) -> Any:
    """``x`` with every time (a float) reduced to whether it is set: real clocks differ between runs."""
    if isinstance(x, float):
        return "t"
    if isinstance(x, tuple | list):
        return tuple(_timeless(y) for y in x)
    return x


class _Tap:
    """The RoCEv2 datagrams between two loopback addresses, seen on ``lo`` (root only)."""

    def __init__(self, ips: tuple[str, str]) -> None:
        self.ips = {socket.inet_aton(ip): side for ip, side in zip(ips, "ab", strict=True)}
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
        self.sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, 32 << 20)
        # A classic BPF filter: only frames from the two addresses, so that other traffic on lo
        # (bulk runs beside this test) cannot fill the buffer and drop ours.
        a, b = (int.from_bytes(socket.inet_aton(ip), "big") for ip in ips)
        code = ((0x20, 0, 0, 26), (0x15, 1, 0, a), (0x15, 0, 1, b), (0x06, 0, 0, 0xFFFF), (0x06, 0, 0, 0))
        self._prog = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *c) for c in code))
        fprog = struct.pack("HL", len(code), ctypes.addressof(self._prog))
        self.sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
        self.sock.bind(("lo", 0))
        self.seen: list[tuple[str, bytes]] = []
        self.drain()  # what came before the filter
        self.seen.clear()

    def drain(self) -> None:
        while True:
            try:
                data, addr = self.sock.recvfrom(65535, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            if addr[2] == 4:  # PACKET_OUTGOING: lo shows each frame twice
                continue
            ip = data[14:]
            if len(ip) < 28 or ip[9] != 17 or ip[12:16] not in self.ips or ip[16:20] not in self.ips:
                continue
            hl = (ip[0] & 15) * 4
            self.seen.append((self.ips[ip[12:16]], bytes(ip[hl + 8 : -4])))  # the UDP payload but its ICRC

    def close(self) -> None:
        self.sock.close()


def _counting(loop: WaitLoop, took: list[int], k: int) -> WaitLoop:
    def counted(*args: Any) -> Any:
        got = loop(*args)
        took[k] += sum(t for t, _ in got[2])
        return got

    return counted


def _serve(drv: Driver, stop: threading.Event, spin: float) -> None:
    while not stop.is_set():
        drv.run_until(stop.is_set, 0.05, spin)


def _pair(new_ip: Callable[[], str], seed: int) -> tuple[SoftDevice, SoftDevice]:
    return (
        SoftDevice(new_ip(), port=0, rng=random.Random(seed)),
        SoftDevice(new_ip(), port=0, rng=random.Random(seed + 1)),
    )


def _run(new_ip: Callable[[], str], native: bool, seed: int, spin: float) -> tuple[Any, ...]:
    rng = random.Random(seed)
    a, b = _pair(new_ip, seed)
    tap = _Tap((a.ip, b.ip))
    da, db = Driver(native=native), Driver(native=native)
    took = [0, 0]  # datagrams the native waits took, by side
    for k, drv in enumerate((da, db)):
        if drv._loop is not None:
            drv._loop = _counting(drv._loop, took, k)
    da.add(a)
    db.add(b)
    a.post_with(da.clock)
    cqa, cqb = CompletionQueue(1024), CompletionQueue(1024)
    # Without congestion control: no tail-loss probe, whose deadline a stalled host would meet.
    caps = QpCaps(congestion_control=False)
    qa = a.create_qp(send_cq=cqa, recv_cq=cqa, caps=caps)
    qb = b.create_qp(send_cq=cqb, recv_cq=cqb, caps=caps)
    ma, mb = bytearray(rng.randbytes(_MEM)), bytearray(rng.randbytes(_MEM))
    mra = a.pd.register(ma, 0x10000, ALL_ACCESS)
    mrb = b.pd.register(mb, 0x90000, ALL_ACCESS)
    # A retransmit timer of 4.3 s (not rxe's 0.27 s): a stalled host must not time a request out.
    opts = ConnectOptions(timeout=20)
    connect_qp(a, qa, 10, local_endpoint(b, qb, 20), opts)
    connect_qp(b, qb, 20, local_endpoint(a, qa, 10), opts)
    sends = 0
    for i in range(40):  # the SENDs' receive WQEs, before the far side's pump owns its QP
        qb.post_recv(RecvWR(wr_id=5000 + i, sg_list=(SGE(0x90000 + 60000 + 64 * (i % 8), 64, mrb.lkey),)))
    stop = threading.Event()
    far = threading.Thread(target=_serve, args=(db, stop, spin))
    far.start()
    done: list[Any] = []
    try:
        ops = [WrOpcode.RDMA_WRITE] * 6 + [
            WrOpcode.RDMA_READ, WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP,
            WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE,
        ]  # fmt: skip
        for i in range(160):
            op = rng.choice(ops)
            off = rng.randrange(0, 4096, 8)
            n = 8
            if op is WrOpcode.RDMA_WRITE and rng.random() < 0.08:
                n = rng.choice((3000, 9000))  # several packets: Python takes them
            kw: dict[str, Any] = {"remote_addr": 0x90000 + off, "rkey": mrb.rkey}
            if op in (WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP):
                kw.update(compare_add=rng.getrandbits(8), swap=rng.getrandbits(64))
            if op is WrOpcode.SEND_WITH_IMM:
                if sends == 40:
                    continue
                sends += 1
                kw = {"imm_data": i}
            sge = SGE(0x10000 + 8192 + off * 2, n, mra.lkey)
            qa.post_send(SendWR(wr_id=i, opcode=op, sg_list=(sge,), **kw))
            assert da.run_until(lambda: len(cqa) > 0, 10.0, spin), (native, i)
            done.extend((wc.wr_id, wc.status, wc.opcode, wc.byte_len) for wc in cqa.poll())
            tap.drain()
        # A WRITE to an R_Key the far side never issued: its NAK, the QP to ERR.
        qa.post_send(SendWR(wr_id=999, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x10000, 8, mra.lkey),),
                            remote_addr=0x90000, rkey=mrb.rkey ^ 0x55))  # fmt: skip
        assert da.run_until(lambda: len(cqa) > 0, 10.0, spin)
        done.extend((wc.wr_id, wc.status, wc.opcode, wc.byte_len) for wc in cqa.poll())
        da.run_until(lambda: False, 0.05, spin)  # the last datagrams settle
    finally:
        stop.set()
        far.join()
    tap.drain()
    tap.close()
    done.extend((wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data) for wc in cqb.poll())
    for q in (qa, qb):
        q.disarm()
    state = _timeless((requester_state(qa), requester_state(qb), responder_state(qa), responder_state(qb)))
    counters = (a.counters.as_dict(), b.counters.as_dict(), qa.stats, qb.stats)
    a.close()
    b.close()
    da.close()
    db.close()
    return bytes(ma), bytes(mb), tuple(done), state, counters, tuple(tap.seen), tuple(took)


@pytest.mark.skipif(os.geteuid() != 0, reason="the wire is captured on lo (CAP_NET_RAW)")
@pytest.mark.parametrize(("seed", "spin"), [(1, 0.0), (2, 0.0), (3, 0.0)])
def test_the_native_wait_equals_the_python_loop(new_ip: Callable[[], str], seed: int, spin: float) -> None:
    on = _run(new_ip, True, seed, spin)
    off = _run(new_ip, False, seed, spin)
    names = ("memory a", "memory b", "completions", "engine state", "counters", "wire")
    for name, x, y in zip(names, on[:-1], off[:-1], strict=True):
        assert x == y, name
    assert off[-1] == (0, 0)
    # The far side's armed WRITEs, READs and atomics, taken in C. (Whether the requester's ACKs
    # are is timing: one that comes before its wait begins is taken by its Python pass.)
    assert on[-1][1] >= 80, on[-1]
    assert len(on[2]) > 150
    assert len(on[5]) > 300  # every request and its answer, seen on the wire
    assert any(c[1].name != "SUCCESS" for c in on[2])


def _connected(new_ip: Callable[[], str], n: int = 1, timeout: int | None = None) -> tuple[Any, ...]:
    """``n`` connected QP pairs without congestion control (no tail-loss probe: a stalled host sends
    no duplicate), with the local ACK timeout ``timeout`` (rxe's by default)."""
    a, b = _pair(new_ip, 7)
    caps = QpCaps(congestion_control=False)
    opts = ConnectOptions(timeout=timeout)
    cqs = [CompletionQueue(64) for _ in range(n)]
    cqb = CompletionQueue(64)
    mem_a, mem_b = bytearray(4096), bytearray(4096)
    mra = a.pd.register(mem_a, 0x1000, ALL_ACCESS)
    mrb = b.pd.register(mem_b, 0x9000, ALL_ACCESS)
    pairs = []
    for i in range(n):
        qa = a.create_qp(send_cq=cqs[i], recv_cq=cqs[i], caps=caps)
        qb = b.create_qp(send_cq=cqb, recv_cq=cqb, caps=caps)
        connect_qp(a, qa, 10 + i, local_endpoint(b, qb, 20 + i), opts)
        connect_qp(b, qb, 20 + i, local_endpoint(a, qa, 10 + i), opts)
        pairs.append((qa, qb))
    return a, b, cqs, pairs, mra, mrb


def _write(qa: QueuePair, mra: Any, mrb: Any, wr_id: int) -> None:
    qa.post_send(SendWR(wr_id=wr_id, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000, 8, mra.lkey),),
                        remote_addr=0x9000 + 8 * wr_id, rkey=mrb.rkey))  # fmt: skip


def test_a_deadline_that_comes_due_while_the_wait_blocks_fires_the_retransmit_timer(
    new_ip: Callable[[], str],
) -> None:
    """Nobody pumps the far side: the WRITE is lost to it, the native wait blocks until the
    retransmit deadline, and the timer fires (the request leaves again)."""
    a, b, _, pairs, mra, mrb = _connected(new_ip)
    qa = pairs[0][0]
    with a, b, Driver() as da:
        da.add(a)
        _write(qa, mra, mrb, 1)
        da.progress()
        sent = qa.stats.packets_out
        deadline = qa.get_timer()
        assert deadline is not None
        assert sent == 1
        looks = [0]

        def resent() -> bool:
            looks[0] += 1
            return bool(qa.stats.packets_out > sent)

        # The wait blocks until the deadline (its timer fires in the pass it hands back to), not
        # until the end of the run: done() is asked at each wake-up, a handful of times.
        assert da.run_until(resent, deadline - da.clock() + 60.0, 0.0)
        assert looks[0] <= 50, looks
        assert qa.req.rto_backoff > 0 or qa.stats.retransmits > 0


def test_a_second_qp_on_a_second_cq_completes_through_the_wait(new_ip: Callable[[], str]) -> None:
    a, b, cqs, pairs, mra, mrb = _connected(new_ip, 2, timeout=20)
    stop = threading.Event()
    with a, b, Driver() as da, Driver() as db:
        da.add(a)
        db.add(b)
        far = threading.Thread(target=_serve, args=(db, stop, 0.0))
        far.start()
        try:
            for k in range(20):
                qa = pairs[k % 2][0]
                _write(qa, mra, mrb, k)
                assert da.run_until(lambda cq=cqs[k % 2]: len(cq) > 0, 10.0, 0.0)  # type: ignore[misc]
                (wc,) = cqs[k % 2].poll()
                assert (wc.wr_id, wc.status.name) == (k, "SUCCESS")
        finally:
            stop.set()
            far.join()
        assert not cqs[0]
        assert not cqs[1]


def test_sigint_during_a_blocking_wait_raises_keyboard_interrupt(new_ip: Callable[[], str]) -> None:
    a, b = _pair(new_ip, 3)
    with a, b, Driver() as da:
        da.add(a)
        assert da._loop is not None
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            da.run_until(lambda: False, 3600.0, 0.0)  # only the signal ends it
        timer.join()


def _far_side_calls(new_ip: Callable[[], str], native: bool, n: int) -> tuple[int, int]:
    """Python calls the far side's pump makes over ``n`` WRITE round trips (its thread profiled from
    the first WRITE on), and how many of its datagrams native waits took."""
    a, b, cqs, pairs, mra, mrb = _connected(new_ip, timeout=20)
    qa = pairs[0][0]
    calls = [0]
    took = [0, 0]
    stop, go = threading.Event(), threading.Event()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[0] += 1

    def serve(db: Driver) -> None:
        db.run_until(go.is_set, 10.0, 0.0)
        sys.setprofile(count)
        try:  # no timeout to end each wait: the count must not depend on how long the run takes
            while not stop.is_set():
                db.run_until(stop.is_set, 3600.0, 0.0)
        finally:
            sys.setprofile(None)

    with a, b, Driver(native=native) as da, Driver(native=native) as db:
        da.add(a)
        db.add(b)
        if db._loop is not None:
            db._loop = _counting(db._loop, took, 1)
        a.post_with(da.clock)
        far = threading.Thread(target=serve, args=(db,))
        far.start()
        try:
            for k in range(n + 1):
                _write(qa, mra, mrb, k % 64)
                assert da.run_until(lambda: len(cqs[0]) > 0, 10.0, 0.0)
                cqs[0].poll()
                if k == 0:  # the first WRITE arms the far side's responder
                    go.set()
        finally:
            stop.set()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"\0", (b.ip, b.port))  # wakes the far side's wait: only Python takes it
            far.join()
    return calls[0], took[1]


def test_the_far_side_runs_in_c_between_packets(new_ip: Callable[[], str]) -> None:
    """Counted, not timed: the far side's Python calls per round trip, with its pump's wait native
    (its done() and the return at the end) and in Python (a pass per packet)."""
    n = 200
    native, took = _far_side_calls(new_ip, True, n)
    python, _ = _far_side_calls(new_ip, False, n)
    assert took >= n // 2, took  # the armed WRITEs, taken in C (most: a stalled thread may miss some)
    assert native <= 4 * n, (native, python)  # stop.is_set() at each turn, 2 a round trip
    assert python >= 20 * n, (native, python)
