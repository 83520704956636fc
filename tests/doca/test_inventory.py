"""DOCA Core 3.3: buffer inventory, buffer pool and buffer array."""

import gc
import itertools
import tracemalloc

import pytest

from rdmakit.doca import BufArray, BufInventory, BufPool, DocaError, DocaErrorCode, Fault, Mmap
from tests.doca.util import MmapFactory, error_code

# -- BufInventory -----------------------------------------------------------------------------


def test_inventory_must_be_started(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_inventory_start): an un-started inventory hands out nothing."""
    mmap = make_mmap()
    inventory = BufInventory(2)
    assert error_code(lambda: inventory.get_by_addr(mmap, mmap.addr, 1)) is DocaErrorCode.BAD_STATE
    inventory.start()
    inventory.get_by_addr(mmap, mmap.addr, 1).dec_refcount()
    inventory.stop()
    assert error_code(lambda: inventory.get_by_addr(mmap, mmap.addr, 1)) is DocaErrorCode.BAD_STATE


def test_mmap_must_be_started() -> None:
    """DOCA Core 3.3: buffers point only into started memory maps (BAD_STATE)."""
    mmap = Mmap()
    mmap.set_memrange(bytearray(8))
    inventory = BufInventory(1)
    inventory.start()
    assert error_code(lambda: inventory.get_by_addr(mmap, mmap.addr, 1)) is DocaErrorCode.BAD_STATE
    assert inventory.num_free == 1


@pytest.mark.parametrize(("offset", "length"), [(-1, 2), (4000, 97), (4096, 1), (0, 4097)])
def test_range_outside_the_mmap_is_invalid(make_mmap: MmapFactory, offset: int, length: int) -> None:
    """DOCA Core 3.3 (doca_buf_inventory_buf_get_by_args): no suitable range is INVALID_VALUE."""
    mmap = make_mmap(4096)
    inventory = BufInventory(1)
    inventory.start()
    assert error_code(lambda: inventory.get_by_addr(mmap, mmap.addr + offset, length)) is (
        DocaErrorCode.INVALID_VALUE
    )
    assert inventory.num_free == 1


def test_data_outside_the_buffer_is_invalid(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_inventory_buf_get_by_args): data must fit in the buffer."""
    mmap = make_mmap()
    inventory = BufInventory(1)
    inventory.start()
    a = mmap.addr
    assert error_code(lambda: inventory.get_by_args(mmap, a + 8, 8, a + 4, 1)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: inventory.get_by_args(mmap, a + 8, 8, a + 12, 5)) is DocaErrorCode.INVALID_VALUE


def test_exhausted_inventory_is_no_memory(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_inventory_buf_get_by_args): empty is NO_MEMORY, the caller's sizing."""
    mmap = make_mmap()
    inventory = BufInventory(3)
    inventory.start()
    bufs = [inventory.get_by_addr(mmap, mmap.addr + i, 1) for i in range(3)]
    with pytest.raises(DocaError) as exc:
        inventory.get_by_addr(mmap, mmap.addr, 1)
    assert exc.value.code is DocaErrorCode.NO_MEMORY
    assert exc.value.fault is Fault.CALLER
    bufs[1].dec_refcount()
    assert inventory.get_by_addr(mmap, mmap.addr, 1) is bufs[1]  # the descriptor is reused


def test_one_inventory_serves_several_mmaps(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3: an inventory's buffers point into any mmap, each counted by its own mmap."""
    first, second = make_mmap(bytearray(b"first" * 10)), make_mmap(bytearray(b"second" * 10))
    inventory = BufInventory(4)
    inventory.start()
    a = inventory.get_by_data(first, first.addr, 5)
    b = inventory.get_by_data(second, second.addr, 6)
    assert (bytes(a.source_view()), bytes(b.source_view())) == (b"first", b"second")
    assert (a.mmap, b.mmap) == (first, second)
    assert (first.num_bufs, second.num_bufs) == (1, 1)
    a.dec_refcount()
    assert (first.num_bufs, second.num_bufs) == (0, 1)
    b.dec_refcount()


def test_destroy_with_buffers_out_is_in_use(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_inventory_destroy): IN_USE until every buffer is back."""
    mmap = make_mmap()
    inventory = BufInventory(2)
    inventory.start()
    buf = inventory.get_by_addr(mmap, mmap.addr, 4)
    assert error_code(inventory.destroy) is DocaErrorCode.IN_USE
    buf.dec_refcount()
    inventory.destroy()
    inventory.destroy()
    assert error_code(inventory.start) is DocaErrorCode.BAD_STATE


def test_dup_copies_the_list(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_inventory_buf_dup): the descriptors of the whole list are copied."""
    mmap = make_mmap()
    inventory = BufInventory(6)
    inventory.start()
    a = inventory.get_by_args(mmap, mmap.addr, 16, mmap.addr + 2, 3)
    b = inventory.get_by_data(mmap, mmap.addr + 32, 8)
    a.chain_list(b)
    copy = inventory.dup(a)
    assert copy is not a
    assert [(x.addr, x.length, x.data, x.data_len) for x in copy] == [
        (x.addr, x.length, x.data, x.data_len) for x in a
    ]
    assert copy.list_len == 2
    assert mmap.num_bufs == 4
    assert error_code(lambda: inventory.dup(b)) is DocaErrorCode.NOT_PERMITTED  # not a head


def test_dup_without_room_takes_nothing(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_inventory_buf_dup): NO_MEMORY, and no descriptor is taken."""
    mmap = make_mmap()
    inventory = BufInventory(3)
    inventory.start()
    a, b = (inventory.get_by_addr(mmap, mmap.addr + i, 1) for i in range(2))
    a.chain_list(b)
    assert error_code(lambda: inventory.dup(a)) is DocaErrorCode.NO_MEMORY
    assert inventory.num_free == 1
    assert mmap.num_bufs == 2


# -- BufPool ------------------------------------------------------------------------------


def test_pool_needs_start_and_a_started_mmap(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_pool_start/alloc): BAD_STATE before start or over an un-started mmap."""
    mmap = Mmap()
    mmap.set_memrange(bytearray(64))
    pool = BufPool(4, 16, mmap)
    assert error_code(pool.alloc) is DocaErrorCode.BAD_STATE
    assert error_code(pool.start) is DocaErrorCode.BAD_STATE
    mmap.start()
    pool.start()
    assert pool.num_free == 4


def test_pool_too_big_for_the_mmap_is_initialization(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_pool_start): a memory range smaller than needed is INITIALIZATION."""
    assert error_code(BufPool(5, 16, make_mmap(64)).start) is DocaErrorCode.INITIALIZATION


def test_pool_elements_tile_the_mmap(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_pool_buf_alloc): each element is its own fixed, empty, disjoint buffer."""
    mmap = make_mmap(100)
    pool = BufPool(6, 16, mmap)
    pool.start()
    bufs = [pool.alloc() for _ in range(6)]
    assert sorted(b.addr for b in bufs) == [mmap.addr + 16 * i for i in range(6)]
    assert all(b.length == 16 and b.data == b.addr and b.data_len == 0 and b.refcount == 1 for b in bufs)
    assert error_code(pool.alloc) is DocaErrorCode.EMPTY
    for b in bufs:
        b.dec_refcount()
    assert pool.num_free == 6


def test_pool_alignment(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_pool_set_element_alignment): every element starts on the alignment."""
    mmap = make_mmap(4096 + 64)
    pool = BufPool(8, 100, mmap)
    assert error_code(lambda: pool.set_element_alignment(48)) is DocaErrorCode.INVALID_VALUE
    pool.set_element_alignment(64)
    pool.start()
    assert error_code(lambda: pool.set_element_alignment(8)) is DocaErrorCode.BAD_STATE
    addrs = sorted(pool.alloc().addr for _ in range(8))
    assert all(a % 64 == 0 for a in addrs)
    assert all(b - a == 128 for a, b in itertools.pairwise(addrs))


def test_alloc_resets_a_reused_element(make_mmap: MmapFactory) -> None:
    """A reallocated element comes back empty, whatever its last user left in it."""
    pool = BufPool(1, 32, make_mmap(32))
    pool.start()
    buf = pool.alloc()
    buf.set_data(buf.addr + 4, 8)
    buf.dec_refcount()
    again = pool.alloc()
    assert again is buf
    assert (again.data, again.data_len, again.refcount) == (again.addr, 0, 1)


def test_pool_stop_and_mmap_stop_order(make_mmap: MmapFactory) -> None:
    """Style rule 7: the pool (child) stops before its mmap (parent); each refuses otherwise."""
    mmap = make_mmap(64)
    pool = BufPool(4, 16, mmap)
    pool.start()
    buf = pool.alloc()
    assert error_code(pool.stop) is DocaErrorCode.IN_USE
    assert error_code(pool.destroy) is DocaErrorCode.IN_USE
    buf.dec_refcount()
    assert mmap.num_bufs == 4  # a started pool's elements all point into the mmap
    assert error_code(mmap.stop) is DocaErrorCode.NOT_PERMITTED
    pool.destroy()
    assert mmap.num_bufs == 0
    mmap.stop()


class _NullPool:
    """Same calls as a pool, doing nothing: the probe's control."""

    def alloc(self) -> "_NullPool":
        return self

    def dec_refcount(self) -> int:
        return 1


def _traced(pool: BufPool | _NullPool, n: int = 5000) -> tuple[int, int]:
    """Bytes (kept, peak) traced while allocating and releasing a buffer `n` times."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        for _ in itertools.repeat(None, n):
            pool.alloc().dec_refcount()
        return tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()


def _transient(pool: BufPool | _NullPool) -> int:
    """Bytes the loop allocates and frees again, beyond what the control loop does.

    Measured as peak minus kept, which cancels the jitter of the interpreter's
    free lists (a tuple here or there); the minimum over rounds is stable.
    """
    rounds = 7
    real = min(peak - kept for kept, peak in (_traced(pool) for _ in range(rounds)))
    control = min(peak - kept for kept, peak in (_traced(_NullPool()) for _ in range(rounds)))
    return real - control


def _retained(pool: BufPool | _NullPool) -> int:
    """Bytes still allocated after 10000 rounds of the loop beyond those after 1000."""
    return min(_traced(pool, 10_000)[0] for _ in range(3)) - min(_traced(pool, 1000)[0] for _ in range(3))


def test_pool_data_path_allocates_nothing(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_pool): after start, alloc and release allocate no memory at all."""
    pool = BufPool(64, 64, make_mmap(64 * 64))
    pool.start()
    held = [pool.alloc() for _ in range(3)]  # the data path runs with some buffers out
    gc.collect()
    objects_before = len(gc.get_objects())
    for _ in itertools.repeat(None, 1000):
        pool.alloc().dec_refcount()
    assert len(gc.get_objects()) == objects_before
    assert _transient(pool) <= 0
    assert _retained(pool) < 100  # a byte kept per round would be 9000
    for buf in held:
        buf.dec_refcount()


class _TransientPool(_NullPool):
    def dec_refcount(self) -> int:
        str(id(self))  # about 60 bytes, freed at once
        return 1


class _LeakyPool(_NullPool):
    def __init__(self) -> None:
        self.kept: list[int] = []

    def dec_refcount(self) -> int:
        self.kept.append(1)  # 8 bytes of list per round
        return 1


def test_allocation_probe_sees_allocation() -> None:
    """The probe above is not blind: a small transient allocation and a one-pointer leak both show."""
    assert _transient(_TransientPool()) >= 32
    assert _retained(_TransientPool()) < 100
    assert _retained(_LeakyPool()) >= 9000 * 8


# -- BufArray -----------------------------------------------------------------------------------


def test_array_elements_by_index(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_arr): element i starts at start_offset + i * element_size."""
    mmap = make_mmap(256)
    array = BufArray(4)
    array.set_params(mmap, 32, start_offset=64)
    assert error_code(lambda: array[0]) is DocaErrorCode.BAD_STATE
    array.start()
    assert len(array) == 4
    assert [array[i].addr for i in range(4)] == [mmap.addr + 64 + 32 * i for i in range(4)]
    assert mmap.num_bufs == 4
    assert error_code(lambda: array.set_params(mmap, 16)) is DocaErrorCode.BAD_STATE


def test_array_elements_are_permanent(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_arr): dropping the last reference resets an element, never frees it."""
    mmap = make_mmap(64)
    array = BufArray(2)
    array.set_params(mmap, 32)
    array.start()
    buf = array[1]
    buf.set_data(buf.addr, 10)
    buf.dec_refcount()
    assert (buf.refcount, buf.data_len) == (1, 0)
    assert array[1] is buf


def test_array_must_fit(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_buf_arr_start): elements outside the mmap are INVALID_VALUE."""
    mmap = make_mmap(64)
    array = BufArray(3)
    assert error_code(array.start) is DocaErrorCode.INVALID_VALUE  # no params
    array.set_params(mmap, 32)
    assert error_code(array.start) is DocaErrorCode.INVALID_VALUE


def test_array_stop_releases_the_mmap(make_mmap: MmapFactory) -> None:
    """Style rule 7: the mmap stops once the array (child) is stopped; IN_USE while an element is chained."""
    mmap = make_mmap(64)
    array = BufArray(2)
    array.set_params(mmap, 32)
    array.start()
    array[0].chain_list(array[1])
    assert error_code(array.stop) is DocaErrorCode.IN_USE
    array[0].unchain(array[1])
    array.destroy()
    assert mmap.num_bufs == 0
    mmap.stop()
