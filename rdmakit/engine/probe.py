"""The tail-loss probe: RFC 8985 §7 (TLP), adapted to go-back-N.

A loss is found by what comes after it: a later request makes the responder
send a NAK-sequence error (IBTA §9.7.5.1.2), a later READ response reveals a
gap. A loss at the tail of what is in flight has nothing after it, and only
the retransmit timer finds it; that timer collapses the congestion window
and, after a whole local ACK timeout, spends ``retry_cnt``. With a window cut
to one READ at a time (:mod:`.congestion`, ``read_fits``) every lost last
response is such a tail.

When the requester has heard nothing for ``probe_timeout`` (two smoothed
round trips, RFC 8985 §7.2) it sends, once per episode of progress, the
request for the first PSN not acknowledged and, where that is not the last
PSN it sent and the last is a SEND or WRITE packet, that last packet again:

- The first: go-back-N's responder keeps nothing past a gap and, once it has
  sent the NAK-sequence error a gap owes, drops every later packet without
  another (IBTA §9.7.5.1.2), so a resent request that was lost again is found
  only by sending that request. For a SEND or WRITE it is the packet, with
  AckReq; for a READ, a READ request for the responses not yet received, from
  the first missing PSN, as a retried READ asks (IBTA Vol. 1 §9.9.3.1.3; rxe
  ``req_retry()``); for an atomic nothing (a duplicate atomic is answered
  from the responder's saved results, which the timer's resend may spend).
- The last (RFC 8985's probe): arrived after a gap, it draws the NAK-sequence
  error the gap owes; a duplicate draws an ACK (IBTA §9.7.5.1.1: the ACK
  that was lost).

A probe is a packet, not a retry: no window cut, no timer backoff, no
``retry_cnt``, no go-back-N. What it draws (a NAK, an ACK, a gap) is handled
as it always is.
"""

from collections import deque
from typing import Protocol

from rdmakit.wire import PSN_MASK, RETH, Opcode, Packet

from .memory import gather
from .send_wqe import READ, SEND_WRITE, SendWqe


class Outstanding(Protocol):
    """What a probe reads of a requester (``Requester`` is one)."""

    req_psn: int
    comp_psn: int
    sq: deque[SendWqe]
    need_retry: bool
    next_idx: int
    req_off: int
    mtu: int


_MASK = PSN_MASK


def tail_probe(req: Outstanding, dqpn: int) -> list[Packet]:
    """The probes for ``req``'s outstanding PSNs (the module's rules); none if nothing is."""
    psn, comp = req.req_psn, req.comp_psn
    sq = req.sq
    if psn == comp or req.need_retry or not sq:
        return []
    idx = req.next_idx
    if req.req_off:
        tail = sq[idx]  # a message under way: its last packet sent
    elif idx:
        tail = sq[idx - 1]
    else:
        return []
    out = []
    first = _request(req, dqpn, sq[0], comp)
    if first is not None:
        out.append(first)
    last = (psn - 1) & _MASK
    if last != comp and tail.kind == SEND_WRITE:
        probe = _request(req, dqpn, tail, last)
        assert probe is not None
        out.append(probe)
    return out


def _request(req: Outstanding, dqpn: int, wqe: SendWqe, psn: int) -> Packet | None:
    """The request ``wqe`` sent for ``psn`` (a READ: from ``psn`` on), with AckReq; None for an atomic."""
    wr = wqe.wr
    mtu = req.mtu
    if wqe.kind == SEND_WRITE:
        off = ((psn - wqe.first_psn) & _MASK) * mtu
        length = wqe.length
        size = min(length - off, mtu)
        first, end = off == 0, off + size >= length
        ops = wqe.ops
        assert ops is not None
        seg0 = wqe.seg0
        if not size:
            payload: memoryview | bytes = b""
        else:
            payload = seg0[off : off + size] if seg0 is not None else gather(wqe.segs, off, size)
        reth = RETH(wr.remote_addr, wr.rkey, length) if first and wqe.is_write else None
        return Packet(
            ops[(first << 1) | end], dqpn, psn, True, end and wqe.solicited, False, 0xFFFF, False, False,
            reth, None, None, None, wqe.imm if end else None, None, payload,
        )  # fmt: skip
    if wqe.kind == READ:
        done = wqe.read_done
        rest = wqe.length - done
        wqe.first_psn = psn  # the retry point, as ``Requester.rewind``'s READ moves it
        return Packet(
            Opcode.RDMA_READ_REQUEST, dqpn, psn, True, False, False, 0xFFFF, False, False,
            RETH(wr.remote_addr + done, wr.rkey, rest),
        )  # fmt: skip
    return None
