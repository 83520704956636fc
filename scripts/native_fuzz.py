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
        state = flow.state(size, 0) if rng.random() < 0.7 else _int(rng)
        with contextlib.suppress(REFUSALS):
            native.icrc_one_pass(state, bytes(buf[rng.randrange(len(buf) + 1) :]))


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
        if rng.random() < 0.5:  # a tail: the right size or not, a batch with room or not
            t.append(rng.randbytes(rng.choice((1040, 1040, 0, 1039, 1 << 16))))
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--count", type=int, default=20000, help="inputs per function family")
    args = ap.parse_args(argv)
    native = fastpath.native
    if native is None:
        print(f"native_fuzz: no native module ({fastpath.describe()})")
        return 1
    # The armed families import this module's input makers (so not at its top).
    from native_fuzz_armed import fuzz_armed, fuzz_armed_read, fuzz_armed_req, fuzz_post
    from native_fuzz_loop import fuzz_wait_loop
    from native_fuzz_post import fuzz_post_send

    rng = random.Random(args.seed)
    fuzz_check_decode(rng, native, args.count)
    fuzz_place_run(rng, native, args.count // 4)
    fuzz_send(rng, native, args.count // 4)
    fuzz_small_request(rng, native, args.count // 2)
    fuzz_small_response(rng, native, args.count // 2)
    fuzz_armed(rng, native, args.count // 2)
    fuzz_armed_req(rng, native, args.count // 4)
    fuzz_armed_read(rng, native, args.count // 2)
    fuzz_post(rng, native, args.count // 4)
    fuzz_wait_loop(rng, native, args.count // 4)
    fuzz_post_send(rng, native, args.count // 2)
    n, h = args.count // 4, args.count // 2
    print(f"native_fuzz: {args.count} check_decode, {n} place_run and icrc_one_pass, {n} x 3 send/recv, "
          f"{h} small_request, {h} small_response, {h} armed responder, {n} armed requester, {h} armed READ, "
          f"{n} post_small, {h} post_send, {n} wait_loop inputs (seed {args.seed}): "
          "all answered or refused")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
