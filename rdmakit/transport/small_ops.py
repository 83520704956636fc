"""The native one-packet paths, one segment at a time: the UDP port's and the simulated network's.

Sending, ``SmallTxQP.tx_small`` gives the one request a QP's requester has
when that is the whole of its work (``rdmakit.engine.small_tx``), and the
segment codec's ``send_packet`` builds its headers and ICRC and sends it in
one call. Receiving:

A segment whose opcode the engine's one-packet interfaces serve is offered
to the segment codec with the engine's ticket (``QueuePair.rx_small`` for a
request, ``rx_small_resp`` for the response that completes a send); when the
codec took it, the engine takes the effect (``rx_small_done``,
``rx_small_resp_done``). Anything else is left to the generic path.
"""

from typing import Protocol, cast

from rdmakit.engine.armed import ArmTicket, NativeResponder
from rdmakit.engine.armed_req import AckLog, NativeRequester, ReqTicket
from rdmakit.engine.bulk import SMALL_REQUESTS, SMALL_RESPONSES
from rdmakit.wire import IcrcFlow, Opcode, Packet, Payload

from .codec import ArmedOwner, SegmentCodec, SmallRespTicket, SmallTicket


class SmallQP(Protocol):
    """What the one-packet paths need of an engine QP (``rdmakit.engine.QueuePair`` fits)."""

    @property
    def qpn(self) -> int: ...
    def rx_small(self) -> SmallTicket | None: ...
    def rx_small_done(
        self, op: int, psn: int, ackreq: int, rkey: int, va: int, length: int, orig: int
    ) -> None: ...
    def rx_small_resp(self) -> SmallRespTicket | None: ...
    def rx_small_resp_done(self, op: int, psn: int, now: float, segment: Payload) -> None: ...
    @property
    def native(self) -> NativeResponder | None: ...
    def arm_ticket(self) -> ArmTicket | None: ...
    def arm(self, owner: NativeResponder) -> None: ...
    def reply_unpaced(self) -> bool: ...
    def reply_sent(self, n: int, now: float) -> None: ...

    req_native: NativeRequester | None

    def arm_req_ticket(self) -> ReqTicket | None: ...
    def acks_taken(self, log: AckLog) -> None: ...


class SmallTxQP(Protocol):
    """What the one-packet send path needs of an engine QP (``rdmakit.engine.QueuePair`` fits)."""

    def tx_small(self, now: float) -> Packet | None: ...


#: The requests an armed responder executes (``_fastpath.Armed``): RDMA WRITE without immediate,
#: RDMA READ and the atomics.
ARMED_OPS = frozenset((
    Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE, Opcode.RDMA_WRITE_LAST, Opcode.RDMA_WRITE_ONLY,
    Opcode.RDMA_READ_REQUEST, Opcode.COMPARE_SWAP, Opcode.FETCH_ADD,
))  # fmt: skip
#: What ``take_small`` answers when the armed responder executed a request of an opcode not 3.
_ARMED_TOOK: dict[int, int] = {Opcode.RDMA_READ_REQUEST: 5, Opcode.COMPARE_SWAP: 6, Opcode.FETCH_ADD: 6}
_ACK = Opcode.ACKNOWLEDGE
#: The opcodes worth offering (a set test before any ticket is built).
OFFERED = SMALL_REQUESTS | SMALL_RESPONSES | ARMED_OPS


def take_small(
    codec: SegmentCodec,
    qp: SmallQP,
    op: int,
    seg: Payload,
    idx: int,
    states: dict[int, int],
    flow: IcrcFlow,
    now: float,
) -> int:
    """Offer segment ``idx`` (opcode ``op``, already addressed to ``qp``) to the one-packet paths.

    1: a request was executed; 2: a response completed a send; 3: an RDMA WRITE FIRST,
    MIDDLE, LAST or ONLY was executed by the QP's armed responder (armed here if it may
    be, ``codec.arm``); 4: an ACK retired SEND/WRITE WQEs natively (``codec.arm_req``; the
    engine then takes its log, ``acks_taken``); 5: an RDMA READ was executed by the armed
    responder, which holds its responses; 6: an atomic was, and it holds the ATOMIC
    ACKNOWLEDGE; 0: not taken (nothing done: the generic path takes the segment).
    """
    if op == _ACK and (arm_req := codec.arm_req) is not None:
        rowner = qp.req_native
        if rowner is None and (rqt := qp.arm_req_ticket()) is not None:
            rowner = qp.req_native = arm_req(*rqt)
        if rowner is not None and rowner.rx(seg, idx, states, flow, now):
            qp.acks_taken(rowner.take())
            return 4
    if op in ARMED_OPS and (arm := codec.arm) is not None:
        owner = cast("ArmedOwner | None", qp.native)  # this transport's own, if any
        if owner is None and (armt := qp.arm_ticket()) is not None:
            owner = arm(*armt)
            qp.arm(owner)
        if owner is not None and owner.rx(seg, idx, states, flow):
            return _ARMED_TOOK.get(op, 3)
    if op in SMALL_REQUESTS:
        small = codec.small_request
        if small is None or (ticket := qp.rx_small()) is None:
            return 0
        done = small(seg, idx, states, flow, qp.qpn, ticket)
        if type(done) is not tuple:
            return 0
        qp.rx_small_done(*done)
        return 1
    if op in SMALL_RESPONSES:
        small_resp = codec.small_response
        if small_resp is None or (rt := qp.rx_small_resp()) is None:
            return 0
        got = small_resp(seg, idx, states, flow, qp.qpn, rt)
        if type(got) is not tuple:
            return 0
        qp.rx_small_resp_done(got[0], got[1], now, seg)
        return 2
    return 0
