"""The requester's common case, one packet at a time: ``QueuePair.tx_small``.

A transport that sends each request itself (the UDP port, whose native codec
builds the headers and ICRC and sends in one call) asks the engine for the
next request when it is the whole of the QP's work: exactly one work request
not yet started, of one packet (a SEND or RDMA WRITE of at most an MTU, with
or without immediate data, an RDMA READ request, COMPARE SWAP or FETCH ADD),
nothing to retry, no RNR wait, no pacing, the congestion window open, its
pacer not armed and the DCQCN rate not limiting, a READ or atomic slot free
and no responder output queued. ``tx_small`` then has exactly the effect of ``poll_transmit`` on the
QP's state (``Requester.transmit``'s for one fresh WQE, rxe ``rxe_requester()``
for an ONLY packet, IBTA Vol. 1 §9.7.1) and returns the one packet; otherwise
it does nothing and returns None, and the caller takes ``poll_transmit``.
``tests/engine/test_engine_small_tx.py`` proves the two equal on seeded
hostile networks (every fault profile, both directions, every opcode).

The Python engine owns all of the requester's state throughout (see
``docs/architecture.md``, "Who owns a QP's state"): this is a shorter route
through the same rules, never a second owner.
"""

from rdmakit.wire import PSN_HALF, PSN_MASK, RETH, AtomicETH, Opcode, Packet

from . import congestion as _cc
from .armed import NativeResponder
from .congestion import PACKET_OVERHEAD
from .requester import Requester, read_fits
from .responder import Responder
from .send_wqe import (
    _SEGMENT_OPS,
    _TAKES_RECEIVE,
    ATOMIC,
    PENDING,
    POSTED,
    READ,
    SEND_WRITE,
    WC_OPCODE,
    SendWqe,
)
from .states import QpState
from .stats import QpStats
from .timers import MAX_MSG_SIZE
from .types import SGE, WcStatus, WrOpcode

_MASK, _HALF = PSN_MASK, PSN_HALF

_POSTED_OPS = (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)
_WRITES = (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)
_IMMS = (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)

#: What native ``post_send`` (``_fastpath.post_send``, ``_nativepostsend.c``) takes from the
#: engine, so that it has no rule of its own: the WQE's class, the state posts are sent in,
#: the status and state of a fresh WQE and of a sent one, per opcode it takes the fields ``SendWqe.__init__``
#: derives (its completion opcode, kind, segment opcodes, is a WRITE, carries ImmDt, takes a
#: receive WQE), the SGE type, post_send's message limit, ``Dcqcn.sent``'s sample period and
#: the constants of ``Requester.arm_timer`` (``RttEstimator.rto``, ``probe_timeout``).
POST_TABLE = (
    SendWqe,
    QpState.RTS,
    WcStatus.SUCCESS,
    POSTED,
    PENDING,
    {
        op: (WC_OPCODE[op], SEND_WRITE, _SEGMENT_OPS[op], op in _WRITES, op in _IMMS, op in _TAKES_RECEIVE)
        for op in _POSTED_OPS
    },
    SGE,
    MAX_MSG_SIZE,
    float(_cc.RATE_SAMPLE_PERIOD),
    tuple(
        float(k)
        for k in (
            _cc.K_GRANULARITY, _cc.K_RTO_VARIANCE, _cc.K_RTO_SRTTS, _cc.K_MAX_RTO, _cc.K_MIN_RTO,
            _cc.K_PTO_RTTS, _cc.K_MIN_PTO,
        )
    ),
)  # fmt: skip
_new_packet = tuple.__new__
_CMP_SWP = WrOpcode.ATOMIC_CMP_AND_SWP
_READ_REQUEST = Opcode.RDMA_READ_REQUEST
_COMPARE_SWAP = Opcode.COMPARE_SWAP
_FETCH_ADD = Opcode.FETCH_ADD


class SmallTransmit:
    """``QueuePair.tx_small`` (a base class of ``QueuePair``)."""

    req: Requester
    resp: Responder
    stats: QpStats
    _tx: bool
    _fast: bool
    native: NativeResponder | None

    def tx_small(self, now: float) -> Packet | None:
        """The one request ``poll_transmit(now)`` would return now, with its effect, in the
        common case described in this module's docstring; None (nothing done) otherwise."""
        if (
            not self._tx
            or not self._fast
            or self.resp.out
            or (self.native is not None and self.native.pending)
        ):
            return None
        req = self.req
        sq = req.sq
        idx = req.next_idx
        if (
            idx != len(sq) - 1
            or req.need_retry
            or req.draining
            or req.req_off
            or req.rnr_deadline is not None
            or req.pace_deadline is not None
        ):
            return None
        wqe = sq[idx]
        if wqe.started or wqe.status or wqe.state != POSTED:
            return None
        psn, comp = req.req_psn, req.comp_psn
        window = req.window
        if req.cc_on:
            if req.rate.rate is not None:
                return None  # DCQCN is pacing: the generic path spends the tokens
            if req.pacer.armed:
                return None  # the window's pacer may hold the packet (``congestion.Pacer``)
            cwnd = req.cc.packets()
            window = min(window, cwnd)
        d = (psn - comp) & _MASK
        if window <= d < _HALF:
            return None
        kind = wqe.kind
        if kind == READ and window < req.window and not read_fits(req, wqe, d, window, 0, 0):
            return None  # the READ's responses do not fit the cut congestion window
        mtu = req.mtu
        wr = wqe.wr
        dqpn = req.qp.dest_qpn
        if kind == SEND_WRITE:
            length = wqe.length
            if length > mtu:
                return None
            seg0 = wqe.seg0
            if seg0 is None and length:
                return None  # scattered: the generic path gathers
            ops = wqe.ops
            assert ops is not None
            pkt: Packet = _new_packet(Packet, (
                ops[3], dqpn, psn, True, wqe.solicited, False, 0xFFFF, False, False,
                RETH(wr.remote_addr, wr.rkey, length) if wqe.is_write else None, None, None, None,
                wqe.imm, None, seg0[:length] if length and seg0 is not None else b"",
            ))  # fmt: skip
            step = 1
        else:
            if wqe.has_rd or req.rd_out >= req.max_rd_atomic or wqe.read_done:
                return None
            if kind == READ:
                rest = wqe.length
                step = max(rest - 1, 0) // mtu + 1
                pkt = _new_packet(Packet, (
                    _READ_REQUEST, dqpn, psn, True, False, False, 0xFFFF, False, False,
                    RETH(wr.remote_addr, wr.rkey, rest), None, None, None, None, None, b"",
                ))  # fmt: skip
            else:
                assert kind == ATOMIC
                if wr.opcode == _CMP_SWP:
                    op, eth = _COMPARE_SWAP, AtomicETH(wr.remote_addr, wr.rkey, wr.swap, wr.compare_add)
                else:
                    op, eth = _FETCH_ADD, AtomicETH(wr.remote_addr, wr.rkey, wr.compare_add, 0)
                pkt = _new_packet(Packet, (
                    op, dqpn, psn, True, False, False, 0xFFFF, False, False, None, None, eth, None, None,
                    None, b"",
                ))  # fmt: skip
                step = 1
            wqe.has_rd = True
            req.rd_out += 1
        # Requester.transmit's effect for this one packet, in its order.
        idle = d == 0
        if not req.credits.may_start(wqe.takes_receive, idle):
            # Only a SEND or WRITE with immediate past its end-to-end credits (a READ or atomic
            # takes no receive WQE, and may_start counts it): nothing has changed yet.
            return None
        wqe.started = True
        wqe.first_psn = psn
        wqe.last_psn = (psn + step - 1) & _MASK
        wqe.state = PENDING
        req.noack = 0
        hwm = req.sent_hwm
        if (psn - hwm) & _MASK >= _HALF:
            self.stats.retransmits += 1
        nxt = (psn + step) & _MASK
        if (nxt - hwm) & _MASK < _HALF:
            req.sent_hwm = nxt
        if req.rtt_psn is None:
            req.rtt_psn, req.rtt_sent = psn, now
        req.next_idx = idx + 1
        req.req_psn = nxt
        if req.rexmit_deadline is None and req.timeout is not None:
            if idle:
                req.progress_at = now
            req.arm_timer(now)
        if req.cc_on:
            req.rate.sent(mtu + PACKET_OVERHEAD, now)
        self.stats.packets_out += 1
        return pkt

    def tx_post(self, now: float) -> Packet | None:
        """``tx_small`` for a SEND or RDMA WRITE only: the reference of native posting (a
        transport's doorbell sends the one fresh SEND or WRITE a post made the QP's whole work
        at once, ``_fastpath.post_small``); None (nothing done) otherwise."""
        sq = self.req.sq
        if not sq or sq[-1].kind != SEND_WRITE:
            return None
        return self.tx_small(now)
