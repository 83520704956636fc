"""A posted receive work request (``ibv_recv_wr``) as the responder fills it."""

from .errors import EngineError
from .memory import ProtectionDomain
from .types import RecvWR

__all__ = ["RecvWqe"]


class RecvWqe:
    """A posted receive work request; ``segs`` is None if an SGE failed its L_Key check."""

    __slots__ = ("length", "segs", "wr_id")

    def __init__(self, wr_id: int, segs: list[memoryview] | None, length: int) -> None:
        self.wr_id = wr_id
        self.segs = segs
        self.length = length

    @classmethod
    def resolve(cls, pd: ProtectionDomain, wr: RecvWR) -> "RecvWqe":
        """`wr`'s WQE, its SGEs resolved in `pd` now (a bad one fails when a message lands in it)."""
        segs: list[memoryview] | None = []
        length = 0
        local_slice = pd.local_slice
        for sge in wr.sg_list:
            if sge.length < 0:
                raise EngineError("INVALID_VALUE", f"negative SGE length {sge.length}")
            length += sge.length
            view = local_slice(sge, True)
            if view is None:
                segs = None
            elif segs is not None and len(view):
                segs.append(view)
        return cls(wr.wr_id, segs, length)
