"""A QP's requester and responder state as comparable values (the equivalence proofs' yardstick)."""

from typing import Any

from rdmakit.engine import QueuePair
from rdmakit.wire import Packet


def requester_state(qp: QueuePair) -> tuple[Any, ...]:
    """Every field of the requester a path could change, its WQEs' progress and the QP's state."""
    r = qp.req
    wqes = tuple((w.state, w.started, w.first_psn, w.last_psn, w.read_done, w.status, w.has_rd) for w in r.sq)
    cc = (r.cc.cwnd, r.cc.ssthresh, r.rate.rate, r.rate.tokens, r.rate.sample_bytes)
    timing = (r.rtt_psn, r.rtt_sent, r.progress_at, r.rto_backoff, r.acked_mark, r.rtt.smoothed)
    return (
        r.comp_psn, r.comp_opcode, r.req_psn, r.sent_hwm, r.next_idx, r.req_off, r.noack, r.rd_out,
        r.retry_left, r.rnr_left, r.need_retry, r.rexmit_deadline, r.rnr_deadline, r.pace_deadline,
        r.probe_deadline, r.probe_due, r.probed, wqes, cc, timing, qp.state,
    )  # fmt: skip


def responder_state(qp: QueuePair) -> tuple[Any, ...]:
    r = qp.resp
    ring = tuple(
        None if x is None else (x.kind, x.first_psn, x.last_psn, x.va, x.length, x.rkey, x.orig)
        for x in r.res.ring
    )
    out = tuple(repr(x) if isinstance(x, Packet) else (x.off, x.resid, x.psn, x.new, x.msn) for x in r.out)
    return (
        r.psn, r.ack_psn, r.msn, r.in_msg, r.sent_psn_nak, r.res.head, ring, out,
        r.w_rkey, r.w_va, r.w_off, r.w_len, r.w_resid, r.w_view is None, qp.state,
    )  # fmt: skip
