"""The native small-operation path equals the Python engine.

``_fastpath.small_request`` checks an in-order RDMA WRITE ONLY, READ request,
COMPARE SWAP or FETCH ADD against the engine's ``QueuePair.rx_small`` ticket
and executes it, and ``rx_small_done`` takes the effect; ``small_response``
checks the ACK, READ RESPONSE ONLY or ATOMIC ACKNOWLEDGE that completes the
head of the send queue against ``rx_small_resp``'s ticket and places its data,
and ``rx_small_resp_done`` completes it. Anything else goes to the generic
path. Three proofs that this changes nothing:

- seeded hostile networks (every fault profile): the same random workloads
  with and without it leave the same trace (every packet's size, ICRC and
  fate, in order), memory, completions, counters, responder and requester
  state and virtual time, and both native paths were taken;
- crafted hostile requests with a valid ICRC (wrong PSN, QPN, P_Key, TVer,
  pad, R_Key, range, alignment, lengths, access; a message under way; no
  responder resources): fed to two identical QPs, one through the engine
  alone and one through ``small_request`` first, they leave the same memory,
  state, completions, counters and response bytes;
- crafted hostile responses likewise (wrong PSN, opcode for the operation,
  NAK and RNR syndromes, P_Key, QPN, TVer, pad, lengths, ICRC).
"""

import random
from collections.abc import Callable
from typing import Any, cast

import pytest

from rdmakit.engine import SGE, Access, CompletionQueue, QpCaps, SendWR, WcStatus, WrOpcode
from rdmakit.testing.engine import ALL_ACCESS, both_ways, connect, fill, finished, make_pair, make_side
from rdmakit.testing.faults import PROFILES, Faults
from rdmakit.transport import fastpath
from rdmakit.transport.codec import ArmedOwner, SegmentCodec, SmallRequest
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.transport.small_ops import take_small
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
    icrc_ipv4,
    pack_icrc,
)
from tests.engine.qp_state import requester_state, responder_state
from tests.engine.seeds import SeedSample
from tests.engine.small_run import counting_tx
from tests.transport.test_device_fastpath import _Counting

pytestmark = pytest.mark.skipif(fastpath.NATIVE is None, reason=f"native data plane: {fastpath.describe()}")


def _small() -> SmallRequest:
    assert fastpath.NATIVE is not None
    assert fastpath.NATIVE.small_request is not None
    return fastpath.NATIVE.small_request


def _codec() -> SegmentCodec:
    assert fastpath.NATIVE is not None
    return fastpath.NATIVE


def fingerprint(
    seed: int,
    faults: Faults,
    small: SegmentCodec | None,
    n: int = 14,
    ops: tuple[WrOpcode, ...] = tuple(WrOpcode),
    max_len: int = 300,
) -> tuple[Any, ...]:
    """A bidirectional random workload of mostly one-packet operations (MTU 256, up to ``max_len``
    bytes); the last item counts what the native paths took: (requests, responses, requester's
    sends, WRITE packets executed by an armed responder, ACKs its completer retired, READs and
    atomics an armed responder executed)."""
    half = max(1 << 14, 2 * n * max_len)
    p = make_pair(seed, faults, mem_size=2 * half, mtu=256, small=small)
    w1, w2 = both_ways(p, random.Random(seed ^ 0x5A11), n, max_len, half, ops)
    assert p.net.run(until=lambda: finished(p, w1, w2), max_time=600.0), f"seed={seed}"
    p.net.run(max_time=p.net.now + 1.0)  # the last ACKs and duplicates settle
    p.drain()
    w1.check()
    w2.check()
    paths = ("small", "small_resp", "small_tx", "armed", "armed_req", "armed_read", "armed_atomic")
    taken = tuple(p.net.stats.pop(k, 0) for k in paths)
    qa, qb = p.a.qp, p.b.qp
    for q in (qa, qb):
        q.disarm()  # an armed responder's state back to the engine, which is what is compared
    return (
        (p.net.now, bytes(p.a.mem), bytes(p.b.mem), p.a.sent, p.a.received, p.b.sent, p.b.received),
        (
            qa.stats,
            qb.stats,
            responder_state(qa),
            responder_state(qb),
            requester_state(qa),
            requester_state(qb),
        ),
        (p.net.trace_digest(), dict(p.net.stats)),
        taken,
    )


def _compare(
    seeds: list[int], faults: Faults, ops: tuple[WrOpcode, ...] = tuple(WrOpcode), max_len: int = 300
) -> tuple[int, int, int]:
    """Assert the runs with and without the native paths equal; (requests, responses, armed)."""
    requests = responses = armed = 0
    for seed in seeds:
        ref = fingerprint(seed, faults, None, ops=ops, max_len=max_len)
        got = fingerprint(seed, faults, _codec(), ops=ops, max_len=max_len)
        assert ref[3] == (0,) * 7
        assert got[:3] == ref[:3], f"seed={seed} faults={faults}"
        requests += got[3][0] + got[3][3] + got[3][5] + got[3][6]
        responses += got[3][1]
        armed += got[3][3] + got[3][5] + got[3][6]
    return requests, responses, armed


@pytest.mark.parametrize("name", PROFILES)
def test_native_small_operations_equal_the_engine(name: str) -> None:
    requests, responses, armed = _compare(list(range(12)), PROFILES[name])
    assert requests > 12 * 8  # most requests took the native path
    assert responses > 12 * 4  # and many responses
    assert armed > 0  # some WRITE ONLY requests met an armed responder


_WRITES = (
    WrOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE,
    WrOpcode.SEND,
    WrOpcode.RDMA_WRITE_WITH_IMM,
)


@pytest.mark.parametrize("name", PROFILES)
def test_armed_responder_equals_the_engine(name: str) -> None:
    """Mostly WRITEs (a SEND or a WRITE with immediate now and then disarms it): the armed responder owns the
    expected PSN and MSN and the ACK between them; the runs stay identical, and it took most WRITEs."""
    requests, _, armed = _compare(list(range(12)), PROFILES[name], _WRITES)
    assert armed > 12 * 8, (armed, requests)


@pytest.mark.slow
@pytest.mark.parametrize("name", PROFILES)
def test_native_small_operations_equal_the_engine_many_seeds(name: str, seed_sample: SeedSample) -> None:
    seeds = seed_sample.seeds(range(1000, 1400))
    assert min(_compare(seeds, PROFILES[name])) > 0
    assert _compare(seeds[:100], PROFILES[name], _WRITES)[2] > 0  # the armed responder took WRITEs
    seed_sample.passed(len(seeds))


# -- crafted hostile requests ----------------------------------------------------------

_OPS = (
    Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_READ_REQUEST, Opcode.COMPARE_SWAP, Opcode.FETCH_ADD,
)  # fmt: skip
_OTHER = (
    Opcode.RDMA_WRITE_FIRST,
    Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    Opcode.SEND_ONLY,
    Opcode.RDMA_WRITE_LAST,
)
_IP_A, _IP_B = b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02"


class _Responder:
    """A connected QP whose requests come from ``craft``; the other side is never run."""

    def __init__(self, seed: int, max_rd_atomic: int, access: Access) -> None:
        rng = random.Random(seed)
        self.a = make_side("a", rng, 4096, QpCaps(), 256)
        self.b = make_side("b", rng, 4096, QpCaps(), 256)
        connect(self.a.qp, self.b.qp, rng, mtu=256, max_rd_atomic=max_rd_atomic, access=access)
        fill(self.b.mem, random.Random(seed + 1))
        # Two more regions: one READ-only, one WRITE-only (every rule of check_rkey in play).
        self.ro = self.b.pd.register(bytearray(512), self.b.mr.addr + 0x10000, Access.REMOTE_READ)
        self.wo_mem = bytearray(512)
        self.wo = self.b.pd.register(
            self.wo_mem, self.b.mr.addr + 0x20000, Access.LOCAL_WRITE | Access.REMOTE_WRITE
        )
        self.out: list[bytes] = []
        #: The requests this QP allows; the others are the "denied" defect.
        rd = bool(max_rd_atomic)
        self.allowed = tuple(
            op
            for op, ok in zip(_OPS, (True, rd and bool(access & Access.REMOTE_READ), rd, rd), strict=True)
            if ok and (op is Opcode.RDMA_WRITE_ONLY or access & (Access.REMOTE_READ | Access.REMOTE_ATOMIC))
        )
        self.denied = tuple(op for op in _OPS if op not in self.allowed)

    def feed(
        self, datagram: bytes, small: SmallRequest | None, armed: Callable[[int], None] | None = None
    ) -> None:
        """Through the engine alone, or ``small_request`` first, or (``armed``: told what
        ``take_small`` answered) the armed responder first, as the UDP port offers it."""
        qp = self.b.qp
        body = memoryview(datagram)[:-4]
        if armed is not None:
            flow = IcrcFlow.ipv4(_IP_A, _IP_B, 0xC000, 4791)
            took = take_small(_codec(), qp, datagram[0], datagram, 0, flow.states, flow, 0.0)
            armed(took)
            if took:
                self._drain()
                return
        if small is not None:
            ticket = qp.rx_small()
            if ticket is not None:
                flow = IcrcFlow.ipv4(_IP_A, _IP_B, 0xC000, 4791)
                done = small(datagram, 0, flow.states, flow, qp.qpn, ticket)
                if type(done) is tuple:
                    qp.rx_small_done(*done)
                    self._drain()
                    return
        if icrc_ipv4(_IP_A, _IP_B, 0xC000, 4791, body) != int.from_bytes(datagram[-4:], "little"):
            return
        try:
            pkt = decode(body)
        except WireError:
            return
        qp.receive(pkt, 0.0)
        self._drain()

    def _drain(self) -> None:
        qp = self.b.qp
        owner = cast("ArmedOwner | None", qp.native)
        # As the port's transmit: the armed responder's ACK first, then the READ responses it
        # holds (every other time; else poll_transmit takes them back, disarming it).
        if owner is not None and (not owner.replying or (len(self.out) % 2 and qp.reply_unpaced())):
            ack = owner.take_ack()
            reply = owner.take_reply() if owner.replying else []
            if reply:
                qp.reply_sent(len(reply) + (ack is not None), 0.0)
            self.out += [encode(pkt) for pkt in ([ack] if ack is not None else []) + reply]
        for pkt in qp.poll_transmit(0.0):
            self.out.append(encode(pkt))
        self.b.drain()

    def fingerprint(self) -> tuple[Any, ...]:
        self.b.qp.disarm()  # the engine's state is what is compared
        return (
            bytes(self.b.mem), bytes(self.wo_mem), self.out, self.b.received, self.b.sent,
            self.b.qp.stats, responder_state(self.b.qp),
        )  # fmt: skip


#: The one thing ``craft`` gets wrong, if any.
DEFECTS = (
    "psn", "rkey", "region", "range", "align", "dma_len", "plen", "opcode", "tver", "pad", "pkey",
    "qpn", "trailing", "cut", "icrc", "denied",
)  # fmt: skip


def _datagram(rng: random.Random, pkt: Packet, defect: str | None, src: bytes, dst: bytes) -> bytes:
    """``pkt`` encoded with its ICRC from ``src`` to ``dst``, but for a header ``defect``."""
    body = bytearray(encode(pkt))
    if defect == "tver":
        body[1] |= rng.choice((1, 2, 8))
    elif defect == "pad":
        body[1] = (body[1] & ~0x30) | rng.choice((1, 2, 3)) << 4
    elif defect == "pkey":
        body[2:4] = rng.choice((b"\x00\x00", b"\x80\x01", b"\x7f\xfe"))
    elif defect == "qpn":
        body[5:8] = ((pkt.dest_qp + rng.randrange(1, 1 << 24)) & 0xFFFFFF).to_bytes(3, "big")
    elif defect == "trailing":
        body += bytes(rng.choice((4, 8)))
    elif defect == "cut":
        del body[rng.randrange(12, len(body)) :]
    crc = icrc_ipv4(src, dst, 0xC000, 4791, body)
    if defect == "icrc":
        crc ^= 1 << rng.randrange(32)
    return bytes(body) + pack_icrc(crc)


def craft(rng: random.Random, r: _Responder, defect: str | None) -> bytes:
    """A valid one-packet request for ``r``, but for ``defect``."""
    qp = r.b.qp
    if defect == "opcode":
        op = rng.choice(_OTHER)
    elif defect == "denied" and r.denied:
        op = rng.choice(r.denied)
    else:
        op = rng.choice(r.allowed)
    atomic = op in (Opcode.COMPARE_SWAP, Opcode.FETCH_ADD)
    psn = qp.resp.psn
    if defect == "psn":
        psn = (psn + rng.choice((-1, 1, 2, -5, 1 << 23))) & 0xFFFFFF
    mr = r.b.mr
    if defect == "region":
        mr = rng.choice((r.ro, r.wo))
    rkey = mr.rkey if defect != "rkey" else rng.choice((0, rng.getrandbits(32), r.b.mr.lkey))
    plen = rng.choice((1, 3, 8, 100, 255, 256))
    span = mr.length
    off = rng.randrange(0, span - 256) & ~7
    if rng.random() < 0.1:
        off = span - (8 if atomic else plen)  # up to the region's last byte
    if defect == "range":
        off = rng.choice((span - plen + 1, span - 4, span, span + 8, -1, -8, -(1 << 40)))
    elif defect == "align":
        off += rng.randrange(1, 8)
    va = (mr.addr + off) & ((1 << 64) - 1)
    if defect == "plen":
        plen = rng.choice((0, 257, 300))
    payload = rng.randbytes(plen)
    dma_len = plen
    if defect == "dma_len":
        dma_len = rng.choice((0, plen + 1, plen - 1, 1 << 31, (1 << 31) + 1))
    pkt: Packet
    if atomic:
        pkt = Packet(
            op, qp.qpn, psn, atomic_eth=AtomicETH(va, rkey, rng.getrandbits(64), rng.getrandbits(64))
        )
        if rng.random() < 0.5:  # a COMPARE SWAP that hits
            cur = int.from_bytes(r.b.mem[off : off + 8], "little") if 0 <= off < span - 8 else 0
            pkt = pkt._replace(atomic_eth=AtomicETH(va, rkey, rng.getrandbits(64), cur))
    elif op is Opcode.RDMA_READ_REQUEST:
        length = dma_len if defect == "dma_len" else rng.choice((0, 8, plen, 256, 700))
        pkt = Packet(op, qp.qpn, psn, reth=RETH(va, rkey, length))
    elif op in (Opcode.SEND_ONLY, Opcode.RDMA_WRITE_LAST):
        pkt = Packet(op, qp.qpn, psn, payload=payload)
    elif op is Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE:
        pkt = Packet(op, qp.qpn, psn, reth=RETH(va, rkey, dma_len), imm=7, payload=payload)
    else:
        pkt = Packet(op, qp.qpn, psn, reth=RETH(va, rkey, dma_len), payload=payload)
    pkt = pkt._replace(ackreq=rng.random() < 0.7, se=rng.random() < 0.2, fecn=rng.random() < 0.1)
    return _datagram(rng, pkt, defect, _IP_A, _IP_B)


@pytest.mark.parametrize("path", ["ticket", "armed"])
@pytest.mark.parametrize("max_rd_atomic", [0, 4])
@pytest.mark.parametrize("access", ["all", "write"])
def test_crafted_hostile_requests_equal_the_engine(max_rd_atomic: int, access: str, path: str) -> None:
    """``ticket``: through ``small_request``, compared after every packet; ``armed``: through the
    armed responder first (``take_small``), which stays armed across valid WRITEs and is
    compared (taken back) after every fourth packet and at the end."""
    acc = ALL_ACCESS if access == "all" else Access.LOCAL_WRITE | Access.REMOTE_WRITE
    native = _small()
    executed: dict[str | None, int] = {}
    current: list[str | None] = [None]

    def counting(*a: Any) -> Any:
        got = native(*a)
        if type(got) is tuple:
            executed[current[0]] = executed.get(current[0], 0) + 1
        return got

    def took(n: int) -> None:
        if n == 3:
            executed[current[0]] = executed.get(current[0], 0) + 1

    for seed in range(120):
        ref, nat = _Responder(seed, max_rd_atomic, acc), _Responder(seed, max_rd_atomic, acc)
        rng = random.Random(seed * 7919)
        for i in range(60):
            defect = rng.choice(DEFECTS) if rng.random() < 0.25 else None
            state = rng.getstate()
            d1 = craft(rng, ref, defect)
            rng.setstate(state)
            # (An armed responder's PSN is its own until taken back: the engine's copy is stale.)
            d2 = craft(rng, nat, defect) if path == "ticket" else craft(rng, ref, defect)
            assert d1 == d2
            current[0] = defect
            ref.feed(d1, None)
            if path == "armed":
                nat.feed(d2, None, took)
            else:
                nat.feed(d2, counting)
            over = ref.b.qp.rx_small() is None  # a class A/C error: the QP is in the error state
            if path == "ticket" or i % 4 == 3 or over or i == 59:
                assert nat.fingerprint() == ref.fingerprint(), (
                    f"seed={seed} packet {i} {defect}: {decode_or_bytes(d1)}"
                )
            if over:
                break
    # Valid requests took the native path, and none with a defect that is one for every
    # request (an unaligned WRITE, a READ of 0 bytes with any R_Key, a region that grants
    # the access, are valid).
    assert executed.get(None, 0) > (300 if path == "ticket" else 100)
    always = {"psn", "opcode", "tver", "pkey", "qpn", "trailing", "cut", "icrc"}
    assert not always & set(executed), executed


def test_an_armed_responder_checks_the_qps_access() -> None:
    """A QP that grants remote READ but not WRITE: an otherwise valid WRITE ONLY meets the
    armed responder and the engine alike (check_op_valid: a NAK, never placed)."""
    acc = Access.LOCAL_WRITE | Access.REMOTE_READ
    for seed in range(20):
        ref, nat = _Responder(seed, 0, acc), _Responder(seed, 0, acc)
        rng = random.Random(seed)
        d = craft(rng, ref, None)
        assert d[0] == Opcode.RDMA_WRITE_ONLY
        taken: list[int] = []
        ref.feed(d, None)
        nat.feed(d, None, taken.append)
        assert taken == [0]
        assert nat.fingerprint() == ref.fingerprint()


def decode_or_bytes(d: bytes) -> object:
    try:
        return decode(memoryview(d)[:-4])
    except WireError:
        return d.hex()


def test_the_port_takes_the_native_path_on_real_sockets(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over two soft devices on loopback, WRITE, READ and both atomics complete through it,
    each request sent by ``tx_small`` and the native ``send_packet``."""
    calls: dict[str, int] = {}
    monkeypatch.setattr(fastpath, "CODEC", _Counting(fastpath.NATIVE, calls))
    with (
        counting_tx() as sent,
        SoftDevice(new_ip(), port=0) as a,
        SoftDevice(new_ip(), port=0) as b,
        Driver() as drv,
    ):
        drv.add(a)
        drv.add(b)
        cqa, cqb = CompletionQueue(64), CompletionQueue(64)
        qa = a.create_qp(send_cq=cqa, recv_cq=cqa)
        qb = b.create_qp(send_cq=cqb, recv_cq=cqb)
        ma, mb = bytearray(range(64)), bytearray(64)
        mra = a.pd.register(ma, 0x1000, ALL_ACCESS)
        mrb = b.pd.register(mb, 0x9000, ALL_ACCESS)
        connect_qp(a, qa, 10, local_endpoint(b, qb, 20))
        connect_qp(b, qb, 20, local_endpoint(a, qa, 10))
        mb[32:40] = (5).to_bytes(8, "little")
        mb[40:48] = (9).to_bytes(8, "little")
        work = [
            (WrOpcode.RDMA_WRITE, SGE(0x1000, 16, mra.lkey), 0x9000, {}),
            (WrOpcode.RDMA_READ, SGE(0x1000 + 48, 16, mra.lkey), 0x9000 + 16, {}),
            (WrOpcode.ATOMIC_FETCH_AND_ADD, SGE(0x1000 + 16, 8, mra.lkey), 0x9000 + 32, {"compare_add": 3}),
            (
                WrOpcode.ATOMIC_CMP_AND_SWP,
                SGE(0x1000 + 24, 8, mra.lkey),
                0x9000 + 40,
                {"compare_add": 9, "swap": 1},
            ),
        ]
        for i, (op, sge, addr, kw) in enumerate(work):
            if op is WrOpcode.ATOMIC_CMP_AND_SWP:
                kw["swap"] = 1
            wr = SendWR(wr_id=i, opcode=op, sg_list=(sge,), remote_addr=addr, rkey=mrb.rkey, **kw)  # type: ignore[arg-type]
            qa.post_send(wr)
            assert drv.run_until(lambda: len(cqa) > 0, 10.0)
            (wc,) = cqa.poll()
            assert wc.status is WcStatus.SUCCESS, op
    assert mb[:16] == bytes(range(16))
    assert ma[48:64] == mb[16:32]
    assert int.from_bytes(ma[16:24], "little") == 5
    assert int.from_bytes(mb[32:40], "little") == 8
    assert int.from_bytes(ma[24:32], "little") == 9
    assert int.from_bytes(mb[40:48], "little") == 1
    # The WRITE, the READ and the atomics met b's responder, armed for them (``Armed``: executed,
    # their ACK, READ RESPONSE and ATOMIC ACKNOWLEDGEs built and sent in C).
    assert calls.get("arm", 0) >= 1
    # (a request resent after a stall, a duplicate, is the engine's: small_request is asked first)
    assert calls.get("small_request", 0) <= qa.stats.probes + qa.stats.retransmits
    assert calls.get("send_packet", 0) >= 4  # the requests
    qb.disarm()
    assert qb.resp.msn == 4
    assert qb.stats.packets_out >= 4
    assert {op for _, op in sent} == {
        Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_READ_REQUEST, Opcode.FETCH_ADD, Opcode.COMPARE_SWAP,
    }  # fmt: skip


# -- crafted hostile responses ---------------------------------------------------------

_RESP_DEFECTS = (
    "psn", "opcode", "nak", "rnr", "pkey", "qpn", "tver", "pad", "length", "trailing", "cut", "icrc",
    "atomic_ack_for_write",
)  # fmt: skip
_REQ_OPS = (WrOpcode.RDMA_WRITE, WrOpcode.SEND, WrOpcode.RDMA_READ, WrOpcode.ATOMIC_FETCH_AND_ADD)


class _Requester:
    """A connected QP whose responses come from ``craft_response``; the peer is never run."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.a = make_side("a", rng, 4096, QpCaps(), 256)
        self.b = make_side("b", rng, 4096, QpCaps(), 256)
        connect(self.a.qp, self.b.qp, rng, mtu=256)
        fill(self.a.mem, random.Random(seed + 1))
        self.sent: list[bytes] = []
        self.now = 0.0

    def post(self, rng: random.Random) -> None:
        op = rng.choice(_REQ_OPS)
        length = 8 if op is WrOpcode.ATOMIC_FETCH_AND_ADD else rng.choice((0, 1, 8, 100, 256, 300))
        off = rng.randrange(0, 2048) & ~7
        sges = (
            (self.a.sge(off, length),) if rng.random() < 0.9 else (self.a.sge(off, 4), self.a.sge(off + 8, 4))
        )
        if op is WrOpcode.ATOMIC_FETCH_AND_ADD and len(sges) == 2:
            sges = (self.a.sge(off, 8),)
        kw: dict[str, Any] = {} if op is WrOpcode.SEND else {"remote_addr": self.b.mr.addr + off, "rkey": 5}
        if op is WrOpcode.ATOMIC_FETCH_AND_ADD:
            kw["compare_add"] = 1
        self.a.qp.post_send(SendWR(wr_id=rng.getrandbits(16), opcode=op, sg_list=sges, **kw))
        self._drain()

    def _drain(self) -> None:
        self.now += 0.001
        self.sent += [encode(p) for p in self.a.qp.poll_transmit(self.now)]
        self.a.drain()

    def feed(self, datagram: bytes, codec: SegmentCodec | None) -> None:
        qp = self.a.qp
        body = memoryview(datagram)[:-4]
        if codec is not None and codec.small_response is not None:
            ticket = qp.rx_small_resp()
            if ticket is not None:
                flow = IcrcFlow.ipv4(_IP_B, _IP_A, 0xC000, 4791)
                got = codec.small_response(datagram, 0, flow.states, flow, qp.qpn, ticket)
                if type(got) is tuple:
                    qp.rx_small_resp_done(got[0], got[1], self.now, datagram)
                    self._drain()
                    return
        if icrc_ipv4(_IP_B, _IP_A, 0xC000, 4791, body) == int.from_bytes(datagram[-4:], "little"):
            try:
                pkt = decode(body)
            except WireError:
                pass
            else:
                qp.receive(pkt, self.now)
        self._drain()

    def fingerprint(self) -> tuple[Any, ...]:
        return bytes(self.a.mem), self.sent, self.a.sent, self.a.qp.stats, requester_state(self.a.qp)


def craft_response(rng: random.Random, r: _Requester, defect: str | None) -> bytes:
    """The response that completes the head of ``r``'s send queue, but for ``defect``."""
    qp = r.a.qp
    wqe = qp.req.sq[0] if qp.req.sq else None
    dqpn = qp.qpn  # responses name the requester's QP
    aeth = AETH(0, rng.getrandbits(24))
    if defect == "nak":
        aeth = AETH(0x60 | rng.choice((0, 1, 2, 3, 4)), aeth.msn)
    elif defect == "rnr":
        aeth = AETH(0x20 | rng.randrange(32), aeth.msn)
    kind = "ack" if wqe is None or wqe.kind == 0 else ("read" if wqe.kind == 1 else "atomic")
    if defect == "opcode":
        kind = rng.choice([k for k in ("ack", "read", "atomic") if k != kind])
    elif defect == "atomic_ack_for_write" and kind == "ack":
        kind = "atomic"
    psn = (
        (wqe.last_psn if wqe is not None else qp.req.comp_psn)
        if kind != "read" or wqe is None
        else wqe.first_psn
    )
    if defect == "psn":
        psn = (psn + rng.choice((-1, 1, 2, -3, 1 << 23))) & 0xFFFFFF
    length = wqe.length if wqe is not None else 0
    if defect == "length":
        length = rng.choice((length + 1, max(length - 1, 0), 257, 0))
    pkt: Packet
    if kind == "ack":
        pkt = Packet(Opcode.ACKNOWLEDGE, dqpn, psn, aeth=aeth)
    elif kind == "read":
        pkt = Packet(Opcode.RDMA_READ_RESPONSE_ONLY, dqpn, psn, aeth=aeth, payload=rng.randbytes(length))
    else:
        pkt = Packet(Opcode.ATOMIC_ACKNOWLEDGE, dqpn, psn, aeth=aeth, atomic_ack=rng.getrandbits(64))
    return _datagram(rng, pkt, defect, _IP_B, _IP_A)


def test_crafted_hostile_responses_equal_the_engine() -> None:
    codec = _codec()
    assert codec.small_response is not None
    native = codec.small_response
    executed: dict[str | None, int] = {}
    current: list[str | None] = [None]

    def counting(*a: Any) -> Any:
        got = native(*a)
        if type(got) is tuple:
            executed[current[0]] = executed.get(current[0], 0) + 1
        return got

    class Counting:
        small_request = None
        small_response = staticmethod(counting)

    for seed in range(150):
        ref, nat = _Requester(seed), _Requester(seed)
        rng = random.Random(seed * 104729)
        for i in range(50):
            if not nat.a.qp.req.sq or rng.random() < 0.1:
                state = rng.getstate()
                ref.post(rng)
                rng.setstate(state)
                nat.post(rng)
            defect = rng.choice(_RESP_DEFECTS) if rng.random() < 0.3 else None
            state = rng.getstate()
            d1 = craft_response(rng, ref, defect)
            rng.setstate(state)
            d2 = craft_response(rng, nat, defect)
            assert d1 == d2
            current[0] = defect
            ref.feed(d1, None)
            nat.feed(d2, cast(SegmentCodec, Counting()))
            assert nat.fingerprint() == ref.fingerprint(), (
                f"seed={seed} response {i} {defect}: {decode_or_bytes(d1)}"
            )
            if nat.a.qp.state is not ref.a.qp.state or ref.a.qp.state.name == "ERR":
                break
    assert executed.get(None, 0) > 500
    always = {"psn", "opcode", "nak", "rnr", "pkey", "qpn", "tver", "trailing", "cut", "icrc"}
    assert not always & set(executed), executed
