"""The DUT as requester: end-to-end credits, and the BTH's SE and MigReq bits (MigReq on responses too)."""

from . import frames as F
from .dut_requester import Q, setup, wc_ok
from .frames import psn_add
from .harness import Ctx, Skip, case, check

#: How long the tester watches for a request the DUT must not send (the DUT's local ACK
#: timer in these cases is 1.07 s: a resend of the outstanding request may come, nothing else).
_QUIET = 0.6


def _only_resends(ctx: Ctx, psn: int, why: str) -> None:
    """For ``_QUIET`` seconds the DUT sends nothing but copies of requests it sent, up to its
    request at ``psn``: a retry (or a probe) may resend any unacknowledged request, never a new one."""
    while (rx := ctx.recv(_QUIET)) is not None:
        check((psn - rx.psn) & F.PSN_MASK < 0x800000, f"{rx.describe()} {why}")


# -- end-to-end credits (IBTA §9.7.7.2) --


@case(
    "req.credits.limit",
    Q,
    "The DUT's requester honours the responder's credits: it stops one SEND past the limit and resumes",
    "IBTA Vol.1 §9.7.7.2 (end-to-end flow control: the limit, one request past it, 0x1F = no limit), "
    "§9.7.5.1 table 45; rdmavt rvt_get_credit()",
    "after ACK credits 0: one SEND and no second until it is ACKed; credits 1: two more; 0x1F: the rest",
)
def _credits_limit(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    p = qp.sq_psn
    ctx.post_send("SEND", mr, 8, wr_id=1)
    ctx.expect_request(F.SEND_ONLY, p)
    ctx.ack(p, 1, F.ACK_KIND, 0)  # MSN 1, no credits: the limit is message 1
    wc_ok(ctx)
    for i in range(2, 7):
        ctx.post_send("SEND", mr, 8, wr_id=i)
    ctx.expect_request(F.SEND_ONLY, psn_add(p, 1))  # message 2: the one request past the limit
    _only_resends(ctx, psn_add(p, 1), "past the limit of 0 credits while message 2 is unacknowledged")
    ctx.ack(psn_add(p, 1), 2, F.ACK_KIND, 1)  # MSN 2, one credit: the limit is message 3
    ctx.expect_request(F.SEND_ONLY, psn_add(p, 2))
    ctx.expect_request(F.SEND_ONLY, psn_add(p, 3))  # message 4: past the limit again
    _only_resends(ctx, psn_add(p, 3), "past the limit of message 3 while message 4 is unacknowledged")
    ctx.ack(psn_add(p, 3), 4)  # credits 0x1F: no flow control from now on
    ctx.expect_request(F.SEND_ONLY, psn_add(p, 4))
    ctx.expect_request(F.SEND_ONLY, psn_add(p, 5))
    ctx.ack(psn_add(p, 5), 6)
    wcs = wc_ok(ctx, 5)
    check([w["wr_id"] for w in wcs] == [2, 3, 4, 5, 6], f"completions {wcs}")


@case(
    "req.credits.write_unlimited",
    Q,
    "Credits count receive WQEs: an RDMA WRITE (which takes none) is not held back by them",
    "IBTA Vol.1 §9.7.7.2 (credits limit the requests that consume a receive WQE)",
    "with 0 credits and a SEND outstanding, two WRITEs still go; SUCCESS",
)
def _credits_write(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    p = qp.sq_psn
    ctx.post_send("SEND", mr, 8, wr_id=1)
    ctx.expect_request(F.SEND_ONLY, p)
    ctx.ack(p, 1, F.ACK_KIND, 0)
    wc_ok(ctx)
    ctx.post_send("SEND", mr, 8, wr_id=2)
    ctx.post_send("RDMA_WRITE", mr, 8, wr_id=3, remote_addr=0x1000, rkey=1)
    ctx.post_send("RDMA_WRITE", mr, 8, wr_id=4, remote_addr=0x1000, rkey=1)
    ctx.expect_request(F.SEND_ONLY, psn_add(p, 1))
    ctx.expect_request(F.WRITE_ONLY, psn_add(p, 2))
    ctx.expect_request(F.WRITE_ONLY, psn_add(p, 3))
    ctx.ack(psn_add(p, 3), 4, F.ACK_KIND, 0)
    wc_ok(ctx, 3)


# -- the BTH's SE bit (IBTA §9.2; IBV_SEND_SOLICITED) --


@case(
    "req.send.se",
    Q,
    "A solicited SEND sets SE on its LAST packet only; an unsolicited one never",
    "IBTA Vol.1 §9.2 (BTH SE: set on the last packet of a SEND or RDMA WRITE with immediate), "
    "§11.4.1.1 (solicited event); rxe_req.c init_req_packet()",
    "FIRST, MIDDLE without SE and LAST with SE at MTU 256; then a SEND ONLY without SE",
)
def _send_se(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    ctx.post_send("SEND", mr, 600, wr_id=1, solicited=True)
    ctx.post_send("SEND", mr, 8, wr_id=2)
    p = qp.sq_psn
    for i, op in enumerate((F.SEND_FIRST, F.SEND_MIDDLE, F.SEND_LAST, F.SEND_ONLY)):
        rx = ctx.expect_request(op, psn_add(p, i))
        check(rx.solicited == (i == 2), f"SE {int(rx.solicited)} on {rx.describe()}")
    ctx.ack(psn_add(p, 3), 2)
    wc_ok(ctx, 2)


@case(
    "req.write_imm.se",
    Q,
    "A solicited WRITE with immediate sets SE on its LAST; a plain WRITE posted solicited never does",
    "IBTA Vol.1 §9.2 (BTH SE), §11.4.1.1 (the solicited event is for SEND and WRITE with immediate); "
    "rxe_req.c init_req_packet()",
    "WRITE FIRST without SE, WRITE LAST with immediate with SE; WRITE ONLY without SE",
)
def _write_imm_se(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    ctx.post_send("RDMA_WRITE_WITH_IMM", mr, 400, wr_id=1, remote_addr=0x2000, rkey=7, imm=5, solicited=True)
    ctx.post_send("RDMA_WRITE", mr, 8, wr_id=2, remote_addr=0x2000, rkey=7, solicited=True)
    p = qp.sq_psn
    for i, op in enumerate((F.WRITE_FIRST, F.WRITE_LAST_IMM, F.WRITE_ONLY)):
        rx = ctx.expect_request(op, psn_add(p, i))
        check(rx.solicited == (i == 1), f"SE {int(rx.solicited)} on {rx.describe()}")
    ctx.ack(psn_add(p, 2), 2)
    wc_ok(ctx, 2)


# -- the BTH's MigReq bit (IBTA §9.2, §17.2.8) --


@case(
    "req.hdr.migreq",
    Q,
    "MigReq is one value on every packet of a QP whose path never migrates, resends included",
    "IBTA Vol.1 §9.2 (BTH MigReq), §17.2.8 (APM: MigReq changes only when the path migrates; "
    "RoCE has no alternate path)",
    "the same MigReq on a 3-packet SEND, a WRITE and their go-back-N resend after a NAK",
)
def _migreq(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    ctx.post_send("SEND", mr, 600, wr_id=1)
    ctx.post_send("RDMA_WRITE", mr, 8, wr_id=2, remote_addr=0x2000, rkey=7)
    p = qp.sq_psn
    seen = []
    for i, op in enumerate((F.SEND_FIRST, F.SEND_MIDDLE, F.SEND_LAST, F.WRITE_ONLY)):
        seen.append(ctx.expect_request(op, psn_add(p, i)))
    nak = ctx.ack(psn_add(p, 1), 0, F.NAK_KIND, F.NAK_PSN_SEQ)
    # Every packet up to the WRITE's resend (where go-back-N goes is other cases' matter).
    while not (seen[-1].psn == psn_add(p, 3) and not 0 < seen[-1].stamp < nak):
        rx = ctx.expect("the go-back-N resend up to the WRITE after the NAK")
        check(rx.opcode != F.ACKNOWLEDGE and (rx.psn - p) & F.PSN_MASK <= 3, f"unexpected {rx.describe()}")
        seen.append(rx)
    values = {rx.migreq for rx in seen}
    check(
        len(values) == 1, "MigReq differs: " + ", ".join(f"{rx.describe()} {int(rx.migreq)}" for rx in seen)
    )
    ctx.log.append(f"MigReq {int(seen[0].migreq)} on every packet")
    ctx.ack(psn_add(p, 3), 2)
    wc_ok(ctx, 2)


# -- MigReq and the path migration state (IBTA §17.2.8) --
#
# A QP's APM state machine starts in Migrated and leaves it only when software loads an
# alternate path and moves it to Rearm; a QP sends MigReq = 1 in every request and response
# while Migrated, 0 while Rearm or Armed (qib_ruc.c qib_make_ruc_header(), rdmavt
# rvt_create_qp(): s_mig_state = IB_MIG_MIGRATED). On RoCE no alternate path can be loaded
# (Linux _ib_modify_qp()), so a QP with the state machine stays Migrated and sends 1.
# These cases hold a DUT to the state its agent reports (query_qp "path_mig_state", from
# ibv_query_qp on a verbs device); a DUT with no APM state machine reports none, and the
# cases are SKIPPED with that reason: rdmakit's engine has none and sends MigReq 0 as rxe
# does (req.hdr.migreq still checks that the bit never changes on a QP).

_MIG_STATES = ("MIGRATED", "REARM", "ARMED")  # enum ibv_mig_state


def mig_state(ctx: Ctx) -> str:
    """The DUT QP's path migration state as its agent reports it; Skip when it reports none."""
    state = ctx.query().get("path_mig_state")
    if state is None:
        raise Skip(
            "the DUT reports no path migration state (no APM state machine; IBTA §17.2.8 would "
            "start it in Migrated, MigReq 1): req.hdr.migreq checks MigReq is constant instead"
        )
    check(state in _MIG_STATES, f"the agent reports path migration state {state!r}")
    return str(state)


def migreq_follows(rx: F.Rx, state: str) -> None:
    want = state == "MIGRATED"
    check(rx.migreq == want, f"MigReq {int(rx.migreq)} on {rx.describe()} in path migration state {state}")


@case(
    "req.hdr.migreq_state",
    Q,
    "MigReq on the DUT's requests follows its path migration state: 1 while Migrated, 0 in Rearm/Armed",
    "IBTA Vol.1 §9.2 (BTH MigReq), §17.2.8 (APM starts in Migrated); qib_ruc.c qib_make_ruc_header()",
    "the SEND's MigReq matches the agent's path_mig_state; SKIPPED for a DUT that reports none",
)
def _migreq_state(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    state = mig_state(ctx)
    ctx.post_send("SEND", mr, 8)
    rx = ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)
    migreq_follows(rx, state)


@case(
    "resp.hdr.migreq_state",
    "responder",
    "MigReq on the DUT's responses follows its path migration state: 1 while Migrated, 0 in Rearm/Armed",
    "IBTA Vol.1 §9.2 (BTH MigReq), §17.2.8 (APM starts in Migrated); qib_rc.c qib_send_rc_ack()",
    "the ACK's MigReq matches the agent's path_mig_state; SKIPPED for a DUT that reports none",
)
def _resp_migreq_state(ctx: Ctx) -> None:
    qp = ctx.dut_qp()
    mr = ctx.mr()
    state = mig_state(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 8), payload=bytes(8))
    migreq_follows(ctx.expect_ack(qp.rq_psn, 1), state)
