"""Two connected engine QPs on a simulated network, random checked workloads, back-to-back pumping.

`make_pair` builds what a verbs program builds on each side (a protection
domain, a registered region, send and receive CQs, an RC QP) and brings both
QPs through RESET -> INIT -> RTR -> RTS (IBTA Vol. 1 §10.3, as pyverbs'
``to_rts`` does), attached to a `rdmakit.transport.simnet.SimNet` with the
given `Faults` (profiles in `rdmakit.testing.faults`). The network runs on a
virtual clock: a seed replays a run exactly.

`Workload` posts random work from one side at the other (every RC opcode,
scatter lists, atomics) and `Workload.check` asserts the outcome: completions
in order, data placed, every FETCH_ADD applied exactly once.

`pump` delivers packets between two QPs with no network at all.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

from rdmakit.engine import (
    SGE,
    Access,
    Completion,
    CompletionQueue,
    MemoryRegion,
    ProtectionDomain,
    QpCaps,
    QpState,
    QueuePair,
    RecvWR,
    SendWR,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from rdmakit.transport.codec import SegmentCodec
from rdmakit.transport.simnet import Faults, SimNet
from rdmakit.wire import Packet

ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
BASE_ADDR = 0x10_0000_0000


@dataclass
class Side:
    name: str
    pd: ProtectionDomain
    qp: QueuePair
    scq: CompletionQueue
    rcq: CompletionQueue
    mem: bytearray
    mr: MemoryRegion
    sent: list[Completion] = field(default_factory=list)
    received: list[Completion] = field(default_factory=list)

    def sge(self, off: int, length: int) -> SGE:
        return SGE(self.mr.addr + off, length, self.mr.lkey)

    def drain(self) -> None:
        self.sent += self.scq.poll(1 << 30)
        self.received += self.rcq.poll(1 << 30)


@dataclass
class Pair:
    net: SimNet
    a: Side
    b: Side

    def drain(self) -> None:
        self.a.drain()
        self.b.drain()

    def run_until_completions(self, n_a_send: int, n_b_recv: int = 0, max_time: float = 30.0) -> bool:
        def done() -> bool:
            self.drain()
            return len(self.a.sent) >= n_a_send and len(self.b.received) >= n_b_recv

        return self.net.run(until=done, max_time=max_time)


def make_side(name: str, rng: random.Random, mem_size: int, caps: QpCaps, cq_depth: int) -> Side:
    pd = ProtectionDomain(rng)
    mem = bytearray(mem_size)
    mr = pd.register(mem, BASE_ADDR + rng.randrange(1 << 20) * 4096, ALL_ACCESS)
    scq = CompletionQueue(cq_depth)
    rcq = CompletionQueue(cq_depth)
    qp = QueuePair(pd, qpn=rng.randrange(2, 1 << 24), send_cq=scq, recv_cq=rcq, caps=caps, rng=rng)
    return Side(name, pd, qp, scq, rcq, mem, mr)


def connect(
    a: QueuePair,
    b: QueuePair,
    rng: random.Random,
    *,
    mtu: int = 1024,
    timeout: int = 8,
    retry_cnt: int = 7,
    rnr_retry: int = 7,
    min_rnr_timer: int = 1,
    max_rd_atomic: int = 16,
    access: Access = ALL_ACCESS,
    remotes: tuple[object, object] = ("b", "a"),
) -> None:
    """RESET -> INIT -> RTR -> RTS for both, as pyverbs ``to_rts`` does."""
    psn_a, psn_b = rng.getrandbits(24), rng.getrandbits(24)
    for qp, peer, my_psn, peer_psn, remote in (
        (a, b, psn_a, psn_b, remotes[0]),
        (b, a, psn_b, psn_a, remotes[1]),
    ):
        qp.modify(QpState.INIT, port=1, pkey_index=0, access=access)
        qp.modify(
            QpState.RTR,
            path_mtu=mtu,
            dest_qpn=peer.qpn,
            rq_psn=peer_psn,
            max_dest_rd_atomic=max_rd_atomic,
            min_rnr_timer=min_rnr_timer,
            remote=remote,
        )
        qp.modify(
            QpState.RTS,
            timeout=timeout,
            retry_cnt=retry_cnt,
            rnr_retry=rnr_retry,
            sq_psn=my_psn,
            max_rd_atomic=max_rd_atomic,
        )


class ConnectOptions(TypedDict, total=False):
    """The keyword arguments of `connect`: the QP attributes it sets."""

    mtu: int
    timeout: int
    retry_cnt: int
    rnr_retry: int
    min_rnr_timer: int
    max_rd_atomic: int
    access: Access
    remotes: tuple[object, object]


class PairOptions(ConnectOptions, total=False):
    """The keyword arguments of `make_pair`: `connect`'s and the sides' own."""

    mem_size: int
    caps: QpCaps | None
    cq_depth: int
    bulk: bool
    small: SegmentCodec | None


def make_pair(
    seed: int,
    faults: Faults | None = None,
    *,
    mem_size: int = 1 << 16,
    caps: QpCaps | None = None,
    cq_depth: int = 4096,
    bulk: bool = False,
    small: SegmentCodec | None = None,
    post: bool = False,
    **conn: Unpack[ConnectOptions],
) -> Pair:
    """Two sides ``a`` and ``b`` with `mem_size` bytes registered each, their QPs connected
    (`connect`, with `conn`) and attached to a new `SimNet` seeded with `seed` (`bulk`,
    `small`, `post`: see `SimNet`)."""
    rng = random.Random(seed)
    net = SimNet(seed, faults, bulk=bulk, small=small, post=post)
    caps = caps or QpCaps()
    a = make_side("a", rng, mem_size, caps, cq_depth)
    b = make_side("b", rng, mem_size, caps, cq_depth)
    connect(a.qp, b.qp, rng, **conn)
    net.attach("a", a.qp)
    net.attach("b", b.qp)
    return Pair(net, a, b)


def fill(mem: bytearray, rng: random.Random) -> None:
    mem[:] = rng.randbytes(len(mem))


def send_wr(wr_id: int, op: WrOpcode, sges: tuple[SGE, ...], **kw: object) -> SendWR:
    return SendWR(wr_id=wr_id, opcode=op, sg_list=sges, **kw)  # type: ignore[arg-type]


def recv_wr(wr_id: int, sges: tuple[SGE, ...]) -> RecvWR:
    return RecvWR(wr_id=wr_id, sg_list=sges)


# -- a checked random workload --------------------------------------------------

_RECV_OPS = (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)


@dataclass
class Workload:
    """Random work posted by ``src`` at ``dst``; ``check()`` asserts the outcome."""

    src: Side
    dst: Side
    rng: random.Random
    n: int
    max_len: int
    #: Offsets of this workload's source area in ``src.mem`` and target area in ``dst.mem``.
    src_base: int = 0
    dst_base: int = 0
    posted: list[tuple[SendWR, object]] = field(default_factory=list)
    recvs: list[tuple[int, int, int]] = field(default_factory=list)  # (wr_id, dst_off, cap)
    fetch_adds: int = 0
    counter_off: int = 0
    expect_signaled: list[int] = field(default_factory=list)
    expect_recv: list[tuple[int, WcOpcode, int, int | None]] = field(default_factory=list)

    def post(self, ops: tuple[WrOpcode, ...] = tuple(WrOpcode)) -> None:
        src, dst, rng = self.src, self.dst, self.rng
        # Memory layout: first 64 bytes of each side's region hold atomic targets.
        self.counter_off = self.dst_base
        dst.mem[self.counter_off : self.counter_off + 8] = bytes(8)
        soff = self.src_base
        doff = self.dst_base + 64
        for i in range(self.n):
            op = rng.choice(ops)
            wr_id = 1000 * (1 + (src.name == "b")) + i
            # The last one is signaled: its completion implies all before it completed.
            signaled = i == self.n - 1 or rng.random() < 0.8
            length = rng.choice((0, 1, self.max_len // 2, self.max_len, rng.randrange(self.max_len + 1)))
            if op in (WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP):
                length = 8
            assert soff + length <= len(src.mem), "memory too small"
            assert doff + length + 8 <= len(dst.mem), "memory too small"
            kw: dict[str, object] = {}
            if op in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM):
                kw["imm_data"] = rng.getrandbits(32)
            record: object = None
            if op is WrOpcode.ATOMIC_FETCH_AND_ADD:
                kw.update(remote_addr=dst.mr.addr + self.counter_off, rkey=dst.mr.rkey, compare_add=1)
                self.fetch_adds += 1
                record = ("fadd", soff)
            elif op is WrOpcode.ATOMIC_CMP_AND_SWP:
                doff = (doff + 7) & ~7
                old = rng.getrandbits(64)
                new = rng.getrandbits(64)
                hit = rng.random() < 0.5
                dst.mem[doff : doff + 8] = old.to_bytes(8, "little")
                kw.update(
                    remote_addr=dst.mr.addr + doff,
                    rkey=dst.mr.rkey,
                    compare_add=old if hit else old ^ 1,
                    swap=new,
                )
                record = ("cas", soff, doff, old, new if hit else old)
            elif op in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.RDMA_READ):
                kw.update(remote_addr=dst.mr.addr + doff, rkey=dst.mr.rkey)
                record = ("rdma", soff, doff, length)
            else:
                record = ("send", soff, doff, length)
            if op in _RECV_OPS:
                rid = 5000 * (1 + (dst.name == "b")) + i
                cap = length + rng.randrange(3)
                sges: tuple[SGE, ...] = () if op is WrOpcode.RDMA_WRITE_WITH_IMM else (dst.sge(doff, cap),)
                dst.qp.post_recv(RecvWR(wr_id=rid, sg_list=sges))
                imm = kw.get("imm_data")
                assert imm is None or isinstance(imm, int)
                if op is WrOpcode.RDMA_WRITE_WITH_IMM:
                    self.expect_recv.append((rid, WcOpcode.RECV_RDMA_WITH_IMM, length, imm))
                else:
                    self.expect_recv.append((rid, WcOpcode.RECV, length, imm))
            # Split the local buffer into 1-3 SGEs sometimes.
            if length >= 3 and rng.random() < 0.3 and op not in (
                WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP,
            ):  # fmt: skip
                cut = sorted(rng.sample(range(1, length), 2))
                sges = (
                    src.sge(soff, cut[0]),
                    src.sge(soff + cut[0], cut[1] - cut[0]),
                    src.sge(soff + cut[1], length - cut[1]),
                )
            else:
                sges = (src.sge(soff, length),)
            # Every other message that takes a receive WQE asks for a solicited event (SE).
            solicited = op in _RECV_OPS and i % 2 == 0
            wr = SendWR(wr_id=wr_id, opcode=op, sg_list=sges, signaled=signaled, solicited=solicited, **kw)  # type: ignore[arg-type]
            src.qp.post_send(wr)
            self.posted.append((wr, record))
            if signaled:
                self.expect_signaled.append(wr_id)
            soff += length + 8
            doff += length + 8

    @property
    def n_signaled(self) -> int:
        return len(self.expect_signaled)

    def check(self) -> None:
        src, dst = self.src, self.dst
        sent = [c for c in src.sent if c.wr_id < 5000]
        assert [c.wr_id for c in sent] == self.expect_signaled, "send completions out of order or missing"
        assert all(c.status is WcStatus.SUCCESS for c in sent), [c for c in sent if c.status]
        got = [(c.wr_id, c.opcode, c.byte_len, c.imm_data) for c in dst.received]
        assert got == self.expect_recv, (got, self.expect_recv)
        assert all(c.status is WcStatus.SUCCESS for c in dst.received)
        fadd_results = []
        for wr, record in self.posted:
            assert isinstance(record, tuple)
            kind = record[0]
            if kind == "fadd":
                fadd_results.append(int.from_bytes(src.mem[record[1] : record[1] + 8], "little"))
            elif kind == "cas":
                _, soff, doff, old, final = record
                assert int.from_bytes(src.mem[soff : soff + 8], "little") == old
                assert int.from_bytes(dst.mem[doff : doff + 8], "little") == final
            elif wr.opcode is WrOpcode.RDMA_READ:
                _, soff, doff, length = record
                assert src.mem[soff : soff + length] == dst.mem[doff : doff + length], f"READ {wr.wr_id}"
            else:
                _, soff, doff, length = record
                assert dst.mem[doff : doff + length] == src.mem[soff : soff + length], (
                    f"{wr.opcode.name} {wr.wr_id}"
                )
        # Exactly once: the counter counts every FETCH_ADD, each saw a distinct value.
        c = self.counter_off
        assert int.from_bytes(dst.mem[c : c + 8], "little") == self.fetch_adds
        assert sorted(fadd_results) == list(range(self.fetch_adds))


def both_ways(
    p: Pair, rng: random.Random, n: int, max_len: int, half: int, ops: tuple[WrOpcode, ...] = tuple(WrOpcode)
) -> tuple[Workload, Workload]:
    """Fill both memories from ``rng``, then post ``n`` random operations from ``a`` at ``b`` and
    ``n`` from ``b`` at ``a`` (``Workload``: sources from offset 0, targets from ``half``)."""
    fill(p.a.mem, rng)
    fill(p.b.mem, rng)
    w1 = Workload(p.a, p.b, rng, n, max_len, 0, half)
    w1.post(ops)
    w2 = Workload(p.b, p.a, rng, n, max_len, 0, half)
    w2.post(ops)
    return w1, w2


def rounds_each_way(
    p: Pair, rng: random.Random, seed: int, rounds: int, ops: tuple[WrOpcode, ...], max_len: int, stride: int
) -> list[object]:
    """``rounds`` rounds of one work request each way (of ``ops``, at most ``max_len`` bytes; the
    round's areas ``stride`` apart), each run until both sides' signaled completions are in, then
    a millisecond more, and checked: every round's completions, in order, by side."""
    done: list[object] = []
    for r in range(rounds):
        base = (r % 16) * stride
        w1 = Workload(p.a, p.b, rng, 1, max_len, base, 32768 + base)
        w2 = Workload(p.b, p.a, rng, 1, max_len, base, 32768 + base)
        w1.post(ops)
        w2.post(ops)

        def sent(w1: Workload = w1, w2: Workload = w2) -> bool:
            p.drain()
            return len(p.a.sent) >= w1.n_signaled and len(p.b.sent) >= w2.n_signaled

        assert p.net.run(until=sent, max_time=600.0), f"seed={seed} round {r}"
        p.net.run(max_time=p.net.now + 1e-3)
        p.drain()
        w1.check()
        w2.check()
        done += [(s.name, c) for s in (p.a, p.b) for c in (*s.sent, *s.received)]
        for s in (p.a, p.b):
            s.sent.clear()
            s.received.clear()
    return done


def finished(p: Pair, w1: Workload, w2: Workload) -> bool:
    """Drain ``p``'s CQs; True once every signaled and receive completion of both workloads is in."""
    p.drain()
    return (
        len(p.a.sent) >= w1.n_signaled
        and len(p.b.received) >= len(w1.expect_recv)
        and len(p.b.sent) >= w2.n_signaled
        and len(p.a.received) >= len(w2.expect_recv)
    )


__all__ = [
    "ALL_ACCESS",
    "BASE_ADDR",
    "Captured",
    "ConnectOptions",
    "Pair",
    "PairOptions",
    "Side",
    "Workload",
    "both_ways",
    "connect",
    "fill",
    "finished",
    "make_pair",
    "make_side",
    "pump",
    "recv_wr",
    "rounds_each_way",
    "send_wr",
    "until_completions",
]


# -- back-to-back QPs without a network -------------------------------------------

Captured = list[tuple[QueuePair, Packet]]


def pump(
    a: QueuePair,
    b: QueuePair,
    now: float = 0.0,
    capture: Captured | None = None,
    drop: Callable[[QueuePair, Packet], bool] | None = None,
    max_rounds: int = 100_000,
) -> None:
    """Deliver packets between ``a`` and ``b`` at time ``now`` until neither has anything to send."""
    for _ in range(max_rounds):
        moved = False
        for src, dst in ((a, b), (b, a)):
            for pkt in src.poll_transmit(now):
                moved = True
                if capture is not None:
                    capture.append((src, pkt))
                if drop is None or not drop(src, pkt):
                    dst.receive(pkt, now)
        if not moved:
            return
    raise AssertionError("pump did not settle")


def until_completions(cq: CompletionQueue, into: list[Completion], n: int = 1) -> Callable[[], bool]:
    """A predicate for a progress loop (``Driver.run_until``, ``SimNet.run``): polls `cq` into
    `into` and holds once `into` has `n` completions."""

    def done() -> bool:
        into.extend(cq.poll(max(n - len(into), 1)))
        return len(into) >= n

    return done
