"""pyverbs calls with their failures as `VerbsError`, and pyverbs SGEs (shared by the verbs objects)."""

from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol, TypeVar

from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.wr import SGE as PvSGE

from rdmakit.verbs.errors import ErrorCode, VerbsError, code_for_errno
from rdmakit.verbs.mr import VerbsMR

__all__ = ["HasZeroMR", "call", "pv_sges", "reraise"]

_T = TypeVar("_T")


class HasZeroMR(Protocol):
    """A device's zero-length registration, the SGE of an empty work request."""

    @property
    def zero_mr(self) -> VerbsMR: ...


def reraise(exc: PyverbsError, what: str, code: ErrorCode | None = None) -> NoReturn:
    """Re-raise a pyverbs failure as a `VerbsError` (``from exc``)."""
    if isinstance(exc, PyverbsRDMAError):
        err = getattr(exc, "error_code", None)
        err = abs(err) if isinstance(err, int) else None
        found, fault = code_for_errno(err)
        raise VerbsError(code or found, f"{what}: {exc}", fault, err) from exc
    raise VerbsError(code or "INVALID_VALUE", f"{what}: {exc}") from exc


def call(what: str, fn: Callable[[], _T]) -> _T:
    try:
        return fn()
    except PyverbsError as e:
        reraise(e, what)


def pv_sges(dev: "HasZeroMR", sg_list: Sequence[tuple[int, int, int]]) -> list[PvSGE]:
    """pyverbs SGEs of `sg_list`; an empty list is one zero-length SGE of `dev`'s zero MR."""
    if not sg_list:
        z = dev.zero_mr
        return [PvSGE(z.addr, 0, z.lkey)]
    return [PvSGE(addr, length, lkey) for addr, length, lkey in sg_list]
