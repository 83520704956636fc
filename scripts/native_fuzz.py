"""Feed the native data plane hostile bytes and hostile arguments (a bounded, seeded run).

    python scripts/native_fuzz.py [--seed N] [--count N]

Meant to run under AddressSanitizer and UBSan (``scripts/native-sanitize.sh``),
which catch what a wrong size computation would do: every call must return
normally or raise ``TypeError``/``ValueError``/``OverflowError``, and what
``check_decode`` returns must be what ``decode`` says of the same bytes.
Prints one summary line; exits non-zero on the first wrong answer.
"""

import argparse
import contextlib
import random
import sys
from collections.abc import Callable
from typing import Any

from rdmakit.engine import Completion, EngineError, QpCaps, SendWR, WcStatus, WrOpcode
from rdmakit.testing.engine import connect, make_side
from rdmakit.transport import fastpath
from rdmakit.wire import (
    AETH,
    RETH,
    AtomicETH,
    IcrcFlow,
    Opcode,
    Packet,
    WireError,
    decode,
    encode,
    pack_icrc,
)

REFUSALS = (TypeError, ValueError, OverflowError)
WM = int(Opcode.RDMA_WRITE_MIDDLE)


def _int(rng: random.Random) -> int:
    """An integer argument, often at or past an edge."""
    edges = (0, 1, -1, 3, 4, 12, 16, 255, 256, 1024, 4096, 65507, 65508, 1 << 16, 1 << 24, 1 << 31, 1 << 32,
             (1 << 53), (1 << 62), (1 << 63) - 1, 1 << 63, 1 << 64)  # fmt: skip
    if rng.random() < 0.6:
        v = rng.choice(edges) + rng.choice((0, 0, 1, -1))
        return -v if rng.random() < 0.1 else v
    return rng.randrange(-(1 << 20), 1 << 20)


def _packet(rng: random.Random) -> Packet:
    op = rng.choice(list(Opcode))
    return Packet(
        op, rng.getrandbits(24), rng.getrandbits(24), ackreq=rng.random() < 0.5,
        reth=RETH(rng.getrandbits(64), rng.getrandbits(32), rng.getrandbits(32)),
        aeth=AETH(rng.choice((0, 0x1F, 0x60)), rng.getrandbits(24)),
        atomic_eth=AtomicETH(*(rng.getrandbits(b) for b in (64, 32, 64, 64))),
        atomic_ack=rng.getrandbits(64), imm=rng.getrandbits(32), ieth=rng.getrandbits(32),
        payload=rng.randbytes(rng.choice((0, 1, 3, 4, 64, 300))),
    )  # fmt: skip


def _valid_body(rng: random.Random) -> bytes:
    """The bytes of a packet ``decode`` takes (headers its opcode carries, nothing else)."""
    from rdmakit.wire import OPCODE_INFO

    pkt = _packet(rng)
    info = OPCODE_INFO[pkt.opcode]
    pkt = pkt._replace(
        reth=pkt.reth if info.reth else None, aeth=pkt.aeth if info.aeth else None,
        atomic_eth=pkt.atomic_eth if info.atomic_eth else None,
        atomic_ack=pkt.atomic_ack if info.atomic_ack_eth else None, imm=pkt.imm if info.imm else None,
        ieth=pkt.ieth if info.ieth else None, payload=pkt.payload if info.payload else b"",
    )  # fmt: skip
    return encode(pkt)


def _mutate(rng: random.Random, data: bytes) -> bytearray:
    b = bytearray(data)
    for _ in range(rng.choice((0, 1, 1, 2, 5))):
        what = rng.random()
        if what < 0.5 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif what < 0.7:
            del b[rng.randrange(len(b) + 1) :]
        elif what < 0.85:
            b += rng.randbytes(rng.randrange(9))
        elif b:
            b[rng.randrange(len(b))] = rng.choice((0, 0xFF, 0x30, 0x0F))
    return b


def fuzz_check_decode(rng: random.Random, native: Any, count: int) -> None:
    flows = [IcrcFlow.ipv4(rng.randbytes(4), rng.randbytes(4), rng.getrandbits(16), 4791) for _ in range(4)]
    for i in range(count):
        flow = rng.choice(flows)
        idx = rng.choice((0, 1, 63, 0xFFFF, rng.getrandbits(16)))
        if i % 3 == 0:
            data = bytearray(rng.randbytes(rng.randrange(40)))
        else:
            body = _valid_body(rng)
            data = _mutate(rng, body + pack_icrc(flow.icrc_seg(idx, body)))
        try:
            got = native.check_decode(memoryview(data), idx, flow.states, flow)
        except REFUSALS:
            continue
        if type(got) is Packet:
            want = decode(bytes(data[:-4]))
            if got != want:
                raise AssertionError(f"check_decode {bytes(data).hex()}: {got} != {want}")
        elif got == 1 and len(data) >= 16:
            try:
                decode(bytes(data[:-4]))
            except WireError:
                continue
            raise AssertionError(f"check_decode refused what decode takes: {bytes(data).hex()}")
        elif got not in (0, 1):
            raise AssertionError(f"check_decode returned {got!r}")


def fuzz_place_run(rng: random.Random, native: Any, count: int) -> None:
    flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 4791, 4791)
    for _ in range(count):
        mtu = rng.choice((256, 1024, 4096, 4))
        n = rng.randrange(1, 8)
        segs = []
        for k in range(n):
            body = encode(Packet(Opcode.RDMA_WRITE_MIDDLE, 0x10, 100 + k, payload=rng.randbytes(mtu)))
            segs.append(body + pack_icrc(flow.icrc_seg(k, body)))
        buf = _mutate(rng, b"".join(segs))
        size = 12 + mtu + 4
        states: Any = flow.seg_states(size, rng.choice((0, 1, n, 64)))
        if rng.random() < 0.2:
            states = memoryview(bytes(states))[rng.randrange(4) :]  # any length, any alignment
        dst = bytearray(rng.choice((0, mtu, n * mtu, 2 * n * mtu + 3)))
        args = [bytes(buf), len(buf), size, 0, states, WM, 0x10, 100, mtu, dst, 0, 1 << 30]
        for _ in range(rng.choice((0, 1, 2, 3))):
            j = rng.choice((1, 2, 3, 6, 7, 8, 10, 11))
            args[j] = _int(rng)
        if rng.random() < 0.1:
            args[0] = args[9] = dst  # source and target the same buffer
        with contextlib.suppress(REFUSALS):
            native.place_run(*args)


def fuzz_send(rng: random.Random, native: Any, count: int) -> None:
    """send_packet, send_train, recv_runs on a closed descriptor: arguments only, no traffic."""
    flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 4791, 4791)
    states = flow.seg_states(12 + 1024 + 4, 64)
    calls: list[Callable[[], object]] = []
    for _ in range(count):
        pkt: Any = _packet(rng)
        if rng.random() < 0.3:
            fields = list(pkt)
            fields[rng.randrange(16)] = rng.choice((None, -1, 1 << 70, "x", b"", (1, 2), 3.5))
            pkt = tuple.__new__(Packet, fields)
        addr = ("127.0.0.1", rng.choice((1, 4791, -1, 1 << 16, 1 << 40)))
        calls.append(lambda pkt=pkt, addr=addr: native.send_packet(-1, addr, False, pkt, flow.states, flow))
        t = [
            -1,
            ("127.0.0.1", 1),
            False,
            True,
            WM,
            1,
            0,
            rng.randrange(4),
            rng.randbytes(4096),
            1024,
            -1,
            1,
            states,
        ]
        for _ in range(rng.choice((1, 2))):
            t[rng.choice((4, 5, 6, 7, 9, 10, 11))] = _int(rng)
        calls.append(lambda t=t: native.send_train(*t))
        dst = bytearray(rng.choice((0, 1024, 8192)))
        r = [-1, bytearray(64), False, ("127.0.0.1", 1), states, WM, 0x10, 0, 1024, dst, 0, 4, 1]
        r[rng.choice((5, 6, 7, 8, 10, 11, 12))] = _int(rng)
        calls.append(lambda r=r: native.recv_runs(*r))
    for call in calls:
        with contextlib.suppress(REFUSALS):
            call()


def fuzz_small_request(rng: random.Random, native: Any, count: int) -> None:
    """Mutated one-packet requests against hostile tickets: what it executes, decode takes alike."""
    flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 4791, 4791)
    ops = (Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_READ_REQUEST, Opcode.COMPARE_SWAP, Opcode.FETCH_ADD)
    for _ in range(count):
        mem = bytearray(rng.choice((0, 8, 64, 4096)))
        base = rng.choice((0, 1 << 12, (1 << 64) - 4096, rng.getrandbits(64)))
        entry: Any = (base, len(mem), rng.choice((0, 2, 4, 8, 14, 0xFF)), memoryview(mem))
        if rng.random() < 0.2:  # a table entry the engine never makes
            fields = list(entry)
            fields[rng.randrange(4)] = rng.choice((-1, 1 << 70, "x", None, b"ro", memoryview(b"12345678")))
            entry = tuple(fields) if rng.random() < 0.8 else fields
        rkey = rng.getrandbits(32)
        op = rng.choice(ops)
        va = base + rng.choice((0, 8, len(mem) - 8, len(mem), rng.getrandbits(16)))
        pkt = Packet(
            op, 0x10, 100, ackreq=rng.random() < 0.5,
            reth=RETH(va & ((1 << 64) - 1), rkey, rng.choice((0, 8, 64, 1 << 31, rng.getrandbits(32)))),
            atomic_eth=AtomicETH(va & ((1 << 64) - 1), rkey, rng.getrandbits(64), rng.getrandbits(64)),
            payload=rng.randbytes(rng.choice((0, 8, 64))),
        )  # fmt: skip
        pkt = pkt._replace(
            reth=None if op in ops[2:] else pkt.reth,
            atomic_eth=pkt.atomic_eth if op in ops[2:] else None,
            payload=pkt.payload if op is ops[0] else b"",
        )
        if op is ops[0] and pkt.reth is not None and rng.random() < 0.7:
            pkt = pkt._replace(reth=pkt.reth._replace(dma_len=len(pkt.payload)))
        body = encode(pkt)
        data = bytearray(body + pack_icrc(flow.icrc_seg(0, body)))
        if rng.random() < 0.5:
            data = _mutate(rng, data)
        ticket: Any = (
            100 if rng.random() < 0.9 else _int(rng), rng.choice((256, 1024, 4096, 0, -1)),
            rng.choice((0, 2, 4, 8, 14)), rng.random() < 0.8, {rkey: entry},
        )  # fmt: skip
        if rng.random() < 0.05:
            ticket = ticket[:4]
        idx = 0 if rng.random() < 0.9 else rng.choice((1, -1, 1 << 16))
        try:
            got = native.small_request(memoryview(data), idx, flow.states, flow, 0x10, ticket)
        except (*REFUSALS, BufferError):
            continue
        if type(got) is tuple:
            want = decode(bytes(data[:-4]))  # what it executed must be a packet decode takes
            ext = want.reth or want.atomic_eth
            if (got[0], got[1], got[3]) != (want.opcode, want.psn, ext.rkey if ext else None):
                raise AssertionError(f"small_request {bytes(data).hex()}: {got} for {want}")
        elif got != -1:
            raise AssertionError(f"small_request returned {got!r}")


def fuzz_small_response(rng: random.Random, native: Any, count: int) -> None:
    """Mutated one-packet responses against hostile tickets: what it takes, decode takes alike."""
    flow = IcrcFlow.ipv4(bytes((127, 0, 0, 8)), bytes((127, 0, 0, 9)), 4791, 4791)
    ops = (Opcode.ACKNOWLEDGE, Opcode.RDMA_READ_RESPONSE_ONLY, Opcode.ATOMIC_ACKNOWLEDGE)
    for _ in range(count):
        op = rng.choice(ops)
        length = rng.choice((0, 1, 8, 256, 300))
        pkt = Packet(
            op, 0x10, 100, aeth=AETH(rng.choice((0, 0, 0, 0x1F, 0x21, 0x60, 0x61)), rng.getrandbits(24)),
            atomic_ack=rng.getrandbits(64) if op is ops[2] else None,
            payload=rng.randbytes(length) if op is ops[1] else b"",
        )  # fmt: skip
        body = encode(pkt)
        data = bytearray(body + pack_icrc(flow.icrc_seg(0, body)))
        if rng.random() < 0.5:
            data = _mutate(rng, data)
        targets = (None, bytearray(8), bytearray(length), bytearray(3), b"readonly", memoryview(b""))
        target: Any = rng.choice(targets)
        ticket: Any = (
            int(op) if rng.random() < 0.9 else _int(rng), 100 if rng.random() < 0.9 else _int(rng),
            length if rng.random() < 0.9 else _int(rng), target, rng.choice((256, 1024, 0, -1)),
        )  # fmt: skip
        idx = 0 if rng.random() < 0.9 else rng.choice((1, -1, 1 << 16))
        try:
            got = native.small_response(memoryview(data), idx, flow.states, flow, 0x10, ticket)
        except (*REFUSALS, BufferError):
            continue
        if type(got) is tuple:
            want = decode(bytes(data[:-4]))  # what it took must be a packet decode takes
            if (got[0], got[1]) != (want.opcode, want.psn) or want.aeth is None or want.aeth.syndrome >> 5:
                raise AssertionError(f"small_response {bytes(data).hex()}: {got} for {want}")
        elif got != -1:
            raise AssertionError(f"small_response returned {got!r}")


class _Stats:
    """What an armed responder counts on (``QpStats``'s two counters)."""

    packets_in = 0
    packets_out = 0


class _Pd:
    generation = 7


_ARMED_OPS = (
    Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE, Opcode.RDMA_WRITE_LAST,
    Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE,
)  # fmt: skip


def _msg(rng: random.Random, rkey: int, va: int, size: int, plen: int) -> Any:
    """An armed responder's WRITE under way: None (between messages), one that fits, or a hostile one."""
    if rng.random() < 0.4:
        return None
    length = rng.choice((size, 2 * plen, 3 * plen, 300, 1 << 31, rng.getrandbits(32)))
    off = rng.choice((0, 8, plen, length // 2, length - plen, length - 2 * plen, length))
    msg: list[Any] = [rkey, va & ((1 << 64) - 1), length, off, length - off, 7]
    if rng.random() < 0.2:
        msg[rng.randrange(6)] = rng.choice((_int(rng), -1, 1 << 64, None, "x"))
    return tuple(msg) if rng.random() < 0.95 else msg


def fuzz_armed(rng: random.Random, native: Any, count: int) -> None:
    """Mutated WRITE FIRST, MIDDLE, LAST (with immediate too) and ONLY requests to an armed responder
    (``Armed``) made from hostile tickets, between messages or within a WRITE, its ACK taken, sent
    to a closed descriptor and handed back in any order: what it executes, decode takes alike, its
    expected PSN moves by one and the WRITE under way stays whole (placed + to come = length)."""
    flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 4791, 4791)
    for _ in range(count):
        mem = bytearray(rng.choice((0, 8, 64, 4096)))
        base = rng.choice((0, 1 << 12, (1 << 64) - 4096, rng.getrandbits(64)))
        entry: Any = (base, len(mem), rng.choice((2, 14, 0xFF, 0, 4)), memoryview(mem))
        if rng.random() < 0.1:
            fields = list(entry)
            fields[rng.randrange(4)] = rng.choice((-1, 1 << 70, "x", None, b"ro", memoryview(b"12345678")))
            entry = tuple(fields) if rng.random() < 0.8 else fields
        rkey = rng.getrandbits(32)
        va = base + rng.choice((0, 0, 8, len(mem) - 8, len(mem), rng.getrandbits(16)))
        payload = rng.randbytes(rng.choice((0, 8, 8, 64, 300)))
        op = rng.choice(_ARMED_OPS)
        dma = len(payload) if rng.random() < 0.7 else rng.choice((0, 8, 1 << 31, rng.getrandbits(32)))
        if op is Opcode.RDMA_WRITE_FIRST and rng.random() < 0.8:  # a message longer than its first packet
            dma = rng.choice((2 * len(payload), len(mem), len(payload) + 1))
        starts = op in (Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_WRITE_FIRST)
        reth = RETH(va & ((1 << 64) - 1), rkey, dma) if starts else None
        pkt = Packet(
            op, 0x10, 100, ackreq=rng.random() < 0.7, reth=reth,
            payload=payload, imm=5 if op is Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE else None,
        )  # fmt: skip
        body = encode(pkt)
        data = bytearray(body + pack_icrc(flow.icrc_seg(0, body)))
        if rng.random() < 0.3:
            data = _mutate(rng, data)
        held: Any = None if rng.random() < 0.7 else rng.choice(((99, 0x1F, 5), (1 << 24, 0, 0), (1, 2), "x"))
        args: list[Any] = [
            0x10, 0x20, 100 if rng.random() < 0.9 else _int(rng), rng.getrandbits(24),
            len(payload) or 1 if rng.random() < 0.5 else rng.choice((256, 1024, 4096, 0, -1)),
            rng.choice((2, 14, 14, 0, 4)),
            {rkey: entry}, 0x1F,
            _Pd(), _Stats(), held,
            None if starts and rng.random() < 0.7 else _msg(rng, rkey, va, len(mem), len(payload)),
        ]  # fmt: skip
        if rng.random() < 0.1:
            args[rng.randrange(len(args))] = rng.choice((_int(rng), None, "x", {}))
        try:
            armed = native.Armed(*args)
        except REFUSALS:
            continue
        idx = 0 if rng.random() < 0.9 else rng.choice((1, -1, 1 << 16))
        try:
            got = armed.rx(memoryview(data), idx, flow.states, flow)
        except (*REFUSALS, AttributeError, BufferError):
            continue
        if got:
            want = decode(bytes(data[:-4]))  # what it executed must be a packet decode takes
            st = armed.disarm()
            whole = st[6] + st[7] == st[5] and (st[9] is None or len(st[9]) == st[5])
            if (
                want.opcode not in _ARMED_OPS[:4]
                or want.psn != 100
                or st[0] != 101
                or st[10] != 1
                or not whole
            ):
                raise AssertionError(f"Armed.rx {bytes(data).hex()}: {st} for {want}")
            continue
        if rng.random() < 0.1:  # the device poll, on a closed descriptor, with a hostile table
            table: Any = {0x10: armed, 0x11: "x", "k": armed}
            with contextlib.suppress(*REFUSALS, BufferError):
                native.poll_armed(-1, bytearray(rng.choice((0, 64))), table, {}, 2, rng.choice((0, 1, -1, 5)))
        for step in rng.sample(("take", "send", "disarm", "rx"), rng.randrange(1, 5)):
            with contextlib.suppress(*REFUSALS, RuntimeError, AttributeError):
                if step == "take":
                    armed.take_ack()
                elif step == "send":
                    armed.send_ack(-1, ("127.0.0.1", 4791), False, flow.states, flow)
                elif step == "disarm":
                    armed.disarm()
                else:
                    armed.rx(memoryview(data), 0, flow.states, flow)


def fuzz_armed_req(rng: random.Random, native: Any, count: int) -> None:
    """Mutated ACKs, at any PSN, to a requester's native completer (``ArmedReq``) over a live send
    queue of WRITEs (some unsignaled, a full CQ now and then), and hostile owners: what it takes,
    decode takes alike as an ACK, and it completes exactly the WQEs its log names."""
    flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 4791, 4791)
    side_rng = random.Random(rng.getrandbits(32))
    made = 0
    while made < count:
        a = make_side("a", side_rng, 4096, QpCaps(), rng.choice((1, 2, 64)))
        b = make_side("b", side_rng, 4096, QpCaps(), 64)
        connect(a.qp, b.qp, side_rng, mtu=256)
        qp, req = a.qp, a.qp.req
        for i in range(rng.randrange(0, 6)):
            sge = a.sge(0, rng.choice((0, 8, 256, 300)))
            wr = SendWR(wr_id=i, opcode=WrOpcode.RDMA_WRITE, sg_list=(sge,), remote_addr=b.mr.addr,
                        rkey=b.mr.rkey, signaled=rng.random() < 0.7)  # fmt: skip
            qp.post_send(wr)
        qp.poll_transmit(0.0, rng.randrange(0, 8))
        args: list[Any] = [qp, req, qp.send_cq, Completion, WcStatus.SUCCESS, qp.qpn]
        if rng.random() < 0.1:
            args[rng.randrange(len(args))] = rng.choice((_int(rng), None, "x", {}, _Pd()))
        try:
            owner = native.ArmedReq(*args)
        except REFUSALS:
            continue
        if rng.random() < 0.2:  # the device poll, on a closed descriptor, with a hostile table
            bad: Any = {qp.qpn: owner, 0x11: "x", "k": owner}
            with contextlib.suppress(*REFUSALS, BufferError):
                native.poll_armed(-1, bytearray(64), {}, {}, 2, rng.choice((0, 1, 5)), bad, 0.0, [])
            with contextlib.suppress(*REFUSALS, BufferError):
                native.poll_armed(-1, bytearray(64), {}, {}, 2, 1, bad)  # no now, no touched list
            with contextlib.suppress(*REFUSALS, BufferError):
                owner.bind(
                    ("127.0.0.9", 4791), rng.random() < 0.2, flow.states, flow, rng.choice((None, "x"))
                )
        for _ in range(rng.randrange(1, 8)):
            made += 1
            psn = (req.comp_psn + rng.choice((-1, 0, 0, 1, 1, 2, 3, 1 << 23))) & 0xFFFFFF
            syn = rng.choice((0, 0, 0x1F, 0x21, 0x60, 0x63))
            body = encode(Packet(Opcode.ACKNOWLEDGE, qp.qpn, psn, aeth=AETH(syn, rng.getrandbits(24))))
            data = bytearray(body + pack_icrc(flow.icrc_seg(0, body)))
            if rng.random() < 0.3:
                data = _mutate(rng, data)
            idx = 0 if rng.random() < 0.9 else rng.choice((1, -1, 1 << 16))
            before = len(req.sq)
            try:
                got = owner.rx(memoryview(data), idx, flow.states, flow, rng.random())
            except (*REFUSALS, AttributeError, BufferError, IndexError):
                break
            log = owner.take()
            if got:
                want = decode(bytes(data[:-4]))
                done = sum(len(e[3]) for e in log)
                if want.opcode is not Opcode.ACKNOWLEDGE or want.aeth is None or want.aeth.syndrome >> 5:
                    raise AssertionError(f"ArmedReq.rx took {bytes(data).hex()}: {want}")
                if len(log) != 1 or done < 1 or before - len(req.sq) != done:
                    raise AssertionError(
                        f"ArmedReq.rx {bytes(data).hex()}: log {log}, {before} -> {len(req.sq)}"
                    )
                qp.acks_taken(log)
            elif log:
                raise AssertionError(f"ArmedReq.rx declined {bytes(data).hex()} but logged {log}")


class _Odd:
    """An attribute any engine field may be swapped for."""

    def __index__(self) -> int:
        raise ValueError("odd")


def fuzz_post(rng: random.Random, native: Any, count: int) -> None:
    """``post_small`` over live requesters (SEND/WRITE, with immediate or not, bad L_Keys, SGE
    lengths past their region, several SGEs) with their fields now and then made hostile (PSNs,
    MTU, the WQE's region, opcodes, remote address, ICRC states): every call returns or is
    refused, and every datagram it builds decodes as the WQE's ONLY packet with a good ICRC."""
    flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 4791, 4791)
    side_rng = random.Random(rng.getrandbits(32))
    ops = (WrOpcode.RDMA_WRITE, WrOpcode.SEND, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.SEND_WITH_IMM)
    hostile: tuple[tuple[str, str], ...] = (
        ("req", "req_psn"), ("req", "comp_psn"), ("req", "mtu"), ("req", "window"), ("req", "sent_hwm"),
        ("wqe", "seg0"), ("wqe", "ops"), ("wqe", "length"), ("wqe", "imm"), ("wr", "remote_addr"),
        ("wr", "rkey"), ("req", "rtt_psn"), ("req", "next_idx"),
    )  # fmt: skip
    made = 0
    while made < count:
        a = make_side("a", side_rng, 4096, QpCaps(), 64)
        b = make_side("b", side_rng, 4096, QpCaps(), 64)
        connect(a.qp, b.qp, side_rng, mtu=256)
        qp, req = a.qp, a.qp.req
        for i in range(rng.randrange(1, 6)):
            made += 1
            op = rng.choice(ops)
            n = rng.choice((0, 1, 1, 1, 2))
            sges = tuple(
                a.sge(rng.randrange(0, 4096), rng.choice((0, 8, 255, 256, 257, 4096))) for _ in range(n)
            )
            if sges and rng.random() < 0.1:
                sges = (type(sges[0])(sges[0].addr, sges[0].length, sges[0].lkey ^ 0x100),)
            imm = (
                rng.getrandbits(32) if op in (WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.SEND_WITH_IMM) else None
            )
            wr = SendWR(wr_id=i, opcode=op, sg_list=sges, remote_addr=b.mr.addr, rkey=b.mr.rkey,
                        imm_data=imm, solicited=rng.random() < 0.3)  # fmt: skip
            try:
                qp.post_send(wr)
            except EngineError:  # the engine refuses it: nothing to post
                continue
            if not req.sq:
                break  # a local error failed the QP
            wqe = req.sq[-1]
            if rng.random() < 0.2:
                where, name = rng.choice(hostile)
                obj = {"req": req, "wqe": wqe, "wr": wqe.wr}[where]
                bad = rng.choice((-1, 1 << 24, 1 << 64, None, "x", _Odd(), (1, 2, 3, 4), memoryview(b"ab")))
                with contextlib.suppress(AttributeError, TypeError):
                    object.__setattr__(obj, name, bad)
            states: Any = flow.states if rng.random() < 0.9 else {0: "x"}
            fd = -1 if rng.random() < 0.9 else 1 << 20
            try:
                got = native.post_small(fd, ("127.0.0.8", 4791), False, states, flow, qp, rng.random(), 64)
            except (*REFUSALS, AttributeError, IndexError, BufferError):
                break  # the QP was made hostile: a fresh one
            if isinstance(got, bytes):
                pkt = decode(got[:-4])
                if (
                    pkt.psn != wqe.first_psn
                    or not pkt.ackreq
                    or got[-4:] != pack_icrc(flow.icrc_seg(0, got[:-4]))
                ):
                    raise AssertionError(f"post_small built {got.hex()} for {wqe.wr}")
                if wqe.is_write and (pkt.reth is None or pkt.reth.dma_len != wqe.length):
                    raise AssertionError(f"post_small's RETH {pkt.reth} for {wqe.wr}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--count", type=int, default=20000, help="inputs per function family")
    args = ap.parse_args(argv)
    native = fastpath.native
    if native is None:
        print(f"native_fuzz: no native module ({fastpath.describe()})")
        return 1
    rng = random.Random(args.seed)
    fuzz_check_decode(rng, native, args.count)
    fuzz_place_run(rng, native, args.count // 4)
    fuzz_send(rng, native, args.count // 4)
    fuzz_small_request(rng, native, args.count // 2)
    fuzz_small_response(rng, native, args.count // 2)
    fuzz_armed(rng, native, args.count // 2)
    fuzz_armed_req(rng, native, args.count // 4)
    fuzz_post(rng, native, args.count // 4)
    n, h = args.count // 4, args.count // 2
    print(f"native_fuzz: {args.count} check_decode, {n} place_run, {n} x 3 send/recv, {h} small_request, "
          f"{h} small_response, {h} armed responder, {n} armed requester, {n} post_small inputs "
          f"(seed {args.seed}): "
          "all answered or refused")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
