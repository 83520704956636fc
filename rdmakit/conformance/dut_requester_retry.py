"""The DUT as requester: exact retry accounting, timers bounded both ways, initiator depth, credits.

Timers are measured between the DUT's own packets (the kernel's receive
time at the tester, :mod:`rdmakit.transport.probe`), or from when the tester
sent the packet that starts them: never from when the tester got round to
reading a packet.
"""

from . import frames as F
from .dut_requester import Q, setup, wc_ok
from .frames import psn_add
from .harness import CaseFail, Ctx, case, check

_NOMINAL = 4.096e-6
#: IBTA §9.7.5.2.8 table 46: RNR NAK timer code -> microseconds (code 0 is the longest).
TABLE_46 = (
    655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
    2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
    163840, 245760, 327680, 491520,
)  # fmt: skip


def _count_then_silence(ctx: Ctx, psn: int, n: int, answer: str, wait: float) -> None:
    """Exactly ``n`` transmissions of the SEND at ``psn`` (each answered as ``answer`` says), then none."""
    for i in range(n):
        rx = ctx.expect(f"transmission {i + 1} of {n} of the SEND at PSN {psn:#x}")
        check(rx.opcode == F.SEND_ONLY and rx.psn == psn, f"transmission {i + 1}: {rx.describe()}")
        if answer == "nak":
            ctx.ack(psn, 0, F.NAK_KIND, F.NAK_PSN_SEQ)
        elif answer == "rnr":
            ctx.ack(psn, 0, F.RNR_KIND, 1)
    more = ctx.recv(wait)
    check(more is None, f"a transmission past the limit of {n}: {more.describe() if more else ''}")


@case(
    "req.nak_seq.count",
    Q,
    "retry_cnt 2 and PSN sequence NAKs: exactly 3 transmissions, then silence and RETRY_EXC_ERR",
    "IBTA Vol.1 §9.9.3.1.2 (retry_cnt), §9.7.5.2.1, C9-140; rxe_comp.c COMPST_ERROR_RETRY",
    "3 transmissions; no 4th; RETRY_EXC_ERR; QP in ERR",
)
def _nak_count(ctx: Ctx) -> None:
    qp, mr = setup(ctx, retry_cnt=2, timeout=12)
    ctx.post_send("SEND", mr, 8)
    _count_then_silence(ctx, qp.sq_psn, 3, "nak", 0.6)
    wc_ok(ctx, 1, "RETRY_EXC_ERR")
    check(ctx.state() == "ERR", "QP not in ERR")


@case(
    "req.timeout.count",
    Q,
    "retry_cnt 3 and no response: exactly 4 transmissions, then silence and RETRY_EXC_ERR",
    "IBTA Vol.1 §9.9.3.1.2 (retry_cnt), §9.7.6.1.3",
    "4 transmissions; no 5th; RETRY_EXC_ERR",
)
def _timeout_count(ctx: Ctx) -> None:
    qp, mr = setup(ctx, retry_cnt=3, timeout=12)
    ctx.post_send("SEND", mr, 8)
    _count_then_silence(ctx, qp.sq_psn, 4, "none", 0.6)
    wc_ok(ctx, 1, "RETRY_EXC_ERR")


@case(
    "req.rnr.count",
    Q,
    "rnr_retry 3: exactly 4 transmissions answered by RNR NAKs, then silence and RNR_RETRY_EXC_ERR",
    "IBTA Vol.1 §9.7.5.2.8, §11.6.2; rxe_comp.c COMPST_RNR_RETRY",
    "4 transmissions; no 5th; RNR_RETRY_EXC_ERR; QP in ERR",
)
def _rnr_count(ctx: Ctx) -> None:
    qp, mr = setup(ctx, rnr_retry=3, timeout=18)  # no local ACK timeout while the tester answers
    ctx.post_send("SEND", mr, 8)
    _count_then_silence(ctx, qp.sq_psn, 4, "rnr", 0.6)
    wc_ok(ctx, 1, "RNR_RETRY_EXC_ERR")
    check(ctx.state() == "ERR", "QP not in ERR")


@case(
    "req.timeout.bounds",
    Q,
    "The local ACK timeout lies between 4.096 us x 2^timeout and four times that",
    "IBTA Vol.1 §9.7.6.1.3, C9-140 (timeout 17: 537 ms .. 2.15 s)",
    "resent at least 537 ms and at most 2.15 s after the first transmission (DUT send times)",
)
def _timeout_bounds(ctx: Ctx) -> None:
    qp, mr = setup(ctx, timeout=17)
    ctx.post_send("SEND", mr, 8)
    first = ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    again = ctx.expect_request(F.SEND_ONLY, qp.sq_psn, timeout=6.0)
    nominal = _NOMINAL * (1 << 17)
    gap = again.stamp - first.stamp
    check(
        gap >= nominal * 0.98,
        f"resent {gap * 1e3:.2f} ms after the first send, before {nominal * 1e3:.0f} ms",
    )
    check(gap <= nominal * 4, f"resent {gap * 1e3:.2f} ms after the first send, past {nominal * 4e3:.0f} ms")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.rnr.code0",
    Q,
    "RNR timer code 0 is the longest wait, 655.36 ms, not zero",
    "IBTA Vol.1 §9.7.5.2.8 table 46 (code 0)",
    "the SEND again no sooner than 655.36 ms after the RNR NAK left the tester; SUCCESS",
)
def _rnr_code0(ctx: Ctx) -> None:
    qp, mr = setup(ctx, rnr_retry=7, timeout=18)
    ctx.post_send("SEND", mr, 8)
    ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    sent = ctx.ack(qp.sq_psn, 0, F.RNR_KIND, 0)
    rx = ctx.expect_request(F.SEND_ONLY, qp.sq_psn, timeout=5.0)
    gap = rx.stamp - sent
    check(gap >= 0.65536, f"resent {gap * 1e3:.2f} ms after an RNR NAK with timer code 0 (655.36 ms)")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.rnr.table46",
    Q,
    "Every RNR timer code 1..31 is waited out: never less than table 46 gives",
    "IBTA Vol.1 §9.7.5.2.8 table 46",
    "for each code, the resend no sooner than its time after the RNR NAK left the tester",
)
def _rnr_table(ctx: Ctx) -> None:
    qp, mr = setup(ctx, rnr_retry=7, timeout=20)
    ctx.post_send("SEND", mr, 8)
    ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    short = []
    for code in range(1, 32):
        sent = ctx.ack(qp.sq_psn, 0, F.RNR_KIND, code)
        try:
            rx = ctx.expect_request(F.SEND_ONLY, qp.sq_psn, timeout=6.0)
        except CaseFail as e:
            raise CaseFail(f"after the RNR NAK with code {code}: {e}") from None
        gap = rx.stamp - sent
        if gap < TABLE_46[code] * 1e-6:
            short.append(f"code {code}: {gap * 1e6:.0f} us < {TABLE_46[code]} us")
    check(not short, "resent before the RNR timer: " + "; ".join(short))
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.rd_atomic.limit",
    Q,
    "The DUT's requester keeps at most max_rd_atomic READs outstanding",
    "IBTA Vol.1 §9.7.5.2.2 (initiator depth), §11.2.5.2 (max_rd_atomic)",
    "with max_rd_atomic 1, the second READ leaves only after the first READ's response",
)
def _rd_limit(ctx: Ctx) -> None:
    qp, mr = setup(ctx, max_rd_atomic=1, timeout=20)
    ctx.post_send("RDMA_READ", mr, 8, wr_id=1, remote_addr=0x5000, rkey=3)
    ctx.post_send("RDMA_READ", mr, 8, wr_id=2, remote_addr=0x6000, rkey=3)
    p = qp.sq_psn
    ctx.expect_request(F.READ_REQUEST, p)
    rx = ctx.recv(0.4)
    check(rx is None, f"a second READ outstanding with max_rd_atomic 1: {rx.describe() if rx else ''}")
    ctx.send(F.READ_RESP_ONLY, p, dqpn=qp.qpn, aeth=(0x1F, 1), payload=bytes(8))
    ctx.expect_request(F.READ_REQUEST, psn_add(p, 1))
    ctx.send(F.READ_RESP_ONLY, psn_add(p, 1), dqpn=qp.qpn, aeth=(0x1F, 2), payload=bytes(8))
    wcs = wc_ok(ctx, 2)
    check([w["wr_id"] for w in wcs] == [1, 2], f"completions {wcs}")


@case(
    "req.rd_atomic.atomic_limit",
    Q,
    "Atomics count against max_rd_atomic like READs",
    "IBTA Vol.1 §9.7.5.2.2, §11.2.5.2",
    "with max_rd_atomic 1, the second FETCH_ADD leaves only after the first's ATOMIC ACK",
)
def _atomic_limit(ctx: Ctx) -> None:
    qp, mr = setup(ctx, max_rd_atomic=1, timeout=20)
    for i in range(2):
        ctx.post_send("ATOMIC_FETCH_AND_ADD", mr, 8, wr_id=i + 1, remote_addr=0x8000, rkey=5, compare_add=1)
    p = qp.sq_psn
    ctx.expect_request(F.FETCH_ADD, p)
    rx = ctx.recv(0.4)
    check(rx is None, f"a second atomic outstanding with max_rd_atomic 1: {rx.describe() if rx else ''}")
    ctx.send(F.ATOMIC_ACKNOWLEDGE, p, dqpn=qp.qpn, aeth=(0x1F, 1), orig=1)
    ctx.expect_request(F.FETCH_ADD, psn_add(p, 1))
    ctx.send(F.ATOMIC_ACKNOWLEDGE, psn_add(p, 1), dqpn=qp.qpn, aeth=(0x1F, 2), orig=2)
    wc_ok(ctx, 2)


@case(
    "req.ack.credits",
    Q,
    "An ACK whose AETH carries a credit count (not 0x1F) still acknowledges",
    "IBTA Vol.1 §9.7.5.1 table 44 (ACK with credit count), §9.7.7.2 (end-to-end credits)",
    "SUCCESS for an ACK with credit code 0 and one with code 5",
)
def _credits(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    for i, code in enumerate((0, 5)):
        ctx.post_send("SEND", mr, 8, wr_id=i + 1)
        ctx.expect_request(F.SEND_ONLY, psn_add(qp.sq_psn, i))
        ctx.ack(psn_add(qp.sq_psn, i), i + 1, F.ACK_KIND, code)
        wc_ok(ctx)


@case(
    "req.nak_seq.send_middle",
    Q,
    "A PSN sequence NAK inside a multi-packet SEND: the DUT resends from that MIDDLE",
    "IBTA Vol.1 §9.7.5.2.1, §9.9.3.1 (go-back-N inside a message)",
    "SEND MIDDLE and LAST again from PSN n+1 with the same bytes; SUCCESS",
)
def _send_middle(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    data = ctx.rng.randbytes(700)
    ctx.write_mem(mr, 0, data)
    ctx.post_send("SEND", mr, 700)
    p = qp.sq_psn
    for i, op in enumerate((F.SEND_FIRST, F.SEND_MIDDLE, F.SEND_LAST)):
        ctx.expect_request(op, psn_add(p, i))
    nak = ctx.ack(psn_add(p, 1), 0, F.NAK_KIND, F.NAK_PSN_SEQ)
    mid = ctx.expect_request(F.SEND_MIDDLE, psn_add(p, 1), strict=True, after=nak)
    last = ctx.expect_request(F.SEND_LAST, psn_add(p, 2), strict=True, after=nak)
    check(mid.payload + last.payload == data[256:], "the resent MIDDLE and LAST carry other bytes")
    ctx.ack(psn_add(p, 2))
    wc_ok(ctx)


@case(
    "req.nak_seq.write_first",
    Q,
    "A PSN sequence NAK at a WRITE's FIRST: the DUT resends the FIRST with its RETH",
    "IBTA Vol.1 §9.7.5.2.1, §9.9.3.1",
    "WRITE FIRST again at PSN n with RETH DMA length 700; SUCCESS",
)
def _write_first(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    ctx.post_send("RDMA_WRITE", mr, 700, remote_addr=0x3000, rkey=9)
    p = qp.sq_psn
    for i, op in enumerate((F.WRITE_FIRST, F.WRITE_MIDDLE, F.WRITE_LAST)):
        ctx.expect_request(op, psn_add(p, i))
    ctx.ack(p, 0, F.NAK_KIND, F.NAK_PSN_SEQ)
    rx = ctx.expect_request(F.WRITE_FIRST, p)
    check(rx.reth == (0x3000, 9, 700), f"the resent FIRST's RETH {rx.reth}, expected (0x3000, 9, 700)")
    ctx.expect_request(F.WRITE_MIDDLE, psn_add(p, 1))
    ctx.expect_request(F.WRITE_LAST, psn_add(p, 2))
    ctx.ack(psn_add(p, 2))
    wc_ok(ctx)
