"""The native fuzz run's armed families: armed responders (WRITE, READ, atomics), native
completers and native posting (``scripts/native_fuzz.py`` runs them)."""

import contextlib
import random
from typing import Any

from native_fuzz import REFUSALS, _int, _mutate

from rdmakit.engine import Completion, EngineError, QpCaps, SendWR, WcStatus, WrOpcode
from rdmakit.testing.engine import connect, make_side
from rdmakit.wire import (
    AETH,
    RETH,
    AtomicETH,
    IcrcFlow,
    Opcode,
    Packet,
    decode,
    encode,
    pack_icrc,
)


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


def fuzz_armed_read(rng: random.Random, native: Any, count: int) -> None:
    """Mutated READ (zero to more than eight responses, any range) and atomic requests to an armed responder
    allowed READs (hostile recorders too), between messages or within a WRITE, with an ACK held or
    not; its responses taken, sent to a closed descriptor or handed back in any order: what it
    executes, decode takes alike, its expected PSN moves past the responses, and the responses it
    gives are the READ's bytes in consecutive PSNs."""
    flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 4791, 4791)
    for _ in range(count):
        mem = bytearray(rng.randbytes(rng.choice((0, 8, 64, 4096))))
        base = rng.choice((0, 1 << 12, (1 << 64) - 4096, rng.getrandbits(64)))
        entry: Any = (base, len(mem), rng.choice((2, 4, 14, 0xFF, 0)), memoryview(mem))
        if rng.random() < 0.1:
            fields = list(entry)
            fields[rng.randrange(4)] = rng.choice((-1, 1 << 70, "x", None, b"ro", memoryview(b"12345678")))
            entry = tuple(fields) if rng.random() < 0.8 else fields
        rkey = rng.getrandbits(32)
        va = base + rng.choice((0, 0, 8, len(mem) - 8, len(mem), rng.getrandbits(16)))
        length = rng.choice((0, 1, 8, 63, 64, 256, 300, len(mem), 4096, 1 << 31, rng.getrandbits(32)))
        pkt = Packet(Opcode.RDMA_READ_REQUEST, 0x10, 100, ackreq=rng.random() < 0.5,
                     reth=RETH(va & ((1 << 64) - 1), rkey, length))  # fmt: skip
        if rng.random() < 0.3:  # an atomic (aligned or not)
            op = rng.choice((Opcode.COMPARE_SWAP, Opcode.FETCH_ADD))
            aeth = AtomicETH(va & ((1 << 64) - 1), rkey, rng.getrandbits(64), rng.getrandbits(64))
            pkt = Packet(op, 0x10, 100, atomic_eth=aeth)
        body = encode(pkt)
        data = bytearray(body + pack_icrc(flow.icrc_seg(0, body)))
        if rng.random() < 0.3:
            data = _mutate(rng, data)
        held: Any = None if rng.random() < 0.6 else (99, 0x1F, 5)
        mtu = rng.choice((64, 256, 1024, 4096))
        args: list[Any] = [
            0x10, 0x20, 100 if rng.random() < 0.9 else _int(rng), rng.getrandbits(24), mtu,
            rng.choice((4, 14, 14, 0, 2)), {rkey: entry}, 0x1F, _Pd(), _Stats(), held,
            None if rng.random() < 0.8 else _msg(rng, rkey, va, len(mem), mtu),
        ]  # fmt: skip
        try:
            armed = native.Armed(*args)
        except REFUSALS:
            continue
        recorded: list[tuple[int, ...]] = []

        def record(*a: int, into: list[tuple[int, ...]] = recorded) -> None:
            into.append(a)

        recorder: Any = record
        if rng.random() < 0.1:
            recorder = rng.choice((None, "x", lambda *a: 1 // 0))
        try:
            armed.allow_reads(recorder, recorder if rng.random() < 0.9 else "x")
            got = armed.rx(memoryview(data), 0, flow.states, flow)
        except (*REFUSALS, ZeroDivisionError):
            continue
        if got and decode(bytes(data[:-4])).opcode is not Opcode.RDMA_READ_REQUEST:
            want = decode(bytes(data[:-4]))
            ae = want.atomic_eth
            if ae is None or ae.va & 7 or want.psn != 100 or recorded[-1][0] != 100 or not armed.replying:
                raise AssertionError(f"Armed.rx atomic {bytes(data).hex()}: {recorded}")
            if rng.random() < 0.5:
                (ack,) = armed.take_reply()
                if ack.atomic_ack != recorded[-1][1] or ack.psn != 100 or armed.replying:
                    raise AssertionError(f"Armed.take_reply atomic {bytes(data).hex()}: {ack}")
        elif got:
            want = decode(bytes(data[:-4]))
            reth = want.reth
            assert reth is not None
            n = max(reth.dma_len - 1, 0) // mtu + 1
            if want.opcode is not Opcode.RDMA_READ_REQUEST or want.psn != 100 or recorded[-1][:2] != (
                100, 100 + n - 1
            ) or not armed.replying:  # fmt: skip
                raise AssertionError(f"Armed.rx READ {bytes(data).hex()}: {recorded}")
            if rng.random() < 0.5:
                pkts = armed.take_reply()
                data_out = b"".join(bytes(p.payload) for p in pkts)
                if reth.dma_len:  # (a hostile entry's own view and address, if any)
                    off = reth.va - entry[0]
                    want_out = bytes(entry[3][off : off + reth.dma_len])
                else:
                    want_out = b""
                if (
                    [p.psn for p in pkts] != list(range(100, 100 + n))
                    or data_out != want_out
                    or armed.replying
                ):
                    raise AssertionError(f"Armed.take_reply {bytes(data).hex()}: {pkts}")
        for step in rng.sample(("take", "send", "disarm", "handback", "rx"), rng.randrange(1, 6)):
            with contextlib.suppress(*REFUSALS, RuntimeError, AttributeError, BufferError):
                if step == "take":
                    armed.take_reply()
                elif step == "send":
                    armed.send_reply(-1, ("127.0.0.1", 4791), False, flow.states, flow)
                elif step == "disarm":
                    armed.disarm()
                elif step == "handback":
                    armed.handback()
                else:
                    armed.rx(memoryview(data), 0, flow.states, flow)


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
