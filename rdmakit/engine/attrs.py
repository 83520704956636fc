"""``QueuePair.modify``'s attributes: their values, their checks and where each one lands.

``ModifyAttrs`` carries the attributes of one modify (``ibv_qp_attr``); a
field left None is not given (the verbs ``attr_mask``). Which ones a
transition requires and takes is ``states.TRANSITIONS``. ``ATTRS`` is the
table of the rest, per attribute: its value check (IBTA §11.2.5.2; rxe
``rxe_qp_chk_attr()``), what setting it does to the requester and responder
(rxe ``rxe_qp_from_attr()``), and whether ``QueuePair.attrs`` reports it.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Protocol

from rdmakit.wire import PSN_MASK

from .errors import EngineError
from .requester import Requester
from .responder import Responder
from .states import QpState
from .timers import IB_MTUS, MAX_LARGE_MTU, MAX_RD_ATOMIC, round_rd_atomic
from .types import Access, QpCaps

_ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
#: QPNs and PSNs are 24-bit (IBTA §9.2 BTH).
_U24 = PSN_MASK


@dataclass(frozen=True, slots=True, kw_only=True)
class ModifyAttrs:
    """The attributes of one ``QueuePair.modify`` (``ibv_qp_attr``); None: not given.

    Names and verbs masks: the table in :mod:`.states`. ``path_mtu`` is in bytes;
    ``remote`` is the transport's opaque peer address (the address vector).
    """

    port: int | None = None
    pkey_index: int | None = None
    access: int | None = None
    remote: object = None
    path_mtu: int | None = None
    dest_qpn: int | None = None
    rq_psn: int | None = None
    max_dest_rd_atomic: int | None = None
    min_rnr_timer: int | None = None
    timeout: int | None = None
    retry_cnt: int | None = None
    rnr_retry: int | None = None
    sq_psn: int | None = None
    max_rd_atomic: int | None = None
    cur_state: QpState | None = None
    en_sqd_async_notify: bool | None = None

    def given(self) -> tuple[str, ...]:
        """The names of the attributes given, in field order (the verbs ``attr_mask``)."""
        return tuple(name for name in MODIFY_FIELDS if getattr(self, name) is not None)


MODIFY_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ModifyAttrs))


@dataclass(frozen=True, slots=True, kw_only=True)
class QpAttrs:
    """The QP's attributes as last modified (``ibv_query_qp``); None where never set."""

    state: QpState
    port: int | None = None
    pkey_index: int | None = None
    access: Access | None = None
    remote: object = None
    path_mtu: int | None = None
    dest_qpn: int | None = None
    rq_psn: int | None = None
    max_dest_rd_atomic: int | None = None
    min_rnr_timer: int | None = None
    timeout: int | None = None
    retry_cnt: int | None = None
    rnr_retry: int | None = None
    sq_psn: int | None = None
    max_rd_atomic: int | None = None
    en_sqd_async_notify: bool | None = None
    sq_draining: bool = False


class Modifiable(Protocol):
    """The queue pair as ``modify`` sees it."""

    @property
    def caps(self) -> QpCaps: ...
    @property
    def state(self) -> QpState: ...
    @property
    def req(self) -> Requester: ...
    @property
    def resp(self) -> Responder: ...

    dest_qpn: int
    access: Access
    access_bits: int
    remote: object


Check = Callable[[Modifiable, Any], Any]


def _int_range(name: str, lo: int, hi: int) -> Check:
    def check(qp: Modifiable, v: Any) -> int:
        if type(v) is bool or not isinstance(v, int) or not lo <= v <= hi:
            raise EngineError("INVALID_VALUE", f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
        return int(v)

    return check


def _check_mtu(qp: Modifiable, v: Any) -> int:
    ok = isinstance(v, int) and type(v) is not bool
    if ok and qp.caps.large_mtu:
        ok = 256 <= v <= MAX_LARGE_MTU and v & (v - 1) == 0
    elif ok:
        ok = v in IB_MTUS
    if not ok:
        allowed = "a power of two in [256, 2**20]" if qp.caps.large_mtu else f"one of {IB_MTUS}"
        raise EngineError("INVALID_VALUE", f"path_mtu is in bytes, {allowed}; got {v!r}")
    return int(v)


def _check_access(qp: Modifiable, v: Any) -> Access:
    if type(v) is bool or not isinstance(v, int) or int(v) & ~int(_ALL_ACCESS):
        raise EngineError("INVALID_VALUE", f"access must be Access flags, got {v!r}")
    return Access(v)


def _check_cur_state(qp: Modifiable, v: Any) -> QpState:
    if v != qp.state:
        raise EngineError("INVALID_VALUE", f"cur_state {v!r} is not the QP's state {qp.state.name}")
    return QpState(v)


def _check_rd_atomic(name: str) -> Check:
    inner = _int_range(name, 0, MAX_RD_ATOMIC)

    def check(qp: Modifiable, v: Any) -> int:
        return round_rd_atomic(inner(qp, v))

    return check


def _any(qp: Modifiable, v: Any) -> Any:
    return v


def _flag(qp: Modifiable, v: Any) -> bool:
    return bool(v)


def _nothing(qp: Modifiable, v: Any) -> None:
    """Recorded for ``QueuePair.attrs`` only: the engine has one port and P_Key, no SQD events."""


def _set_mtu(qp: Modifiable, v: int) -> None:
    qp.req.mtu = qp.resp.mtu = v


def _set_dest_qpn(qp: Modifiable, v: int) -> None:
    qp.dest_qpn = v


def _set_access(qp: Modifiable, v: Access) -> None:
    qp.access = v
    qp.access_bits = int(v)


def _set_remote(qp: Modifiable, v: object) -> None:
    qp.remote = v


def _set_rq_psn(qp: Modifiable, v: int) -> None:
    qp.resp.configure(rq_psn=v)


def _set_sq_psn(qp: Modifiable, v: int) -> None:
    qp.req.set_psn(v)


def _set_max_dest_rd_atomic(qp: Modifiable, v: int) -> None:
    qp.resp.res.configure(v)


def _set_max_rd_atomic(qp: Modifiable, v: int) -> None:
    qp.req.max_rd_atomic = v


def _set_min_rnr_timer(qp: Modifiable, v: int) -> None:
    qp.resp.min_rnr_timer = v


def _set_timeout(qp: Modifiable, v: int) -> None:
    qp.req.set_timeout(v)


def _set_retry_cnt(qp: Modifiable, v: int) -> None:
    qp.req.retry_cnt = qp.req.retry_left = v


def _set_rnr_retry(qp: Modifiable, v: int) -> None:
    qp.req.rnr_retry = qp.req.rnr_left = v


class Attr(NamedTuple):
    """One attribute: its check (value -> the value kept), its effect, and whether ``attrs`` reports it."""

    check: Check
    apply: Callable[[Modifiable, Any], None]
    reported: bool = True


ATTRS: dict[str, Attr] = {
    "port": Attr(_int_range("port", 1, 255), _nothing),
    "pkey_index": Attr(_int_range("pkey_index", 0, 63), _nothing),
    "access": Attr(_check_access, _set_access),
    "remote": Attr(_any, _set_remote),
    "path_mtu": Attr(_check_mtu, _set_mtu),
    "dest_qpn": Attr(_int_range("dest_qpn", 1, _U24), _set_dest_qpn),
    "rq_psn": Attr(_int_range("rq_psn", 0, _U24), _set_rq_psn),
    "max_dest_rd_atomic": Attr(_check_rd_atomic("max_dest_rd_atomic"), _set_max_dest_rd_atomic),
    "min_rnr_timer": Attr(_int_range("min_rnr_timer", 0, 31), _set_min_rnr_timer),
    "timeout": Attr(_int_range("timeout", 0, 31), _set_timeout),
    "retry_cnt": Attr(_int_range("retry_cnt", 0, 7), _set_retry_cnt),
    "rnr_retry": Attr(_int_range("rnr_retry", 0, 7), _set_rnr_retry),
    "sq_psn": Attr(_int_range("sq_psn", 0, _U24), _set_sq_psn),
    "max_rd_atomic": Attr(_check_rd_atomic("max_rd_atomic"), _set_max_rd_atomic),
    # Checked against the QP's state, never kept (verbs IBV_QP_CUR_STATE).
    "cur_state": Attr(_check_cur_state, _nothing, reported=False),
    "en_sqd_async_notify": Attr(_flag, _nothing),
}
