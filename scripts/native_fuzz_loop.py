"""The native fuzz run's device poll loop family (``wait_loop``, ``_nativeloop.c``): hostile
datagrams on a real loopback socket and hostile arguments (``scripts/native_fuzz.py`` runs it)."""

import contextlib
import math
import random
import select
import socket
import time
from typing import Any

from native_fuzz import REFUSALS, _int, _mutate
from native_fuzz_armed import _Pd, _Stats

from rdmakit.wire import RETH, IcrcFlow, Opcode, Packet, encode, pack_icrc


class _RxFlow:
    """What the device poll marks on a receive flow it took from."""

    kernel = False
    ours = 0


class _Qp:
    """The QP an armed responder wakes (any object: the loop puts it in the active set)."""


def _drain(s: socket.socket) -> None:
    with contextlib.suppress(BlockingIOError):
        while True:
            s.recv(65536)


def _done(answer: float) -> Any:
    """A ``done`` that raises (5 %), says yes (15 %) or no."""

    def done() -> bool:
        if answer < 0.05:
            raise ValueError("done")
        return answer < 0.2

    return done


def fuzz_wait_loop(rng: random.Random, native: Any, count: int) -> None:
    """WRITE ONLY requests (in order, mutated, or not RoCE at all) from the source an armed responder
    was bound to, read by ``wait_loop`` with its ACK route well formed or hostile, port tuples and
    times hostile now and then, and ``done`` raising or lying: every call answers or refuses, and
    what it answers is one of its reasons with one (taken, sent) pair per port."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    tx.setblocking(False)
    ep = select.epoll()
    ep.register(rx.fileno(), select.EPOLLIN)
    src, dst = tx.getsockname(), rx.getsockname()
    lo = bytes((127, 0, 0, 1))
    flow = IcrcFlow.ipv4(lo, lo, src[1], dst[1])  # the requests' (IPv4 ID 0: an unconnected DF socket)
    back = IcrcFlow.ipv4(lo, lo, dst[1], src[1])  # the ACKs'
    buf = bytearray(65536)
    psn = 100
    for _ in range(count):
        mem = bytearray(64)
        rkey = rng.getrandbits(32)
        table: Any = {rkey: (0x1000, len(mem), 2, memoryview(mem))}
        armed = native.Armed(0x10, 0x20, psn, 0, 1024, 2, table, 0x1F, _Pd(), _Stats(), None, None)
        armed.bind(src, False, flow.states, flow, _RxFlow(), _Qp(), None, None)
        for k in range(rng.choice((0, 1, 1, 2, 3))):
            pkt = Packet(
                Opcode.RDMA_WRITE_ONLY, 0x10, (psn + k) & 0xFFFFFF, ackreq=rng.random() < 0.8,
                reth=RETH(0x1000 + rng.choice((0, 8, 56, 64)), rkey, 8), payload=rng.randbytes(8),
            )  # fmt: skip
            body = encode(pkt)
            data = bytearray(body + pack_icrc(flow.icrc_seg(0, body)))
            if rng.random() < 0.3:
                data = _mutate(rng, data)
            if rng.random() < 0.1:
                data = bytearray(rng.randbytes(rng.choice((0, 1, 12, 40))))
            with contextlib.suppress(OSError):
                tx.sendto(data, dst)
        routes: Any = {0x10: (dst if rng.random() < 0.5 else src, False, back.states, back)}
        if rng.random() < 0.2:
            bad = ((src,), ("x", False, {}, back), (("::1", 1), True, back.states, back), 7)
            routes[0x10] = rng.choice(bad)
        port: list[Any] = [rx.fileno(), buf, {0x10: armed}, {}, 2, {}, [], routes, []]
        if rng.random() < 0.1:
            port[rng.randrange(len(port))] = rng.choice((_int(rng), None, "x", {}, [], -1))
        ports: Any = [tuple(port)] if rng.random() < 0.95 else rng.choice(([], [port], [tuple(port)] * 65))
        done = _done(rng.random())

        now = time.monotonic()
        times = [now, now + rng.choice((0.0, 0.0005, -1.0)), rng.choice((math.inf, now, now + 0.0002))]
        if rng.random() < 0.05:
            times[rng.randrange(3)] = math.nan
        try:
            got = native.wait_loop(ep.fileno(), ports, done, *times, rng.choice((1, 64, 64, 0)))
        except (*REFUSALS, OSError):
            got = None
        if got is not None and (got[0] not in range(5) or len(got[2]) != len(ports)):
            raise AssertionError(f"wait_loop answered {got!r}")
        psn = (psn + 1) & 0xFFFFFF
        _drain(rx)
        _drain(tx)
    ep.close()
    rx.close()
    tx.close()
