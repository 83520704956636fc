"""The shared receive queue (IBTA Vol. 1 §10.2.9, ``ibv_create_srq``(3); rxe ``rxe_srq.c``).

One queue of receive WQEs that several RC queue pairs of one protection
domain take from: a QP created with ``srq=`` (``ibv_qp_init_attr.srq``) has no
receive queue of its own. The rules, each as rxe and ``libibverbs`` have them:

- `SharedReceiveQueue.post_recv` (``ibv_post_srq_recv``): at most ``max_wr``
  WQEs outstanding (FULL; rxe ``post_one_recv`` -ENOMEM), at most ``max_sge``
  SGEs each (INVALID_VALUE). SGEs are checked against the PD when a message
  lands, as on a QP's own receive queue.
- A QP attached to an SRQ refuses ``post_recv`` (INVALID_VALUE; rxe
  ``rxe_post_recv``: "if (qp->srq) return -EINVAL").
- A message takes the head WQE when its first packet needs one (SEND
  FIRST/ONLY, WRITE with immediate LAST/ONLY), in arrival order across the
  QPs; its completion goes to the receiving QP's CQ with that QP's number
  (``ibv_wc.qp_num``), which is how a consumer tells the QPs apart
  (IBTA §11.4.2.1). With the SRQ empty the QP answers RNR NAK (rxe
  ``check_resource``).
- The limit (``ibv_modify_srq`` IBV_SRQ_LIMIT, IBTA §10.2.9.3, §11.6.3.1):
  once armed with a limit above 0, the first take that leaves fewer WQEs
  than the limit raises one `SrqEventKind.LIMIT_REACHED` and disarms (rxe
  ``get_srq_wqe``). A limit above ``max_wr`` is INVALID_VALUE (rxe
  ``rxe_srq_chk_attr``). Arming never raises an event by itself, as in rxe.
- A QP moving to the Error state flushes only the WQE it was filling; the
  SRQ's WQEs stay for the other QPs ("If the QP is associated with an SRQ,
  the WRs in the SRQ won't be flushed", ``ibv_modify_qp``(3)), and the
  SRQ reports `SrqEventKind.LAST_WQE_REACHED` for it (IBTA §11.6.3.1,
  IBV_EVENT_QP_LAST_WQE_REACHED).
- `close` (``ibv_destroy_srq``) while a QP is attached is IN_USE (EBUSY);
  `detach` is what destroying the QP does.

Events are small frozen values queued on the SRQ and read with
`poll_events`, never callbacks: the engine stays sans-IO.
"""

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from .errors import EngineError
from .memory import ProtectionDomain
from .rwqe import RecvWqe
from .types import RecvWR


class _Attached(Protocol):
    """What the SRQ knows of a QP attached to it."""

    @property
    def qpn(self) -> int: ...
    @property
    def pd(self) -> ProtectionDomain: ...


__all__ = ["SharedReceiveQueue", "SrqEvent", "SrqEventKind"]

#: The largest SRQ the engine makes (``ibv_device_attr`` max_srq_wr, max_srq_sge of a soft device).
MAX_SRQ_WR = 1 << 16
MAX_SRQ_SGE = 16


class SrqEventKind(Enum):
    """The SRQ's asynchronous events (``enum ibv_event_type``; IBTA §11.6.3.1)."""

    LIMIT_REACHED = "srq_limit_reached"  # IBV_EVENT_SRQ_LIMIT_REACHED: fewer WQEs than the armed limit
    LAST_WQE_REACHED = "qp_last_wqe_reached"  # IBV_EVENT_QP_LAST_WQE_REACHED: the QP took its last WQE


@dataclass(frozen=True, slots=True, kw_only=True)
class SrqEvent:
    """One asynchronous event; ``qpn`` names the QP of a LAST_WQE_REACHED, 0 otherwise."""

    kind: SrqEventKind
    qpn: int = 0


class SharedReceiveQueue:
    """An SRQ (``ibv_srq``): receive WQEs shared by the RC QPs attached to it."""

    def __init__(self, pd: ProtectionDomain, *, max_wr: int, max_sge: int = 1, srq_limit: int = 0) -> None:
        if not 1 <= max_wr <= MAX_SRQ_WR:
            raise EngineError("INVALID_VALUE", f"max_wr must be in [1, {MAX_SRQ_WR}], got {max_wr}")
        if not 1 <= max_sge <= MAX_SRQ_SGE:
            raise EngineError("INVALID_VALUE", f"max_sge must be in [1, {MAX_SRQ_SGE}], got {max_sge}")
        self.pd = pd
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.rq: deque[RecvWqe] = deque()
        self._limit = 0
        self._events: deque[SrqEvent] = deque()
        self._qps: dict[int, _Attached] = {}
        self.closed = False
        self.arm(srq_limit)

    def __repr__(self) -> str:
        return f"<SharedReceiveQueue wqes={len(self.rq)}/{self.max_wr} qps={len(self._qps)}>"

    @property
    def limit(self) -> int:
        """The armed limit (``ibv_query_srq`` srq_limit); 0 once it fired or was never armed."""
        return self._limit

    @property
    def qps(self) -> tuple[_Attached, ...]:
        return tuple(self._qps.values())

    def arm(self, limit: int) -> None:
        """``ibv_modify_srq(IBV_SRQ_LIMIT)``: raise LIMIT_REACHED once fewer than `limit` WQEs remain."""
        if not 0 <= limit <= self.max_wr:
            raise EngineError("INVALID_VALUE", f"srq_limit {limit} is not in [0, max_wr={self.max_wr}]")
        self._limit = limit

    def post_recv(self, wr: RecvWR) -> None:
        """``ibv_post_srq_recv``: one WQE at the tail."""
        if self.closed:
            raise EngineError("BAD_STATE", "the SRQ is destroyed")
        if len(wr.sg_list) > self.max_sge:
            raise EngineError("INVALID_VALUE", f"{len(wr.sg_list)} SGEs, the SRQ's max_sge is {self.max_sge}")
        if len(self.rq) >= self.max_wr:
            raise EngineError("FULL", f"the SRQ holds max_wr={self.max_wr} requests")
        self.rq.append(RecvWqe.resolve(self.pd, wr))

    def poll_events(self) -> list[SrqEvent]:
        """The events since the last call, oldest first."""
        out = list(self._events)
        self._events.clear()
        return out

    # -- the engine's side --

    def attach(self, qp: _Attached) -> None:
        """`qp` takes its receive WQEs from here (its PD must be the SRQ's, IBTA §10.2.9)."""
        if self.closed:
            raise EngineError("BAD_STATE", "the SRQ is destroyed")
        if qp.pd is not self.pd:
            raise EngineError("INVALID_VALUE", "a QP and its SRQ must be in one protection domain")
        self._qps[qp.qpn] = qp

    def detach(self, qp: _Attached) -> None:
        """`qp` was destroyed; idempotent."""
        if self._qps.get(qp.qpn) is qp:
            del self._qps[qp.qpn]

    def taken(self) -> None:
        """A QP took the head WQE (rxe ``get_srq_wqe``): the limit event, once, if armed and crossed."""
        if self._limit and len(self.rq) < self._limit:
            self._limit = 0
            self._events.append(SrqEvent(kind=SrqEventKind.LIMIT_REACHED))

    def qp_flushed(self, qpn: int) -> None:
        """The QP `qpn` entered the Error state: it takes no more WQEs (IBTA §11.6.3.1)."""
        self._events.append(SrqEvent(kind=SrqEventKind.LAST_WQE_REACHED, qpn=qpn))

    def close(self) -> None:
        """``ibv_destroy_srq``: IN_USE while a QP is attached; the WQEs are dropped. Idempotent."""
        if self._qps:
            raise EngineError("IN_USE", f"{len(self._qps)} QPs are still attached to the SRQ")
        self.closed = True
        self.rq.clear()
