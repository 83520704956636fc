"""A verbs memory region (``ibv_mr``) as the rest of rdmakit sees it: keys, range, access, bytes.

Pure Python: `rdmakit.verbs.device` registers the memory through pyverbs and
hands the region its keys and a `release` that deregisters it.
"""

from collections.abc import Callable

from rdmakit.engine.types import Access

__all__ = ["VerbsMR"]


class VerbsMR:
    """A registered memory region (``ibv_mr``); the device's child."""

    def __init__(
        self,
        *,
        addr: int,
        lkey: int,
        rkey: int,
        view: memoryview,
        access: Access,
        release: Callable[[], None],
    ) -> None:
        self._release: Callable[[], None] | None = release
        self._view: memoryview | None = view  # pins the buffer while registered
        self.addr = addr
        self.length = len(view)
        self.lkey = lkey
        self.rkey = rkey
        self.access = access

    @property
    def closed(self) -> bool:
        return self._release is None

    def view(self, addr: int, length: int, *, write: bool) -> memoryview | None:
        """The registered bytes ``[addr, addr+length)``; None if outside, closed, or a write to read-only.

        The checks of a local protection error (IBTA §10.6.3.2).
        """
        view = self._view
        if view is None or length < 0 or addr < self.addr or addr + length > self.addr + self.length:
            return None
        if write and not self.access & Access.LOCAL_WRITE:
            return None
        return view[addr - self.addr : addr - self.addr + length]

    def close(self) -> None:
        """``ibv_dereg_mr``; idempotent."""
        release, self._release, self._view = self._release, None, None
        if release is not None:
            release()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"lkey={self.lkey:#x} rkey={self.rkey:#x}"
        return f"<VerbsMR {self.addr:#x}+{self.length} {state}>"
