"""Requester and completer bugs (IBTA Vol. 1 §9.7.5.1, §9.7.5.2, §9.9.3)."""

from collections.abc import Callable
from typing import Any

from rdmakit.engine import completer as completer_mod
from rdmakit.engine import credits as credits_mod
from rdmakit.engine import probe as probe_mod
from rdmakit.engine import qp as qp_mod
from rdmakit.engine import requester as req_mod
from rdmakit.engine import send_wqe as wqe_mod
from rdmakit.engine import timers
from rdmakit.engine.types import WcStatus
from rdmakit.wire import NakCode, Opcode, Packet

from . import _MASK, QueuePair, Requester, mutant, patch

# -- the requester (IBTA §9.7.5.2, §9.9.3) ----------------------------------------------------


_EXTRA: dict[int, bool] = {}  # id(requester) -> the extra retry was given


@mutant("retry-cnt-plus-one", "requester", "req.nak_seq.count", "req.timeout.count")
def _retry_plus_one() -> None:
    """retry_cnt counts retries from 0 to retry_cnt inclusive: one transmission too many."""
    orig = Requester.error_retry

    def error_retry(
        self: Any, now: float, timeout: bool, counted: bool = True, sequence: bool = False
    ) -> None:
        if counted and self.retry_left == 0 and not _EXTRA.get(id(self)):
            _EXTRA[id(self)] = True
            self.retry_left = 1
        orig(self, now, timeout, counted, sequence)

    patch(Requester, "error_retry", error_retry)


@mutant("rnr-retry-plus-one", "requester", "req.rnr.count")
def _rnr_plus_one() -> None:
    """rnr_retry counts from 0 to rnr_retry inclusive: one transmission too many."""
    orig = Requester.rnr_nak

    def rnr(self: Any, now: float, code: int) -> None:
        if self.rnr_left == 0 and not _EXTRA.get(id(self)):
            _EXTRA[id(self)] = True
            self.rnr_left = 1
        orig(self, now, code)

    patch(Requester, "rnr_nak", rnr)


@mutant("ignore-rnr-retry", "requester", "req.rnr.retry_exceeded")
def _ignore_rnr_retry() -> None:
    """rnr_retry never runs out: every RNR NAK is waited out and retried."""
    orig = Requester.rnr_nak

    def rnr(self: Any, now: float, code: int) -> None:
        self.rnr_left = 7
        orig(self, now, code)

    patch(Requester, "rnr_nak", rnr)


@mutant("timeouts-not-counted", "requester", "req.timeout.count", "req.timeout.exceeded")
def _timeouts_not_counted() -> None:
    """A local ACK timeout retries without counting against retry_cnt."""
    orig = Requester.error_retry

    def error_retry(
        self: Any, now: float, timeout: bool, counted: bool = True, sequence: bool = False
    ) -> None:
        if timeout and counted and 0 < self.retry_left < 7:
            self.retry_left += 1
        orig(self, now, timeout, counted, sequence)

    patch(Requester, "error_retry", error_retry)


@mutant("timeout-halved", "requester", "req.timeout.retransmit", "req.timeout.bounds")
def _timeout_halved() -> None:
    """The local ACK timeout is 4.096 us x 2^(timeout - 1): half what C9-140 asks."""

    def set_timeout(self: Any, t: int) -> None:
        self.timeout = timers.transport_timeout(max(t - 1, 1)) if t else None

    patch(Requester, "set_timeout", set_timeout)


@mutant("timeout-eight-times", "requester", "req.timeout.bounds")
def _timeout_long() -> None:
    """The local ACK timeout is 4.096 us x 2^(timeout + 3): past C9-140's upper bound."""

    def set_timeout(self: Any, t: int) -> None:
        self.timeout = timers.transport_timeout(t + 3) if t else None

    patch(Requester, "set_timeout", set_timeout)


@mutant("rnr-table-shifted", "requester", "req.rnr.table46", "req.rnr.wait")
def _rnr_table_shifted() -> None:
    """The RNR timer table is read one row early (code n waits what code n - 1 gives)."""
    patch(req_mod, "rnr_delay", lambda code: timers.rnr_delay(code - 1 if code > 1 else code))


@mutant("rnr-code0-no-wait", "requester", "req.rnr.code0")
def _rnr_code0() -> None:
    """RNR timer code 0 is taken as no wait instead of the longest, 655.36 ms."""
    patch(req_mod, "rnr_delay", lambda code: 0.0 if code & 0x1F == 0 else timers.rnr_delay(code))


@mutant("retry-whole-message", "requester", "req.nak_seq.gobackn", "req.nak_seq.send_middle")
def _retry_whole_message() -> None:
    """A PSN sequence NAK inside a message makes the requester resend it from its FIRST."""
    orig = Requester.rewind

    def rewind(self: Any) -> None:
        head = self.sq[0] if self.sq else None
        if head is not None and head.started and head.kind == wqe_mod.SEND_WRITE:
            self.comp_psn = head.first_psn
        orig(self)

    patch(Requester, "rewind", rewind)


@mutant("read-retry-from-start", "requester", "req.resp.missing_last")
def _read_retry_from_start() -> None:
    """A READ retried after a lost response asks for all of it again, at the missing PSN (by
    go-back-N and by the tail-loss probe alike)."""
    orig, probe = Requester.rewind, probe_mod.tail_probe

    def from_start(req: Any) -> None:
        for wqe in req.sq:
            if wqe.kind == wqe_mod.READ:
                wqe.read_done = 0

    def rewind(self: Any) -> None:
        from_start(self)
        orig(self)

    def tail_probe(req: Any, dqpn: int) -> list[Packet]:
        from_start(req)
        return probe(req, dqpn)

    patch(Requester, "rewind", rewind)
    patch(req_mod, "tail_probe", tail_probe)


@mutant("max-rd-atomic-ignored", "requester", "req.rd_atomic.limit", "req.rd_atomic.atomic_limit")
def _max_rd_atomic_ignored() -> None:
    """The requester sends READs and atomics past max_rd_atomic."""
    orig = Requester.transmit

    def transmit(self: Any, *args: Any, **kw: Any) -> int:
        self.max_rd_atomic = 1 << 20
        return orig(self, *args, **kw)

    patch(Requester, "transmit", transmit)


@mutant("reth-length-of-first-packet", "requester", "req.write.dmalen_first", "req.write.split")
def _reth_first_packet() -> None:
    """A multi-packet WRITE's RETH carries the FIRST packet's length, not the message's."""
    orig = Requester.transmit

    def transmit(self: Any, out: list[Any], *args: Any, **kw: Any) -> int:
        start = len(out)
        n = orig(self, out, *args, **kw)
        for i in range(start, len(out)):
            p = out[i]
            if getattr(p, "opcode", None) is Opcode.RDMA_WRITE_FIRST and p.reth is not None:
                out[i] = p._replace(reth=p.reth._replace(dma_len=len(p.payload)))
        return n

    patch(Requester, "transmit", transmit)


@mutant("no-periodic-ackreq", "requester", "req.write.ackreq_periodic")
def _no_periodic_ackreq() -> None:
    """A long message asks for an ACK only on its LAST packet."""
    patch(req_mod, "MAX_PKT_PER_ACK", 1 << 30)


# -- the completer (IBTA §9.7.5.1, §9.9.3) ----------------------------------------------------


@mutant("no-implied-nak", "completer", "req.implied_nak.read", "req.implied_nak.atomic")
def _no_implied_nak() -> None:
    """An ACK past an outstanding READ or atomic is ignored instead of starting a retry."""
    orig = completer_mod.on_response

    def on_response(qp: Any, req: Any, pkt: Any, info: Any, now: float) -> None:
        sq = req.sq
        if sq and pkt.opcode is Opcode.ACKNOWLEDGE and sq[0].kind != wqe_mod.SEND_WRITE:
            d = (pkt.psn - sq[0].last_psn) & _MASK
            if 0 < d < 0x800000:
                return
        orig(qp, req, pkt, info, now)

    patch(qp_mod, "on_response", on_response)  # where QueuePair calls it


@mutant("ghost-ack-completes", "completer", "req.ack.ghost")
def _ghost_ack() -> None:
    """An ACK for a PSN never sent is taken as acknowledging everything sent (rxe's check_psn())."""
    orig = completer_mod.on_response

    def on_response(qp: Any, req: Any, pkt: Any, info: Any, now: float) -> None:
        if (pkt.psn - req.sent_hwm) & _MASK < 0x800000:
            pkt = pkt._replace(psn=(req.sent_hwm - 1) & _MASK)
        orig(qp, req, pkt, info, now)

    patch(qp_mod, "on_response", on_response)


@mutant("credit-ack-dropped", "completer", "req.ack.credits")
def _credit_ack_dropped() -> None:
    """Only an ACK with syndrome 0x1F is taken as an ACK; one carrying a credit count is dropped."""
    orig = completer_mod.on_response

    def on_response(qp: Any, req: Any, pkt: Any, info: Any, now: float) -> None:
        if pkt.opcode is Opcode.ACKNOWLEDGE and pkt.aeth is not None and pkt.aeth.syndrome < 0x1F:
            return
        orig(qp, req, pkt, info, now)

    patch(qp_mod, "on_response", on_response)


@mutant("nak-status-swapped", "completer", "req.nak.remote_access")
def _nak_status_swapped() -> None:
    """A remote access error NAK completes the WR as a remote operational error."""
    completer_mod.NAK_STATUS[NakCode.REMOTE_ACCESS_ERROR] = WcStatus.REM_OP_ERR


@mutant("bad-response-dropped", "completer", "req.resp.unexpected_read")
def _bad_response_dropped() -> None:
    """A READ response to a SEND is dropped instead of failing it with BAD_RESP_ERR."""
    orig = QueuePair.fail_send

    def fail_send(self: Any, status: WcStatus) -> None:
        if status is not WcStatus.BAD_RESP_ERR:
            orig(self, status)

    patch(QueuePair, "fail_send", fail_send)


@mutant("nak-seq-not-implied-ack", "completer", "req.nak_seq.implied_ack")
def _nak_not_implied_ack() -> None:
    """A PSN sequence NAK does not acknowledge the messages before its PSN: they are resent."""
    orig = completer_mod.on_response

    def on_response(qp: Any, req: Any, pkt: Any, info: Any, now: float) -> None:
        aeth = pkt.aeth
        if pkt.opcode is Opcode.ACKNOWLEDGE and aeth is not None and aeth.syndrome == 0x60:
            req.error_retry(now, False)
            return
        orig(qp, req, pkt, info, now)

    patch(qp_mod, "on_response", on_response)


# -- end-to-end credits (IBTA §9.7.7.2) and the BTH's SE and MigReq bits (§9.2) -----------------


@mutant("credits-ignored", "requester", "req.credits.limit")
def _credits_ignored() -> None:
    """The requester never holds a SEND back for credits (as rxe's: it reads only the syndrome's kind)."""

    def may_start(self: Any, takes_receive: bool, idle: bool = False) -> bool:
        self.ssn = (self.ssn + 1) & _MASK
        return True

    patch(credits_mod.RequesterCredits, "may_start", may_start)


@mutant("credits-no-probe", "requester", "req.credits.limit")
def _credits_no_probe() -> None:
    """A requester at its limit waits for credits with nothing outstanding to bring them: no probe."""
    orig = credits_mod.RequesterCredits.may_start

    def may_start(self: Any, takes_receive: bool, idle: bool = False) -> bool:
        lsn = self.lsn
        past = lsn is not None and 0 < (self.ssn + 1 - lsn) & _MASK < 0x800000
        if takes_receive and past and not self.unlimited:
            return False
        return bool(orig(self, takes_receive, False))

    patch(credits_mod.RequesterCredits, "may_start", may_start)


@mutant("credits-hold-writes", "requester", "req.credits.write_unlimited")
def _credits_hold_writes() -> None:
    """Every message counts against the credits, RDMA WRITEs too (they take no receive WQE)."""
    orig = credits_mod.RequesterCredits.may_start

    def may_start(self: Any, takes_receive: bool, idle: bool = False) -> bool:
        return bool(orig(self, True, idle))

    patch(credits_mod.RequesterCredits, "may_start", may_start)


@mutant("se-never-set", "requester", "req.send.se", "req.write_imm.se")
def _se_never_set() -> None:
    """IBV_SEND_SOLICITED is dropped: SE is never set."""
    orig = wqe_mod.SendWqe.__init__

    def init(self: Any, *args: Any) -> None:
        orig(self, *args)
        self.solicited = False

    patch(wqe_mod.SendWqe, "__init__", init)


def _rewrite_sent(rewrite: Callable[[Any, Packet], Packet]) -> None:
    """Pass every request packet the requester makes through ``rewrite(requester, packet)``."""
    orig = Requester.transmit

    def transmit(self: Any, out: list[Any], budget: int, now: float, trains: bool = False) -> int:
        start = len(out)
        n = orig(self, out, budget, now, False)
        out[start:] = [rewrite(self, p) for p in out[start:]]
        return int(n)

    patch(Requester, "transmit", transmit)


@mutant("se-on-every-packet", "requester", "req.send.se")
def _se_every_packet() -> None:
    """SE is set on every packet of a solicited message, not only on its last."""

    def rewrite(req: Any, pkt: Packet) -> Packet:
        if pkt.opcode in (Opcode.SEND_FIRST, Opcode.SEND_MIDDLE) and any(w.solicited for w in req.sq):
            return pkt._replace(se=True)
        return pkt

    _rewrite_sent(rewrite)


@mutant("migreq-on-resend", "requester", "req.hdr.migreq")
def _migreq_on_resend() -> None:
    """A go-back-N resend is sent with MigReq set, as if the path had migrated."""

    def rewrite(req: Any, pkt: Packet) -> Packet:
        return pkt._replace(migreq=True) if req.qp.stats.retries else pkt

    _rewrite_sent(rewrite)
