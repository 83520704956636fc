"""The DUT as requester, continued: RNR, implied NAK, ghost and duplicate ACKs, bad responses, fatal NAKs."""

from . import frames as F
from .dut_requester import Q, setup, wc_ok
from .frames import psn_add
from .harness import Ctx, case, check

#: RNR timer code 20: 10.24 ms (IBTA §9.7.5.2.8 table 46).
_RNR_CODE, _RNR_SECONDS = 20, 10.24e-3


def rnr(ctx: Ctx, psn: int, code: int = _RNR_CODE) -> float:
    """Send an RNR NAK at ``psn``; return when it left (``time.time()``)."""
    return ctx.ack(psn, 0, F.RNR_KIND, code)


@case(
    "req.rnr.wait",
    Q,
    "After an RNR NAK the DUT waits at least the NAK's timer, then resends",
    "IBTA Vol.1 §9.7.5.2.8 (RNR timer); roce-sim RNR retry not exceeded",
    "the same SEND again no sooner than 10.24 ms (code 20); SUCCESS",
)
def _rnr_wait(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("SEND", mr, 8)
    ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    t0 = rnr(ctx, qp.sq_psn)
    gap = ctx.expect_request(F.SEND_ONLY, qp.sq_psn).stamp - t0
    check(gap >= _RNR_SECONDS * 0.9, f"resent {gap * 1e3:.2f} ms after the RNR NAK, before its timer")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.rnr.order",
    Q,
    "A longer RNR timer is never waited out before a shorter one",
    "IBTA Vol.1 §9.7.5.2.8 table 46 (timer order)",
    "wait(code 22) >= 20.48 ms, wait(code 14) >= 1.28 ms",
)
def _rnr_order(ctx: Ctx) -> None:
    qp, mr = setup(ctx, rnr_retry=7)
    ctx.post_send("SEND", mr, 8)
    ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    for code, nominal in ((14, 1.28e-3), (22, 20.48e-3)):
        t0 = rnr(ctx, qp.sq_psn, code)
        gap = ctx.expect_request(F.SEND_ONLY, qp.sq_psn).stamp - t0
        check(gap >= nominal * 0.9, f"code {code}: resent after {gap * 1e3:.2f} ms < {nominal * 1e3} ms")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.rnr.retry_exceeded",
    Q,
    "rnr_retry RNR NAKs are retried; one more ends in RNR_RETRY_EXC_ERR",
    "IBTA Vol.1 §9.7.5.2.8, §11.6.2; roce-sim RNR retry exceeded",
    "3 transmissions (rnr_retry 2); RNR_RETRY_EXC_ERR",
)
def _rnr_exceeded(ctx: Ctx) -> None:
    qp, mr = setup(ctx, rnr_retry=2)
    ctx.post_send("SEND", mr, 8)
    for _ in range(3):
        ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
        rnr(ctx, qp.sq_psn, 1)
    wc_ok(ctx, 1, "RNR_RETRY_EXC_ERR")
    check(ctx.state() == "ERR", "QP not in ERR")


@case(
    "req.rnr.infinite",
    Q,
    "rnr_retry 7 never runs out: 10 RNR NAKs, then an ACK, succeed",
    "IBTA Vol.1 §9.7.5.2.8 (7 = infinite)",
    "SUCCESS after 10 RNR NAKs",
)
def _rnr_infinite(ctx: Ctx) -> None:
    qp, mr = setup(ctx, rnr_retry=7)
    ctx.post_send("SEND", mr, 8)
    for _ in range(10):
        ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
        rnr(ctx, qp.sq_psn, 1)
    ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


def _implied(ctx: Ctx, opname: str, op: int) -> None:
    # timeout 0: no local ACK timer, so only the implied NAK can make the DUT resend.
    qp, mr = setup(ctx, timeout=0)
    ctx.post_send(opname, mr, 8, wr_id=1, remote_addr=0x8000, rkey=5, compare_add=1)
    ctx.post_send("SEND", mr, 8, wr_id=2)
    p = qp.sq_psn
    ctx.expect_request(op, p)
    ctx.expect_request(F.SEND_ONLY, psn_add(p, 1))
    ctx.ack(psn_add(p, 1), 2)  # passes the READ/atomic: its response was lost
    ctx.expect_request(op, p, timeout=3.0)
    if op == F.READ_REQUEST:
        ctx.send(F.READ_RESP_ONLY, p, dqpn=qp.qpn, aeth=(0x1F, 1), payload=bytes(8))
    else:
        ctx.send(F.ATOMIC_ACKNOWLEDGE, p, dqpn=qp.qpn, aeth=(0x1F, 1), orig=7)
    # Go-back-N resends the SEND after the READ/atomic, before or after their response.
    rx = ctx.expect_request(F.SEND_ONLY, psn_add(p, 1), strict=True)
    ctx.ack(rx.psn, 2)
    wcs = wc_ok(ctx, 2)
    check([w["wr_id"] for w in wcs] == [1, 2], f"completions {wcs}")


@case(
    "req.implied_nak.read",
    Q,
    "An ACK past an outstanding READ makes the DUT resend the READ",
    "IBTA Vol.1 §9.7.5.1.4 (implied NAK); roce-sim implied NAK",
    "READ_REQUEST sent again; both complete",
)
def _implied_read(ctx: Ctx) -> None:
    _implied(ctx, "RDMA_READ", F.READ_REQUEST)


@case(
    "req.implied_nak.atomic",
    Q,
    "An ACK past an outstanding atomic makes the DUT resend the atomic",
    "IBTA Vol.1 §9.7.5.1.4 (implied NAK)",
    "FETCH_ADD sent again; both complete",
)
def _implied_atomic(ctx: Ctx) -> None:
    _implied(ctx, "ATOMIC_FETCH_AND_ADD", F.FETCH_ADD)


@case(
    "req.ack.ghost",
    Q,
    "An ACK for a PSN never sent is ignored",
    "IBTA Vol.1 §9.7.5.1.3 (ghost ACK: invalid PSN); roce-sim ghost ACK",
    "no completion until the real ACK",
)
def _ghost(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("SEND", mr, 8)
    ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    ctx.ack(psn_add(qp.sq_psn, 100))
    ctx.no_wc("send")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.ack.duplicate",
    Q,
    "A duplicate ACK of an already completed PSN changes nothing",
    "IBTA Vol.1 §9.7.5.1.3 (duplicate ACK)",
    "one completion per WR; the next SEND is unaffected",
)
def _dup_ack(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("SEND", mr, 8, wr_id=1)
    ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)
    ctx.post_send("SEND", mr, 8, wr_id=2)
    ctx.expect_request(F.SEND_ONLY, psn_add(qp.sq_psn, 1))
    ctx.ack(qp.sq_psn)
    ctx.no_wc("send")
    ctx.ack(psn_add(qp.sq_psn, 1), 2)
    wc_ok(ctx)


@case(
    "req.resp.unexpected_read",
    Q,
    "A READ response to a SEND is a bad response",
    "IBTA Vol.1 §9.7.5.1.5 (unexpected response opcode); rxe check_ack(); roce-sim bad response",
    "BAD_RESP_ERR; QP in ERR",
)
def _bad_resp(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("SEND", mr, 8)
    ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    ctx.send(F.READ_RESP_ONLY, qp.sq_psn, dqpn=qp.qpn, aeth=(0x1F, 1), payload=bytes(8))
    wc_ok(ctx, 1, "BAD_RESP_ERR")
    check(ctx.state() == "ERR", "QP not in ERR")


@case(
    "req.resp.missing_last",
    Q,
    "READ responses without their LAST: the DUT re-requests the rest, then completes",
    "IBTA Vol.1 §9.9.3.1.3 (READ retry from the first missing PSN); roce-sim missing LAST",
    "READ_REQUEST again at PSN n+2 for the last 88 bytes; SUCCESS",
)
def _missing_last(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256, timeout=12, retry_cnt=7)
    ctx.post_send("RDMA_READ", mr, 600, remote_addr=0x5000, rkey=3)
    p = qp.sq_psn
    ctx.expect_request(F.READ_REQUEST, p)
    data = ctx.rng.randbytes(600)
    ctx.send(F.READ_RESP_FIRST, p, dqpn=qp.qpn, aeth=(0x1F, 1), payload=data[:256])
    ctx.send(F.READ_RESP_MIDDLE, psn_add(p, 1), dqpn=qp.qpn, payload=data[256:512])
    while True:
        # A retry timed out before the DUT took a response asks from that response's PSN.
        rx = ctx.expect("a READ retry")
        check(rx.opcode == F.READ_REQUEST, f"got {rx.describe()}")
        k = (rx.psn - p) & F.PSN_MASK
        check(k <= 2, f"READ retry at {rx.psn:#x}, outside the READ's PSNs")
        check(rx.reth == (0x5000 + 256 * k, 3, 600 - 256 * k), f"retry at +{k} with RETH {rx.reth}")
        if k == 2:
            break
    ctx.send(F.READ_RESP_ONLY, psn_add(p, 2), dqpn=qp.qpn, aeth=(0x1F, 1), payload=data[512:])
    wc_ok(ctx)
    check(ctx.read_mem(mr, 0, 600) == data, "the read data differs")


@case(
    "req.resp.gap_exceeded",
    Q,
    "READ responses that keep skipping a PSN exhaust retry_cnt",
    "IBTA Vol.1 §9.9.3.1.2; roce-sim PSN gap retry limit exceeded",
    "RETRY_EXC_ERR",
)
def _gap_exceeded(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256, timeout=12, retry_cnt=1)
    ctx.post_send("RDMA_READ", mr, 600, remote_addr=0x5000, rkey=3)
    p = qp.sq_psn
    for _ in range(2):
        rx = ctx.expect("READ_REQUEST")
        check(rx.opcode == F.READ_REQUEST and rx.psn == p, f"got {rx.describe()}")
        ctx.send(F.READ_RESP_LAST, psn_add(p, 2), dqpn=qp.qpn, aeth=(0x1F, 1), payload=bytes(88))
    wc_ok(ctx, 1, "RETRY_EXC_ERR")


def _fatal(ctx: Ctx, code: int, status: str) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("RDMA_WRITE", mr, 8, wr_id=1, remote_addr=0x1000, rkey=1)
    ctx.post_send("SEND", mr, 8, wr_id=2)
    ctx.expect_request(F.WRITE_ONLY, qp.sq_psn)
    ctx.ack(qp.sq_psn, 0, F.NAK_KIND, code)
    wcs = ctx.wait_wc("send", 2)
    check(
        wcs[0]["status"] == status and wcs[0]["wr_id"] == 1, f"first completion {wcs[0]}, expected {status}"
    )
    check(wcs[1]["status"] == "WR_FLUSH_ERR", f"second completion {wcs[1]}, expected WR_FLUSH_ERR")
    check(ctx.state() == "ERR", "QP not in ERR")


@case(
    "req.nak.remote_access",
    Q,
    "A remote access error NAK fails the WR, the QP goes to ERR, the rest is flushed",
    "IBTA Vol.1 §9.7.5.2.4, §10.3.1, §11.6.2; roce-sim rkey violation",
    "REM_ACCESS_ERR, WR_FLUSH_ERR; ERR",
)
def _nak_access(ctx: Ctx) -> None:
    _fatal(ctx, F.NAK_REMOTE_ACCESS, "REM_ACCESS_ERR")


@case(
    "req.nak.invalid_request",
    Q,
    "An invalid request NAK fails the WR with REM_INV_REQ_ERR",
    "IBTA Vol.1 §9.7.5.2.2, §11.6.2",
    "REM_INV_REQ_ERR, WR_FLUSH_ERR; ERR",
)
def _nak_inv(ctx: Ctx) -> None:
    _fatal(ctx, F.NAK_INVALID_REQ, "REM_INV_REQ_ERR")


@case(
    "req.nak.remote_op",
    Q,
    "A remote operational error NAK (e.g. the responder's CQ full) fails the WR",
    "IBTA Vol.1 §9.7.5.2.5, §11.6.2; roce-sim remote op error on full CQ",
    "REM_OP_ERR, WR_FLUSH_ERR; ERR",
)
def _nak_op(ctx: Ctx) -> None:
    _fatal(ctx, F.NAK_REMOTE_OP, "REM_OP_ERR")


@case(
    "req.err.no_more_requests",
    Q,
    "A QP in ERR sends nothing for WRs posted later; they are flushed",
    "IBTA Vol.1 §10.3.1 (Error state)",
    "no request on the wire; WR_FLUSH_ERR",
)
def _err_quiet(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("SEND", mr, 8, wr_id=1)
    ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    ctx.ack(qp.sq_psn, 0, F.NAK_KIND, F.NAK_REMOTE_OP)
    wc_ok(ctx, 1, "REM_OP_ERR")
    try:
        ctx.post_send("SEND", mr, 8, wr_id=2)
    except Exception:  # a DUT may refuse the post in ERR: that is fine too
        return
    ctx.silence(0.3)
    wc_ok(ctx, 1, "WR_FLUSH_ERR")
