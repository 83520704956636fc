"""R_Keys, access rights, and VA boundaries for WRITE, READ and atomics (IBTA Vol. 1 §9.7.5.2.4, §10.6.3.1).

Each range is tried exactly at the end of the region (allowed), one byte
past it, one byte below its start, and where the VA plus the length wraps
64 bits. After every NAK the QP is in the error state and the whole region
holds what it held before (google/rdma-unit-test checks the same).
"""

from . import frames as F
from .dut_responder import NAK_ACC, NAK_INV, R, setup
from .frames import psn_add
from .harness import Ctx, Mr, case, check

_U64 = 1 << 64
_LEN = 4096


def _region(ctx: Ctx) -> Mr:
    _qp, mr = setup(ctx, mr_len=_LEN)
    ctx.write_mem(mr, 0, ctx.rng.randbytes(_LEN))
    return mr


def _request(ctx: Ctx, op: int, mr: Mr, va: int, n: int = 8) -> bytes:
    """Send ``op`` on [va, va + n) of ``mr``'s R_Key; return the data a WRITE carries."""
    assert ctx.qp is not None
    psn = ctx.qp.rq_psn
    data = ctx.rng.randbytes(n)
    if op == F.WRITE_ONLY:
        ctx.send(op, psn, ackreq=True, reth=(va % _U64, mr.rkey, n), payload=data)
    elif op == F.READ_REQUEST:
        ctx.send(op, psn, ackreq=True, reth=(va % _U64, mr.rkey, n))
    else:
        ctx.send(op, psn, ackreq=True, atomic=(va % _U64, mr.rkey, 1, 0))
    return data


def refused(ctx: Ctx, op: int, offset: int) -> None:
    """``op`` at ``offset`` from the region's start (a VA of 2^64 - 8 or more: that VA itself)
    is refused: NAK, ERR, the region unchanged."""
    mr = _region(ctx)
    before = ctx.read_mem(mr, 0, _LEN)
    _request(ctx, op, mr, offset if offset >= _U64 - 8 else mr.addr + offset)
    assert ctx.qp is not None
    ctx.expect_nak(NAK_ACC, ctx.qp.rq_psn)
    st = ctx.state()
    check(st == "ERR", f"QP state {st} after a remote access error, expected ERR")
    check(ctx.read_mem(mr, 0, _LEN) == before, "the region changed after a refused request")


def allowed(ctx: Ctx, op: int) -> None:
    """``op`` on the region's last 8 bytes executes."""
    mr = _region(ctx)
    before = ctx.read_mem(mr, 0, _LEN)
    data = _request(ctx, op, mr, mr.addr + _LEN - 8)
    assert ctx.qp is not None
    psn = ctx.qp.rq_psn
    if op == F.WRITE_ONLY:
        ctx.expect_ack(psn, 1)
        check(ctx.read_mem(mr, _LEN - 8, 8) == data, "the last 8 bytes do not hold the WRITE's data")
    elif op == F.READ_REQUEST:
        rx = ctx.expect("READ response")
        check(rx.opcode == F.READ_RESP_ONLY and rx.psn == psn, rx.describe())
        check(rx.payload == before[-8:], "the READ returned other bytes than the region's last 8")
    else:
        rx = ctx.expect("ATOMIC ACKNOWLEDGE")
        check(rx.opcode == F.ATOMIC_ACKNOWLEDGE and rx.psn == psn, rx.describe())
        check(rx.orig == int.from_bytes(before[-8:], "little"), f"original value {rx.orig}")
    check(ctx.read_mem(mr, 0, _LEN - 8) == before[:-8], "bytes before the target changed")


_OPS = (("write", F.WRITE_ONLY), ("read", F.READ_REQUEST), ("atomic", F.FETCH_ADD))
#: (name, offset from the region's start, what it probes); atomics step by 8 to stay aligned.
_EDGES = (
    ("past_end", {"write": _LEN - 7, "read": _LEN - 7, "atomic": _LEN}, "one byte past the end"),
    ("below_start", {"write": -1, "read": -1, "atomic": -8}, "one byte below the start"),
    ("va_wrap", {"write": _U64 - 4, "read": _U64 - 4, "atomic": _U64 - 8}, "VA + length wrapping 2^64"),
)


# -- keys, ranges, permissions (IBTA §9.7.5.2.4, remote access errors) --


def _access_nak(
    ctx: Ctx, op: int, mr_access: int = 0xF, rkey_xor: int = 0, va_off: int = 0, n: int = 8
) -> None:
    qp, mr = setup(ctx, mr_access=mr_access, mr_len=4096)
    ctx.write_mem(mr, 0, ctx.rng.randbytes(4096))
    before = ctx.read_mem(mr, 0, 4096)
    va, rkey = mr.addr + va_off, mr.rkey ^ rkey_xor
    if op == F.WRITE_ONLY:
        ctx.send(op, qp.rq_psn, ackreq=True, reth=(va, rkey, n), payload=bytes(n))
    elif op == F.READ_REQUEST:
        ctx.send(op, qp.rq_psn, ackreq=True, reth=(va, rkey, n))
    else:
        ctx.send(op, qp.rq_psn, ackreq=True, atomic=(va, rkey, 1, 0))
    ctx.expect_nak(NAK_ACC, qp.rq_psn)
    st = ctx.state()
    check(st == "ERR", f"QP state {st} after a remote access error, expected ERR")
    check(ctx.read_mem(mr, 0, mr.length) == before, "the region changed after a refused request")


@case(
    "resp.key.bad_rkey",
    R,
    "A WRITE with an unknown R_Key gets a remote access error NAK",
    "IBTA Vol.1 §9.7.5.2.4 (R_Key check); roce-sim rkey violation",
    "NAK remote access error (0x62); QP in ERR",
)
def _bad_rkey(ctx: Ctx) -> None:
    _access_nak(ctx, F.WRITE_ONLY, rkey_xor=0x00A5A500)


@case(
    "resp.key.range",
    R,
    "A WRITE past the end of the MR gets a remote access error NAK",
    "IBTA Vol.1 §9.7.5.2.4 (bounds)",
    "NAK remote access error; QP in ERR",
)
def _range(ctx: Ctx) -> None:
    _access_nak(ctx, F.WRITE_ONLY, va_off=4092, n=8)


@case(
    "resp.key.no_remote_write",
    R,
    "A WRITE to an MR without remote write gets a remote access error NAK",
    "IBTA Vol.1 §9.7.5.2.4, §10.6.3.1 (access rights)",
    "NAK remote access error; QP in ERR",
)
def _perm_write(ctx: Ctx) -> None:
    _access_nak(ctx, F.WRITE_ONLY, mr_access=0x1 | 0x4)


@case(
    "resp.key.no_remote_read",
    R,
    "A READ of an MR without remote read gets a remote access error NAK",
    "IBTA Vol.1 §9.7.5.2.4, §10.6.3.1",
    "NAK remote access error; QP in ERR",
)
def _perm_read(ctx: Ctx) -> None:
    _access_nak(ctx, F.READ_REQUEST, mr_access=0x1 | 0x2)


@case(
    "resp.key.no_remote_atomic",
    R,
    "An atomic on an MR without remote atomic gets a remote access error NAK",
    "IBTA Vol.1 §9.7.5.2.4, §10.6.3.1",
    "NAK remote access error; QP in ERR",
)
def _perm_atomic(ctx: Ctx) -> None:
    _access_nak(ctx, F.FETCH_ADD, mr_access=0x1 | 0x2 | 0x4)


@case(
    "resp.atomic.unaligned",
    R,
    "An atomic at an address not 8-byte aligned is an invalid request",
    "IBTA Vol.1 §9.4.5 (alignment); rxe check_rkey()",
    "NAK invalid request",
)
def _unaligned(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.FETCH_ADD, qp.rq_psn, ackreq=True, atomic=(mr.addr + 4, mr.rkey, 1, 0))
    ctx.expect_nak(NAK_INV, qp.rq_psn)


@case(
    "resp.err.silent",
    R,
    "A QP in ERR after a fatal NAK answers nothing more",
    "IBTA Vol.1 §10.3.1 (Error state), §9.7.5.2.4",
    "no response to a later request",
)
def _err_silent(ctx: Ctx) -> None:
    qp, mr = setup(ctx)
    ctx.send(F.WRITE_ONLY, qp.rq_psn, ackreq=True, reth=(mr.addr, mr.rkey ^ 0x10, 4), payload=b"bad!")
    ctx.expect_nak(NAK_ACC, qp.rq_psn)
    ctx.send(F.WRITE_ONLY, psn_add(qp.rq_psn, 1), ackreq=True, reth=(mr.addr, mr.rkey, 4), payload=b"more")
    ctx.silence()


def _register() -> None:
    for name, op in _OPS:
        what = {"write": "A WRITE", "read": "A READ", "atomic": "A FETCH_ADD"}[name]

        def ok(ctx: Ctx, op: int = op) -> None:
            allowed(ctx, op)

        case(
            f"resp.bounds.{name}_at_end",
            R,
            f"{what} of the region's last 8 bytes is inside it",
            "IBTA Vol.1 §9.7.5.2.4 (bounds), §10.6.3.1",
            "executed; nothing else in the region changes",
        )(ok)
        for edge, offsets, desc in _EDGES:
            off = offsets[name]

            def bad(ctx: Ctx, op: int = op, off: int = off) -> None:
                refused(ctx, op, off)

            case(
                f"resp.bounds.{name}_{edge}",
                R,
                f"{what} {desc} gets a remote access error NAK; memory unchanged",
                "IBTA Vol.1 §9.7.5.2.4 (R_Key bounds), §10.6.3.1; google/rdma-unit-test",
                "NAK remote access error (0x62); QP in ERR; the region unchanged",
            )(bad)


_register()
