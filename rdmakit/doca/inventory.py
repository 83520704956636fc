"""Buffer inventories (DOCA Core 3.3): where `Buf` descriptors come from.

- `BufInventory` (``doca_buf_inventory.h``): a fixed number of descriptors,
  each pointed at any range of any started `Mmap` when taken. Exhausted:
  NO_MEMORY.
- `BufPool` (``doca_buf_pool.h``): one mmap cut into equal elements, each
  with its own permanent descriptor. Everything is laid out at `start`;
  `alloc` and release only move a descriptor on a preallocated stack, so the
  data path allocates nothing. Exhausted: EMPTY.
- `BufArray` (``doca_buf_arr.h``): equal elements addressed by index; the
  descriptors are permanent and never return anywhere.

Every descriptor handed out counts in its mmap's ``num_bufs`` (a pool or array
counts all its elements while started), which keeps the mmap from being
stopped or destroyed underneath them.
"""

from typing import Self

from rdmakit.doca.buf import DEFAULT_MAX_LIST_LEN, Buf
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.mmap import Mmap

__all__ = ["BufArray", "BufInventory", "BufPool"]


def _check_count(name: str, value: int) -> None:
    if value <= 0:
        raise DocaError(DocaErrorCode.INVALID_VALUE, f"{name} must be positive, got {value}")


def _check_mmap_started(mmap: Mmap) -> None:
    if mmap.destroyed or not mmap.started:
        raise DocaError(DocaErrorCode.BAD_STATE, "mmap is not started")


def _align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) & -alignment


class BufInventory:
    """A fixed set of buffer descriptors for ranges of any mmap (``doca_buf_inventory``)."""

    def __init__(self, num_elements: int, *, max_list_len: int = DEFAULT_MAX_LIST_LEN) -> None:
        _check_count("num_elements", num_elements)
        _check_count("max_list_len", max_list_len)
        self._num_elements = num_elements
        self._max_list_len = max_list_len
        self._free = [Buf(self) for _ in range(num_elements)]  # a stack; [0, _top) are free
        self._top = num_elements
        self._started = False
        self._destroyed = False

    @property
    def num_elements(self) -> int:
        return self._num_elements

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def max_list_len(self) -> int:
        """Longest list `Buf.chain_list` may build from this inventory's buffers."""
        return self._max_list_len

    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> None:
        """Allow taking buffers (``doca_buf_inventory_start``)."""
        if self._destroyed:
            raise DocaError(DocaErrorCode.BAD_STATE, "inventory is destroyed")
        self._started = True

    def stop(self) -> None:
        """Stop handing out buffers; taken ones stay valid (``doca_buf_inventory_stop``)."""
        self._started = False

    def destroy(self) -> None:
        """Idempotent; IN_USE while buffers are out (``doca_buf_inventory_destroy``)."""
        if self._destroyed:
            return
        if self._top != self._num_elements:
            raise DocaError(
                DocaErrorCode.IN_USE,
                f"{self._num_elements - self._top} buffers were not returned to the inventory",
            )
        self._started = False
        self._destroyed = True

    close = destroy

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()

    def _take(self, n: int) -> None:
        if not self._started:
            raise DocaError(DocaErrorCode.BAD_STATE, "inventory is not started")
        if self._top < n:
            raise DocaError(
                DocaErrorCode.NO_MEMORY,
                f"inventory has {self._top} free buffers, {n} needed",
                Fault.CALLER,
            )

    def get_by_args(self, mmap: Mmap, addr: int, length: int, data: int, data_len: int) -> Buf:
        """A buffer ``[addr, addr+length)`` with data ``[data, data+data_len)``.

        ``doca_buf_inventory_buf_get_by_args``: BAD_STATE unless the inventory
        and the mmap are started, INVALID_VALUE for a range outside the mmap,
        NO_MEMORY when no descriptor is free.
        """
        self._take(1)
        _check_mmap_started(mmap)
        if length < 0 or not mmap.contains(addr, length):
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{addr:#x}+{length} is outside the mmap's range")
        if data_len < 0 or data < addr or data + data_len > addr + length:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"data {data:#x}+{data_len} is outside the buffer")
        self._top -= 1
        buf = self._free[self._top]
        buf._init(mmap, addr, length, data, data_len)
        mmap._num_bufs += 1
        return buf

    def get_by_addr(self, mmap: Mmap, addr: int, length: int) -> Buf:
        """An empty buffer ``[addr, addr+length)``, a destination (``..._buf_get_by_addr``)."""
        return self.get_by_args(mmap, addr, length, addr, 0)

    def get_by_data(self, mmap: Mmap, data: int, data_len: int) -> Buf:
        """A buffer that is all data ``[data, data+data_len)``, a source (``..._buf_get_by_data``)."""
        return self.get_by_args(mmap, data, data_len, data, data_len)

    def dup(self, buf: Buf) -> Buf:
        """A copy of the descriptors of the list headed by `buf` (``doca_buf_inventory_buf_dup``)."""
        buf._check_live()
        if not buf.is_first:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "dup: buf is not the head of its list")
        n = buf.list_len
        self._take(n)
        for src in buf:
            _check_mmap_started(src.mmap)
        head: Buf | None = None
        prev: Buf | None = None
        for src in buf:
            self._top -= 1
            new = self._free[self._top]
            new._init(src.mmap, src.addr, src.length, src.data, src.data_len)
            src.mmap._num_bufs += 1
            if prev is None:
                head = new
            else:
                prev._next = new
                new._prev = prev
            prev = new
        assert head is not None
        return head

    def _release(self, buf: Buf) -> None:
        assert buf._mmap is not None
        buf._mmap._num_bufs -= 1
        buf._mmap = None
        self._free[self._top] = buf
        self._top += 1

    def __repr__(self) -> str:
        return f"<BufInventory {self._top}/{self._num_elements} free>"


class _Started:
    """Lifetime shared by the pool and the array: destroy stops first; idempotent; a context manager."""

    _started: bool
    _destroyed: bool

    def stop(self) -> None:
        raise NotImplementedError

    def destroy(self) -> None:
        """Idempotent; IN_USE while any element is still in use (``doca_buf_pool_destroy``)."""
        if self._destroyed:
            return
        if self._started:
            self.stop()
        self._destroyed = True

    def close(self) -> None:
        self.destroy()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()


class BufPool(_Started):
    """An mmap cut into `num_elements` buffers of `element_size` bytes (``doca_buf_pool``)."""

    def __init__(
        self,
        num_elements: int,
        element_size: int,
        mmap: Mmap,
        *,
        max_list_len: int = DEFAULT_MAX_LIST_LEN,
    ) -> None:
        _check_count("num_elements", num_elements)
        _check_count("element_size", element_size)
        _check_count("max_list_len", max_list_len)
        self._num_elements = num_elements
        self._element_size = element_size
        self._mmap = mmap
        self._max_list_len = max_list_len
        self._alignment = 1
        self._free = [Buf(self) for _ in range(num_elements)]  # a stack; [0, _top) are free
        self._top = 0
        self._started = False
        self._destroyed = False

    @property
    def num_elements(self) -> int:
        return self._num_elements

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def element_size(self) -> int:
        return self._element_size

    @property
    def element_alignment(self) -> int:
        return self._alignment

    @property
    def max_list_len(self) -> int:
        return self._max_list_len

    @property
    def started(self) -> bool:
        return self._started

    def set_element_alignment(self, alignment: int) -> None:
        """Align each element to `alignment`, a power of 2 (``doca_buf_pool_set_element_alignment``)."""
        if self._started:
            raise DocaError(DocaErrorCode.BAD_STATE, "buf pool is started")
        if alignment < 1 or alignment & (alignment - 1):
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"alignment {alignment} is not a power of 2")
        self._alignment = alignment

    def start(self) -> None:
        """Lay the elements out over the mmap and make them allocatable (``doca_buf_pool_start``)."""
        if self._destroyed:
            raise DocaError(DocaErrorCode.BAD_STATE, "buf pool is destroyed")
        if self._started:
            raise DocaError(DocaErrorCode.BAD_STATE, "buf pool is already started")
        mmap = self._mmap
        _check_mmap_started(mmap)
        base = _align_up(mmap.addr, self._alignment)
        stride = _align_up(self._element_size, self._alignment)
        end = base + stride * (self._num_elements - 1) + self._element_size
        if end > mmap.addr + mmap.length:
            raise DocaError(
                DocaErrorCode.INITIALIZATION,
                f"{self._num_elements} elements of {self._element_size} bytes"
                f" (alignment {self._alignment}) need {end - mmap.addr} bytes;"
                f" the mmap has {mmap.length}",
                Fault.CALLER,
            )
        for i, buf in enumerate(self._free):
            buf._init(mmap, base + i * stride, self._element_size, base + i * stride, 0)
            buf._refcount = 0
        self._top = self._num_elements
        mmap._num_bufs += self._num_elements
        self._started = True

    def _check_all_returned(self, what: str) -> None:
        if self._top != self._num_elements:
            raise DocaError(
                DocaErrorCode.IN_USE,
                f"{what}: {self._num_elements - self._top} buffers were not returned to the pool",
            )

    def stop(self) -> None:
        """Withdraw the elements; IN_USE while any is allocated (``doca_buf_pool_stop``)."""
        if not self._started:
            raise DocaError(DocaErrorCode.BAD_STATE, "buf pool is not started")
        self._check_all_returned("stop")
        self._top = 0
        self._mmap._num_bufs -= self._num_elements
        self._started = False

    def _cannot_alloc(self) -> DocaError:
        if not self._started:
            return DocaError(DocaErrorCode.BAD_STATE, "buf pool is not started")
        return DocaError(DocaErrorCode.EMPTY, "all buffers of the pool are allocated")

    def alloc(self) -> Buf:
        """An element with an empty data section at its start (``doca_buf_pool_buf_alloc``)."""
        top = self._top
        if not top:
            raise self._cannot_alloc()
        top -= 1
        self._top = top
        buf = self._free[top]
        buf._refcount = 1
        buf._data = buf._addr
        buf._data_len = 0
        return buf

    def _release(self, buf: Buf) -> None:
        self._free[self._top] = buf
        self._top += 1

    def __repr__(self) -> str:
        return f"<BufPool {self._top}/{self._num_elements} free x {self._element_size} bytes>"


class BufArray(_Started):
    """Fixed-size buffers over an mmap, addressed by index (``doca_buf_arr``).

    Elements are permanent: dropping an element's last reference resets it
    (data section emptied, refcount back to 1) instead of freeing it.
    """

    def __init__(self, num_elements: int, *, max_list_len: int = DEFAULT_MAX_LIST_LEN) -> None:
        _check_count("num_elements", num_elements)
        _check_count("max_list_len", max_list_len)
        self._num_elements = num_elements
        self._max_list_len = max_list_len
        self._bufs = [Buf(self) for _ in range(num_elements)]
        self._mmap: Mmap | None = None
        self._element_size = 0
        self._start_offset = 0
        self._started = False
        self._destroyed = False

    @property
    def max_list_len(self) -> int:
        return self._max_list_len

    @property
    def started(self) -> bool:
        return self._started

    def set_params(self, mmap: Mmap, element_size: int, start_offset: int = 0) -> None:
        """Elements of `element_size` bytes from `start_offset` into `mmap` (``doca_buf_arr_set_params``)."""
        if self._started or self._destroyed:
            raise DocaError(DocaErrorCode.BAD_STATE, "buf array is started or destroyed")
        _check_count("element_size", element_size)
        if start_offset < 0:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "start_offset must not be negative")
        self._mmap, self._element_size, self._start_offset = mmap, element_size, start_offset

    def start(self) -> None:
        """Point every element into the mmap (``doca_buf_arr_start``)."""
        if self._started or self._destroyed:
            raise DocaError(DocaErrorCode.BAD_STATE, "buf array is started or destroyed")
        mmap = self._mmap
        if mmap is None:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "set_params was not called")
        _check_mmap_started(mmap)
        size = self._element_size
        base = mmap.addr + self._start_offset
        if not mmap.contains(base, size * self._num_elements):
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"{self._num_elements} x {size} bytes from offset {self._start_offset}"
                f" exceed the mmap's {mmap.length} bytes",
            )
        for i, buf in enumerate(self._bufs):
            buf._init(mmap, base + i * size, size, base + i * size, 0)
        mmap._num_bufs += self._num_elements
        self._started = True

    def stop(self) -> None:
        """Withdraw the elements; IN_USE while any is chained or extra-referenced."""
        if not self._started:
            raise DocaError(DocaErrorCode.BAD_STATE, "buf array is not started")
        if any(buf.refcount != 1 or buf.is_in_list for buf in self._bufs):
            raise DocaError(DocaErrorCode.IN_USE, "buf array elements are still in use")
        assert self._mmap is not None
        self._mmap._num_bufs -= self._num_elements
        for buf in self._bufs:
            buf._refcount = 0
        self._started = False

    def __len__(self) -> int:
        return self._num_elements

    def __getitem__(self, index: int) -> Buf:
        if not self._started:
            raise DocaError(DocaErrorCode.BAD_STATE, "buf array is not started")
        return self._bufs[index]

    def _release(self, buf: Buf) -> None:
        buf._refcount = 1
        buf._data = buf._addr
        buf._data_len = 0

    def __repr__(self) -> str:
        state = "started" if self._started else "idle"
        return f"<BufArray {self._num_elements} x {self._element_size} bytes {state}>"
