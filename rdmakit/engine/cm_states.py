"""The IB CM's connection states, events and the table of what each state accepts (IBTA Vol. 1 §12.9).

`CmEndpoint` (:mod:`.cm`) consults `ACCEPTS` for every MAD that names a
connection: a (state, attribute) pair the table does not list is dropped
and counted as unexpected, never guessed at.
"""

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

from rdmakit.wire.cm import CmAttr, CmMad

__all__ = ["ACCEPTS", "CmConnParams", "CmEvent", "CmEventKind", "CmState", "Conn", "response_timeout"]


def response_timeout(exponent: int) -> float:
    """Seconds of a CM response timeout field: 4.096 µs × 2^exponent (IBTA §12.7.24)."""
    return 4.096e-6 * (1 << (exponent & 0x1F))


class CmState(Enum):
    """Connection states (IBTA §12.9.6, Figures 138 and 139)."""

    REQ_SENT = "REQ_SENT"
    REP_RCVD = "REP_RCVD"
    REQ_RCVD = "REQ_RCVD"
    MRA_REQ_SENT = "MRA_REQ_SENT"
    REP_SENT = "REP_SENT"
    ESTABLISHED = "ESTABLISHED"
    DREQ_SENT = "DREQ_SENT"
    TIMEWAIT = "TIMEWAIT"
    CLOSED = "CLOSED"


class CmEventKind(Enum):
    REQ_RECEIVED = "REQ_RECEIVED"  # passive: accept or reject it
    REP_RECEIVED = "REP_RECEIVED"  # active: move the QP to RTS, then send_rtu (or reject)
    ESTABLISHED = "ESTABLISHED"
    REJECTED = "REJECTED"  # the peer's REJ; `reason` says why
    TIMEOUT = "TIMEOUT"  # the peer never answered
    DISCONNECTED = "DISCONNECTED"  # a DREQ or DREP: move the QP to ERROR


@dataclass(frozen=True, slots=True)
class CmEvent:
    kind: CmEventKind
    comm_id: int  # the local communication ID: the connection's handle
    peer: Hashable
    mad: CmMad | None = None  # the REQ, REP, REJ, RTU, DREQ or DREP behind it
    reason: int | None = None  # REJ reason (REJECTED), or TIMEOUT's

    @property
    def private_data(self) -> bytes:
        return self.mad.private_data if self.mad is not None else b""


@dataclass(slots=True)
class CmConnParams:
    """What a REQ or REP says of this side's QP (IBTA Tables 106 and 110)."""

    qpn: int
    starting_psn: int
    responder_resources: int = 1
    initiator_depth: int = 1
    retry_count: int = 7
    rnr_retry_count: int = 7
    path_mtu: int = 3  # IBTA encoding: 1=256 … 5=4096
    local_ack_timeout: int = 14
    pkey: int = 0xFFFF
    local_gid: int = 0
    remote_gid: int = 0
    hop_limit: int = 64
    traffic_class: int = 0
    flow_label: int = 0
    private_data: bytes = b""


@dataclass(slots=True)
class Conn:
    local_id: int
    peer: Hashable
    active: bool
    state: CmState
    tid: int
    remote_id: int = 0
    remote_qpn: int = -1
    remote_guid: int = 0
    service_id: int = 0
    last: CmMad | None = None  # what a retransmission or a duplicate gets
    retries: int = 0
    deadline: float | None = None
    stats: dict[str, int] = field(default_factory=dict)


#: (state, attribute) -> handler name; anything else is dropped as unexpected.
ACCEPTS: dict[tuple[CmState, CmAttr], str] = {
    (CmState.REQ_SENT, CmAttr.REP): "_on_rep",
    (CmState.REQ_SENT, CmAttr.MRA): "_on_mra",
    (CmState.REQ_SENT, CmAttr.REJ): "_on_rej",
    (CmState.REP_RCVD, CmAttr.REP): "_ignore",  # the user has not answered yet
    (CmState.REP_RCVD, CmAttr.REJ): "_on_rej",
    (CmState.REQ_RCVD, CmAttr.REJ): "_on_rej",
    (CmState.MRA_REQ_SENT, CmAttr.REJ): "_on_rej",
    (CmState.REP_SENT, CmAttr.RTU): "_on_rtu",
    (CmState.REP_SENT, CmAttr.MRA): "_on_mra",
    (CmState.REP_SENT, CmAttr.REJ): "_on_rej",
    (CmState.REP_SENT, CmAttr.DREQ): "_on_dreq",  # the RTU was lost: the DREQ implies it
    (CmState.ESTABLISHED, CmAttr.REP): "_resend",  # our RTU was lost
    (CmState.ESTABLISHED, CmAttr.RTU): "_ignore",
    (CmState.ESTABLISHED, CmAttr.DREQ): "_on_dreq",
    (CmState.ESTABLISHED, CmAttr.REJ): "_on_rej",  # the passive side timed out waiting for our RTU
    (CmState.DREQ_SENT, CmAttr.DREP): "_on_drep",
    (CmState.DREQ_SENT, CmAttr.DREQ): "_on_dreq",  # both sides disconnect at once
    (CmState.TIMEWAIT, CmAttr.DREQ): "_answer_dreq",  # our DREP was lost
    (CmState.TIMEWAIT, CmAttr.DREP): "_ignore",
    (CmState.TIMEWAIT, CmAttr.REP): "_resend_rej",  # we refused the REP and the REJ was lost
}
