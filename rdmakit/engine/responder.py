"""The responder: requests in, data placed, ACKs and READ responses out.

Follows rxe ``rxe_resp.c`` (IBTA Vol. 1 §9.7.5, §9.9): for each request packet,
``check_psn`` (one PSN-sequence NAK per gap, then silent drops; duplicates),
``check_op_seq`` (FIRST/MIDDLE/LAST order), ``check_op_valid`` (QP access
flags), ``check_resource`` (receive WQE or RNR NAK; responder resources),
``check_length`` (MTU rules), ``check_rkey`` (R_Key, range, permission), then
``execute`` and ``acknowledge``.

Responses leave in request order through ``Responder.out``
(:mod:`.resp_output`, the ``Responder``'s base class); READ and atomic
requests leave a responder resource behind for duplicates to replay
(:mod:`.rdatomic`). In-order MIDDLE packets may skip this module's generic
dispatch through the fast paths of :mod:`.resp_runs`, with the same effect.

Class A/C errors (IBTA §9.9.3.1, rxe ``do_class_ac_error()``) send a NAK with
the offending PSN, complete the receive WQE in use with an error, and move the
QP to the error state, which flushes the receive queue.

Where this differs from rxe, on purpose:

- A SEND longer than its receive WQE completes that WQE with LOC_LEN_ERR
  (IBTA §10.10.2 and hardware; rxe reports REM_INV_REQ_ERR locally too). The
  peer gets NAK invalid request either way.
- A receive WQE whose SGE fails its L_Key check completes with LOC_PROT_ERR
  and the peer gets NAK remote operational error (rxe: LOC_QP_OP_ERR).
- SEND with invalidate gets NAK invalid request: there are no memory windows
  or fast-registered MRs to invalidate (rxe fails the invalidate as well).
- READ responses are generated lazily, while later requests are executed
  (rxe holds them until the READ reply is sent); the data is read when the
  transport encodes each packet. IBTA leaves that ordering to the fence flag.

Invariants:

- ``psn`` is the next request PSN expected; every PSN before it was executed.
- ``in_msg`` is the kind of the multi-packet SEND or WRITE being received
  (rxe ``resp.opcode`` FIRST/MIDDLE), None between messages.
- ``cur_recv`` is the receive WQE of the SEND being received; it has left
  ``rq`` already.
- With a shared receive queue (:mod:`.srq`), ``rq`` is the SRQ's deque: a WQE
  is taken only when a message's first packet needs it, and only ``cur_recv``
  is this QP's to flush.
- The engine keeps no reference to a received packet's payload.
"""

import sys
from collections import deque

from rdmakit.wire import (
    OPCODE_INFO,
    PSN_HALF,
    PSN_MASK,
    Kind,
    NakCode,
    Opcode,
    OpInfo,
    Packet,
    Payload,
    Position,
    rnr_syndrome,
)

from .congestion import ResponsePacer
from .context import QpContext
from .memory import scatter
from .rdatomic import RdAtomicResources
from .resp_output import ReadReply, ResponseOutput
from .rwqe import RecvWqe
from .srq import SharedReceiveQueue
from .timers import MAX_MSG_SIZE
from .types import Access, Completion, WcOpcode, WcStatus

_MASK = PSN_MASK
_HALF = PSN_HALF
_U64 = 0xFFFFFFFFFFFFFFFF
_BYTEORDER = sys.byteorder

_FIRST, _MIDDLE, _LAST, _ONLY = Position.FIRST, Position.MIDDLE, Position.LAST, Position.ONLY
_SEND, _WRITE, _READ, _ATOMIC = Kind.SEND, Kind.WRITE, Kind.READ_REQUEST, Kind.ATOMIC
#: The QP access flag each remote operation needs (rxe ``check_qp_attr_access()``), as plain ints.
_QP_ACCESS = {
    _WRITE: int(Access.REMOTE_WRITE), _READ: int(Access.REMOTE_READ), _ATOMIC: int(Access.REMOTE_ATOMIC),
}  # fmt: skip
#: Opcodes that take a receive WQE (rxe ``RXE_RWR_MASK``).
_RWQE_OPS = frozenset(op for op, i in OPCODE_INFO.items() if i.consumes_rwqe)
_REMOTE_WRITE = int(Access.REMOTE_WRITE)
_REMOTE_READ = int(Access.REMOTE_READ)
_REMOTE_ATOMIC = int(Access.REMOTE_ATOMIC)


class _Fatal(Exception):
    """Internal: a class A/C responder error (never leaves this module)."""

    def __init__(self, code: NakCode, status: WcStatus) -> None:
        self.code = code
        self.status = status


class Responder(ResponseOutput):
    """Receive-side state of one QP."""

    __slots__ = (
        "ack_psn",
        "cur_recv",
        "fast",
        "in_msg",
        "min_rnr_timer",
        "msn",
        "mtu",
        "out",
        "placed",
        "psn",
        "qp",
        "recv_off",
        "res",
        "rq",
        "sent_psn_nak",
        "srq",
        "w_gen",
        "w_len",
        "w_off",
        "w_resid",
        "w_rkey",
        "w_va",
        "w_view",
    )  # fmt: skip

    def __init__(self, qp: QpContext, fast: bool = True, congestion: bool = False) -> None:
        self.qp = qp
        #: Paces READ responses once some were lost (``QpCaps.congestion_control``), else None.
        self.pacer: ResponsePacer | None = ResponsePacer() if congestion else None
        self.res = RdAtomicResources()
        #: Runs of READ response MIDDLE packets take the tight loop (``QpCaps.fast_paths``).
        self.fast = fast
        self.rq: deque[RecvWqe] = deque()
        #: The shared receive queue whose WQEs ``rq`` is (``attach``), None: the QP's own.
        self.srq: SharedReceiveQueue | None = None
        self.out: deque[Packet | ReadReply] = deque()
        self.reset()

    def attach(self, srq: SharedReceiveQueue) -> None:
        """Take receive WQEs from `srq` (IBTA §10.2.9): ``rq`` becomes its queue."""
        self.srq = srq
        self.rq = srq.rq

    def reset(self) -> None:
        if self.srq is None:
            self.rq.clear()  # an SRQ's WQEs are the other QPs' too: never dropped here
        self.out.clear()
        if self.pacer is not None:
            self.pacer = ResponsePacer()
        #: While the pacer holds the next response back: when it may leave.
        self.pace_deadline: float | None = None
        self.psn = 0
        self.ack_psn = 0
        self.msn = 0
        self.in_msg: Kind | None = None
        self.sent_psn_nak = False
        self.cur_recv: RecvWqe | None = None
        self.recv_off = 0
        self.w_view: memoryview | None = None
        #: The RETH of the WRITE in progress and the PD generation its slice was resolved in.
        self.w_rkey = self.w_va = self.w_gen = 0
        self.w_off = 0
        self.w_resid = 0
        self.w_len = 0
        #: A payload a transport already put where ``write_target`` said: (the buffer, where).
        self.placed: tuple[Payload, tuple[int, int, int, int]] | None = None
        self.mtu = 1024
        self.min_rnr_timer = 0
        self.res.configure(0)

    def configure(self, *, rq_psn: int) -> None:
        self.psn = self.ack_psn = rq_psn

    # -- output --
    # -- requests --

    def on_request(self, pkt: Packet, info: OpInfo) -> None:
        qp = self.qp
        d = (pkt.psn - self.psn) & _MASK
        if d:
            if d < _HALF:
                # PSN sequence error, class B: one NAK per gap, then silent drops.
                if self.sent_psn_nak:
                    qp.stats.drop("out_of_sequence")
                    return
                self.sent_psn_nak = True
                self.queue_nak(NakCode.PSN_SEQUENCE_ERROR, self.psn)
                return
            qp.stats.duplicates += 1
            self._duplicate(pkt, info)
            return
        self.sent_psn_nak = False
        try:
            self._execute(pkt, info)
        except _Fatal as e:
            self._fatal(pkt.psn, e.code, e.status)

    def _fatal(self, psn: int, code: NakCode, status: WcStatus) -> None:
        """Class A/C error: complete the receive WQE in use, NAK, error state."""
        qp = self.qp
        r = self.cur_recv
        if r is not None:
            self.cur_recv = None
            qp.push_recv(Completion(wr_id=r.wr_id, status=status, opcode=WcOpcode.RECV, qp_num=qp.qpn))
        qp.enter_error()
        self.queue_nak(code, psn)

    def _execute(self, pkt: Packet, info: OpInfo) -> None:
        qp = self.qp
        kind = info.kind
        pos = info.position
        # check_op_seq (rxe): a message continues with its own MIDDLE/LAST only.
        in_msg = self.in_msg
        if in_msg is not None:
            if kind is not in_msg or pos is _FIRST or pos is _ONLY:
                raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
        elif (pos is _MIDDLE or pos is _LAST) and (kind is _SEND or kind is _WRITE):
            raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
        # check_op_valid: the QP must allow the operation (rxe check_qp_attr_access()).
        if kind is not _SEND:
            if not qp.access_bits & _QP_ACCESS[kind]:
                raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
        elif info.ieth:
            # SEND with invalidate needs memory windows / fast-registered MRs,
            # which this engine does not have (rxe fails the invalidate too).
            raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
        if kind is _SEND or kind is _WRITE:
            self._send_write(pkt, info, kind, pos)
        elif kind is _READ:
            self._read(pkt)
        else:
            self._atomic(pkt)

    def _send_write(self, pkt: Packet, info: OpInfo, kind: Kind, pos: Position) -> None:
        qp = self.qp
        # check_resource: a receive WQE for SEND FIRST/ONLY and WRITE with immediate.
        rwqe: RecvWqe | None = None
        if info.opcode in _RWQE_OPS:
            if not self.rq:
                qp.stats.rnr_naks_sent += 1
                self._queue(self._ack(Opcode.ACKNOWLEDGE, pkt.psn, rnr_syndrome(self.min_rnr_timer)))
                return
            if kind is _SEND:
                self.cur_recv = self.rq.popleft()
                self.recv_off = 0
                if self.srq is not None:
                    self.srq.taken()
            else:
                rwqe = self.rq[0]
        # check_length (rxe rxe_resp_check_length(), IBTA C9-92..C9-94).
        payload = pkt.payload
        plen = len(payload)
        mtu = self.mtu
        if pos is _FIRST or pos is _MIDDLE:
            bad = plen != mtu
        elif pos is _LAST:
            bad = plen == 0 or plen > mtu
        else:
            bad = plen > mtu
        if bad:
            self._fail_rwqe(rwqe, WcStatus.REM_INV_REQ_ERR)
            raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
        end = pos is _LAST or pos is _ONLY
        if kind is _SEND:
            r = self.cur_recv
            assert r is not None
            if plen:
                segs = r.segs
                off = self.recv_off
                if segs is None:
                    raise _Fatal(NakCode.REMOTE_OPERATIONAL_ERROR, WcStatus.LOC_PROT_ERR)
                if off + plen > r.length:
                    raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.LOC_LEN_ERR)
                if len(segs) == 1:
                    segs[0][off : off + plen] = payload
                else:
                    scatter(segs, off, payload)
                self.recv_off = off + plen
            if end:
                self.cur_recv = None
                self.msn = (self.msn + 1) & _MASK
                qp.push_recv(
                    Completion(
                        wr_id=r.wr_id,
                        status=WcStatus.SUCCESS,
                        opcode=WcOpcode.RECV,
                        byte_len=self.recv_off,
                        imm_data=pkt.imm,
                        qp_num=qp.qpn,
                        src_qp=qp.dest_qpn,
                    )
                )
                self.in_msg = None
            else:
                self.in_msg = _SEND
        else:
            reth = pkt.reth
            if reth is not None:
                length = reth.dma_len
                if length > MAX_MSG_SIZE:
                    self._fail_rwqe(rwqe, WcStatus.REM_INV_REQ_ERR)
                    raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
                if length:
                    view = qp.pd.remote_slice(reth.rkey, reth.va, length, _REMOTE_WRITE)
                    if view is None:
                        self._fail_rwqe(rwqe, WcStatus.REM_ACCESS_ERR)
                        raise _Fatal(NakCode.REMOTE_ACCESS_ERROR, WcStatus.REM_ACCESS_ERR)
                else:
                    view = None
                self.w_view = view
                self.w_rkey, self.w_va, self.w_gen = reth.rkey, reth.va, qp.pd.generation
                self.w_off = 0
                self.w_len = self.w_resid = length
            resid = self.w_resid
            if (plen != resid) if end else (plen >= resid):
                self._fail_rwqe(rwqe, WcStatus.REM_INV_REQ_ERR)
                raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
            if plen:
                if self.w_gen != qp.pd.generation:
                    # Something was deregistered since the FIRST packet: the rest of the
                    # message may only land if its R_Key still grants the range.
                    self.w_view = qp.pd.remote_slice(self.w_rkey, self.w_va, self.w_len, _REMOTE_WRITE)
                    self.w_gen = qp.pd.generation
                    if self.w_view is None:
                        self._fail_rwqe(rwqe, WcStatus.REM_ACCESS_ERR)
                        raise _Fatal(NakCode.REMOTE_ACCESS_ERROR, WcStatus.REM_ACCESS_ERR)
                view = self.w_view
                assert view is not None
                off = self.w_off
                placed = self.placed
                if (
                    placed is None
                    or placed[0] is not payload
                    or placed[1] != (self.w_rkey, self.w_va, off, plen)
                ):
                    view[off : off + plen] = payload
                self.placed = None
                self.w_off = off + plen
                self.w_resid = resid - plen
            if end:
                self.w_view = None
                self.in_msg = None
                self.msn = (self.msn + 1) & _MASK
                if rwqe is not None:
                    self.rq.popleft()
                    if self.srq is not None:
                        self.srq.taken()
                    qp.push_recv(
                        Completion(
                            wr_id=rwqe.wr_id,
                            status=WcStatus.SUCCESS,
                            opcode=WcOpcode.RECV_RDMA_WITH_IMM,
                            byte_len=self.w_len,
                            imm_data=pkt.imm,
                            qp_num=qp.qpn,
                            src_qp=qp.dest_qpn,
                        )
                    )
            else:
                self.in_msg = _WRITE
        psn = pkt.psn
        self.psn = self.ack_psn = (psn + 1) & _MASK
        if pkt.ackreq:
            self.queue_ack(psn)

    def write_only_executed(self, psn: int, rkey: int, va: int, length: int, ackreq: bool) -> None:
        """The in-order WRITE ONLY (no immediate) at ``psn`` passed every check and its
        ``length`` > 0 bytes were placed: the state ``_send_write`` leaves, and its ACK if asked."""
        self.w_view = None
        self.w_rkey, self.w_va, self.w_gen = rkey, va, self.qp.pd.generation
        self.w_off = self.w_len = length
        self.w_resid = 0
        self.placed = None
        self.in_msg = None
        self.msn = (self.msn + 1) & _MASK
        self.psn = self.ack_psn = (psn + 1) & _MASK
        if ackreq:
            self.queue_ack(psn)

    def _fail_rwqe(self, rwqe: RecvWqe | None, status: WcStatus) -> None:
        """A WRITE with immediate failed: its receive WQE completes with ``status``."""
        if rwqe is not None:
            self.rq.popleft()
            if self.srq is not None:
                self.srq.taken()
            self.qp.push_recv(
                Completion(
                    wr_id=rwqe.wr_id,
                    status=status,
                    opcode=WcOpcode.RECV_RDMA_WITH_IMM,
                    qp_num=self.qp.qpn,
                )
            )

    def _read(self, pkt: Packet) -> None:
        qp = self.qp
        if not self.res.ring:
            raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
        reth = pkt.reth
        assert reth is not None
        length = reth.dma_len
        if length > MAX_MSG_SIZE:
            raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
        view = None
        if length:
            view = qp.pd.remote_slice(reth.rkey, reth.va, length, _REMOTE_READ)
            if view is None:
                raise _Fatal(NakCode.REMOTE_ACCESS_ERROR, WcStatus.REM_ACCESS_ERR)
        self.read_executed(pkt.psn, reth.rkey, reth.va, length, view)

    def read_executed(self, psn: int, rkey: int, va: int, length: int, view: memoryview | None) -> None:
        """The in-order READ request at ``psn`` passed every check: a responder resource
        for its duplicates, and its response queued (``view``: the bytes; None if empty)."""
        npkts = max(length - 1, 0) // self.mtu + 1
        self.res.new_read(psn, (psn + npkts - 1) & _MASK, rkey, va, length)
        # IBTA C9-148: a READ counts as a message when it executes.
        self.msn = (self.msn + 1) & _MASK
        self.psn = (psn + npkts) & _MASK
        self.in_msg = None
        self.queue_read(view, length, psn, True)

    def _atomic(self, pkt: Packet) -> None:
        qp = self.qp
        if not self.res.ring:
            raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
        ae = pkt.atomic_eth
        assert ae is not None
        view = qp.pd.remote_slice(ae.rkey, ae.va, 8, _REMOTE_ATOMIC)
        if view is None:
            raise _Fatal(NakCode.REMOTE_ACCESS_ERROR, WcStatus.REM_ACCESS_ERR)
        if ae.va & 7:
            raise _Fatal(NakCode.INVALID_REQUEST, WcStatus.REM_INV_REQ_ERR)
        # IBTA §9.4.5: the target is a u64 in the responder's byte order (rxe
        # operates on a CPU-native u64).
        orig = int.from_bytes(view, _BYTEORDER)
        if pkt.opcode is Opcode.COMPARE_SWAP:
            if orig == ae.compare:
                view[:] = (ae.swap_add & _U64).to_bytes(8, _BYTEORDER)
        else:
            view[:] = ((orig + ae.swap_add) & _U64).to_bytes(8, _BYTEORDER)
        self.atomic_executed(pkt.psn, orig)

    def atomic_executed(self, psn: int, orig: int) -> None:
        """The in-order atomic request at ``psn`` was executed on a u64 that held ``orig``:
        a responder resource for its duplicates, and the ATOMIC ACKNOWLEDGE queued."""
        self.res.new_atomic(psn, orig)
        self.msn = (self.msn + 1) & _MASK
        self.psn = self.ack_psn = (psn + 1) & _MASK
        self.in_msg = None
        self._queue(self._ack(Opcode.ATOMIC_ACKNOWLEDGE, psn, self.credit_syndrome(), orig))

    def _duplicate(self, pkt: Packet, info: OpInfo) -> None:
        """A request before ``psn`` (rxe ``duplicate_request()``, IBTA §9.9.2.1)."""
        kind = info.kind
        if kind is _SEND or kind is _WRITE:
            # C9-105: acknowledge again, up to the last request executed.
            self.queue_ack((self.ack_psn - 1) & _MASK)
            return
        psn = pkt.psn
        if kind is _ATOMIC:
            res = self.res.find(psn, _ATOMIC)
            if res is None:
                self.qp.stats.drop("duplicate_without_resource")
                return
            # Replay the cached original value; never execute twice.
            self._queue(self._ack(Opcode.ATOMIC_ACKNOWLEDGE, psn, self.credit_syndrome(), res.orig))
            return
        res = self.res.find(psn, _READ)
        reth = pkt.reth
        assert reth is not None
        va, length = reth.va, reth.dma_len
        if res is None or reth.rkey != res.rkey or va < res.va or va + length > res.va + res.length:
            self.qp.stats.drop("duplicate_without_resource")
            return
        view = None
        if length:
            view = self.qp.pd.remote_slice(reth.rkey, va, length, _REMOTE_READ)
            if view is None:
                self._fatal(psn, NakCode.REMOTE_ACCESS_ERROR, WcStatus.REM_ACCESS_ERR)
                return
        if self.pacer is not None:
            self.pacer.armed = True  # the requester went back for responses that were lost
        self.queue_read(view, length, psn, psn == res.first_psn)

    def flush(self) -> list[int]:
        """Drop all receive state; the wr_ids of the receive WQEs to flush, oldest first."""
        ids = []
        r = self.cur_recv
        if r is not None:
            ids.append(r.wr_id)
            self.cur_recv = None
        if self.srq is None:  # the SRQ's WQEs stay for its other QPs (``ibv_modify_qp``(3))
            ids.extend(w.wr_id for w in self.rq)
            self.rq.clear()
        self.out.clear()
        self.pace_deadline = None
        self.in_msg = None
        self.w_view = None
        return ids
