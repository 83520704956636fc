"""DOCA Core 3.3: the buffer (doca_buf.h): geometry, data, lists and references."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmakit.doca import (
    MAX_REFCOUNT,
    AccessFlag,
    Buf,
    BufInventory,
    Dev,
    DocaErrorCode,
    Mmap,
)
from tests.doca.util import MmapFactory, error_code


@pytest.fixture
def inventory() -> BufInventory:
    inv = BufInventory(16, max_list_len=4)
    inv.start()
    return inv


@pytest.fixture
def mmap(make_mmap: MmapFactory) -> Mmap:
    return make_mmap(bytearray(range(256)))


# -- geometry ---------------------------------------------------------------------------


@settings(deadline=None)
@given(
    size=st.integers(1, 4096),
    offsets=st.tuples(st.integers(0, 4096), st.integers(0, 4096), st.integers(0, 4096), st.integers(0, 4096)),
)
def test_room_arithmetic(size: int, offsets: tuple[int, int, int, int]) -> None:
    """DOCA Core 3.3 (doca_buf.h data placement): head = data - addr, tail = addr+len - (data+data_len)."""
    a, b, c, d = sorted(o % (size + 1) for o in offsets)
    mmap = Mmap()
    mmap.set_memrange(bytearray(size))
    mmap.start()
    inv = BufInventory(1)
    inv.start()
    base = mmap.addr
    buf = inv.get_by_args(mmap, base + a, d - a, base + b, c - b)
    assert (buf.addr, buf.length, buf.data, buf.data_len) == (base + a, d - a, base + b, c - b)
    assert buf.headroom == b - a
    assert buf.tailroom == d - c
    assert buf.dataroom == d - b == buf.data_len + buf.tailroom
    assert buf.headroom + buf.data_len + buf.tailroom == buf.length
    assert len(buf.source_view()) == buf.data_len
    assert len(buf.append_view()) == buf.tailroom
    buf.dec_refcount()
    mmap.destroy()


def test_get_by_addr_is_an_empty_destination(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_inventory_buf_get_by_addr): data at the start, length 0."""
    buf = inventory.get_by_addr(mmap, mmap.addr + 8, 32)
    assert (buf.data, buf.data_len, buf.headroom, buf.tailroom) == (mmap.addr + 8, 0, 0, 32)


def test_get_by_data_is_a_full_source(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_inventory_buf_get_by_data): the whole buffer is data."""
    buf = inventory.get_by_data(mmap, mmap.addr + 8, 4)
    assert (buf.data_len, buf.headroom, buf.tailroom) == (4, 0, 0)
    assert bytes(buf.source_view()) == bytes([8, 9, 10, 11])


def test_set_data_moves_the_data_section(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_set_data): data may go anywhere inside the buffer."""
    buf = inventory.get_by_addr(mmap, mmap.addr, 16)
    buf.set_data(mmap.addr + 4, 8)
    assert (buf.headroom, buf.data_len, buf.tailroom) == (4, 8, 4)
    assert bytes(buf.source_view()) == bytes(range(4, 12))


@pytest.mark.parametrize(("offset", "length"), [(-1, 1), (0, 17), (16, 1), (8, 9), (0, -1)])
def test_set_data_outside_the_buffer_is_invalid(
    inventory: BufInventory, mmap: Mmap, offset: int, length: int
) -> None:
    """DOCA Core 3.3 (doca_buf_set_data): [data, data+data_len] must lie in [head, head+len]."""
    buf = inventory.get_by_addr(mmap, mmap.addr + 100, 16)
    assert error_code(lambda: buf.set_data(buf.addr + offset, length)) is DocaErrorCode.INVALID_VALUE
    assert (buf.data, buf.data_len) == (buf.addr, 0)


def test_reset_data_len_keeps_data_pointer(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_reset_data_len): length 0, data where it was."""
    buf = inventory.get_by_args(mmap, mmap.addr, 16, mmap.addr + 5, 6)
    buf.reset_data_len()
    assert (buf.data, buf.data_len, buf.tailroom) == (mmap.addr + 5, 0, 11)


# -- source and destination -----------------------------------------------------------


def test_append_then_commit_grows_the_data(inventory: BufInventory, make_mmap: MmapFactory) -> None:
    """A destination is appended to: write the tailroom, then commit the count."""
    memory = bytearray(32)
    mmap = make_mmap(memory)
    buf = inventory.get_by_args(mmap, mmap.addr, 32, mmap.addr + 2, 3)
    buf.append_view()[:4] = b"abcd"
    buf.commit_append(4)
    assert (buf.data_len, buf.tailroom) == (7, 23)
    assert memory[5:9] == b"abcd"
    assert bytes(buf.source_view())[3:] == b"abcd"


def test_commit_beyond_the_tailroom_is_invalid(inventory: BufInventory, mmap: Mmap) -> None:
    """Appending more than the tailroom holds is INVALID_VALUE and changes nothing."""
    buf = inventory.get_by_addr(mmap, mmap.addr, 8)
    assert error_code(lambda: buf.commit_append(9)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: buf.commit_append(-1)) is DocaErrorCode.INVALID_VALUE
    assert buf.data_len == 0


def test_read_only_mmap_is_no_destination(inventory: BufInventory, make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3: a destination needs LOCAL_READ_WRITE; reading the source still works."""
    mmap = make_mmap(b"read-only bytes", access=AccessFlag.LOCAL_READ_ONLY)
    buf = inventory.get_by_data(mmap, mmap.addr, 4)
    assert bytes(buf.source_view()) == b"read"
    assert error_code(buf.append_view) is DocaErrorCode.NOT_PERMITTED


def test_remote_buf_has_no_local_bytes(inventory: BufInventory, make_mmap: MmapFactory, dev: Dev) -> None:
    """DOCA Core 3.3: a buffer in a remote mmap has addresses but no local memory."""
    local = make_mmap(access=AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE)
    remote = Mmap.create_from_export(local.export_rdma(dev), dev)
    buf = inventory.get_by_addr(remote, remote.addr + 64, 128)
    assert (buf.addr, buf.length) == (local.addr + 64, 128)
    for view in (buf.view, buf.source_view, buf.append_view):
        assert error_code(view) is DocaErrorCode.NOT_PERMITTED
    buf.dec_refcount()
    remote.destroy()


# -- lists ----------------------------------------------------------------------------------------


def _bufs(inventory: BufInventory, mmap: Mmap, n: int) -> list[Buf]:
    return [inventory.get_by_data(mmap, mmap.addr + 10 * i, 10) for i in range(n)]


def test_chain_list_appends_a_list(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_chain_list): list2 follows list1's last element."""
    a, b, c = _bufs(inventory, mmap, 3)
    b.chain_list(c)
    a.chain_list(b)
    assert list(a) == [a, b, c]
    assert a.list_len == 3
    assert a.get_next() is b
    assert b.get_next() is c
    assert c.get_next() is None
    assert a.get_last() is c
    assert (a.is_first, a.is_last, b.is_first, c.is_last, a.is_in_list) == (True, False, False, True, True)


def test_chain_needs_heads_and_refcount_one(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_chain_list): both must be heads, list2 with refcount 1 (NOT_PERMITTED)."""
    a, b, c, d = _bufs(inventory, mmap, 4)
    a.chain_list(b)
    assert error_code(lambda: c.chain_list(b)) is DocaErrorCode.NOT_PERMITTED  # b is not a head
    assert error_code(lambda: b.chain_list(c)) is DocaErrorCode.NOT_PERMITTED
    d.inc_refcount()
    assert error_code(lambda: c.chain_list(d)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: c.chain_list(c)) is DocaErrorCode.INVALID_VALUE
    assert c.list_len == 1
    assert d.list_len == 1


def test_chain_length_is_limited(inventory: BufInventory, mmap: Mmap) -> None:
    """A list may not grow past the inventory's max_list_len (TOO_BIG)."""
    bufs = _bufs(inventory, mmap, 5)
    for buf in bufs[1:4]:
        bufs[0].chain_list(buf)
    assert bufs[0].list_len == inventory.max_list_len == 4
    assert error_code(lambda: bufs[0].chain_list(bufs[4])) is DocaErrorCode.TOO_BIG
    assert bufs[0].list_len == 4
    assert bufs[4].is_first


def test_list_len_only_on_the_head(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_get_list_len): NOT_PERMITTED unless the buffer is a head."""
    a, b = _bufs(inventory, mmap, 2)
    a.chain_list(b)
    assert error_code(lambda: b.list_len) is DocaErrorCode.NOT_PERMITTED


def test_unchain_splits_the_list(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_unchain_list): list2 becomes a head with refcount 1."""
    a, b, c, d = _bufs(inventory, mmap, 4)
    for buf in (b, c, d):
        a.chain_list(buf)
    a.unchain(c)
    assert list(a) == [a, b]
    assert list(c) == [c, d]
    assert c.is_first
    assert c.refcount == 1
    assert error_code(lambda: a.unchain(d)) is DocaErrorCode.INVALID_VALUE  # d is no longer in a's list
    assert error_code(lambda: a.unchain(a)) is DocaErrorCode.INVALID_VALUE


# -- references -----------------------------------------------------------------------------------


def test_refcount_returns_the_count_before(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_inc/dec_refcount): the out value is the count before the call."""
    (buf,) = _bufs(inventory, mmap, 1)
    assert buf.inc_refcount() == 1
    assert buf.inc_refcount() == 2
    assert buf.dec_refcount() == 3
    assert buf.refcount == 2
    assert inventory.num_free == 15


def test_dec_to_zero_returns_the_whole_list(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_dec_refcount): at 0 every buffer of the list goes back."""
    a, b, c = _bufs(inventory, mmap, 3)
    a.chain_list(b)
    a.chain_list(c)
    assert inventory.num_free == 13
    assert mmap.num_bufs == 3
    assert a.dec_refcount() == 1
    assert inventory.num_free == 16
    assert mmap.num_bufs == 0
    assert all(buf.refcount == 0 and not buf.is_in_list for buf in (a, b, c))


def test_references_live_on_the_head(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_inc_refcount): a non-head element is NOT_PERMITTED."""
    a, b = _bufs(inventory, mmap, 2)
    a.chain_list(b)
    assert error_code(b.inc_refcount) is DocaErrorCode.NOT_PERMITTED
    assert error_code(b.dec_refcount) is DocaErrorCode.NOT_PERMITTED


def test_refcount_is_a_uint16(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_inc_refcount): past UINT16_MAX is TOO_BIG."""
    (buf,) = _bufs(inventory, mmap, 1)
    for _ in range(MAX_REFCOUNT - 1):
        buf.inc_refcount()
    assert buf.refcount == MAX_REFCOUNT
    assert error_code(buf.inc_refcount) is DocaErrorCode.TOO_BIG


def test_released_buf_is_bad_state(inventory: BufInventory, mmap: Mmap) -> None:
    """DOCA Core 3.3 (doca_buf_dec_refcount): a count already 0 is BAD_STATE, and so is using the buffer."""
    (buf,) = _bufs(inventory, mmap, 1)
    buf.dec_refcount()
    for call in (buf.dec_refcount, buf.inc_refcount, buf.source_view, buf.reset_data_len):
        assert error_code(call) is DocaErrorCode.BAD_STATE


def test_with_block_drops_one_reference(inventory: BufInventory, mmap: Mmap) -> None:
    """Style rule 7: a buffer is a context manager releasing its reference."""
    with inventory.get_by_addr(mmap, mmap.addr, 8) as buf:
        assert inventory.num_free == 15
    assert buf.refcount == 0
    assert inventory.num_free == 16


# -- a job's plan ---------------------------------------------------------------------------


def test_a_plan_holds_until_a_planned_slot_of_a_buffer_changes(inventory: BufInventory, mmap: Mmap) -> None:
    """`plan_holds` compares, slot by slot, exactly what `plan_state` records: a change of any one
    of them in any buffer of the list voids a resubmitted job's plan (``rdmakit.doca.rdma_jobs``)."""
    from rdmakit.doca.buf import PLAN_SLOTS, plan_holds, plan_state

    bufs = (inventory.get_by_data(mmap, mmap.addr, 8), inventory.get_by_addr(mmap, mmap.addr + 8, 8))
    state = tuple(map(plan_state, bufs))
    assert plan_holds(bufs, state)
    other = inventory.get_by_addr(mmap, mmap.addr + 64, 8)
    for buf in bufs:
        for slot in PLAN_SLOTS:
            if slot in ("_prev", "_next"):
                continue
            was = getattr(buf, slot)
            setattr(buf, slot, other if slot == "_mmap" else was + 1)
            assert not plan_holds(bufs, state), slot
            setattr(buf, slot, was)
            assert plan_holds(bufs, state)
    # The list neighbours, through the API: the head gains a next, the chained buffer a previous.
    bufs[0].chain_list(other)
    assert not plan_holds(bufs, state)
    bufs[0].unchain(other)
    assert plan_holds(bufs, state)
    bufs[1].chain_list(other)
    assert not plan_holds(bufs, state)
    bufs[1].unchain(other)
    other.chain_list(bufs[1])
    assert not plan_holds(bufs, state)
