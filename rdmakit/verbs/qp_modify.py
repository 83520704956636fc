"""One ``ibv_modify_qp`` with exactly the attributes a caller names.

`VerbsQP.connect` picks the attributes of each transition itself. A test agent
(``rdmakit conformance-target``) must set the ones a case asks for instead: a
given starting PSN, local ACK timeout, retry counts, RNR timer, path MTU.
This sets the named attributes and the state, with the mask that says so,
and lets the device refuse what it refuses (IBTA Vol. 1 §11.2.5.2).
"""

from collections.abc import Mapping
from ipaddress import IPv6Address
from typing import Any

from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.qp import QPAttr

from rdmakit.engine.states import QpState
from rdmakit.engine.types import Access
from rdmakit.verbs.attrs import QpAttrMask, gid_text, mtu_enum, qp_access
from rdmakit.verbs.device import VerbsQP
from rdmakit.verbs.pvcall import call as _call

__all__ = ["MIG_STATES", "MODIFIABLE", "modify_qp", "path_mig_state"]

_M = QpAttrMask
#: attribute name -> (``ibv_qp_attr`` field, mask bit)
MODIFIABLE: dict[str, tuple[str, QpAttrMask]] = {
    "port": ("port_num", _M.PORT),
    "pkey_index": ("pkey_index", _M.PKEY_INDEX),
    "access": ("qp_access_flags", _M.ACCESS_FLAGS),
    "path_mtu": ("path_mtu", _M.PATH_MTU),
    "dest_qpn": ("dest_qp_num", _M.DEST_QPN),
    "rq_psn": ("rq_psn", _M.RQ_PSN),
    "max_dest_rd_atomic": ("max_dest_rd_atomic", _M.MAX_DEST_RD_ATOMIC),
    "min_rnr_timer": ("min_rnr_timer", _M.MIN_RNR_TIMER),
    "timeout": ("timeout", _M.TIMEOUT),
    "retry_cnt": ("retry_cnt", _M.RETRY_CNT),
    "rnr_retry": ("rnr_retry", _M.RNR_RETRY),
    "sq_psn": ("sq_psn", _M.SQ_PSN),
    "max_rd_atomic": ("max_rd_atomic", _M.MAX_QP_RD_ATOMIC),
}


def modify_qp(
    qp: VerbsQP,
    to: QpState,
    attrs: Mapping[str, int],
    *,
    dgid: IPv6Address | None = None,
    hop_limit: int = 64,
) -> None:
    """Move `qp` to `to`, setting `attrs` (names of `MODIFIABLE`) and, with `dgid`, the address vector."""
    attr = QPAttr(qp_state=int(to))
    mask = _M.STATE
    for name, value in attrs.items():
        field, bit = MODIFIABLE[name]
        if name == "path_mtu":
            value = mtu_enum(value)
        elif name == "access":
            value = int(qp_access(int(Access(value))))
        setattr(attr, field, value)
        mask |= bit
    if dgid is not None:
        route = GlobalRoute(dgid=GID(gid_text(dgid)), sgid_index=qp.gid_index, hop_limit=hop_limit)
        av: Any = AHAttr(port_num=attrs.get("port", 1), is_global=1, gr=route)
        attr.ah_attr = av
        mask |= _M.AV
    _call(f"ibv_modify_qp -> {to.name}", lambda: qp._qp.modify(attr, int(mask)))


#: ``enum ibv_mig_state`` (``verbs.h``): the APM state machine's states (IBTA Vol. 1 §17.2.8).
MIG_STATES = ("MIGRATED", "REARM", "ARMED")


def path_mig_state(qp: VerbsQP) -> str:
    """`qp`'s path migration state (``ibv_query_qp`` with ``IBV_QP_PATH_MIG_STATE``)."""
    attr, _ = _call("ibv_query_qp", lambda: qp._qp.query(int(_M.PATH_MIG_STATE)))
    v = int(attr.path_mig_state)
    return MIG_STATES[v] if 0 <= v < len(MIG_STATES) else f"UNKNOWN({v})"
