"""DOCA Buffer (DOCA Core 3.3, ``doca_buf.h``).

A `Buf` is a descriptor of bytes inside an `Mmap`; it never owns memory. Its
geometry, as drawn in ``doca_buf.h``::

    addr                data           data+data_len      addr+length
     |<--- headroom --->|<-- data_len -->|<--- tailroom --->|
                        |<------------ dataroom ----------->|

    headroom = data - addr
    tailroom = addr + length - (data + data_len)
    dataroom = addr + length - data = data_len + tailroom

Jobs read a source buffer's data section (`source_view`) and append to a
destination buffer's tailroom (`append_view`, then `commit_append`).

Buffers chain into lists (``doca_buf_chain_list``); only the head of a list
carries a reference count, every other element has refcount 1. When the
head's count drops to 0 every element returns to its inventory or pool, and
a stale reference then refers to a free (later reused) descriptor: use it
only while you hold a reference, as in C. Descriptors are preallocated by
their inventory and reused; nothing here allocates on the data path.
"""

from collections.abc import Iterator
from operator import attrgetter
from typing import Protocol, Self

from rdmakit.doca.errors import DocaError, DocaErrorCode
from rdmakit.doca.mmap import AccessFlag, Mmap

# PLAN_SLOTS, plan_state, plan_holds: for rdmakit.doca.rdma_jobs
__all__ = ["DEFAULT_MAX_LIST_LEN", "MAX_REFCOUNT", "Buf"]

DEFAULT_MAX_LIST_LEN = 64
MAX_REFCOUNT = 0xFFFF  # refcount is a uint16_t (doca_buf_inc_refcount)


class _BufOwner(Protocol):
    """The inventory, pool or array a `Buf` descriptor belongs to."""

    @property
    def max_list_len(self) -> int: ...

    def _release(self, buf: "Buf") -> None: ...


class Buf:
    """A DOCA buffer (``doca_buf``). Obtain one from a `BufInventory`, `BufPool` or `BufArray`."""

    __slots__ = (
        "_addr",
        "_data",
        "_data_len",
        "_length",
        "_mmap",
        "_next",
        "_owner",
        "_prev",
        "_refcount",
    )

    def __init__(self, owner: _BufOwner) -> None:
        self._owner = owner
        self._mmap: Mmap | None = None
        self._addr = 0
        self._length = 0
        self._data = 0
        self._data_len = 0
        self._refcount = 0
        self._next: Buf | None = None
        self._prev: Buf | None = None

    def _init(self, mmap: Mmap, addr: int, length: int, data: int, data_len: int) -> None:
        self._mmap = mmap
        self._addr = addr
        self._length = length
        self._data = data
        self._data_len = data_len
        self._refcount = 1

    # -- geometry ---------------------------------------------------------------

    @property
    def mmap(self) -> Mmap:
        self._check_live()
        assert self._mmap is not None
        return self._mmap

    @property
    def addr(self) -> int:
        """Start of the buffer (``doca_buf_get_head``)."""
        return self._addr

    @property
    def length(self) -> int:
        """Length of the buffer (``doca_buf_get_len``)."""
        return self._length

    @property
    def data(self) -> int:
        """Start of the data (``doca_buf_get_data``)."""
        return self._data

    @property
    def data_len(self) -> int:
        """Length of the data (``doca_buf_get_data_len``)."""
        return self._data_len

    @property
    def headroom(self) -> int:
        return self._data - self._addr

    @property
    def tailroom(self) -> int:
        return self._addr + self._length - (self._data + self._data_len)

    @property
    def dataroom(self) -> int:
        return self._addr + self._length - self._data

    @property
    def refcount(self) -> int:
        return self._refcount

    def _check_live(self) -> None:
        if self._refcount == 0:
            raise DocaError(DocaErrorCode.BAD_STATE, "buf was returned to its inventory")

    def set_data(self, data: int, data_len: int) -> None:
        """Point the data section at ``[data, data+data_len)`` inside the buffer (``doca_buf_set_data``)."""
        self._check_live()
        if data_len < 0 or data < self._addr or data + data_len > self._addr + self._length:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"data {data:#x}+{data_len} is outside buffer {self._addr:#x}+{self._length}",
            )
        self._data = data
        self._data_len = data_len

    def reset_data_len(self) -> None:
        """Empty the data section; `data` keeps its place (``doca_buf_reset_data_len``)."""
        self._check_live()
        self._data_len = 0

    # -- memory -------------------------------------------------------------------

    def view(self) -> memoryview:
        """The whole buffer's local bytes (no copy)."""
        self._check_live()
        assert self._mmap is not None
        return self._mmap.view(self._addr, self._length)

    def source_view(self) -> memoryview:
        """The data section: what this buffer contributes as a job's source."""
        self._check_live()
        assert self._mmap is not None
        return self._mmap.view(self._data, self._data_len)

    def append_view(self) -> memoryview:
        """The tailroom, writable: where a job appends when this buffer is its destination."""
        self._check_live()
        assert self._mmap is not None
        if AccessFlag.LOCAL_READ_WRITE not in self._mmap.permissions:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "destination mmap lacks LOCAL_READ_WRITE permission")
        return self._mmap.view(self._data + self._data_len, self.tailroom)

    def commit_append(self, n: int) -> None:
        """Grow the data section by `n` bytes written through `append_view`."""
        if self._refcount == 0:
            self._check_live()
        # One call per completed job: the tailroom is computed here, not through the property.
        if not 0 <= n <= self._addr + self._length - (self._data + self._data_len):
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"cannot append {n} bytes to {self.tailroom} of tailroom"
            )
        self._data_len += n

    # -- lists ----------------------------------------------------------------------

    @property
    def is_first(self) -> bool:
        return self._prev is None

    @property
    def is_last(self) -> bool:
        return self._next is None

    @property
    def is_in_list(self) -> bool:
        return self._prev is not None or self._next is not None

    def get_next(self) -> "Buf | None":
        """The next element of the list, or None (``doca_buf_get_next_in_list``)."""
        return self._next

    def get_last(self) -> "Buf":
        """The last element of the list from here, maybe self (``doca_buf_get_last_in_list``)."""
        buf = self
        while buf._next is not None:
            buf = buf._next
        return buf

    def __iter__(self) -> Iterator["Buf"]:
        """Self, then the rest of the list."""
        buf: Buf | None = self
        while buf is not None:
            yield buf
            buf = buf._next

    @property
    def list_len(self) -> int:
        """Number of elements; self must be the head (``doca_buf_get_list_len``)."""
        if self._prev is not None:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "list_len: buf is not the head of a list")
        n = 1
        buf = self._next
        while buf is not None:
            n += 1
            buf = buf._next
        return n

    def chain_list(self, other: "Buf") -> None:
        """Append the list headed by `other` to this list (``doca_buf_chain_list``).

        Both must be heads; `other` must have refcount 1; the result may not be
        longer than the inventory's ``max_list_len`` (TOO_BIG).
        """
        self._check_live()
        other._check_live()
        if other is self:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "cannot chain a list to itself")
        if self._prev is not None or other._prev is not None:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "chain_list: both bufs must be list heads")
        if other._refcount != 1:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                f"chain_list: appended list has refcount {other._refcount}, not 1",
            )
        total = self.list_len + other.list_len
        limit = self._owner.max_list_len
        if total > limit:
            raise DocaError(DocaErrorCode.TOO_BIG, f"a list of {total} bufs exceeds {limit}")
        last = self.get_last()
        last._next = other
        other._prev = last

    def unchain(self, other: "Buf") -> None:
        """Split the list before `other`, which becomes a head with refcount 1 (``doca_buf_unchain_list``)."""
        self._check_live()
        buf = self._next
        while buf is not None and buf is not other:
            buf = buf._next
        if buf is None:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "unchain: buf is not later in this list")
        assert other._prev is not None
        other._prev._next = None
        other._prev = None
        other._refcount = 1

    # -- references -----------------------------------------------------------------

    def inc_refcount(self) -> int:
        """Add a reference; returns the count before (``doca_buf_inc_refcount``)."""
        if self._prev is not None:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "only a list head carries references")
        before = self._refcount
        if before == 0:
            raise DocaError(DocaErrorCode.BAD_STATE, "buf was returned to its inventory")
        if before >= MAX_REFCOUNT:
            raise DocaError(DocaErrorCode.TOO_BIG, f"refcount is already {MAX_REFCOUNT}")
        self._refcount = before + 1
        return before

    def dec_refcount(self) -> int:
        """Drop a reference; at 0 the whole list is released. Returns the count before."""
        if self._prev is not None:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "only a list head carries references")
        before = self._refcount
        if before == 0:
            raise DocaError(DocaErrorCode.BAD_STATE, "refcount is already 0")
        if before > 1:
            self._refcount = before - 1
            return before
        buf: Buf | None = self
        while buf is not None:
            nxt = buf._next
            buf._next = buf._prev = None
            buf._refcount = 0
            buf._owner._release(buf)
            buf = nxt
        return before

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.dec_refcount()

    def __repr__(self) -> str:
        if self._refcount == 0:
            return "<Buf free>"
        return (
            f"<Buf {self._addr:#x}+{self._length} data={self._data:#x}+{self._data_len}"
            f" refcount={self._refcount}>"
        )


#: What a job planned on a buffer depends on (``rdmakit.doca.rdma_jobs``): the descriptor's mmap,
#: liveness, geometry and list neighbours. A plan is reused while every buffer of its lists gives the
#: same tuple; a live buffer's mmap cannot be stopped or destroyed (``doca_mmap_stop``: buffers
#: still point into it), so its registration and permissions hold as long as this does.
PLAN_SLOTS = ("_mmap", "_refcount", "_addr", "_length", "_data", "_data_len", "_prev", "_next")
plan_state: "attrgetter[tuple[object, ...]]" = attrgetter(*PLAN_SLOTS)


def plan_holds(bufs: tuple[Buf, ...], state: tuple[tuple[object, ...], ...]) -> bool:
    """Whether each buffer of `bufs` still gives its `plan_state` in `state` (`PLAN_SLOTS` in order),
    compared slot by slot rather than made again: checking a resubmitted job's plan allocates
    nothing. The data section first: it is what an application moves between submits."""
    i = len(bufs)
    while i:
        i -= 1
        b = bufs[i]
        s = state[i]
        if (
            b._data != s[4] or b._data_len != s[5] or b._refcount != s[1] or b._mmap is not s[0]
            or b._addr != s[2] or b._length != s[3] or b._prev is not s[6] or b._next is not s[7]
        ):  # fmt: skip
            return False
    return True
