"""A device's QP timers as a heap: a poll looks only at the QPs whose deadline is due.

Each QP says when it wants ``handle_timer`` (``QueuePair.get_timer``: the
retransmit, RNR or pace deadline, whichever is first). A QP's deadline moves
only while something happens to it: a segment reaches it, it transmits, a
timer of its fires, all inside the device's ``progress`` and all on a QP the
port then visits. So the device notes a QP's deadline (``note``) after each
visit, and the earliest deadline of all QPs is the top of a heap, not a scan
of every QP.

An entry is never removed when its QP's deadline moves: it stays valid only
while it is the deadline last noted for that QP (``_at``), and the others are
dropped when they reach the top. ``due`` hands out each QP at most once per
noted deadline; the device calls ``handle_timer`` if the QP's timer is indeed
due and notes the QP again. A deadline that moved later without a note is
therefore only an early look, never a missed timer; one that moved earlier
without a note is what ``rebuild`` (every QP, noted afresh) is for: the
device's safety net for QPs driven directly by their owner.
"""

import heapq
from collections.abc import Iterable
from itertools import count

from rdmakit.engine import QueuePair


class DeadlineHeap:
    """The noted deadlines of a device's QPs, earliest first."""

    def __init__(self) -> None:
        #: (deadline, tie-breaker, QP); stale entries stay until they reach the top.
        self._heap: list[tuple[float, int, QueuePair]] = []
        #: The deadline last noted for each QP that has one.
        self._at: dict[QueuePair, float] = {}
        self._seq = count()

    def __len__(self) -> int:
        """How many QPs have a noted deadline."""
        return len(self._at)

    def note(self, qp: QueuePair) -> None:
        """Record ``qp``'s deadline as it is now (``get_timer``; None: it has none)."""
        t = qp.get_timer()
        at = self._at
        if t is None:
            at.pop(qp, None)
        elif at.get(qp) != t:
            at[qp] = t
            heap = self._heap
            heapq.heappush(heap, (t, next(self._seq), qp))
            if len(heap) > 2 * len(at) + 64:
                self._compact()

    def forget(self, qp: QueuePair) -> None:
        """``qp`` was destroyed or reset: its entries are void."""
        self._at.pop(qp, None)

    def earliest(self) -> float | None:
        """The earliest noted deadline, or None."""
        heap, at = self._heap, self._at
        while heap:
            t, _, qp = heap[0]
            if at.get(qp) == t:
                return t
            heapq.heappop(heap)
        return None

    def due(self, now: float) -> list[QueuePair]:
        """The QPs whose noted deadline is at or before ``now``, each once; their notes are spent."""
        heap, at = self._heap, self._at
        out: list[QueuePair] = []
        while heap and heap[0][0] <= now:
            t, _, qp = heapq.heappop(heap)
            if at.get(qp) == t:
                del at[qp]
                out.append(qp)
        return out

    def rebuild(self, qps: Iterable[QueuePair]) -> None:
        """Note every QP of ``qps`` afresh, forgetting all else."""
        self._at = {qp: t for qp in qps if (t := qp.get_timer()) is not None}
        self._compact()

    def _compact(self) -> None:
        seq = self._seq
        self._heap = [(t, next(seq), qp) for qp, t in self._at.items()]
        heapq.heapify(self._heap)
