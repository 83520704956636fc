"""The RC queue pair: user calls, packets and timers in; packets, deadlines and completions out.

A ``QueuePair`` is sans-IO (the aioquic shape): it never reads a clock or
touches a socket. It is driven by the user's calls (``modify``,
``post_send``, ``post_recv``), by ``receive(pkt, now)`` for each packet from
the peer and by ``handle_timer(now)`` at ``get_timer()``; it answers with
``poll_transmit(now)`` (packets addressed to ``dest_qpn``, to be sent to
``remote``) and with completions in its CQs. ``now`` is seconds on any
monotonic clock the transport likes.

The send side is :mod:`.requester` and :mod:`.completer`, the receive side
:mod:`.responder`, the state machine :mod:`.states`, the attributes of
``modify`` :mod:`.attrs`; the receive interfaces of transports that place
MIDDLE packets in bulk are :mod:`.bulk` (the base class).

Packets are never trusted: whatever the peer sends (wrong QP, wrong state,
missing headers, bad PSNs, lengths, keys), ``receive`` drops and counts it in
``stats.dropped``, or answers per IBTA with a NAK and error completions; it
never raises. ``receive`` keeps no reference to the packet's payload, so the
transport may reuse its receive buffer. Outgoing payloads are zero-copy views
of registered memory: encode them before the memory changes.
"""

import random
from collections.abc import Callable
from typing import Any, cast

from rdmakit.wire import (
    MIDDLE_OPCODES,
    OPCODE_INFO,
    PSN_HALF,
    PSN_MASK,
    Opcode,
    OpInfo,
    Packet,
    Train,
)

from .armed import ArmedResponder, NativeResponder
from .armed_req import ArmedRequester, NativeRequester
from .attrs import ATTRS, ModifyAttrs, QpAttrs
from .bulk import BulkReceive
from .completer import fast_read_middle, on_response
from .congestion import DCQCN_CNP_INTERVAL
from .cq import CompletionQueue
from .errors import EngineError
from .memory import ProtectionDomain
from .requester import Requester
from .resp_runs import fast_middle
from .responder import Responder
from .rwqe import RecvWqe
from .send_wqe import WC_OPCODE, SendWqe
from .small_tx import SmallTransmit
from .srq import SharedReceiveQueue
from .states import QpState, check_transition
from .stats import QpStats
from .timers import MAX_MSG_SIZE
from .types import Access, Completion, QpCaps, RecvWR, SendWR, WcOpcode, WcStatus, WrOpcode

#: QPNs and PSNs are 24-bit (IBTA §9.2 BTH).
_U24 = PSN_MASK
_ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF
_READ_ATOMIC = (WrOpcode.RDMA_READ, WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD)
_WITH_IMM = (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)

#: Opcode -> (OpInfo, is a request, indices of the Packet fields its headers
#: need (must not be None), carries a payload), looked up once per packet.
_HEADERS = (
    ("reth", "reth"), ("aeth", "aeth"), ("atomic_eth", "atomic_eth"),
    ("atomic_ack", "atomic_ack_eth"), ("imm", "imm"), ("ieth", "ieth"),
)  # fmt: skip
_ROWS: dict[int, tuple[OpInfo, bool, tuple[int, ...], bool]] = {
    op: (
        info,
        info.is_request,
        tuple(Packet._fields.index(f) for f, flag in _HEADERS if getattr(info, flag)),
        info.payload,
    )
    for op, info in OPCODE_INFO.items()
}


#: The MIDDLE opcodes (``MIDDLE_OPCODES``) each have a fast path.
_RR_MIDDLE = Opcode.RDMA_READ_RESPONSE_MIDDLE
_MIDDLE_OPS = MIDDLE_OPCODES
#: Packet fields reth .. ieth, all None on a MIDDLE packet.
_NO_EXT_HEADERS = (None,) * 6


class QueuePair(BulkReceive, SmallTransmit, ArmedResponder, ArmedRequester):
    """One Reliable Connection queue pair (``ibv_qp`` of type RC)."""

    def __init__(
        self,
        pd: ProtectionDomain,
        *,
        qpn: int,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        caps: QpCaps = QpCaps(),  # noqa: B008 (frozen)
        rng: random.Random,
        srq: SharedReceiveQueue | None = None,
    ) -> None:
        if type(qpn) is bool or not isinstance(qpn, int) or not 2 <= qpn <= _U24:
            raise EngineError(
                "INVALID_VALUE", f"qpn must be in [2, 2**24) (0 and 1 are special), got {qpn!r}"
            )
        for name in ("max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge"):
            if getattr(caps, name) < 1:
                raise EngineError("INVALID_VALUE", f"caps.{name} must be at least 1")
        if not 1 <= caps.max_unacked_psns < 1 << 22:
            raise EngineError("INVALID_VALUE", "caps.max_unacked_psns must be in [1, 2**22)")
        self.pd = pd
        self.qpn = qpn
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.caps = caps
        #: Injected randomness; the engine makes no random choice on its own today.
        self.rng = rng
        self.stats = QpStats()
        self._state = QpState.RESET
        #: Receives requests (RTR, RTS, SQD, SQE) / runs the requester (RTS, SQD).
        self._rx = False
        self._tx = False
        self._attrs: dict[str, Any] = {}
        self.dest_qpn = 0
        self.access = Access.NONE
        #: ``access`` as a plain int for the per-packet check.
        self.access_bits = 0
        self.remote: object = None
        #: The fast paths of MIDDLE packets are on (``QpCaps.fast_paths``).
        self._fast = caps.fast_paths
        self.req = Requester(self, caps.max_unacked_psns, caps.fast_paths, caps.congestion_control)
        #: The notification point (RoCEv2 Annex A17.9.3): a CNP is owed to the peer, and when
        #: the last one left (DCQCN: at most one per ``DCQCN_CNP_INTERVAL``).
        self._cnp_due = False
        self._cnp_at = -DCQCN_CNP_INTERVAL
        self.resp = Responder(self, caps.fast_paths, caps.congestion_control)
        #: The shared receive queue the QP takes receive WQEs from (:mod:`.srq`), if any.
        self.srq = srq
        if srq is not None:
            srq.attach(self)
            self.resp.attach(srq)
        #: Called with this QP when a user call gave it something to send (``post_send``, a
        #: ``modify`` that may resume sending): a transport that polls only QPs with work
        #: (``UdpPort``'s active set) learns of it here. None: nobody listens.
        self.doorbell: Callable[[QueuePair], None] | None = None
        #: The native owner of the responder's steady state while armed (:mod:`.armed`).
        self.native: NativeResponder | None = None
        #: The native owner of the requester's common ACKs, or None (:mod:`.armed_req`).
        self.req_native: NativeRequester | None = None
        #: Native posting, set by a transport: ``(post, ctx)``; ``post(self, wr, ctx)`` does
        #: this ``post_send``'s whole effect (and its doorbell's) for the requests it takes
        #: and returns None for the rest, having changed nothing (``small_tx.POST_TABLE``).
        self.poster: tuple[Callable[[QueuePair, SendWR, list[Any]], object], list[Any]] | None = None

    def __repr__(self) -> str:
        return f"<QueuePair qpn={self.qpn:#x} {self._state.name} dest_qpn={self.dest_qpn:#x}>"

    # -- state --

    @property
    def state(self) -> QpState:
        return self._state

    def _set_state(self, st: QpState) -> None:
        self._state = st
        self._rx = QpState.RTR <= st <= QpState.SQE
        self._tx = st is QpState.RTS or st is QpState.SQD

    def state_is_error(self) -> bool:
        return self._state is QpState.ERR

    @property
    def attrs(self) -> QpAttrs:
        return QpAttrs(state=self._state, sq_draining=self.req.draining, **self._attrs)

    @property
    def window(self) -> int:
        """The requester's window in PSNs (default ``caps.max_unacked_psns``, rxe: 128)."""
        return self.req.window

    @window.setter
    def window(self, value: int) -> None:
        if not 1 <= value < 1 << 22:
            raise EngineError("INVALID_VALUE", "window must be in [1, 2**22)")
        self.req.window = value
        self.req.cc.set_limit(value)

    @property
    def sq_drained(self) -> bool:
        """In SQD, True once no started send work request is outstanding (IBTA §10.3.1.3)."""
        return self._state is QpState.SQD and not any(w.started for w in self.req.sq)

    def modify(
        self,
        state: QpState,
        attrs: ModifyAttrs | None = None,
        /,
        *,
        port: int | None = None,
        pkey_index: int | None = None,
        access: int | None = None,
        remote: object = None,
        path_mtu: int | None = None,
        dest_qpn: int | None = None,
        rq_psn: int | None = None,
        max_dest_rd_atomic: int | None = None,
        min_rnr_timer: int | None = None,
        timeout: int | None = None,
        retry_cnt: int | None = None,
        rnr_retry: int | None = None,
        sq_psn: int | None = None,
        max_rd_atomic: int | None = None,
        cur_state: QpState | None = None,
        en_sqd_async_notify: bool | None = None,
    ) -> None:
        """Move to ``state`` setting ``attrs`` (``ibv_modify_qp``; table in :mod:`.states`).

        The attributes come as a :class:`ModifyAttrs` or as its fields'
        keywords, not both. All-or-nothing: a bad pair, a missing or extra
        attribute or a bad value raises EngineError and changes nothing.
        """
        self.disarm()
        kw = ModifyAttrs(
            port=port, pkey_index=pkey_index, access=access, remote=remote, path_mtu=path_mtu,
            dest_qpn=dest_qpn, rq_psn=rq_psn, max_dest_rd_atomic=max_dest_rd_atomic,
            min_rnr_timer=min_rnr_timer, timeout=timeout, retry_cnt=retry_cnt, rnr_retry=rnr_retry,
            sq_psn=sq_psn, max_rd_atomic=max_rd_atomic, cur_state=cur_state,
            en_sqd_async_notify=en_sqd_async_notify,
        )  # fmt: skip
        if attrs is None:
            attrs = kw
        elif kw.given():
            raise EngineError("INVALID_VALUE", "give the attributes as ModifyAttrs or as keywords, not both")
        try:
            to = QpState(state)
        except ValueError:
            raise EngineError("INVALID_VALUE", f"not a QP state: {state!r}") from None
        given = attrs.given()
        check_transition(self._state, to, set(given))
        values = [(ATTRS[name], name, ATTRS[name].check(self, getattr(attrs, name))) for name in given]
        if to is QpState.RESET:
            self._reset()
            return
        if to is QpState.ERR:
            self.enter_error()
            return
        for attr, name, v in values:
            attr.apply(self, v)
            if attr.reported:
                self._attrs[name] = v
        self.req.draining = to is QpState.SQD
        self._set_state(to)
        if self.doorbell is not None:
            self.doorbell(self)

    def _reset(self) -> None:
        """Any state -> RESET: queues emptied without completions (IBTA §10.3.1.1)."""
        self._set_state(QpState.RESET)
        self._attrs.clear()
        self.dest_qpn = 0
        self.access = Access.NONE
        self.access_bits = 0
        self.remote = None
        self.req.reset()
        self.resp.reset()

    def enter_error(self) -> None:
        """Move to ERR: every outstanding work request completes with WR_FLUSH_ERR (IBTA §10.3.1.8)."""
        self.disarm()
        if self._state is QpState.ERR:
            return
        self._set_state(QpState.ERR)
        req = self.req
        wqes = list(req.sq)
        req.sq.clear()
        req.next_idx = req.req_off = req.rd_out = 0
        req.need_retry = False
        req.rexmit_deadline = req.rnr_deadline = req.pace_deadline = req.probe_deadline = None
        req.probe_due = False
        for w in wqes:
            self.push_send(
                Completion(
                    wr_id=w.wr.wr_id,
                    status=WcStatus.WR_FLUSH_ERR,
                    opcode=w.wc_opcode,
                    qp_num=self.qpn,
                )
            )
        for wr_id in self.resp.flush():
            self.push_recv(
                Completion(wr_id=wr_id, status=WcStatus.WR_FLUSH_ERR, opcode=WcOpcode.RECV, qp_num=self.qpn)
            )
        if self.srq is not None:
            self.srq.qp_flushed(self.qpn)

    # -- completions (engine internal) --

    def push_send(self, wc: Completion) -> None:
        if not self.send_cq.push(wc):
            self.enter_error()

    def push_recv(self, wc: Completion) -> None:
        if not self.recv_cq.push(wc):
            self.enter_error()

    def complete_send_head(self, status: WcStatus) -> None:
        """Complete the oldest send WQE; then fail it at once if the next one carries a local error."""
        req = self.req
        wqe = req.sq.popleft()
        if req.next_idx:
            req.next_idx -= 1
        else:
            # The head was being resent when a late cumulative ACK covered it:
            # the next WQE starts after it, at comp_psn.
            req.req_off = 0
            if (req.req_psn - req.comp_psn) & PSN_MASK >= PSN_HALF:
                req.req_psn = req.comp_psn
        if wqe.has_rd:
            req.rd_out -= 1
        if status or wqe.signaled:
            self.push_send(
                Completion(
                    wr_id=wqe.wr.wr_id,
                    status=status,
                    opcode=wqe.wc_opcode,
                    byte_len=wqe.length,
                    qp_num=self.qpn,
                )
            )
        sq = req.sq
        if sq and sq[0].status and self._state is not QpState.ERR:
            self.fail_send(sq[0].status)

    def fail_send(self, status: WcStatus) -> None:
        """The head send WQE fails with ``status``; the QP goes to ERR (rxe COMPST_ERROR)."""
        if self.req.sq:
            wqe = self.req.sq.popleft()
            self.push_send(
                Completion(wr_id=wqe.wr.wr_id, status=status, opcode=wqe.wc_opcode, qp_num=self.qpn)
            )
        self.enter_error()

    # -- user calls --

    def post_send(self, wr: SendWR) -> None:
        """Queue a send work request (``ibv_post_send``).

        Allowed in RTS and SQD (where it waits for RTS); in ERR it completes at
        once with WR_FLUSH_ERR (verbs). Raises EngineError for a bad state
        (BAD_STATE), a full queue (FULL) or a malformed request
        (INVALID_VALUE). An SGE whose L_Key, range or access is wrong is not
        a post error: the request completes with LOC_PROT_ERR once the ones
        before it are done, and the QP goes to ERR.
        """
        poster = self.poster
        if poster is not None:
            got = poster[0](self, wr, poster[1])
            if got is not None:
                if got is not True:
                    poster[1][-2](self, got)  # the transport's ``after`` (``_nativepostsend.c``)
                return
        st = self._state
        if st is not QpState.RTS and st is not QpState.SQD and st is not QpState.ERR:
            raise EngineError("BAD_STATE", f"post_send needs RTS or SQD, the QP is in {st.name}")
        try:
            opcode = WrOpcode(wr.opcode)
        except ValueError:
            raise EngineError("INVALID_VALUE", f"unknown send opcode {wr.opcode!r}") from None
        sges = wr.sg_list
        if len(sges) > self.caps.max_send_sge:
            raise EngineError("INVALID_VALUE", f"{len(sges)} SGEs, max_send_sge is {self.caps.max_send_sge}")
        length = 0
        for sge in sges:
            if sge.length < 0:
                raise EngineError("INVALID_VALUE", f"negative SGE length {sge.length}")
            length += sge.length
        if length > MAX_MSG_SIZE:
            raise EngineError("INVALID_VALUE", f"message of {length} bytes exceeds 2**31")
        if opcode in _WITH_IMM and (wr.imm_data is None or not 0 <= wr.imm_data <= _U32):
            raise EngineError("INVALID_VALUE", f"{opcode.name} needs imm_data, a u32")
        if opcode in _READ_ATOMIC:
            if opcode is not WrOpcode.RDMA_READ:
                if length != 8:
                    raise EngineError("INVALID_VALUE", f"an atomic needs exactly 8 local bytes, got {length}")
                if wr.remote_addr & 7:
                    raise EngineError("INVALID_VALUE", "an atomic's remote_addr must be 8-byte aligned")
                if not (0 <= wr.compare_add <= _U64 and 0 <= wr.swap <= _U64):
                    raise EngineError("INVALID_VALUE", "atomic operands are u64")
            if st is not QpState.ERR and self.req.max_rd_atomic == 0:
                raise EngineError("INVALID_VALUE", f"{opcode.name} with max_rd_atomic 0 could never be sent")
        if not (0 <= wr.remote_addr <= _U64 and 0 <= wr.rkey <= _U32):
            raise EngineError("INVALID_VALUE", "remote_addr is a u64 and rkey a u32")
        if st is QpState.ERR:
            self.push_send(
                Completion(
                    wr_id=wr.wr_id,
                    status=WcStatus.WR_FLUSH_ERR,
                    opcode=WC_OPCODE[opcode],
                    qp_num=self.qpn,
                )
            )
            return
        sq = self.req.sq
        if len(sq) >= self.caps.max_send_wr:
            raise EngineError("FULL", f"the send queue holds max_send_wr={self.caps.max_send_wr} requests")
        write = opcode in _READ_ATOMIC
        segs = []
        status = WcStatus.SUCCESS
        local_slice = self.pd.local_slice
        for sge in sges:
            view = local_slice(sge, write)
            if view is None:
                status = WcStatus.LOC_PROT_ERR
                break
            if len(view):
                segs.append(view)
        sq.append(SendWqe(wr, opcode, length, segs, status))
        if status and len(sq) == 1:
            self.fail_send(status)
        elif self.doorbell is not None:
            self.doorbell(self)

    def post_recv(self, wr: RecvWR) -> None:
        """Queue a receive work request (``ibv_post_recv``); allowed from INIT on.

        In ERR it completes at once with WR_FLUSH_ERR. A bad SGE surfaces when
        a message lands in it: LOC_PROT_ERR here, NAK remote operational
        error at the peer.
        """
        self.disarm()  # the ACKs' credit count changes
        st = self._state
        if self.srq is not None:
            # rxe_post_recv: "if (qp->srq) return -EINVAL"; post to the SRQ instead.
            raise EngineError("INVALID_VALUE", "the QP takes its receives from an SRQ: post them there")
        if st is QpState.RESET:
            raise EngineError("BAD_STATE", "post_recv needs INIT or later, the QP is in RESET")
        sges = wr.sg_list
        if len(sges) > self.caps.max_recv_sge:
            raise EngineError("INVALID_VALUE", f"{len(sges)} SGEs, max_recv_sge is {self.caps.max_recv_sge}")
        if st is QpState.ERR:
            self.push_recv(
                Completion(
                    wr_id=wr.wr_id, status=WcStatus.WR_FLUSH_ERR, opcode=WcOpcode.RECV, qp_num=self.qpn
                )
            )
            return
        resp = self.resp
        if len(resp.rq) + (resp.cur_recv is not None) >= self.caps.max_recv_wr:
            raise EngineError("FULL", f"the receive queue holds max_recv_wr={self.caps.max_recv_wr} requests")
        resp.rq.append(RecvWqe.resolve(self.pd, wr))

    # -- network and timers --

    def receive(self, pkt: Packet, now: float) -> None:
        """One packet from the peer (already ICRC-checked and decoded). Never raises."""
        stats = self.stats
        stats.packets_in += 1
        if not self._rx:
            stats.drop("qp_state")
            return
        if pkt.dest_qp != self.qpn:
            stats.drop("dest_qp")
            return
        if pkt.pkey & 0x7FFF != 0x7FFF:
            # rxe check_keys(): pkey_match() against the default P_Key 0xFFFF.
            stats.drop("pkey")
            return
        op = pkt.opcode
        if op in _MIDDLE_OPS and self._fast and pkt[9:15] == _NO_EXT_HEADERS:
            if op == _RR_MIDDLE:
                if self._tx and fast_read_middle(self.req, pkt.psn, pkt.payload, now):
                    return
            else:
                self.disarm()
                if fast_middle(self.resp, op, pkt.psn, pkt.ackreq, pkt.payload):
                    return
        row = _ROWS.get(op)
        if row is None:
            stats.drop("opcode")
            return
        info, is_request, required, payload_ok = row
        for i in required:
            if pkt[i] is None:
                stats.drop("missing_header")
                return
        if not payload_ok and pkt.payload:
            stats.drop("unexpected_payload")
            return
        if is_request:
            self.disarm()
            self.resp.on_request(pkt, info)
        elif self._tx:
            on_response(self, self.req, pkt, info, now)
            if self._tx:
                # Any response re-arms the retransmit timer while requests are outstanding,
                # not only one that acknowledges new PSNs (rxe rxe_comp.c COMPST_EXIT): a slow
                # responder still answering our duplicates is alive, and retrying it again
                # only adds duplicates it must answer first (a retransmission storm that ends
                # in RETRY_EXC_ERR without any loss).
                self.req.restart_timer(now)
        else:
            stats.drop("qp_state")

    # -- congestion notification (RoCEv2 Annex A17.9) --

    def congestion_experienced(self, now: float) -> None:
        """A packet for this QP arrived marked CE (ECN 0b11 in the IP header, which only the
        transport sees): as the notification point, owe the peer a CNP, at most one per
        ``DCQCN_CNP_INTERVAL`` (Zhu et al. 2015, §3.2)."""
        self.stats.ce_received += 1
        if self._rx and now - self._cnp_at >= DCQCN_CNP_INTERVAL:
            self._cnp_due = True
            self._cnp_at = now

    def poll_cnp(self) -> bool:
        """True once per CNP owed: the transport then sends one to ``dest_qpn`` (``wire.cnp``)."""
        if not self._cnp_due:
            return False
        self._cnp_due = False
        if not self._rx:
            return False
        self.stats.cnps_sent += 1
        return True

    def cnp_received(self, now: float) -> None:
        """A CNP named this QP (already ICRC-checked): as the reaction point, lower the rate
        (DCQCN). Counted and otherwise ignored where no requester runs or congestion control is off."""
        self.stats.cnps_received += 1
        if self._tx and self.req.cc_on:
            self.req.rate.on_cnp(now)

    def get_timer(self) -> float | None:
        """The earliest deadline (retransmit, RNR wait or pace) at which to call ``handle_timer``."""
        t = self.req.deadline() if self._tx else None
        r = self.resp.pace_deadline
        return r if r is not None and (t is None or r < t) else t

    def handle_timer(self, now: float) -> None:
        r = self.resp.pace_deadline
        if r is not None and now >= r:
            self.resp.pace_deadline = None
        if self._tx:
            self.req.on_timer(now)

    def may_transmit(self, held_ack: bool = True) -> bool:
        """False when ``poll_transmit`` would certainly return nothing (a cheap test for pumps);
        ``held_ack=False``: nothing but the ACK the armed responder holds."""
        if held_ack and self.native is not None and self.native.pending:
            return True
        if self.resp.out and self.resp.pace_deadline is None:
            return self._state >= QpState.RTR
        req = self.req
        return (
            self._tx
            and req.rnr_deadline is None
            and (
                req.probe_due
                or (req.pace_deadline is None and (req.need_retry or req.next_idx < len(req.sq)))
            )
        )

    def poll_transmit(self, now: float, max_packets: int | None = None) -> list[Packet]:
        """Packets ready to go now, responses first; each addressed to ``dest_qpn``."""
        return cast("list[Packet]", self.poll_transmit_trains(now, max_packets, False))

    def poll_transmit_trains(
        self, now: float, max_packets: int | None = None, trains: bool = True
    ) -> list[Packet | Train]:
        """``poll_transmit``, with runs of MIDDLE packets as :class:`~rdmakit.wire.Train` objects.

        For senders that build headers in bulk; ``max_packets`` counts the
        packets in trains too.
        """
        if self.native is not None and self.native.pending:
            self.disarm()  # its ACK goes first, from Responder.out
        st = self._state
        if st < QpState.RTR:
            return []
        out: list[Packet | Train] = []
        budget = (1 << 62) if max_packets is None else max_packets
        n = self.resp.paced_transmit(out, budget, now, trains, self.req.rate) if self.resp.out else 0
        if self._tx and n < budget:
            n += self.req.transmit(out, budget - n, now, trains)
        self.stats.packets_out += n
        return out

    def transport_error(self, now: float) -> None:
        """The transport lost the path (e.g. a TCP reset): as if retries ran out.

        The oldest send WR completes with RETRY_EXC_ERR, the rest and all
        receive WRs with WR_FLUSH_ERR; the QP moves to ERR.
        """
        self.disarm()
        if self._state is QpState.ERR or self._state is QpState.RESET:
            return
        self.fail_send(WcStatus.RETRY_EXC_ERR)
