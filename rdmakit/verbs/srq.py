"""A shared receive queue on a verbs device (``ibv_create_srq``(3), IBTA Vol. 1 §10.2.9).

`VerbsSRQ` is the SRQ of one `rdmakit.verbs.device.VerbsDevice`'s protection
domain; `VerbsDevice.create_qp` with ``srq=`` makes an RC QP whose receives
come from it (``ibv_qp_init_attr.srq``). Receives are posted under internal
ids from `rdmakit.verbs.wr.SRQ_FIRST_ID` on, so the QP whose CQ reports one
maps it back to the caller's ``wr_id`` through the SRQ's tracker.
"""

from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from pyverbs.wr import RecvWR as PvRecvWR

from rdmakit.engine.types import RecvWR
from rdmakit.verbs.errors import VerbsError
from rdmakit.verbs.pvcall import HasZeroMR, call, pv_sges, reraise
from rdmakit.verbs.wr import SRQ_FIRST_ID, WrTracker

__all__ = ["VerbsSRQ"]

#: ``IBV_SRQ_LIMIT`` (``enum ibv_srq_attr_mask``).
_SRQ_LIMIT = 1 << 1


class VerbsSRQ:
    """An ``ibv_srq`` of a device's protection domain `pd`; `dev` gives empty receives their SGE."""

    def __init__(self, pd: PD, dev: HasZeroMR, max_wr: int, max_sge: int) -> None:
        self._dev = dev
        self.max_wr = max_wr
        self.max_sge = max_sge
        attr = SrqInitAttr(SrqAttr(max_wr=max_wr, max_sge=max_sge, srq_limit=0))
        self.pv: SRQ = call(f"ibv_create_srq(max_wr={max_wr}, max_sge={max_sge})", lambda: SRQ(pd, attr))
        self.tracker = WrTracker(SRQ_FIRST_ID)
        self._closed = False

    def post_recv(self, wr: RecvWR) -> None:
        """``ibv_post_srq_recv`` of one work request."""
        if self._closed:
            raise VerbsError("BAD_STATE", "the SRQ is destroyed")
        if len(wr.sg_list) > self.max_sge:
            raise VerbsError("INVALID_VALUE", f"{len(wr.sg_list)} SGEs, the SRQ's max_sge is {self.max_sge}")
        sges = pv_sges(self._dev, wr.sg_list)
        iid = self.tracker.post_recv(wr.wr_id)
        try:
            self.pv.post_recv(PvRecvWR(wr_id=iid, num_sge=len(sges), sg=sges))
        except PyverbsError as e:
            self.tracker.unpost(iid)
            full = len(self.tracker) >= self.max_wr
            reraise(
                e,
                "ibv_post_srq_recv: the SRQ is full" if full else "ibv_post_srq_recv",
                "FULL" if full else None,
            )

    def arm(self, limit: int) -> None:
        """``ibv_modify_srq(IBV_SRQ_LIMIT)``: IBV_EVENT_SRQ_LIMIT_REACHED below `limit`."""
        call("ibv_modify_srq", lambda: self.pv.modify(SrqAttr(srq_limit=limit), _SRQ_LIMIT))

    def close(self) -> None:
        """``ibv_destroy_srq``; idempotent."""
        if not self._closed:
            call("ibv_destroy_srq", self.pv.close)
            self._closed = True
