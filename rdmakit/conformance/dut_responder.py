"""Cases where the tester is the requester and the DUT responds (IBTA Vol. 1 §9.7.5, §9.9.2)."""

from . import frames as F
from .frames import psn_add
from .harness import Ctx, DutQp, Mr, case, check

R = "responder"  # the DUT's role: the tester sends requests
NAK_INV, NAK_ACC, NAK_SEQ = F.NAK_INVALID_REQ, F.NAK_REMOTE_ACCESS, F.NAK_PSN_SEQ


def setup(ctx: Ctx, *, mtu: int = 1024, recvs: int = 0, mr_len: int = 4096, access: int = 0xF,
          mr_access: int = 0xF, **kw: int) -> tuple[DutQp, Mr]:  # fmt: skip
    qp = ctx.dut_qp(mtu=mtu, access=access, **kw)
    mr = ctx.mr(mr_len, mr_access)
    for i in range(recvs):
        ctx.post_recv(mr, wr_id=i + 1)
    return qp, mr


def u64(b: bytes) -> int:
    return int.from_bytes(b, "little")


def alive(ctx: Ctx, qp: DutQp, psn: int, mr: Mr, msn: int) -> None:
    """The QP still executes a WRITE at ``psn`` (what was dropped before changed nothing)."""
    ctx.send(F.WRITE_ONLY, psn, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"live")
    ctx.expect_ack(psn, msn)


# -- successful operations (roce-sim: send, write, write-imm, read, CAS success) --


@case(
    "resp.send.only",
    R,
    "SEND ONLY is placed, completed and ACKed with MSN 1",
    "IBTA Vol.1 §9.4.1, C9-148; roce-sim send",
    "ACK PSN n, MSN 1; RECV completion with the data",
)
def _send_only(ctx: Ctx) -> None:
    qp, mr = setup(ctx, recvs=1)
    data = ctx.rng.randbytes(100)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=data)
    ctx.expect_ack(qp.rq_psn, 1)
    wc = ctx.wait_wc("recv")[0]
    check(wc["status"] == "SUCCESS" and wc["byte_len"] == 100, f"receive completion {wc}")
    check(ctx.read_mem(mr, 0, 100) == data, "the received data differs")


@case(
    "resp.send.multi",
    R,
    "SEND FIRST/MIDDLE/LAST at MTU 256 is one message",
    "IBTA Vol.1 §9.4.1, C9-92..C9-94",
    "one ACK of the LAST with MSN 1; byte_len 600",
)
def _send_multi(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256, recvs=1)
    data = ctx.rng.randbytes(600)
    p = qp.rq_psn
    ctx.send(F.SEND_FIRST, p, payload=data[:256])
    ctx.send(F.SEND_MIDDLE, psn_add(p, 1), payload=data[256:512])
    ctx.send(F.SEND_LAST, psn_add(p, 2), ackreq=True, payload=data[512:])
    ctx.expect_ack(psn_add(p, 2), 1)
    wc = ctx.wait_wc("recv")[0]
    check(wc["byte_len"] == 600, f"receive completion {wc}")
    check(ctx.read_mem(mr, 0, 600) == data, "the received data differs")


@case(
    "resp.send.imm",
    R,
    "SEND ONLY with immediate delivers the ImmDt in the completion",
    "IBTA Vol.1 §9.4.1, §9.3 ImmDt",
    "ACK; RECV completion carrying the immediate",
)
def _send_imm(ctx: Ctx) -> None:
    qp, _ = setup(ctx, recvs=1)
    imm = ctx.rng.getrandbits(32)
    ctx.send(F.SEND_ONLY_IMM, qp.rq_psn, ackreq=True, imm=imm, payload=b"x" * 8)
    ctx.expect_ack(qp.rq_psn, 1)
    wc = ctx.wait_wc("recv")[0]
    check(wc["imm"] == imm, f"immediate {wc['imm']} != {imm}")


@case(
    "resp.write.only",
    R,
    "RDMA WRITE ONLY lands at the RETH address and is ACKed",
    "IBTA Vol.1 §9.4.2; roce-sim write",
    "ACK MSN 1; memory holds the data",
)
def _write_only(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    data = ctx.rng.randbytes(200)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr + 64, mr.rkey, 200), payload=data)
    ctx.expect_ack(qp.rq_psn, 1)
    check(ctx.read_mem(mr, 64, 200) == data, "the written data differs")


@case(
    "resp.write.multi",
    R,
    "RDMA WRITE FIRST/MIDDLE/LAST at MTU 256 lands contiguously",
    "IBTA Vol.1 §9.4.2, C9-92..C9-94",
    "ACK of the LAST, MSN 1; memory holds the data",
)
def _write_multi(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    data = ctx.rng.randbytes(700)
    p = qp.rq_psn
    ctx.send(F.WRITE_FIRST, p, reth=(mr.addr, mr.rkey, 700), payload=data[:256])
    ctx.send(F.WRITE_MIDDLE, psn_add(p, 1), payload=data[256:512])
    ctx.send(F.WRITE_LAST, psn_add(p, 2), ackreq=True, payload=data[512:])
    ctx.expect_ack(psn_add(p, 2), 1)
    check(ctx.read_mem(mr, 0, 700) == data, "the written data differs")


@case(
    "resp.write.imm",
    R,
    "RDMA WRITE with immediate consumes a receive and reports the ImmDt",
    "IBTA Vol.1 §9.4.2; roce-sim write-imm",
    "ACK; RECV_RDMA_WITH_IMM completion with the immediate",
)
def _write_imm(ctx: Ctx) -> None:
    qp, mr = setup(ctx, recvs=1)
    imm = ctx.rng.getrandbits(32)
    ctx.send(
        F.WRITE_ONLY_IMM, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 16), imm=imm, payload=b"i" * 16
    )
    ctx.expect_ack(qp.rq_psn, 1)
    wc = ctx.wait_wc("recv")[0]
    check(wc["opcode"] == "RECV_RDMA_WITH_IMM" and wc["imm"] == imm, f"receive completion {wc}")


@case(
    "resp.read.only",
    R,
    "RDMA READ of less than an MTU is answered with READ RESPONSE ONLY",
    "IBTA Vol.1 §9.4.3, §9.7.5.1.2; roce-sim read",
    "READ_RESP_ONLY at the request PSN with AETH MSN 1",
)
def _read_only(ctx: Ctx) -> None:
    data = ctx.rng.randbytes(300)
    qp, mr = setup(ctx)
    ctx.write_mem(mr, 0, data)
    ctx.send(F.READ_REQUEST, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 300))
    rx = ctx.expect("READ response")
    check(rx.opcode == F.READ_RESP_ONLY and rx.psn == qp.rq_psn, f"got {rx.describe()}")
    check(rx.msn == 1 and rx.ack_kind == F.ACK_KIND, f"AETH {rx.describe()}")
    check(rx.payload == data, "the read data differs")


@case(
    "resp.read.multi",
    R,
    "A 3-packet READ: FIRST and LAST carry an AETH, MIDDLE none, PSNs consecutive",
    "IBTA Vol.1 §9.4.3, §9.2 table 35",
    "READ_RESP FIRST/MIDDLE/LAST at n, n+1, n+2; data in order",
)
def _read_multi(ctx: Ctx) -> None:
    data = ctx.rng.randbytes(600)
    qp, mr = setup(ctx, mtu=256)
    ctx.write_mem(mr, 0, data)
    p = qp.rq_psn
    ctx.send(F.READ_REQUEST, p, ackreq=True, reth=(mr.addr, mr.rkey, 600))
    got = b""
    for i, op in enumerate((F.READ_RESP_FIRST, F.READ_RESP_MIDDLE, F.READ_RESP_LAST)):
        rx = ctx.expect(F.OPCODE_NAMES[op])
        check(rx.opcode == op and rx.psn == psn_add(p, i), f"packet {i}: {rx.describe()}")
        check((rx.syndrome is None) == (op == F.READ_RESP_MIDDLE), f"AETH presence: {rx.describe()}")
        got += rx.payload
    check(got == data, "the read data differs")


def _atomic(ctx: Ctx, op: int, init: int, swap: int, cmp: int, want_mem: int) -> None:
    qp, mr = setup(ctx)
    ctx.write_mem(mr, 8, init.to_bytes(8, "little"))
    ctx.send(op, qp.rq_psn, ackreq=True, atomic=(mr.addr + 8, mr.rkey, swap, cmp))
    rx = ctx.expect("ATOMIC ACKNOWLEDGE")
    check(rx.opcode == F.ATOMIC_ACKNOWLEDGE and rx.psn == qp.rq_psn, f"got {rx.describe()}")
    check(rx.orig == init and rx.msn == 1, f"original value {rx.orig} != {init}: {rx.describe()}")
    check(u64(ctx.read_mem(mr, 8, 8)) == want_mem, "the target after the atomic is wrong")


@case(
    "resp.atomic.cas",
    R,
    "COMPARE & SWAP that matches swaps and returns the original",
    "IBTA Vol.1 §9.4.5; roce-sim CAS success",
    "ATOMIC_ACK with the original value; memory swapped",
)
def _cas(ctx: Ctx) -> None:
    v = ctx.rng.getrandbits(64)
    _atomic(ctx, F.COMPARE_SWAP, v, 0x1122334455667788, v, 0x1122334455667788)


@case(
    "resp.atomic.cas_miss",
    R,
    "COMPARE & SWAP that does not match leaves memory alone",
    "IBTA Vol.1 §9.4.5",
    "ATOMIC_ACK with the original value; memory unchanged",
)
def _cas_miss(ctx: Ctx) -> None:
    v = ctx.rng.getrandbits(63)
    _atomic(ctx, F.COMPARE_SWAP, v, 5, v + 1, v)


@case(
    "resp.atomic.fadd",
    R,
    "FETCH & ADD adds modulo 2^64 and returns the original",
    "IBTA Vol.1 §9.4.5",
    "ATOMIC_ACK with the original value; memory = original + add",
)
def _fadd(ctx: Ctx) -> None:
    v = (1 << 64) - 3
    _atomic(ctx, F.FETCH_ADD, v, 10, 0, 7)


@case(
    "resp.msn.progress",
    R,
    "MSN counts completed messages: three SENDs give MSN 1, 2, 3",
    "IBTA Vol.1 §9.7.5.1.1, C9-148",
    "ACKs with MSN 1, 2, 3",
)
def _msn(ctx: Ctx) -> None:
    qp, _ = setup(ctx, recvs=3)
    for i in range(3):
        ctx.send(F.SEND_ONLY, psn_add(qp.rq_psn, i), ackreq=True, payload=b"m")
        ctx.expect_ack(psn_add(qp.rq_psn, i), i + 1)


@case(
    "resp.ack.coalesce",
    R,
    "Requests without AckReq may be acknowledged by one later ACK",
    "IBTA Vol.1 §9.7.5.1.1 (coalesced ACKs)",
    "the last ACK covers the 4th PSN with MSN 4; none beyond it",
)
def _coalesce(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    for i in range(4):
        ctx.send(
            F.WRITE_ONLY, psn_add(qp.rq_psn, i), ackreq=i == 3, reth=(mr.addr, mr.rkey, 8), payload=b"c" * 8
        )
    last = psn_add(qp.rq_psn, 3)
    while True:
        rx = ctx.expect("an ACK")
        check(rx.is_ack(), f"got {rx.describe()}")
        if rx.psn == last:
            check(rx.msn == 4, f"MSN {rx.msn} in the final ACK, expected 4")
            break
    ctx.silence(0.3)


# -- PSN sequence errors and duplicates (IBTA §9.7.5.2.1, §9.9.2.1) --


@case(
    "resp.psn.gap_nak",
    R,
    "A request past the expected PSN is NAKed with the expected PSN",
    "IBTA Vol.1 §9.7.5.2.1, C9-110",
    "NAK PSN sequence error (0x60) at the expected PSN",
)
def _gap_nak(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.WRITE_ONLY, psn_add(qp.rq_psn, 2), ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"gap!")
    rx = ctx.expect_nak(NAK_SEQ, qp.rq_psn)
    check(rx.syndrome == 0x60, f"syndrome {rx.syndrome:#x}, expected 0x60")


@case(
    "resp.psn.gap_once",
    R,
    "One NAK per gap: later out-of-sequence requests are dropped silently",
    "IBTA Vol.1 §9.7.5.2.1 (class B: one NAK, then silence); rxe check_psn()",
    "one NAK, then nothing",
)
def _gap_once(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    for i in (2, 3, 4):
        ctx.send(
            F.WRITE_ONLY, psn_add(qp.rq_psn, i), ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"gap!"
        )
    ctx.expect_nak(NAK_SEQ, qp.rq_psn)
    ctx.silence()


@case(
    "resp.psn.gap_recover",
    R,
    "After the expected PSN arrives, a new gap is NAKed again",
    "IBTA Vol.1 §9.7.5.2.1, C9-110",
    "ACK of the retried PSN, then a second NAK for the second gap",
)
def _gap_recover(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    p = qp.rq_psn
    ctx.send(F.WRITE_ONLY, psn_add(p, 1), ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"gap!")
    ctx.expect_nak(NAK_SEQ, p)
    ctx.send(F.WRITE_ONLY, p, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"okay")
    ctx.expect_ack(p, 1)
    ctx.send(F.WRITE_ONLY, psn_add(p, 3), ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"gap!")
    ctx.expect_nak(NAK_SEQ, psn_add(p, 1))


@case(
    "resp.dup.send",
    R,
    "A duplicate SEND is acknowledged again and not delivered twice",
    "IBTA Vol.1 §9.9.2.1, C9-105",
    "ACK again (MSN 1); one receive completion only",
)
def _dup_send(ctx: Ctx) -> None:
    qp, _ = setup(ctx, recvs=2)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=b"once")
    ctx.expect_ack(qp.rq_psn, 1)
    ctx.wait_wc("recv")
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=b"once")
    ctx.expect_ack(qp.rq_psn, 1, "duplicate ACK")
    ctx.no_wc("recv")


@case(
    "resp.dup.write",
    R,
    "A duplicate WRITE is acknowledged again without re-executing",
    "IBTA Vol.1 §9.9.2.1, C9-105",
    "ACK again with the same MSN",
)
def _dup_write(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    for _ in range(2):
        ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"dupw")
        ctx.expect_ack(qp.rq_psn, 1)


@case(
    "resp.dup.read",
    R,
    "A duplicate READ is answered again from the current memory",
    "IBTA Vol.1 §9.9.2.1.2, C9-107",
    "READ_RESP_ONLY again at the duplicate's PSN",
)
def _dup_read(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.write_mem(mr, 0, b"A" * 64)
    for want in (b"A" * 64, b"B" * 64):
        ctx.send(F.READ_REQUEST, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 64))
        rx = ctx.expect("READ response")
        check(rx.opcode == F.READ_RESP_ONLY and rx.psn == qp.rq_psn and rx.payload == want, rx.describe())
        ctx.write_mem(mr, 0, b"B" * 64)


def _dup_atomic(ctx: Ctx, op: int, swap: int, cmp: int) -> None:
    qp, mr = setup(ctx)
    ctx.write_mem(mr, 0, (100).to_bytes(8, "little"))
    first = None
    for _ in range(2):
        ctx.send(op, qp.rq_psn, ackreq=True, atomic=(mr.addr, mr.rkey, swap, cmp))
        rx = ctx.expect("ATOMIC ACKNOWLEDGE")
        check(rx.opcode == F.ATOMIC_ACKNOWLEDGE and rx.psn == qp.rq_psn, rx.describe())
        first = rx.orig if first is None else first
        check(rx.orig == first == 100, f"original value {rx.orig}, expected 100 both times")
    mem = u64(ctx.read_mem(mr, 0, 8))
    want = 100 + swap if op == F.FETCH_ADD else swap
    check(mem == want, f"target {mem} after the duplicate, expected {want}: executed twice")


@case(
    "resp.dup.fadd",
    R,
    "A duplicate FETCH & ADD is answered from the cache, not executed again",
    "IBTA Vol.1 §9.9.2.1.3, C9-108; rxe duplicate_request()",
    "same original value; added once",
)
def _dup_fadd(ctx: Ctx) -> None:
    _dup_atomic(ctx, F.FETCH_ADD, 5, 0)


@case(
    "resp.dup.cas",
    R,
    "A duplicate COMPARE & SWAP is answered from the cache, not executed again",
    "IBTA Vol.1 §9.9.2.1.3, C9-108",
    "same original value; swapped once",
)
def _dup_cas(ctx: Ctx) -> None:
    _dup_atomic(ctx, F.COMPARE_SWAP, 100 + 1, 100)


@case(
    "resp.dup.read_evicted",
    R,
    "A duplicate READ whose resource was reused is dropped",
    "rxe find_resource()/duplicate_request() (IBTA §9.9.2.1.2 leaves it to the responder)",
    "no response to the old READ; the QP keeps working",
)
def _dup_evicted(ctx: Ctx) -> None:
    qp, mr = setup(ctx, max_dest_rd_atomic=1)
    p = qp.rq_psn
    for i in range(2):
        ctx.send(F.READ_REQUEST, psn_add(p, i), ackreq=True, reth=(mr.addr, mr.rkey, 8))
        ctx.expect("READ response")
    ctx.send(F.READ_REQUEST, p, ackreq=True, reth=(mr.addr, mr.rkey, 8))
    ctx.silence()
    alive(ctx, qp, psn_add(p, 2), mr, 3)
