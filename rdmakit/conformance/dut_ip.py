"""Annex A17 at the IP layer, the DUT as responder: ECN and DSCP on requests, congestion notification."""

from . import frames as F
from .dut_responder import R, setup
from .harness import CaseFail, Ctx, Skip, case, check

#: IPv4 TOS byte: DSCP 26 (AF31) with ECN Congestion Experienced (RFC 3168 §5: 0b11).
TOS_CE = (26 << 2) | 3
CNP = 0x81  # IBTA Vol. 1 Annex A17.9.2: BTH opcode of a Congestion Notification Packet


@case(
    "resp.ip.ce_accepted",
    R,
    "A request marked CE, with a DSCP, is executed: the ICRC does not cover the TOS byte",
    "IBTA Vol.1 Annex A17.3.3 (ICRC masks the TOS), A17.9 (ECN)",
    "ACK MSN 1; memory holds the data",
)
def _ce_accepted(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    data = ctx.rng.randbytes(64)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, tos=TOS_CE, ackreq=True, reth=(mr.addr, mr.rkey, 64), payload=data)
    rx = ctx.expect(f"ACK of PSN {qp.rq_psn:#x}")
    if rx.opcode == CNP:  # a DUT that notifies congestion may answer CE first (resp.ip.cnp checks it)
        rx = ctx.expect(f"ACK of PSN {qp.rq_psn:#x}")
    check(
        rx.is_ack() and rx.psn == qp.rq_psn and rx.msn == 1,
        f"expected ACK MSN 1 of PSN {qp.rq_psn:#x}, got {rx.describe()}",
    )
    check(ctx.read_mem(mr, 0, 64) == data, "the CE-marked WRITE did not land")


@case(
    "resp.ip.cnp",
    R,
    "A CE-marked request is answered by a CNP to the requester's QP (if the DUT notifies congestion)",
    "IBTA Vol.1 Annex A17.9 (CNP: BTH opcode 0x81, 16 reserved bytes); Lumina, SIGCOMM 2023",
    "a CNP to the tester's QPN with P_Key 0xFFFF and a good ICRC; the WRITE still ACKed",
)
def _cnp(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, tos=TOS_CE, ackreq=True, reth=(mr.addr, mr.rkey, 8), payload=bytes(8))
    acked, cnp = False, None
    while (rx := ctx.recv(1.0)) is not None:
        if rx.opcode == CNP:
            cnp = rx
        else:
            check(rx.is_ack() and rx.psn == qp.rq_psn, f"expected an ACK or a CNP, got {rx.describe()}")
            acked = True
        if acked and cnp is not None:
            break
    check(acked, "the CE-marked WRITE was not ACKed")
    if cnp is None:
        if not ctx.info.get("cnp"):
            raise Skip("the DUT does not claim Annex A17.9 congestion notification (agent info: cnp)")
        raise CaseFail("no CNP for a CE-marked request, though the DUT claims congestion notification")
    check(len(cnp.payload) == 16 and not any(cnp.payload), f"the CNP carries {cnp.payload.hex()}")
