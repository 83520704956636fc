"""Cases where the DUT is the requester and the tester responds (IBTA Vol. 1 §9.7.5.2, §9.9.3).

The tester asks the agent to post a work request, checks the DUT's request
packets, and answers them correctly or wrongly on purpose. Timers are measured
between the DUT's own packets (the kernel's receive times, which on a direct
link are its send times) or from when the tester sent what starts them.
"""

from . import frames as F
from .frames import psn_add
from .harness import Ctx, DutQp, Mr, case, check

Q = "requester"  # the DUT's role: the tester answers its requests
_NOMINAL = 4.096e-6


def setup(ctx: Ctx, *, mtu: int = 1024, timeout: int = 18, retry_cnt: int = 3, rnr_retry: int = 3,
          sq_psn: int | None = None, max_rd_atomic: int = 4) -> tuple[DutQp, Mr]:  # fmt: skip
    qp = ctx.dut_qp(mtu=mtu, timeout=timeout, retry_cnt=retry_cnt, rnr_retry=rnr_retry, sq_psn=sq_psn,
                    max_rd_atomic=max_rd_atomic)  # fmt: skip
    return qp, ctx.mr(8192)


def wc_ok(ctx: Ctx, n: int = 1, status: str = "SUCCESS") -> list[dict[str, object]]:
    wcs = ctx.wait_wc("send", n)
    for wc in wcs:
        check(wc["status"] == status, f"send completion {wc}, expected {status}")
    return wcs


# -- successful operations (roce-sim: send, write, write-imm, read, CAS success) --


@case(
    "req.send.ack",
    Q,
    "The DUT's SEND ONLY carries the posted data and AckReq; an ACK completes it",
    "IBTA Vol.1 §9.4.1, §9.7.5.1.1; roce-sim send",
    "SEND_ONLY at sq_psn with AckReq; SUCCESS",
)
def _send(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    data = ctx.rng.randbytes(100)
    ctx.write_mem(mr, 0, data)
    ctx.post_send("SEND", mr, 100)
    rx = ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    check(rx.payload == data and rx.ackreq, f"request {rx.describe()}, AckReq {rx.ackreq}")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.write.ack",
    Q,
    "The DUT's WRITE ONLY carries RETH va, rkey and length",
    "IBTA Vol.1 §9.4.2, §9.3.3; roce-sim write",
    "WRITE_ONLY with the posted RETH; SUCCESS",
)
def _write(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("RDMA_WRITE", mr, 64, remote_addr=0x1000, rkey=0x4321)
    rx = ctx.expect_request(F.WRITE_ONLY, qp.sq_psn)
    check(rx.reth == (0x1000, 0x4321, 64) and len(rx.payload) == 64, f"request {rx.describe()} {rx.reth}")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.write_imm.ack",
    Q,
    "The DUT's WRITE ONLY with immediate carries the ImmDt",
    "IBTA Vol.1 §9.4.2; roce-sim write-imm",
    "WRITE_ONLY_IMM with the immediate; SUCCESS",
)
def _write_imm(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("RDMA_WRITE_WITH_IMM", mr, 16, remote_addr=0x2000, rkey=7, imm=0xCAFEF00D)
    rx = ctx.expect_request(F.WRITE_ONLY_IMM, qp.sq_psn)
    check(rx.imm == 0xCAFEF00D, f"immediate {rx.imm}")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.write.split",
    Q,
    "A 700-byte WRITE at MTU 256 is FIRST(256, RETH) MIDDLE(256) LAST(188)",
    "IBTA Vol.1 §9.4.2, C9-92..C9-94",
    "three packets, RETH only on FIRST with DMA length 700; AckReq on LAST",
)
def _write_split(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    ctx.post_send("RDMA_WRITE", mr, 700, remote_addr=0x3000, rkey=9)
    p = qp.sq_psn
    sizes = ((F.WRITE_FIRST, 256), (F.WRITE_MIDDLE, 256), (F.WRITE_LAST, 188))
    for i, (op, n) in enumerate(sizes):
        rx = ctx.expect_request(op, psn_add(p, i))
        check(len(rx.payload) == n, f"packet {i} has {len(rx.payload)} bytes, expected {n}")
        check((rx.reth is not None) == (i == 0), "RETH only on the FIRST")
        if i == 0:
            check(rx.reth == (0x3000, 9, 700), f"FIRST's RETH {rx.reth}, expected DMA length 700")
    check(rx.ackreq, "AckReq on the LAST")
    check(rx.reth is None, "no RETH on LAST")
    ctx.ack(psn_add(p, 2))
    wc_ok(ctx)


@case(
    "req.read.resp",
    Q,
    "A READ RESPONSE ONLY fills the DUT's buffer and completes the READ",
    "IBTA Vol.1 §9.4.3; roce-sim read",
    "READ_REQUEST with RETH; SUCCESS; data in the local buffer",
)
def _read(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.post_send("RDMA_READ", mr, 100, remote_addr=0x5000, rkey=3)
    rx = ctx.expect_request(F.READ_REQUEST, qp.sq_psn)
    check(rx.reth == (0x5000, 3, 100), f"RETH {rx.reth}")
    data = ctx.rng.randbytes(100)
    ctx.send(F.READ_RESP_ONLY, qp.sq_psn, dqpn=qp.qpn, aeth=(0x1F, 1), payload=data)
    wc_ok(ctx)
    check(ctx.read_mem(mr, 0, 100) == data, "the read data differs")


@case(
    "req.read.multi",
    Q,
    "A 600-byte READ at MTU 256 completes from FIRST/MIDDLE/LAST responses",
    "IBTA Vol.1 §9.4.3",
    "SUCCESS; data in order",
)
def _read_multi(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    ctx.post_send("RDMA_READ", mr, 600, remote_addr=0x5000, rkey=3)
    ctx.expect_request(F.READ_REQUEST, qp.sq_psn)
    data = ctx.rng.randbytes(600)
    p = qp.sq_psn
    ctx.send(F.READ_RESP_FIRST, p, dqpn=qp.qpn, aeth=(0x1F, 1), payload=data[:256])
    ctx.send(F.READ_RESP_MIDDLE, psn_add(p, 1), dqpn=qp.qpn, payload=data[256:512])
    ctx.send(F.READ_RESP_LAST, psn_add(p, 2), dqpn=qp.qpn, aeth=(0x1F, 1), payload=data[512:])
    wc_ok(ctx)
    check(ctx.read_mem(mr, 0, 600) == data, "the read data differs")


def _atomic(ctx: Ctx, opname: str, op: int) -> None:
    qp, mr = setup(ctx)
    ctx.post_send(opname, mr, 8, remote_addr=0x8000, rkey=5, compare_add=11, swap=22)
    rx = ctx.expect_request(op, qp.sq_psn)
    want = (0x8000, 5, 22, 11) if op == F.COMPARE_SWAP else (0x8000, 5, 11, 0)
    check(rx.atomic is not None and rx.atomic[:3] == want[:3], f"AtomicETH {rx.atomic}, expected {want}")
    orig = ctx.rng.getrandbits(64)
    ctx.send(F.ATOMIC_ACKNOWLEDGE, qp.sq_psn, dqpn=qp.qpn, aeth=(0x1F, 1), orig=orig)
    wc_ok(ctx)
    got = int.from_bytes(ctx.read_mem(mr, 0, 8), "little")
    check(got == orig, f"local buffer {got:#x}, expected the original value {orig:#x}")


@case(
    "req.atomic.cas",
    Q,
    "COMPARE & SWAP: AtomicETH swap/compare; the ACK's original value lands locally",
    "IBTA Vol.1 §9.4.5, §9.3.6; roce-sim CAS success",
    "SUCCESS; local buffer = OrigRemDt",
)
def _cas(ctx: Ctx) -> None:
    _atomic(ctx, "ATOMIC_CMP_AND_SWP", F.COMPARE_SWAP)


@case(
    "req.atomic.fadd",
    Q,
    "FETCH & ADD: the ACK's original value lands locally",
    "IBTA Vol.1 §9.4.5, §9.3.6",
    "SUCCESS; local buffer = OrigRemDt",
)
def _fadd(ctx: Ctx) -> None:
    _atomic(ctx, "ATOMIC_FETCH_AND_ADD", F.FETCH_ADD)


@case(
    "req.ack.coalesced",
    Q,
    "One ACK of the last PSN completes three SENDs in order",
    "IBTA Vol.1 §9.7.5.1.1 (cumulative ACK)",
    "three SUCCESS completions, wr_id 1, 2, 3",
)
def _coalesced(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    for i in range(3):
        ctx.post_send("SEND", mr, 8, wr_id=i + 1)
    for i in range(3):
        ctx.expect_request(F.SEND_ONLY, psn_add(qp.sq_psn, i))
    ctx.ack(psn_add(qp.sq_psn, 2), 3)
    wcs = wc_ok(ctx, 3)
    check([w["wr_id"] for w in wcs] == [1, 2, 3], f"completion order {wcs}")


@case(
    "req.psn.wrap",
    Q,
    "The DUT's PSNs wrap from 0xFFFFFF to 0; an ACK of 0 completes both",
    "IBTA Vol.1 §9.7.1",
    "SENDs at 0xFFFFFF and 0; two SUCCESS",
)
def _wrap(ctx: Ctx) -> None:
    _qp, mr = setup(ctx, sq_psn=0xFFFFFF)
    ctx.post_send("SEND", mr, 8, wr_id=1)
    ctx.post_send("SEND", mr, 8, wr_id=2)
    ctx.expect_request(F.SEND_ONLY, 0xFFFFFF)
    ctx.expect_request(F.SEND_ONLY, 0)
    ctx.ack(0, 2)
    wc_ok(ctx, 2)


# -- NAKs and retries (IBTA §9.7.5.2, §9.9.3) --


@case(
    "req.nak_seq.gobackn",
    Q,
    "After a PSN sequence NAK the DUT resends from the NAK's PSN (partial retry, MTU 256)",
    "IBTA Vol.1 §9.7.5.2.1, §9.9.3.1 (go-back-N)",
    "MIDDLE and LAST sent again from PSN n+1; SUCCESS",
)
def _gobackn(ctx: Ctx) -> None:
    qp, mr = setup(ctx, mtu=256)
    ctx.post_send("RDMA_WRITE", mr, 700, remote_addr=0x3000, rkey=9)
    p = qp.sq_psn
    for i, op in enumerate((F.WRITE_FIRST, F.WRITE_MIDDLE, F.WRITE_LAST)):
        ctx.expect_request(op, psn_add(p, i))
    nak = ctx.ack(psn_add(p, 1), 0, F.NAK_KIND, F.NAK_PSN_SEQ)
    ctx.expect_request(F.WRITE_MIDDLE, psn_add(p, 1), strict=True, after=nak)
    ctx.expect_request(F.WRITE_LAST, psn_add(p, 2), strict=True, after=nak)
    ctx.ack(psn_add(p, 2))
    wc_ok(ctx)


@case(
    "req.nak_seq.implied_ack",
    Q,
    "A PSN sequence NAK acknowledges every message before its PSN",
    "IBTA Vol.1 §9.7.5.1.1, §9.7.5.2.1",
    "the first two SENDs complete; the third is resent",
)
def _nak_acks(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    for i in range(3):
        ctx.post_send("SEND", mr, 8, wr_id=i + 1)
    for i in range(3):
        ctx.expect_request(F.SEND_ONLY, psn_add(qp.sq_psn, i))
    nak = ctx.ack(psn_add(qp.sq_psn, 2), 2, F.NAK_KIND, F.NAK_PSN_SEQ)
    wcs = wc_ok(ctx, 2)
    check([w["wr_id"] for w in wcs] == [1, 2], f"completions {wcs}")
    ctx.expect_request(F.SEND_ONLY, psn_add(qp.sq_psn, 2), strict=True, after=nak)
    ctx.ack(psn_add(qp.sq_psn, 2), 3)
    wc_ok(ctx)


@case(
    "req.nak_seq.retry_exceeded",
    Q,
    "PSN sequence NAKs and timeouts beyond retry_cnt end in RETRY_EXC_ERR",
    "IBTA Vol.1 §9.9.3.1.2 (retry count), §11.6.2; roce-sim PSN gap retry limit exceeded",
    "RETRY_EXC_ERR; QP in ERR",
)
def _nak_exceeded(ctx: Ctx) -> None:
    qp, mr = setup(ctx, retry_cnt=1, timeout=12)
    ctx.post_send("SEND", mr, 8)
    for _ in range(2):
        rx = ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
        ctx.ack(qp.sq_psn, 0, F.NAK_KIND, F.NAK_PSN_SEQ)
    wc_ok(ctx, 1, "RETRY_EXC_ERR")
    check(ctx.state() == "ERR", "QP not in ERR")
    _ = rx


@case(
    "req.timeout.retransmit",
    Q,
    "Without a response the DUT resends the same PSN, not before the local ACK timeout",
    "IBTA Vol.1 §9.7.6.1.3 (4.096 us x 2^timeout), C9-140; roce-sim local ACK timeout",
    "the same request again, at least the nominal timeout later",
)
def _timeout(ctx: Ctx) -> None:
    qp, mr = setup(ctx, timeout=16, retry_cnt=7)
    ctx.post_send("SEND", mr, 8)
    first = ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    again = ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    gap = again.stamp - first.stamp  # between the DUT's two sends
    check(gap >= _NOMINAL * (1 << 16) * 0.9, f"resent after {gap * 1e3:.2f} ms, before the timeout")
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)


@case(
    "req.timeout.exceeded",
    Q,
    "retry_cnt timeouts without a response end in RETRY_EXC_ERR, the rest flushed",
    "IBTA Vol.1 §9.9.3.1.2, §10.3.1 (flush); roce-sim local ACK timeout retry limit exceeded",
    "retry_cnt + 1 transmissions; RETRY_EXC_ERR then WR_FLUSH_ERR",
)
def _timeout_exceeded(ctx: Ctx) -> None:
    qp, mr = setup(ctx, timeout=12, retry_cnt=2)
    ctx.post_send("SEND", mr, 8, wr_id=1)
    ctx.post_send("SEND", mr, 8, wr_id=2)
    first, second = qp.sq_psn, psn_add(qp.sq_psn, 1)
    sent = 0  # transmissions of the first SEND; the second may follow each (go-back-N resends both)
    while sent < 3:
        rx = ctx.expect(f"SEND_ONLY at PSN {first:#x}")
        check(rx.opcode == F.SEND_ONLY and rx.psn in (first, second), f"unexpected {rx.describe()}")
        sent += rx.psn == first
    wcs = ctx.wait_wc("send", 2)
    check(wcs[0]["status"] == "RETRY_EXC_ERR", f"first completion {wcs[0]}")
    check(wcs[1]["status"] == "WR_FLUSH_ERR", f"second completion {wcs[1]}")
    check(ctx.state() == "ERR", "QP not in ERR")


@case(
    "req.timeout.recovers",
    Q,
    "A response after a timeout retry (within retry_cnt) completes normally",
    "IBTA Vol.1 §9.9.3.1.2; roce-sim local ACK timeout retry limit not exceeded",
    "SUCCESS",
)
def _timeout_ok(ctx: Ctx) -> None:
    qp, mr = setup(ctx, timeout=14, retry_cnt=7)
    ctx.post_send("SEND", mr, 8)
    for _ in range(2):
        ctx.expect_request(F.SEND_ONLY, qp.sq_psn)
    ctx.ack(qp.sq_psn)
    wc_ok(ctx)
