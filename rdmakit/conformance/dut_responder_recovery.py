"""The responder inside messages and after errors: mid-range duplicate READs, gaps and duplicates
inside multi-packet messages, AckReq before the LAST, the AETH's MSN and credits, the Error state."""

from typing import Any

from . import frames as F
from .dut_responder import NAK_ACC, NAK_INV, NAK_SEQ, R, alive, setup
from .frames import psn_add
from .harness import Ctx, DutQp, Mr, case, check

# -- a duplicate READ from the middle (IBTA §9.9.2.1.2, C9-107; roce-sim) --


def _read3(ctx: Ctx) -> tuple[DutQp, Mr, bytes]:
    """A 600-byte READ at MTU 256 at the first PSN, its three responses received."""
    qp, mr = setup(ctx, mtu=256)
    data = ctx.rng.randbytes(600)
    ctx.write_mem(mr, 0, data)
    ctx.send(F.READ_REQUEST, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 600))
    for i in range(3):
        rx = ctx.expect(f"READ response {i}")
        check(rx.psn == psn_add(qp.rq_psn, i), rx.describe())
    return qp, mr, data


def _replayed(ctx: Ctx, qp: DutQp, data: bytes, at: int) -> None:
    """The responses to a duplicate READ at PSN first + ``at``: MIDDLE/LAST from there, the rest."""
    got = b""
    ops = [F.READ_RESP_MIDDLE] * (2 - at) + [F.READ_RESP_LAST]
    for i, op in enumerate(ops):
        psn = psn_add(qp.rq_psn, at + i)
        rx = ctx.expect(f"{F.OPCODE_NAMES[op]} at PSN {psn:#x}")
        check(
            rx.opcode == op and rx.psn == psn,
            f"expected {F.OPCODE_NAMES[op]} at {psn:#x}, got {rx.describe()}",
        )
        got += rx.payload
    check(got == data[256 * at :], f"the replayed responses carry {len(got)} other bytes")


@case(
    "resp.dup.read_middle",
    R,
    "A duplicate READ whose PSN lies inside an earlier READ is answered from that PSN",
    "IBTA Vol.1 §9.9.2.1.2, C9-107; roce-sim duplicate READ",
    "READ_RESP MIDDLE at n+1 and LAST at n+2 with bytes 256..600",
)
def _dup_read_middle(ctx: Ctx) -> None:
    qp, mr, data = _read3(ctx)
    ctx.send(F.READ_REQUEST, psn_add(qp.rq_psn, 1), ackreq=True, reth=(mr.addr + 256, mr.rkey, 344))
    _replayed(ctx, qp, data, 1)


@case(
    "resp.dup.read_last",
    R,
    "A duplicate READ at the PSN of an earlier READ's LAST is answered by that LAST alone",
    "IBTA Vol.1 §9.9.2.1.2, C9-107",
    "READ_RESP_LAST at n+2 with bytes 512..600",
)
def _dup_read_last(ctx: Ctx) -> None:
    qp, mr, data = _read3(ctx)
    ctx.send(F.READ_REQUEST, psn_add(qp.rq_psn, 2), ackreq=True, reth=(mr.addr + 512, mr.rkey, 88))
    _replayed(ctx, qp, data, 2)


@case(
    "resp.dup.read_in_write",
    R,
    "A mid-range duplicate READ while a WRITE is open is answered, and the WRITE still completes",
    "IBTA Vol.1 §9.9.2.1.2, C9-107, §9.8.3.1 (a duplicate does not break the open message)",
    "MIDDLE/LAST replayed; the WRITE's LAST ACKed with MSN 2; memory holds the WRITE",
)
def _dup_read_in_write(ctx: Ctx) -> None:
    qp, mr, data = _read3(ctx)
    w = ctx.rng.randbytes(300)
    ctx.send(F.WRITE_FIRST, psn_add(qp.rq_psn, 3), reth=(mr.addr + 1024, mr.rkey, 300), payload=w[:256])
    ctx.send(F.READ_REQUEST, psn_add(qp.rq_psn, 1), ackreq=True, reth=(mr.addr + 256, mr.rkey, 344))
    _replayed(ctx, qp, data, 1)
    ctx.send(F.WRITE_LAST, psn_add(qp.rq_psn, 4), ackreq=True, payload=w[256:])
    ctx.expect_ack(psn_add(qp.rq_psn, 4), 2)
    check(ctx.read_mem(mr, 1024, 300) == w, "the WRITE around the duplicate READ did not land")


# -- go-back-N inside multi-packet messages (IBTA §9.7.5.2.1, §9.9.2) --


@case(
    "resp.gap.write_middle",
    R,
    "A WRITE whose MIDDLE is lost: NAK at the MIDDLE, the resent MIDDLE and LAST accepted",
    "IBTA Vol.1 §9.7.5.2.1, C9-110 (go-back-N inside a message)",
    "NAK PSN sequence error at n+1; then ACK of n+2, MSN 1; memory holds the message",
)
def _gap_write_middle(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    data = ctx.rng.randbytes(600)
    p = qp.rq_psn
    ctx.send(F.WRITE_FIRST, p, reth=(mr.addr, mr.rkey, 600), payload=data[:256])
    ctx.send(F.WRITE_LAST, psn_add(p, 2), ackreq=True, payload=data[512:])
    ctx.expect_nak(NAK_SEQ, psn_add(p, 1))
    ctx.send(F.WRITE_MIDDLE, psn_add(p, 1), payload=data[256:512])
    ctx.send(F.WRITE_LAST, psn_add(p, 2), ackreq=True, payload=data[512:])
    ctx.expect_ack(psn_add(p, 2), 1)
    check(ctx.read_mem(mr, 0, 600) == data, "the written data differs")


@case(
    "resp.gap.send_middle",
    R,
    "A SEND whose MIDDLE is lost: NAK at the MIDDLE, the resent rest completes one receive",
    "IBTA Vol.1 §9.7.5.2.1, C9-110",
    "NAK PSN sequence error at n+1; ACK of n+2, MSN 1; one receive completion of 600 bytes",
)
def _gap_send_middle(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256, recvs=1)
    data = ctx.rng.randbytes(600)
    p = qp.rq_psn
    ctx.send(F.SEND_FIRST, p, payload=data[:256])
    ctx.send(F.SEND_LAST, psn_add(p, 2), ackreq=True, payload=data[512:])
    ctx.expect_nak(NAK_SEQ, psn_add(p, 1))
    ctx.send(F.SEND_MIDDLE, psn_add(p, 1), payload=data[256:512])
    ctx.send(F.SEND_LAST, psn_add(p, 2), ackreq=True, payload=data[512:])
    ctx.expect_ack(psn_add(p, 2), 1)
    wc = ctx.wait_wc("recv")[0]
    check(wc["status"] == "SUCCESS" and wc["byte_len"] == 600, f"receive completion {wc}")
    check(ctx.read_mem(mr, 0, 600) == data, "the received data differs")
    ctx.no_wc("recv", 0.1)


@case(
    "resp.dup.first_inside",
    R,
    "A duplicate FIRST inside the open message it began is acknowledged, and the message goes on",
    "IBTA Vol.1 §9.9.2.1, C9-105 (duplicate inside an open message)",
    "ACK of n+1 (MSN 0) for the duplicate; the LAST completes the WRITE, MSN 1",
)
def _dup_first_inside(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    data = ctx.rng.randbytes(600)
    p = qp.rq_psn
    ctx.send(F.WRITE_FIRST, p, reth=(mr.addr, mr.rkey, 600), payload=data[:256])
    ctx.send(F.WRITE_MIDDLE, psn_add(p, 1), payload=data[256:512])
    ctx.send(F.WRITE_FIRST, p, ackreq=True, reth=(mr.addr, mr.rkey, 600), payload=data[:256])
    ctx.expect_ack(psn_add(p, 1), 0, "duplicate ACK")
    ctx.send(F.WRITE_LAST, psn_add(p, 2), ackreq=True, payload=data[512:])
    ctx.expect_ack(psn_add(p, 2), 1)
    check(ctx.read_mem(mr, 0, 600) == data, "the written data differs")


@case(
    "resp.dup.send_multi",
    R,
    "A whole multi-packet SEND sent twice is delivered once, each duplicate ACKed",
    "IBTA Vol.1 §9.9.2.1, C9-105",
    "ACK MSN 1 twice; one receive completion; the second receive untouched",
)
def _dup_send_multi(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    ctx.post_recv(mr, 0, 1024, wr_id=1)
    ctx.post_recv(mr, 1024, 1024, wr_id=2)
    data = ctx.rng.randbytes(300)
    p = qp.rq_psn
    for _ in range(2):
        ctx.send(F.SEND_FIRST, p, payload=data[:256])
        ctx.send(F.SEND_LAST, psn_add(p, 1), ackreq=True, payload=data[256:])
        while True:
            rx = ctx.expect(f"ACK of PSN {psn_add(p, 1):#x}")
            check(rx.is_ack(), f"got {rx.describe()}")
            if rx.psn == psn_add(p, 1):
                check(rx.msn == 1, f"MSN {rx.msn}, expected 1")
                break
    wc = ctx.wait_wc("recv")[0]
    check(wc["wr_id"] == 1 and wc["byte_len"] == 300, f"receive completion {wc}")
    ctx.no_wc("recv")


# -- AckReq on packets that are not last (IBTA §9.7.5.1.1) --


@case(
    "resp.ackreq.first_middle",
    R,
    "AckReq on a FIRST and a MIDDLE is answered at once, with the MSN of the messages completed",
    "IBTA Vol.1 §9.7.5.1.1 (AckReq), C9-148",
    "ACK of n (MSN 0), ACK of n+1 (MSN 0), ACK of n+2 (MSN 1)",
)
def _ackreq_first(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    data = ctx.rng.randbytes(600)
    p = qp.rq_psn
    ctx.send(F.WRITE_FIRST, p, ackreq=True, reth=(mr.addr, mr.rkey, 600), payload=data[:256])
    ctx.expect_ack(p, 0)
    ctx.send(F.WRITE_MIDDLE, psn_add(p, 1), ackreq=True, payload=data[256:512])
    ctx.expect_ack(psn_add(p, 1), 0)
    ctx.send(F.WRITE_LAST, psn_add(p, 2), ackreq=True, payload=data[512:])
    ctx.expect_ack(psn_add(p, 2), 1)


@case(
    "resp.ackreq.long_write",
    R,
    "A 200-packet WRITE crossing any window is ACKed where AckReq asks, in PSN order",
    "IBTA Vol.1 §9.7.5.1.1 (AckReq; ACKs are cumulative and may be coalesced), §9.7.1",
    "ACKs only at packets with AckReq (every 50th and the LAST), rising, MSN 0 but the LAST's (1)",
)
def _ackreq_long(ctx: Ctx) -> None:
    qp, _ = setup(ctx, mtu=256)
    mr = ctx.mr(200 * 256)
    data = ctx.rng.randbytes(200 * 256)
    p = qp.rq_psn
    for i in range(200):
        op = F.WRITE_FIRST if i == 0 else F.WRITE_LAST if i == 199 else F.WRITE_MIDDLE
        extra: dict[str, Any] = {"reth": (mr.addr, mr.rkey, len(data))} if i == 0 else {}
        ctx.send(op, psn_add(p, i), ackreq=i % 50 == 49 or i == 199, payload=data[i * 256 : i * 256 + 256],
                 **extra)  # fmt: skip
    # A responder that has read several AckReq packets before it answers may answer only the
    # newest: an ACK acknowledges every PSN up to its own (coalescing, §9.7.5.1.1).
    asked = [psn_add(p, i) for i in (49, 99, 149, 199)]
    while True:
        rx = ctx.expect(f"an ACK of one of the PSNs {[hex(a) for a in asked]}")
        check(
            rx.is_ack() and rx.psn in asked,
            f"expected an ACK of {[hex(a) for a in asked]}, got {rx.describe()}",
        )
        last = rx.psn == asked[-1]
        check(rx.msn == (1 if last else 0), f"MSN {rx.msn} in the ACK of PSN {rx.psn:#x}")
        if last:
            break
        asked = asked[asked.index(rx.psn) + 1 :]
    check(ctx.read_mem(mr, 0, len(data)) == data, "the written data differs")


# -- the AETH beyond its syndrome: MSN in NAKs, credits (IBTA §9.7.5.1, §9.7.7) --


@case(
    "resp.nak.msn_seq",
    R,
    "A PSN sequence NAK carries the MSN of the messages completed so far",
    "IBTA Vol.1 §9.7.5.1 (AETH MSN), C9-148",
    "after two SENDs, NAK PSN sequence error with MSN 2",
)
def _nak_msn_seq(ctx: Ctx) -> None:
    qp, _ = setup(ctx, recvs=2)
    for i in range(2):
        ctx.send(F.SEND_ONLY, psn_add(qp.rq_psn, i), ackreq=True, payload=b"m")
        ctx.expect_ack(psn_add(qp.rq_psn, i), i + 1)
    ctx.send(F.SEND_ONLY, psn_add(qp.rq_psn, 4), ackreq=True, payload=b"m")
    rx = ctx.expect_nak(NAK_SEQ, psn_add(qp.rq_psn, 2))
    check(rx.msn == 2, f"MSN {rx.msn} in the NAK, expected 2")


@case(
    "resp.nak.msn_access",
    R,
    "A remote access error NAK carries the MSN of the messages completed so far",
    "IBTA Vol.1 §9.7.5.1 (AETH MSN), §9.7.5.2.4",
    "after one WRITE, NAK remote access error with MSN 1",
)
def _nak_msn_access(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"good")
    ctx.expect_ack(qp.rq_psn, 1)
    p = psn_add(qp.rq_psn, 1)
    ctx.send(F.WRITE_ONLY, p, ackreq=True, reth=(mr.addr, mr.rkey ^ 0x100, 4), payload=b"bad!")
    rx = ctx.expect_nak(NAK_ACC, p)
    check(rx.msn == 1, f"MSN {rx.msn} in the NAK, expected 1")


@case(
    "resp.rnr.msn",
    R,
    "An RNR NAK carries the MSN of the messages completed so far",
    "IBTA Vol.1 §9.7.5.1 (AETH MSN), §9.7.5.2.8",
    "after one SEND, RNR NAK with MSN 1",
)
def _rnr_msn(ctx: Ctx) -> None:
    qp, _ = setup(ctx, recvs=1)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=b"one")
    ctx.expect_ack(qp.rq_psn, 1)
    p = psn_add(qp.rq_psn, 1)
    ctx.send(F.SEND_ONLY, p, ackreq=True, payload=b"two")
    rx = ctx.expect("RNR NAK")
    check(
        rx.is_rnr() and rx.psn == p and rx.msn == 1,
        f"expected RNR NAK at {p:#x} with MSN 1, got {rx.describe()}",
    )


#: IBTA §9.7.5.1 table 45: AETH credit code -> receive WQEs it grants.
CREDITS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
           1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)  # fmt: skip


@case(
    "resp.ack.credits",
    R,
    "An ACK never grants more credits than receive WQEs are left (or says 0x1F: none kept)",
    "IBTA Vol.1 §9.7.7.2 (end-to-end credits), §9.7.5.1 table 45",
    "after a SEND takes one of 3 receives, the ACK's credit code is 0x1F or grants at most 2",
)
def _ack_credits(ctx: Ctx) -> None:
    qp, _ = setup(ctx, recvs=3)
    ctx.send(F.SEND_ONLY, qp.rq_psn, ackreq=True, payload=b"credit")
    rx = ctx.expect_ack(qp.rq_psn, 1)
    assert rx.syndrome is not None
    code = rx.syndrome & 0x1F
    check(code == 0x1F or CREDITS[code] <= 2, f"credit code {code} grants {CREDITS[min(code, 30)]} > 2 left")


# -- the responder's state after a Class C error or an invalid request (IBTA §9.9.3.1, §10.3.1) --


def _after_fatal(ctx: Ctx, mr: Mr, nak: int, psn: int) -> None:
    """The NAK at ``psn``, then ERR, the posted receive flushed, silence."""
    ctx.expect_nak(nak, psn)
    st = ctx.state()
    check(st == "ERR", f"QP state {st} after the NAK, expected ERR")
    wcs = ctx.wait_wc("recv")
    check(wcs[0]["status"] == "WR_FLUSH_ERR", f"receive completion {wcs[0]}, expected WR_FLUSH_ERR")
    ctx.send(F.WRITE_ONLY, psn_add(psn, 1), ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"more")
    ctx.silence()


@case(
    "resp.err.invalid_flush",
    R,
    "After an invalid request NAK the QP is in ERR, its receives are flushed, and it falls silent",
    "IBTA Vol.1 §9.9.3.1 (class C), §10.3.1 (Error state: flush)",
    "NAK invalid request; ERR; WR_FLUSH_ERR receive completion; no answer to a later request",
)
def _err_invalid(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256, recvs=1)
    ctx.send(F.WRITE_LAST, qp.rq_psn, ackreq=True, payload=bytes(16))
    _after_fatal(ctx, mr, NAK_INV, qp.rq_psn)


@case(
    "resp.err.access_flush",
    R,
    "After a remote access error NAK the QP is in ERR, its receives are flushed, and it falls silent",
    "IBTA Vol.1 §9.7.5.2.4, §10.3.1 (Error state: flush)",
    "NAK remote access error; ERR; WR_FLUSH_ERR; no answer to a later request",
)
def _err_access(ctx: Ctx) -> None:
    qp, mr = setup(ctx, recvs=1)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey ^ 0x40, 4), payload=b"bad!")
    _after_fatal(ctx, mr, NAK_ACC, qp.rq_psn)


@case(
    "resp.err.no_dup_reply",
    R,
    "A QP in ERR does not answer a duplicate of a request it executed before the error",
    "IBTA Vol.1 §10.3.1 (Error state: no packets sent)",
    "no response to a duplicate WRITE after the NAK",
)
def _err_no_dup(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"good")
    ctx.expect_ack(qp.rq_psn, 1)
    p = psn_add(qp.rq_psn, 1)
    ctx.send(F.READ_REQUEST, p, ackreq=True, reth=(mr.addr, mr.rkey ^ 0x8, 4))
    ctx.expect_nak(NAK_ACC, p)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"good")
    ctx.silence()


@case(
    "resp.dup.write_not_again",
    R,
    "A duplicate WRITE is not executed again: memory changed since keeps its new bytes",
    "IBTA Vol.1 §9.9.2.1, C9-105 (duplicates are not re-executed)",
    "duplicate ACKed; the region holds what was written after the first WRITE",
)
def _dup_write_memory(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"orig")
    ctx.expect_ack(qp.rq_psn, 1)
    ctx.write_mem(mr, 0, b"next")
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"orig")
    ctx.expect_ack(qp.rq_psn, 1, "duplicate ACK")
    check(ctx.read_mem(mr, 0, 4) == b"next", "the duplicate WRITE was executed again")
    alive(ctx, qp, psn_add(qp.rq_psn, 1), mr, 2)
