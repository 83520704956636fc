"""Responder error cases: wrap, RNR, lengths, opcode sequences, header checks, keys (tester = requester)."""

from typing import Any

from . import frames as F
from .dut_responder import NAK_INV, NAK_SEQ, R, alive, setup
from .frames import psn_add
from .harness import Ctx, Skip, case, check

# -- PSN wrap at 2^24 (IBTA §9.7.1: PSNs are modulo 2^24) --


@case(
    "resp.wrap.send",
    R,
    "SENDs at PSN 0xFFFFFE, 0xFFFFFF and 0 execute in order across the wrap",
    "IBTA Vol.1 §9.7.1, §9.7.5.2.1",
    "ACKs of 0xFFFFFE, 0xFFFFFF, 0 with MSN 1, 2, 3",
)
def _wrap_send(ctx: Ctx) -> None:
    _qp, _ = setup(ctx, recvs=3, rq_psn=0xFFFFFE)
    for i in range(3):
        ctx.send(F.SEND_ONLY, psn_add(0xFFFFFE, i), ackreq=True, payload=b"w")
        ctx.expect_ack(psn_add(0xFFFFFE, i), i + 1)


@case(
    "resp.wrap.write_multi",
    R,
    "A multi-packet WRITE whose PSNs wrap is one message",
    "IBTA Vol.1 §9.7.1",
    "ACK of PSN 1, MSN 1",
)
def _wrap_write(ctx: Ctx) -> None:
    _qp, mr = setup(ctx, mtu=256, rq_psn=0xFFFFFF)
    data = ctx.rng.randbytes(600)
    ctx.send(F.WRITE_FIRST, 0xFFFFFF, reth=(mr.addr, mr.rkey, 600), payload=data[:256])
    ctx.send(F.WRITE_MIDDLE, 0, payload=data[256:512])
    ctx.send(F.WRITE_LAST, 1, ackreq=True, payload=data[512:])
    ctx.expect_ack(1, 1)
    check(ctx.read_mem(mr, 0, 600) == data, "the written data differs")


@case(
    "resp.wrap.read",
    R,
    "READ responses wrap their PSNs from 0xFFFFFF to 0",
    "IBTA Vol.1 §9.7.1, §9.4.3",
    "READ_RESP FIRST at 0xFFFFFF, MIDDLE at 0, LAST at 1",
)
def _wrap_read(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256, rq_psn=0xFFFFFF)
    ctx.send(F.READ_REQUEST, 0xFFFFFF, ackreq=True, reth=(mr.addr, mr.rkey, 600))
    for psn in (0xFFFFFF, 0, 1):
        rx = ctx.expect("READ response")
        check(rx.psn == psn, f"expected PSN {psn:#x}, got {rx.describe()}")
    alive(ctx, qp, 2, mr, 2)


@case(
    "resp.wrap.dup",
    R,
    "A request just before a wrapped PSN is a duplicate, not a gap",
    "IBTA Vol.1 §9.7.5.2.1 (half the PSN space behind is duplicate)",
    "ACK again, not a NAK",
)
def _wrap_dup(ctx: Ctx) -> None:
    _qp, mr = setup(ctx, rq_psn=0xFFFFFF)
    ctx.send(F.WRITE_ONLY, 0xFFFFFF, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"wrap")
    ctx.expect_ack(0xFFFFFF, 1)
    ctx.send(F.WRITE_ONLY, 0xFFFFFF, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"wrap")
    ctx.expect_ack(0xFFFFFF, 1, "duplicate ACK")


# -- RNR (IBTA §9.7.5.2.8) --


@case(
    "resp.rnr.nak",
    R,
    "A SEND with no receive posted gets an RNR NAK carrying min_rnr_timer",
    "IBTA Vol.1 §9.7.5.2.8, C9-113; roce-sim RNR",
    "RNR NAK at the SEND's PSN, syndrome 0x20|timer",
)
def _rnr_nak(ctx: Ctx) -> None:
    qp, _ = setup(ctx, min_rnr_timer=14)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=b"rnr")
    rx = ctx.expect("RNR NAK")
    check(rx.is_rnr() and rx.psn == qp.rq_psn, f"got {rx.describe()}")
    check(rx.syndrome == 0x20 | 14, f"syndrome {rx.syndrome:#x}, expected {0x20 | 14:#x} (timer code 14)")


@case(
    "resp.rnr.timer_code",
    R,
    "The RNR NAK's timer field is the QP's min_rnr_timer (code 31)",
    "IBTA Vol.1 §9.7.5.2.8 table 46",
    "RNR NAK syndrome 0x3F",
)
def _rnr_code(ctx: Ctx) -> None:
    qp, _ = setup(ctx, min_rnr_timer=31)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=b"rnr")
    rx = ctx.expect("RNR NAK")
    check(rx.is_rnr() and rx.syndrome == 0x3F, f"got {rx.describe()}")


@case(
    "resp.rnr.recover",
    R,
    "After an RNR NAK and a posted receive, the retried SEND succeeds",
    "IBTA Vol.1 §9.7.5.2.8",
    "RNR NAK, then ACK MSN 1 for the same PSN",
)
def _rnr_recover(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=b"rnr")
    rx = ctx.expect("RNR NAK")
    check(rx.is_rnr(), f"got {rx.describe()}")
    ctx.post_recv(mr)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=b"rnr")
    ctx.expect_ack(qp.rq_psn, 1)


@case(
    "resp.rnr.write_imm",
    R,
    "A WRITE with immediate and no receive posted gets an RNR NAK",
    "IBTA Vol.1 §9.7.5.2.8; rxe check_resource()",
    "RNR NAK; memory not written",
)
def _rnr_wimm(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.write_mem(mr, 0, b"keep")
    ctx.send(F.WRITE_ONLY_IMM, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 4), imm=1, payload=b"rnr!")
    rx = ctx.expect("RNR NAK")
    check(rx.is_rnr() and rx.psn == qp.rq_psn, f"got {rx.describe()}")
    check(ctx.read_mem(mr, 0, 4) == b"keep", "the WRITE with immediate was placed before its RNR NAK")


# -- lengths, MTU and pad (IBTA C9-92..C9-94, §9.2 PadCnt) --


def _bad_len(ctx: Ctx, ops: list[tuple[int, int]], mtu: int = 256, **kw: object) -> None:
    qp, mr = setup(ctx, mtu=mtu, recvs=1)
    p = qp.rq_psn
    for i, (op, n) in enumerate(ops):
        extra: dict[str, Any] = (
            {"reth": (mr.addr, mr.rkey, 4096)} if op in (F.WRITE_FIRST, F.WRITE_ONLY) else {}
        )
        ctx.send(op, psn_add(p, i), ackreq=i == len(ops) - 1, payload=bytes(n), **extra)
    bad = psn_add(p, len(ops) - 1)
    while True:
        rx = ctx.expect(f"NAK invalid request at PSN {bad:#x}")
        if rx.is_ack() and rx.psn != bad:
            continue  # an ACK of the good packets before it
        check(
            rx.is_nak(NAK_INV) and rx.psn == bad,
            f"expected NAK invalid request at {bad:#x}, got {rx.describe()}",
        )
        return


@case(
    "resp.len.middle_short",
    R,
    "A SEND MIDDLE shorter than the MTU is an invalid request",
    "IBTA Vol.1 C9-93; rxe check_length()",
    "NAK invalid request (0x61) at the MIDDLE",
)
def _mid_short(ctx: Ctx) -> None:
    _bad_len(ctx, [(F.SEND_FIRST, 256), (F.SEND_MIDDLE, 100)])


@case(
    "resp.len.middle_long",
    R,
    "A WRITE MIDDLE longer than the MTU is an invalid request",
    "IBTA Vol.1 C9-93; rxe check_length()",
    "NAK invalid request at the MIDDLE",
)
def _mid_long(ctx: Ctx) -> None:
    _bad_len(ctx, [(F.WRITE_FIRST, 256), (F.WRITE_MIDDLE, 260)])


@case(
    "resp.len.first_short",
    R,
    "A SEND FIRST shorter than the MTU is an invalid request",
    "IBTA Vol.1 C9-92",
    "NAK invalid request at the FIRST",
)
def _first_short(ctx: Ctx) -> None:
    _bad_len(ctx, [(F.SEND_FIRST, 128)])


@case(
    "resp.len.only_over_mtu",
    R,
    "A SEND ONLY longer than the MTU is an invalid request",
    "IBTA Vol.1 C9-94",
    "NAK invalid request",
)
def _only_long(ctx: Ctx) -> None:
    _bad_len(ctx, [(F.SEND_ONLY, 300)])


@case(
    "resp.len.last_over_mtu",
    R,
    "A SEND LAST longer than the MTU is an invalid request",
    "IBTA Vol.1 C9-94",
    "NAK invalid request at the LAST",
)
def _last_long(ctx: Ctx) -> None:
    _bad_len(ctx, [(F.SEND_FIRST, 256), (F.SEND_LAST, 300)])


@case(
    "resp.len.write_dmalen",
    R,
    "A WRITE ONLY whose payload differs from the RETH DMA length is invalid",
    "IBTA Vol.1 §9.4.2, C9-94; rxe check_rkey()",
    "NAK invalid request",
)
def _write_dmalen(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 64), payload=bytes(32))
    ctx.expect_nak(NAK_INV, qp.rq_psn)


@case(
    "resp.len.recv_too_small",
    R,
    "A SEND longer than the posted receive buffer fails",
    "IBTA Vol.1 §9.7.5.2.2 (invalid request), §11.6.2 LOC_LEN_ERR",
    "NAK invalid request; receive error completion",
)
def _recv_small(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_recv(mr, 0, 16)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=bytes(64))
    ctx.expect_nak(NAK_INV, qp.rq_psn)
    wc = ctx.wait_wc("recv")[0]
    check(wc["status"] != "SUCCESS", f"receive completion {wc}")


@case(
    "resp.pad.stripped",
    R,
    "PadCnt bytes are not data: a 5-byte SEND is received as 5 bytes",
    "IBTA Vol.1 §9.2 (PadCnt), §9.4.1",
    "ACK; byte_len 5",
)
def _pad(ctx: Ctx) -> None:
    qp, _mr = setup(ctx, recvs=1)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=b"12345")
    ctx.expect_ack(qp.rq_psn, 1)
    wc = ctx.wait_wc("recv")[0]
    check(wc["byte_len"] == 5, f"byte_len {wc['byte_len']}, expected 5")


# -- opcode sequence and opcodes (IBTA §9.8.3; rxe check_op_seq(), check_op_valid()) --


@case(
    "resp.opseq.middle_first",
    R,
    "A SEND MIDDLE with no message open is an invalid request",
    "IBTA Vol.1 §9.8.3.1 (opcode sequence); rxe check_op_seq()",
    "NAK invalid request",
)
def _seq_middle(ctx: Ctx) -> None:
    qp, _ = setup(ctx, mtu=256, recvs=1)
    ctx.send(F.SEND_MIDDLE, qp.rq_psn, ackreq=True, payload=bytes(256))
    ctx.expect_nak(NAK_INV, qp.rq_psn)


@case(
    "resp.opseq.last_first",
    R,
    "A WRITE LAST with no message open is an invalid request",
    "IBTA Vol.1 §9.8.3.1; rxe check_op_seq()",
    "NAK invalid request",
)
def _seq_last(ctx: Ctx) -> None:
    qp, _ = setup(ctx, mtu=256)
    ctx.send(F.WRITE_LAST, qp.rq_psn, ackreq=True, payload=bytes(16))
    ctx.expect_nak(NAK_INV, qp.rq_psn)


@case(
    "resp.opseq.only_inside",
    R,
    "A SEND ONLY inside an open SEND message is an invalid request",
    "IBTA Vol.1 §9.8.3.1; rxe check_op_seq()",
    "NAK invalid request at the ONLY",
)
def _seq_only(ctx: Ctx) -> None:
    _bad_len(ctx, [(F.SEND_FIRST, 256), (F.SEND_ONLY, 16)])


@case(
    "resp.opseq.kind_switch",
    R,
    "A WRITE MIDDLE inside an open SEND message is an invalid request",
    "IBTA Vol.1 §9.8.3.1; rxe check_op_seq()",
    "NAK invalid request",
)
def _seq_switch(ctx: Ctx) -> None:
    _bad_len(ctx, [(F.SEND_FIRST, 256), (F.WRITE_MIDDLE, 256)])


@case(
    "resp.opcode.reserved",
    R,
    "A reserved RC opcode (0x15) is dropped and changes nothing",
    "IBTA Vol.1 §9.2 table 35 (reserved); rxe hdr_check()",
    "no response; the QP keeps working",
)
def _reserved(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(0x15, qp.rq_psn, ackreq=True, payload=bytes(8))
    ctx.silence()
    alive(ctx, qp, qp.rq_psn, mr, 1)


@case(
    "resp.opcode.ud_on_rc",
    R,
    "A UD SEND ONLY (0x64) to an RC QP is dropped",
    "IBTA Vol.1 §9.6.1.1 (transport type); rxe check_type_state()",
    "no response; the QP keeps working",
)
def _ud(ctx: Ctx) -> None:
    qp, mr = setup(ctx, recvs=1)
    ctx.send(0x64, qp.rq_psn, ackreq=True, payload=bytes(16))
    ctx.silence()
    alive(ctx, qp, qp.rq_psn, mr, 1)


@case(
    "resp.opcode.qp_access",
    R,
    "A WRITE to a QP without remote-write access is an invalid request",
    "IBTA Vol.1 §9.7.5.2.2, §10.2.4 (QP access flags); rxe check_op_valid()",
    "NAK invalid request",
)
def _qp_access(ctx: Ctx) -> None:
    qp, mr = setup(ctx, access=0x1 | 0x4)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"deny")
    ctx.expect_nak(NAK_INV, qp.rq_psn)


# -- header checks: silently dropped (IBTA §9.6.1) --


@case(
    "resp.hdr.tver",
    R,
    "A packet with TVer 1 is dropped silently",
    "IBTA Vol.1 §9.6.1.1, C9-12 (TVer)",
    "no response; the QP keeps working",
)
def _tver(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, version=1, reth=(mr.addr, mr.rkey, 4), payload=b"tver")
    ctx.silence()
    alive(ctx, qp, qp.rq_psn, mr, 1)


@case(
    "resp.hdr.pkey",
    R,
    "A packet with a P_Key of another partition is dropped silently",
    "IBTA Vol.1 §9.6.1.1, C9-42 (P_Key check)",
    "no response; the QP keeps working",
)
def _pkey(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, pkey=0x8123, reth=(mr.addr, mr.rkey, 4), payload=b"pkey")
    ctx.silence()
    alive(ctx, qp, qp.rq_psn, mr, 1)


@case(
    "resp.hdr.pkey_limited",
    R,
    "The default partition's limited P_Key 0x7FFF matches a full member",
    "IBTA Vol.1 §10.9.3 (membership), C9-42",
    "ACK",
)
def _pkey_limited(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, pkey=0x7FFF, reth=(mr.addr, mr.rkey, 4), payload=b"lim.")
    ctx.expect_ack(qp.rq_psn, 1)


@case(
    "resp.hdr.unknown_qpn",
    R,
    "A packet to a QPN that does not exist is dropped silently",
    "IBTA Vol.1 §9.6.1.1 (destination QP)",
    "no response; the QP keeps working",
)
def _unknown_qpn(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(
        F.WRITE_ONLY,
        qp.rq_psn,
        dqpn=qp.qpn ^ 0x5A5A5A,
        ackreq=True,
        reth=(mr.addr, mr.rkey, 4),
        payload=b"who?",
    )
    ctx.silence()
    alive(ctx, qp, qp.rq_psn, mr, 1)


@case(
    "resp.hdr.bad_icrc",
    R,
    "A packet with a bad ICRC is dropped silently and not executed",
    "IBTA Vol.1 §9.6.1.1, Annex A17.3.3 (ICRC)",
    "no response; the same PSN then executes once",
)
def _bad_icrc(ctx: Ctx) -> None:
    qp, _mr = setup(ctx, recvs=2)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, corrupt_icrc=True, payload=b"corrupt")
    ctx.silence()
    ctx.no_wc("recv", 0)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=b"good")
    ctx.expect_ack(qp.rq_psn, 1)


# -- zero-length operations (IBTA §9.4.2, §9.4.3: no R_Key check at length 0) --


@case(
    "resp.zero.send",
    R,
    "A zero-length SEND completes a receive with byte_len 0",
    "IBTA Vol.1 §9.4.1",
    "ACK; receive completion byte_len 0",
)
def _zero_send(ctx: Ctx) -> None:
    qp, _ = setup(ctx, recvs=1)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True)
    ctx.expect_ack(qp.rq_psn, 1)
    wc = ctx.wait_wc("recv")[0]
    check(wc["byte_len"] == 0 and wc["status"] == "SUCCESS", f"receive completion {wc}")


@case(
    "resp.zero.write",
    R,
    "A zero-length WRITE is ACKed without an R_Key check",
    "IBTA Vol.1 §9.4.2 (DMA length 0); rxe check_rkey()",
    "ACK",
)
def _zero_write(ctx: Ctx) -> None:
    qp, _ = setup(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(0, 0, 0))
    ctx.expect_ack(qp.rq_psn, 1)


@case(
    "resp.zero.read",
    R,
    "A zero-length READ is answered by an empty READ RESPONSE ONLY",
    "IBTA Vol.1 §9.4.3",
    "READ_RESP_ONLY with no payload, MSN 1",
)
def _zero_read(ctx: Ctx) -> None:
    qp, _ = setup(ctx)
    ctx.send(F.READ_REQUEST, qp.rq_psn, ackreq=True, reth=(0, 0, 0))
    rx = ctx.expect("READ response")
    check(rx.opcode == F.READ_RESP_ONLY and not rx.payload and rx.msn == 1, rx.describe())


# -- responder resources (IBTA §9.7.5.2.2, max_dest_rd_atomic) --


@case(
    "resp.rd_atomic.none",
    R,
    "With max_dest_rd_atomic 0 a READ is an invalid request",
    "IBTA Vol.1 §9.7.5.2.2, §11.2.5.2 (responder resources)",
    "NAK invalid request",
)
def _rd_none(ctx: Ctx) -> None:
    qp, mr = setup(ctx, max_dest_rd_atomic=0)
    ctx.send(F.READ_REQUEST, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 8))
    ctx.expect_nak(NAK_INV, qp.rq_psn)


@case(
    "resp.rd_atomic.over_limit",
    R,
    "More READs outstanding than max_dest_rd_atomic: each is still answered once",
    "IBTA Vol.1 §9.7.5.2.2; rxe rxe_prepare_res() (oldest resource reused)",
    "four READ responses in order",
)
def _rd_over(ctx: Ctx) -> None:
    qp, mr = setup(ctx, max_dest_rd_atomic=2)
    for i in range(4):
        ctx.send(F.READ_REQUEST, psn_add(qp.rq_psn, i), ackreq=True, reth=(mr.addr, mr.rkey, 8))
    for i in range(4):
        rx = ctx.expect("READ response")
        check(rx.opcode == F.READ_RESP_ONLY and rx.psn == psn_add(qp.rq_psn, i), rx.describe())


@case(
    "resp.send_inv",
    R,
    "SEND with invalidate invalidates the named R_Key",
    "IBTA Vol.1 §9.4.1.1 (SEND with Invalidate), §10.6.7",
    "ACK; the R_Key no longer works",
)
def _send_inv(ctx: Ctx) -> None:
    if not ctx.info.get("memory_windows"):
        raise Skip("no memory window or fast-registered MR to invalidate (the agent sets none up)")
    qp, mr = setup(ctx, recvs=1)
    ctx.send(F.SEND_ONLY_INV, qp.rq_psn, ackreq=True, ieth=mr.rkey, payload=b"inv")
    ctx.expect_ack(qp.rq_psn, 1)


_ = NAK_SEQ
