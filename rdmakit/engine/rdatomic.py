"""The responder's resources for READ and atomic requests (rxe ``struct resp_res``).

A ring of ``max_dest_rd_atomic`` slots (IBTA §9.5: responder resources)
remembers each READ and atomic executed, so that a duplicate is replayed
(IBTA §9.9.2.1: a READ's data read again, an atomic's original value sent
again, never executed twice) rather than executed.
"""

from rdmakit.wire import Kind, psn_diff


class RdAtomicResource:
    """A responder resource (rxe ``struct resp_res``): what a duplicate READ or atomic replays."""

    __slots__ = ("first_psn", "kind", "last_psn", "length", "orig", "rkey", "va")

    def __init__(self, kind: Kind, first_psn: int, last_psn: int) -> None:
        self.kind = kind
        self.first_psn = first_psn
        self.last_psn = last_psn
        self.va = 0
        self.length = 0
        self.rkey = 0
        self.orig = 0


class RdAtomicResources:
    """The ring of responder resources (rxe ``qp->resp.resources``, ``res_head``)."""

    __slots__ = ("head", "ring")

    def __init__(self) -> None:
        self.ring: list[RdAtomicResource | None] = []
        self.head = 0

    def configure(self, n: int) -> None:
        """``max_dest_rd_atomic`` slots, all free (rxe ``alloc_rd_atomic_resources()``)."""
        self.ring = [None] * n
        self.head = 0

    def new(self, kind: Kind, first: int, last: int) -> RdAtomicResource:
        """Take the next slot of the ring (rxe ``rxe_prepare_res()``: recycled, not enforced)."""
        res = RdAtomicResource(kind, first, last)
        ring = self.ring
        ring[self.head] = res
        self.head = (self.head + 1) % len(ring)
        return res

    def new_read(self, first: int, last: int, rkey: int, va: int, length: int) -> None:
        """The resource of a READ executed over PSNs ``first`` .. ``last`` (rxe ``rxe_prepare_res()``
        and ``read_reply()``'s bookkeeping): what a duplicate of it may read again."""
        res = self.new(Kind.READ_REQUEST, first, last)
        res.va = va
        res.length = length
        res.rkey = rkey

    def new_atomic(self, psn: int, orig: int) -> None:
        """The resource of the atomic executed at ``psn`` on a u64 that held ``orig`` (rxe
        ``atomic_reply()``'s): what a duplicate of it is answered with (IBTA §9.4.5)."""
        self.new(Kind.ATOMIC, psn, psn).orig = orig

    def find(self, psn: int, kind: Kind) -> RdAtomicResource | None:
        """The resource of ``kind`` whose PSN range holds ``psn`` (rxe ``find_resource()``)."""
        for res in self.ring:
            if (
                res is not None
                and res.kind is kind
                and psn_diff(psn, res.first_psn) >= 0
                and psn_diff(psn, res.last_psn) <= 0
            ):
                return res
        return None
