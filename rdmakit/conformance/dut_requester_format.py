"""The format of the DUT's requests: RETH on multi-packet WRITEs, pad, reserved bits, AckReq, UDP/IP."""

from . import frames as F
from .dut_requester import Q, setup, wc_ok
from .frames import psn_add
from .harness import Ctx, case, check


@case(
    "req.write.dmalen_first",
    Q,
    "The RETH on a WRITE FIRST gives the whole message's DMA length, not the first packet's",
    "IBTA Vol.1 §9.3.3 (RETH DMA Length), §9.4.2",
    "WRITE FIRST with RETH (va, rkey, 2000) at MTU 512",
)
def _dmalen_first(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=512)
    ctx.post_send("RDMA_WRITE", mr, 2000, remote_addr=0x7000, rkey=0x77)
    p = qp.sq_psn
    rx = ctx.expect_request(F.WRITE_FIRST, p)
    check(rx.reth == (0x7000, 0x77, 2000), f"RETH {rx.reth}, expected (0x7000, 0x77, 2000)")
    for i, op in ((1, F.WRITE_MIDDLE), (2, F.WRITE_MIDDLE), (3, F.WRITE_LAST)):
        rx = ctx.expect_request(op, psn_add(p, i))
        check(rx.reth is None, f"a RETH on {rx.describe()}")
    ctx.ack(psn_add(p, 3))
    wc_ok(ctx)


@case(
    "req.write_imm.split",
    Q,
    "A multi-packet WRITE with immediate carries the ImmDt on the LAST only",
    "IBTA Vol.1 §9.4.2, §9.2 table 35 (RDMA WRITE Last with Immediate)",
    "WRITE FIRST (RETH), WRITE_LAST_IMM with the immediate; SUCCESS",
)
def _write_imm_split(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    ctx.post_send("RDMA_WRITE_WITH_IMM", mr, 400, remote_addr=0x2000, rkey=7, imm=0x0BADCAFE)
    p = qp.sq_psn
    rx = ctx.expect_request(F.WRITE_FIRST, p)
    check(rx.reth == (0x2000, 7, 400) and rx.imm is None, f"FIRST {rx.describe()} RETH {rx.reth}")
    rx = ctx.expect_request(F.WRITE_LAST_IMM, psn_add(p, 1))
    check(rx.imm == 0x0BADCAFE and len(rx.payload) == 144, f"LAST {rx.describe()} immediate {rx.imm}")
    ctx.ack(psn_add(p, 1))
    wc_ok(ctx)


@case(
    "req.send.split",
    Q,
    "A 600-byte SEND at MTU 256 is FIRST(256) MIDDLE(256) LAST(88), AckReq on the LAST",
    "IBTA Vol.1 §9.4.1, C9-92..C9-94",
    "three packets of 256, 256 and 88 bytes carrying the data in order",
)
def _send_split(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    data = ctx.rng.randbytes(600)
    ctx.write_mem(mr, 0, data)
    ctx.post_send("SEND", mr, 600)
    p = qp.sq_psn
    got = b""
    for i, op in enumerate((F.SEND_FIRST, F.SEND_MIDDLE, F.SEND_LAST)):
        rx = ctx.expect_request(op, psn_add(p, i))
        got += rx.payload
    check(rx.ackreq, "no AckReq on the LAST")
    check(got == data, "the SEND's packets carry other bytes")
    ctx.ack(psn_add(p, 2))
    wc_ok(ctx)


@case(
    "req.send.pad",
    Q,
    "A 5-byte SEND has PadCnt 3 and zero pad bytes",
    "IBTA Vol.1 §9.2 (PadCnt), §9.3.1 (pad bytes are 0)",
    "SEND ONLY with PadCnt 3, pad 00 00 00, the 5 bytes",
)
def _pad(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.write_mem(mr, 0, b"12345")
    ctx.post_send("SEND", mr, 5)
    rx = ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    check(rx.padcount == 3 and rx.pad == b"\0\0\0", f"PadCnt {rx.padcount}, pad {rx.pad.hex()}")
    check(rx.payload == b"12345", f"payload {rx.payload!r}")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.hdr.reserved",
    Q,
    "The DUT's requests have TVer 0, P_Key 0xFFFF and the BTH reserved bits 0",
    "IBTA Vol.1 §9.2 (BTH), C9-12; §9.3.3 (reserved fields are sent as 0)",
    "Resv6 and Resv7 zero on SEND, WRITE and READ requests",
)
def _reserved(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("SEND", mr, 8, wr_id=1)
    ctx.post_send("RDMA_WRITE", mr, 8, wr_id=2, remote_addr=0x1000, rkey=1)
    ctx.post_send("RDMA_READ", mr, 8, wr_id=3, remote_addr=0x1000, rkey=1)
    p = qp.sq_psn
    for i, op in enumerate((F.SEND_ONLY, F.WRITE_ONLY, F.READ_REQUEST)):
        rx = ctx.expect_request(op, psn_add(p, i))
        check(rx.reserved == 0, f"reserved bits {rx.reserved:#x} in {rx.describe()}")
    # Answered again if the DUT asks again (its local ACK timer, 1.07 s: a datagram lost on a
    # busy host); a resend has the reserved bits clear too.
    while True:
        ctx.send(F.READ_RESP_ONLY, psn_add(p, 2), dqpn=qp.qpn, aeth=(0x1F, 3), payload=bytes(8))
        again = ctx.recv(1.5)
        if again is None:
            break
        check(again.opcode == F.READ_REQUEST and again.psn == psn_add(p, 2), f"unexpected {again.describe()}")
        check(again.reserved == 0, f"reserved bits {again.reserved:#x} in {again.describe()}")
    wc_ok(ctx, 3)


@case(
    "req.write.ackreq_periodic",
    Q,
    "A long WRITE asks for an ACK before its LAST, so the window can move",
    "IBTA Vol.1 §9.7.5.1.1 (AckReq); rxe_req.c init_req_packet() (RXE_MAX_PKT_PER_ACK)",
    "AckReq on some packet other than the LAST of a 100-packet WRITE at MTU 256",
)
def _ackreq_periodic(ctx: Ctx) -> None:
    qp, _ = setup(ctx, mtu=256, timeout=20, retry_cnt=7)
    mr = ctx.mr(100 * 256)
    ctx.post_send("RDMA_WRITE", mr, 100 * 256, remote_addr=0x10000, rkey=1)
    p = qp.sq_psn
    asked = set()
    seen = 0  # packets received in order; each AckReq is ACKed at once, as a responder does
    while seen < 100:
        rx = ctx.expect(f"packet {seen} of the WRITE")
        i = (rx.psn - p) & F.PSN_MASK
        check(i <= seen, f"packet {seen} expected, got {rx.describe()}")
        if i < seen:
            continue  # sent again after a loss on a busy path
        seen += 1
        if rx.ackreq:
            asked.add(i)
            ctx.ack(rx.psn, 0 if i < 99 else 1)
    check(asked - {99}, "no AckReq before the LAST of 100 packets")
    ctx.ack(psn_add(p, 99))
    wc_ok(ctx)


@case(
    "req.udp.sport",
    Q,
    "The UDP source port of the DUT's packets is the same for every packet of a QP, retries too",
    "IBTA Vol.1 Annex A17 (RoCEv2 UDP source port: flow entropy); rxe_qp.c rxe_qp_init_req()",
    "one non-zero source port for three SENDs and a retransmission",
)
def _sport(ctx: Ctx) -> None:
    qp, mr = setup(ctx, timeout=16, retry_cnt=7)
    for i in range(3):
        ctx.post_send("SEND", mr, 8, wr_id=i + 1)
    want = {psn_add(qp.sq_psn, i) for i in range(3)}
    seen: list[int] = []
    ports = set()
    while not (want <= set(seen) and len(seen) > len(set(seen))):  # all three, and a retransmission
        rx = ctx.expect(f"the SENDs at {sorted(want)} and a retransmission; got {seen}")
        check(rx.opcode == F.SEND_ONLY and rx.psn in want, f"unexpected {rx.describe()}")
        seen.append(rx.psn)
        ports.add(rx.sport)
    check(len(ports) == 1 and 0 not in ports, f"source ports {sorted(ports)}")
    ctx.ack(psn_add(qp.sq_psn, 2), 3)
    wc_ok(ctx, 3)


@case(
    "req.ip.ecn",
    Q,
    "The DUT never marks its own packets Congestion Experienced",
    "IBTA Vol.1 Annex A17.9 (ECN marking by the network); RFC 3168 §5",
    "ECN field of the DUT's request is Not-ECT, ECT(0) or ECT(1), never CE",
)
def _ecn(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("SEND", mr, 8)
    rx = ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    if rx.tos is not None:
        check(rx.tos & 3 != 3, f"the DUT's request is marked CE (TOS {rx.tos:#04x})")
        ctx.log.append(f"DSCP {rx.tos >> 2}, ECN {rx.tos & 3}")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)
