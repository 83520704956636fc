"""The RC queue pair state machine as data (IBTA Vol. 1 §10.3.1, §11.2.5.2).

``TRANSITIONS`` maps ``(from_state, to_state)`` to the attributes that
``QueuePair.modify`` requires and those it accepts (fields of
``attrs.ModifyAttrs``, applied by the table ``attrs.ATTRS``). It is the RC column of
Linux's ``qp_state_table`` (``drivers/infiniband/core/verbs.c``,
``ib_modify_qp_is_ok()``; pyverbs ``qp.pyx`` ``_get_comp_mask``), with
attribute names of this API:

=====================  =====================================
verbs mask             ``ModifyAttrs`` field
=====================  =====================================
IBV_QP_PORT            ``port``
IBV_QP_PKEY_INDEX      ``pkey_index``
IBV_QP_ACCESS_FLAGS    ``access``
IBV_QP_AV              ``remote`` (opaque peer address)
IBV_QP_PATH_MTU        ``path_mtu`` (bytes)
IBV_QP_DEST_QPN        ``dest_qpn``
IBV_QP_RQ_PSN          ``rq_psn``
IBV_QP_MAX_DEST_RD_ATOMIC ``max_dest_rd_atomic``
IBV_QP_MIN_RNR_TIMER   ``min_rnr_timer``
IBV_QP_TIMEOUT         ``timeout``
IBV_QP_RETRY_CNT       ``retry_cnt``
IBV_QP_RNR_RETRY       ``rnr_retry``
IBV_QP_SQ_PSN          ``sq_psn``
IBV_QP_MAX_QP_RD_ATOMIC ``max_rd_atomic``
IBV_QP_CUR_STATE       ``cur_state``
IBV_QP_EN_SQD_ASYNC_NOTIFY ``en_sqd_async_notify``
=====================  =====================================

Differences from the kernel table, on purpose:

- ``remote`` (the address vector) is optional at INIT->RTR: the engine is
  sans-IO and only carries it for the transport.
- ALT_PATH and PATH_MIG_STATE are absent: RoCE has no automatic path
  migration (Linux ``_ib_modify_qp()`` rejects an alternate path on RoCE).
- RESET->ERR is allowed (IBTA §10.3.1: any state may go to Error; the
  uverbs table allows it too).

A pair that is not a key of ``TRANSITIONS`` is a local misuse.
"""

from dataclasses import dataclass
from enum import IntEnum

from .errors import EngineError


class QpState(IntEnum):
    """QP states (``ibv_qp_state``, rxe's ``IB_QPS_*``; IBTA §10.3.1 figure 124)."""

    RESET = 0  # IB_QPS_RESET (§10.3.1.1)
    INIT = 1  # IB_QPS_INIT, Initialized (§10.3.1.2)
    RTR = 2  # IB_QPS_RTR, Ready To Receive (§10.3.1.3)
    RTS = 3  # IB_QPS_RTS, Ready To Send (§10.3.1.4)
    SQD = 4  # IB_QPS_SQD, Send Queue Drain (§10.3.1.5)
    SQE = 5  # IB_QPS_SQE, Send Queue Error: UC/UD only, RC errors go to ERR (§10.3.1.6)
    ERR = 6  # IB_QPS_ERR (§10.3.1.8)


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    required: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()


def _t(required: str = "", optional: str = "") -> Transition:
    return Transition(required=frozenset(required.split()), optional=frozenset(optional.split()))


_R, _I, _RTR, _RTS, _SQD, _SQE, _E = QpState

TRANSITIONS: dict[tuple[QpState, QpState], Transition] = {
    (_R, _R): _t(),
    (_R, _I): _t("port pkey_index access"),
    (_I, _I): _t(optional="port pkey_index access"),
    (_I, _RTR): _t(
        "path_mtu dest_qpn rq_psn max_dest_rd_atomic min_rnr_timer",
        "remote access pkey_index",
    ),
    (_RTR, _RTS): _t(
        "timeout retry_cnt rnr_retry sq_psn max_rd_atomic",
        "cur_state access min_rnr_timer",
    ),
    (_RTS, _RTS): _t(optional="cur_state access min_rnr_timer"),
    (_RTS, _SQD): _t(optional="en_sqd_async_notify"),
    (_SQD, _RTS): _t(optional="cur_state access min_rnr_timer"),
    (_SQD, _SQD): _t(
        optional="port remote timeout retry_cnt rnr_retry max_rd_atomic max_dest_rd_atomic "
        "access pkey_index min_rnr_timer"
    ),
    (_SQE, _RTS): _t(),
    # IBTA §10.3.1: every state may be reset or moved to Error.
    **{(s, _R): _t() for s in QpState if s is not _R},
    **{(s, _E): _t() for s in QpState},
}

#: Every attribute name the table knows.
ALL_ATTRS: frozenset[str] = frozenset().union(*(t.required | t.optional for t in TRANSITIONS.values()))


def check_transition(cur: QpState, to: QpState, attrs: frozenset[str] | set[str]) -> Transition:
    """The table entry for ``cur -> to``; EngineError if the pair or the attributes don't fit."""
    t = TRANSITIONS.get((cur, to))
    if t is None:
        raise EngineError("BAD_STATE", f"no QP transition {cur.name} -> {to.name} (IBTA §10.3.1)")
    missing = t.required - attrs
    if missing:
        raise EngineError("INVALID_VALUE", f"{cur.name} -> {to.name} requires {', '.join(sorted(missing))}")
    extra = attrs - t.required - t.optional
    if extra:
        raise EngineError(
            "INVALID_VALUE", f"{cur.name} -> {to.name} does not take {', '.join(sorted(extra))}"
        )
    return t
