"""``QueuePair``'s receive interfaces for transports that skip building ``Packet``s.

A transport that checks headers itself (the native UDP data plane, the TCP
stream reader) hands the engine an in-order MIDDLE packet's fields
(``receive_middle``), asks where a run of them or a large payload goes
(``rx_run``, ``rx_place``) and reports what it placed (``rx_run_done``). Each
has exactly the effect of ``QueuePair.receive`` on the same packets, which
``tests/engine/test_engine_fastpath.py`` proves on seeded hostile networks;
with ``QpCaps.fast_paths`` off they decline everything.
"""

from collections.abc import Callable
from typing import cast

from rdmakit.wire import BTH_LEN, MIDDLE_OPCODES, PSN_HALF, PSN_MASK, Opcode, Packet, Payload

from .completer import acked, fast_read_middle, read_run, read_run_done
from .context import QpContext
from .memory import ProtectionDomain
from .requester import Requester
from .resp_runs import fast_middle, send_run, send_run_done, write_run, write_run_done, write_target
from .responder import Responder
from .send_wqe import ATOMIC, POSTED, SEND_WRITE
from .stats import QpStats
from .types import Access

_RR_MIDDLE = Opcode.RDMA_READ_RESPONSE_MIDDLE
_WRITE_MIDDLE = Opcode.RDMA_WRITE_MIDDLE
_SEND_MIDDLE = Opcode.SEND_MIDDLE
_WRITE_ONLY = Opcode.RDMA_WRITE_ONLY
_READ_REQUEST = Opcode.RDMA_READ_REQUEST
_REMOTE_READ = int(Access.REMOTE_READ)
_ACK = Opcode.ACKNOWLEDGE
_ATOMIC_ACK = Opcode.ATOMIC_ACKNOWLEDGE
_RR_ONLY = Opcode.RDMA_READ_RESPONSE_ONLY
_MASK, _HALF = PSN_MASK, PSN_HALF
#: The one-packet responses ``rx_small_resp`` serves (the native data plane's ``small_response``).
SMALL_RESPONSES = frozenset((_ACK, _ATOMIC_ACK, _RR_ONLY))
#: The one-packet requests ``rx_small`` serves (the native data plane's ``small_request``).
SMALL_REQUESTS = frozenset((_WRITE_ONLY, _READ_REQUEST, Opcode.COMPARE_SWAP, Opcode.FETCH_ADD))


class BulkReceive:
    """The bulk receive interfaces of ``QueuePair`` (its base class)."""

    req: Requester
    resp: Responder
    stats: QpStats
    #: Receives requests / runs the requester / takes the fast paths (see ``QueuePair``).
    _rx: bool
    _tx: bool
    _fast: bool
    access_bits: int
    pd: ProtectionDomain

    #: Takes the responder back from a native owner (``armed.ArmedResponder.disarm``).
    disarm: Callable[[], None]

    def receive_middle(self, opcode: int, psn: int, ackreq: bool, payload: Payload, now: float) -> bool:
        """The fast path of ``receive`` for a MIDDLE packet (WRITE, SEND, READ response).

        For transports that have not built a ``Packet``: the packet is
        addressed to this QP, has a valid P_Key and TVer, no extension headers
        and no pad. If it is the next in-order packet of the message under
        way, it is placed and True returned, with the same effect as
        ``receive``. Otherwise nothing happens and False is returned: decode
        it and call ``receive``.
        """
        if not self._fast or not self._rx:
            return False
        if opcode != _RR_MIDDLE:
            self.disarm()
        if opcode == _RR_MIDDLE:
            if not self._tx or not fast_read_middle(self.req, psn, payload, now):
                return False
        elif opcode not in MIDDLE_OPCODES or not fast_middle(self.resp, opcode, psn, ackreq, payload):
            return False
        self.stats.packets_in += 1
        return True

    def rx_run(self, opcode: int) -> tuple[int, memoryview, int, int, int] | None:
        """Where a run of in-order MIDDLE packets of ``opcode`` would go, for bulk placement.

        For transports that check and place many packets in one step (the
        native UDP data plane): ``(first PSN, target memory, offset, most
        packets, MTU)``. Packet ``i`` of the run must be the MIDDLE with PSN
        ``first + i``, a P_Key, TVer, pad and length as ``receive_middle``
        takes them, and its payload goes to ``memory[offset + i*MTU:]``. Then
        call ``rx_run_done``: the effect is that of ``receive_middle`` for each.
        None: such packets take the per-packet path now.
        """
        if not self._fast or not self._rx:
            return None
        if opcode != _RR_MIDDLE:
            self.disarm()
        if opcode == _WRITE_MIDDLE:
            return write_run(self.resp)
        if opcode == _SEND_MIDDLE:
            return send_run(self.resp)
        if opcode == _RR_MIDDLE and self._tx:
            return read_run(self.req)
        return None

    def rx_place(self, pkt: Packet, plen: int) -> memoryview | None:
        """Where ``plen`` payload bytes of the request ``pkt`` (headers only) will land, for
        transports that receive a payload straight into place (see ``resp_runs.write_target``)."""
        if not self._fast or not self._rx:
            return None
        self.disarm()
        return write_target(self.resp, pkt, plen)

    def rx_small(self) -> tuple[int, int, int, bool, dict[int, tuple[int, int, int, memoryview]]] | None:
        """What a one-packet request must match for a transport to check and execute it.

        For the native data plane's ``small_request``: ``(expected PSN, MTU,
        the QP's access bits, responder resources exist, the PD's R_Key table
        (``ProtectionDomain.remote_table``))``. The request must be an RDMA
        WRITE ONLY without immediate, a READ request, COMPARE SWAP or FETCH
        ADD with that PSN, pass every check of ``Responder.on_request`` and
        ``receive`` (P_Key, QPN, access, length, R_Key) and be executed (the
        WRITE's payload placed, the atomic done on the u64); then call
        ``rx_small_done``. None: requests take ``receive`` now (between
        messages only: the ONLY after a FIRST is the generic path's error).
        """
        if not self._fast or not self._rx:
            return None
        self.disarm()
        resp = self.resp
        if resp.in_msg is not None:
            return None
        return resp.psn, resp.mtu, self.access_bits, bool(resp.res.ring), self.pd.remote_table

    def rx_small_done(
        self, op: int, psn: int, ackreq: int, rkey: int, va: int, length: int, orig: int
    ) -> None:
        """The request ``rx_small`` described was checked and executed: ``receive``'s effect.

        ``orig``: an atomic's original value; a READ's data is sliced here.
        """
        resp = self.resp
        resp.sent_psn_nak = False
        if op == _WRITE_ONLY:
            resp.write_only_executed(psn, rkey, va, length, bool(ackreq))
        elif op == _READ_REQUEST:
            view = self.pd.remote_slice(rkey, va, length, _REMOTE_READ) if length else None
            resp.read_executed(psn, rkey, va, length, view)
        else:
            resp.atomic_executed(psn, orig)
        self.stats.packets_in += 1

    def rx_small_resp(self) -> tuple[int, int, int, memoryview | None, int] | None:
        """What the one-packet response that completes the head of the send queue must match,
        for a transport to check it (and place its data) itself: ``small_response``'s ticket.

        ``(opcode, PSN, payload length, where its data goes, MTU)``: an ACKNOWLEDGE (ACK
        syndrome) at the head SEND/WRITE's last PSN; an RDMA READ RESPONSE ONLY carrying the
        head READ's bytes (all of them, at most an MTU) into its one buffer; an ATOMIC
        ACKNOWLEDGE whose original value goes to the head atomic's 8-byte buffer (this
        host's byte order). Every other check of ``receive`` and ``on_response`` must pass
        (P_Key, QPN, syndrome, length); then call ``rx_small_resp_done``. None: responses
        take ``receive`` now.
        """
        if not self._fast or not self._tx:
            return None
        req = self.req
        sq = req.sq
        if not sq or req.comp_opcode is not None:
            return None
        wqe = sq[0]
        if wqe.state == POSTED or not wqe.started or wqe.status:
            return None
        last = wqe.last_psn
        if (last - req.sent_hwm) & _MASK < _HALF:
            return None  # its last packet is not out yet
        kind = wqe.kind
        if kind == SEND_WRITE:
            if (last - req.comp_psn) & _MASK >= _HALF:
                return None
            return _ACK, last, 0, None, req.mtu
        if req.comp_psn != wqe.first_psn or wqe.read_done:
            return None
        seg0 = wqe.seg0
        if kind == ATOMIC:
            if seg0 is None or len(seg0) != 8:
                return None
            return _ATOMIC_ACK, last, 8, seg0, req.mtu
        rest = wqe.length
        if rest > req.mtu or (seg0 is None and rest):
            return None
        return _RR_ONLY, last, rest, seg0, req.mtu

    def rx_small_resp_done(self, op: int, psn: int, now: float, segment: Payload) -> None:
        """The response ``rx_small_resp`` described was checked and its data placed: ``receive``'s
        effect. ``segment`` is that response (BTH first), for the end-to-end credits its AETH
        carries (:mod:`.credits`; ``small_response`` checked that the syndrome is of kind ACK)."""
        req = self.req
        credits = req.credits
        if not credits.unlimited:
            aeth = memoryview(segment).cast("B")[BTH_LEN : BTH_LEN + 4]
            credits.on_ack(aeth[0], int.from_bytes(aeth[1:]))
        if op == _RR_ONLY:
            req.sq[0].read_done = req.sq[0].length
        acked(cast(QpContext, self), req, psn, True, now)
        if self._tx:
            req.restart_timer(now)
        self.stats.packets_in += 1

    def rx_run_done(self, opcode: int, count: int, last_ackreq: int, now: float) -> None:
        """``count`` packets of the run ``rx_run`` described were placed (``last_ackreq``: see Train)."""
        if opcode == _RR_MIDDLE:
            read_run_done(self.req, count, now)
        elif opcode == _SEND_MIDDLE:
            send_run_done(self.resp, count, last_ackreq)
        else:
            write_run_done(self.resp, count, last_ackreq)
        self.stats.packets_in += count
