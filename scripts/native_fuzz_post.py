"""The sanitizer fuzz run's family for native ``post_send`` (``_nativepostsend.c``): see
``native_fuzz.py``, which runs it."""

import contextlib
import random
from typing import Any

from native_fuzz import REFUSALS

from rdmakit.engine import SGE, EngineError, QpCaps, SendWR, WrOpcode
from rdmakit.engine.congestion import PACKET_OVERHEAD
from rdmakit.engine.small_tx import POST_TABLE
from rdmakit.testing.engine import connect, make_side
from rdmakit.wire import IcrcFlow, decode, pack_icrc


class _Odd:
    """A value any field may be swapped for."""

    def __index__(self) -> int:
        raise ValueError("odd")

    def __hash__(self) -> int:
        raise TypeError("odd")


def _bad(rng: random.Random) -> object:
    return rng.choice((-1, 1 << 24, 1 << 64, None, "x", _Odd(), (1, 2, 3), [1], memoryview(b"ab"), 2.5))


def fuzz_post_send(rng: random.Random, native: Any, count: int) -> None:
    """``post_send`` over live requesters: hostile work requests (every opcode, odd SGE lists,
    L_Keys, lengths, addresses, ImmDt, remote keys), now and then a hostile requester field
    or context entry: every call returns or is refused; one that declines leaves the send
    queue as it was (and the engine's own ``post_send`` then takes the request); every
    datagram it builds decodes as the queued WQE's ONLY packet with a good ICRC."""
    flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 4791, 4791)
    side_rng = random.Random(rng.getrandbits(32))
    fields = ("req_psn", "comp_psn", "mtu", "window", "sent_hwm", "next_idx", "rtt_psn", "timeout", "cc_on")
    made = 0
    while made < count:
        a = make_side("a", side_rng, 4096, QpCaps(max_send_wr=8), 64)
        b = make_side("b", side_rng, 4096, QpCaps(), 64)
        connect(a.qp, b.qp, side_rng, mtu=256)
        qp, req = a.qp, a.qp.req
        qp.remote = "b"
        after: list[object] = []
        flows = {id("b"): ("b", None, flow.states, flow)}
        ctx: list[Any] = [
            -1, False, rng.random, PACKET_OVERHEAD, {}, [], [], flows, None, None,
            lambda _q, got, out=after: out.append(got), POST_TABLE,
        ]  # fmt: skip
        for i in range(rng.randrange(1, 8)):
            made += 1
            op: object = rng.choice(tuple(WrOpcode)) if rng.random() < 0.95 else _bad(rng)
            sges: Any = tuple(
                SGE(
                    a.mr.addr + rng.randrange(-8, 4100),
                    rng.choice((0, 1, 8, 255, 256, 257, 4096, -1)),
                    a.mr.lkey if rng.random() < 0.9 else _bad(rng),
                )
                for _ in range(rng.choice((0, 1, 1, 1, 2, 17)))
            )
            if rng.random() < 0.05:
                sges = list(sges) if rng.random() < 0.5 else _bad(rng)
            wr = SendWR(
                wr_id=i, opcode=op, sg_list=sges,  # type: ignore[arg-type]
                remote_addr=b.mr.addr if rng.random() < 0.9 else _bad(rng),  # type: ignore[arg-type]
                rkey=b.mr.rkey if rng.random() < 0.9 else _bad(rng),  # type: ignore[arg-type]
                imm_data=rng.getrandbits(32) if rng.random() < 0.8 else _bad(rng),  # type: ignore[arg-type]
                solicited=rng.random() < 0.3, signaled=rng.random() < 0.8,
            )  # fmt: skip
            if rng.random() < 0.1:
                with contextlib.suppress(AttributeError, TypeError):
                    object.__setattr__(req, rng.choice(fields), _bad(rng))
            if rng.random() < 0.05:
                ctx[rng.randrange(len(ctx))] = _bad(rng)
            ctx[0] = -1 if rng.random() < 0.9 else 1 << 20  # an fd that is no socket: EBADF
            before = list(req.sq)
            try:
                got = native.post_send(qp, wr, ctx)
            except (*REFUSALS, AttributeError, IndexError, BufferError, KeyError):
                break  # the requester or context was made hostile: a fresh one
            if got is None:
                if list(req.sq) != before:
                    raise AssertionError(f"post_send declined {wr} but changed the send queue")
                with contextlib.suppress(EngineError, *REFUSALS, AttributeError):
                    qp.post_send(wr)
                continue
            if len(req.sq) != len(before) + 1 or req.sq[-1].wr is not wr:
                raise AssertionError(f"post_send took {wr} but did not queue it")
            if isinstance(got, bytes):
                pkt = decode(got[:-4])
                wqe = req.sq[-1]
                if (
                    pkt.psn != wqe.first_psn
                    or not pkt.ackreq
                    or got[-4:] != pack_icrc(flow.icrc_seg(0, got[:-4]))
                ):
                    raise AssertionError(f"post_send built {got.hex()} for {wr}")
                if len(pkt.payload) != wqe.length or (wqe.is_write and pkt.reth.dma_len != wqe.length):  # type: ignore[union-attr]
                    raise AssertionError(f"post_send's lengths in {pkt} for {wr}")
