"""Completion queues (IBTA Vol. 1 §10.2.6, §11.4.2)."""

from collections import deque

from .errors import EngineError
from .types import Completion


class CompletionQueue:
    """A bounded FIFO of work completions (``ibv_cq``).

    Overflow follows verbs: a CQ overrun is an error of the CQ (IBTA §11.6.2,
    "CQ overrun"), the completion that did not fit is lost, ``overflowed``
    becomes True and stays so, and the QP that tried to post moves to the
    error state (its remaining work requests flush, and those completions are
    lost too if the CQ is still full). Size the CQ for the work you post.
    """

    __slots__ = ("_entries", "depth", "lost", "overflowed")

    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise EngineError("INVALID_VALUE", f"CQ depth must be at least 1, got {depth}")
        self.depth = depth
        self._entries: deque[Completion] = deque()
        self.overflowed = False
        self.lost = 0

    def push(self, wc: Completion) -> bool:
        """Append ``wc``; False (and the CQ marked overflowed) if it is full. Engine use."""
        if len(self._entries) >= self.depth:
            self.overflowed = True
            self.lost += 1
            return False
        self._entries.append(wc)
        return True

    def poll(self, n: int = 1) -> list[Completion]:
        """Take up to ``n`` completions, oldest first (``ibv_poll_cq``)."""
        entries = self._entries
        if not entries:
            return []
        k = min(n, len(entries))
        return [entries.popleft() for _ in range(k)]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> "deque[Completion]":
        """The FIFO itself, as a driver sees its CQE ring in memory: its consumer may test it for
        emptiness without a call, and take the oldest entry (``popleft``) as `poll` would, under
        the same lock as its other polls."""
        return self._entries
