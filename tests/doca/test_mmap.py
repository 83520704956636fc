"""DOCA Core 3.3: the memory map (doca_mmap.h)."""

import ctypes
import json
import mmap as stdlib_mmap
from functools import partial
from ipaddress import IPv6Address
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmakit.doca import (
    DESCRIPTOR_FORMAT,
    AccessFlag,
    BufInventory,
    Dev,
    DocaError,
    DocaErrorCode,
    Fault,
    LocalBackendDevice,
    Mmap,
    MmapDescriptor,
    local_devinfo,
)
from tests.doca.util import MmapFactory, error_code

if TYPE_CHECKING:
    from typing_extensions import Buffer


def as_buffer(array: np.ndarray[Any, Any]) -> "Buffer":
    """`array` as the Buffer it is: numpy's stubs give ndarray ``__buffer__`` only from Python 3.12."""
    return cast("Buffer", array)


RDMA_RW = AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE


# -- permissions ---------------------------------------------------------------------


def test_access_flags_match_doca_types_h() -> None:
    """DOCA Core 3.1.2: enum doca_access_flag has the values of doca_types.h."""
    assert {flag.name: flag.value for flag in AccessFlag} | {"LOCAL_READ_ONLY": 0} == {
        "LOCAL_READ_ONLY": 0,
        "LOCAL_READ_WRITE": 1,
        "RDMA_READ": 2,
        "RDMA_WRITE": 4,
        "RDMA_ATOMIC": 8,
        "PCI_READ_ONLY": 16,
        "PCI_READ_WRITE": 32,
        "PCI_RELAXED_ORDERING": 64,
    }
    assert int(AccessFlag.LOCAL_READ_ONLY) == 0


def test_undefined_access_bits_are_invalid() -> None:
    """DOCA Core 3.3 (doca_mmap_set_permissions): an undefined flag is INVALID_VALUE."""
    assert error_code(lambda: Mmap().set_permissions(1 << 7)) is DocaErrorCode.INVALID_VALUE


def test_pci_read_only_and_read_write_are_exclusive() -> None:
    """DOCA Core 3.3 (doca_mmap_set_permissions): an invalid combination is INVALID_VALUE."""
    flags = AccessFlag.PCI_READ_ONLY | AccessFlag.PCI_READ_WRITE
    assert error_code(lambda: Mmap().set_permissions(flags)) is DocaErrorCode.INVALID_VALUE


# -- memory range ------------------------------------------------------------------------


def test_address_is_the_buffers_real_address() -> None:
    """DOCA Core 3.3: the range's address is where the bytes are (ctypes agrees)."""
    memory = bytearray(100)
    mmap = Mmap()
    mmap.set_memrange(memory)
    assert not mmap.synthetic_addr
    assert mmap.memrange == (ctypes.addressof((ctypes.c_char * 100).from_buffer(memory)), 100)


def test_address_of_a_slice_is_offset() -> None:
    """A memoryview slice maps from its own first byte, not its exporter's."""
    memory = bytearray(100)
    whole, part = Mmap(), Mmap()
    whole.set_memrange(memory)
    part.set_memrange(memoryview(memory)[10:30])
    assert part.memrange == (whole.addr + 10, 20)


def test_numpy_array_maps_its_data() -> None:
    """A numpy array maps its data buffer; the address is the array's own."""
    array = np.zeros((4, 8), dtype=np.float64)
    mmap = Mmap()
    mmap.set_memrange(as_buffer(array))
    assert mmap.memrange == (array.ctypes.data, array.nbytes)


def test_read_only_numpy_array_needs_read_only_permissions() -> None:
    """DOCA Core 3.3: read-only memory is mapped only without write permissions."""
    array = np.arange(16, dtype=np.uint8)
    array.setflags(write=False)
    refused = Mmap()
    assert error_code(lambda: refused.set_memrange(as_buffer(array))) is DocaErrorCode.INVALID_VALUE
    accepted = Mmap()
    accepted.set_permissions(AccessFlag.LOCAL_READ_ONLY | AccessFlag.RDMA_READ)
    accepted.set_memrange(as_buffer(array))
    assert accepted.addr == array.ctypes.data


def test_bytes_refuse_write_permission_after_the_fact() -> None:
    """A write permission set after a read-only range is INVALID_VALUE and changes nothing."""
    mmap = Mmap()
    mmap.set_permissions(AccessFlag.RDMA_READ)
    mmap.set_memrange(b"constant")
    assert error_code(lambda: mmap.set_permissions(AccessFlag.RDMA_WRITE)) is DocaErrorCode.INVALID_VALUE
    assert mmap.permissions is AccessFlag.RDMA_READ


def test_file_mmap_is_mapped_and_pinned(tmp_path: Path, dev: Dev) -> None:
    """An mmap.mmap of a file maps; bytes written through a Buf land in the file."""
    path = tmp_path / "region"
    path.write_bytes(bytes(4096))
    with path.open("r+b") as f, stdlib_mmap.mmap(f.fileno(), 4096) as region:
        mmap = Mmap()
        mmap.set_memrange(region)
        mmap.add_dev(dev)
        mmap.start()
        inventory = BufInventory(1)
        inventory.start()
        with inventory.get_by_addr(mmap, mmap.addr + 100, 5) as buf:
            buf.append_view()[:] = b"hello"
        with pytest.raises(BufferError):
            region.close()  # pinned while mapped
        mmap.destroy()
        region.flush()
    assert path.read_bytes()[100:105] == b"hello"


@pytest.mark.parametrize(
    "memory",
    [bytearray(0), memoryview(bytearray(10))[::2], 42, "text"],
    ids=["empty", "non-contiguous", "int", "str"],
)
def test_unusable_memory_is_invalid(memory: Any) -> None:
    """DOCA Core 3.3 (doca_mmap_set_memrange): empty, strided or non-buffer memory is INVALID_VALUE."""
    assert error_code(lambda: Mmap().set_memrange(memory)) is DocaErrorCode.INVALID_VALUE


def test_memrange_is_set_once() -> None:
    """DOCA Core 3.3 (doca_mmap_set_memrange): a second memrange is NOT_PERMITTED."""
    mmap = Mmap()
    mmap.set_memrange(bytearray(8))
    assert error_code(lambda: mmap.set_memrange(bytearray(8))) is DocaErrorCode.NOT_PERMITTED


def test_memrange_unset_is_bad_state() -> None:
    """DOCA Core 3.3 (doca_mmap_get_memrange): no range yet is BAD_STATE."""
    assert error_code(lambda: Mmap().memrange) is DocaErrorCode.BAD_STATE


# -- lifecycle ---------------------------------------------------------------------------


def test_start_needs_a_memrange(dev: Dev) -> None:
    """DOCA Core 3.3 (doca_mmap_start): starting without a range is INVALID_VALUE."""
    mmap = Mmap()
    mmap.add_dev(dev)
    assert error_code(mmap.start) is DocaErrorCode.INVALID_VALUE
    assert not mmap.started


def test_start_registers_with_every_device(rng: Any) -> None:
    """DOCA Core 3.3 (doca_mmap_start): the range is registered with each added device."""
    devs = [Dev.open(local_devinfo(f"local{i}", rng=rng)) for i in range(2)]
    mmap = Mmap()
    mmap.set_memrange(bytearray(64))
    for d in devs:
        mmap.add_dev(d)
    mmap.start()
    for d in devs:
        backend = d.backend
        assert isinstance(backend, LocalBackendDevice)
        reg = mmap.registration(d)
        assert (reg.addr, reg.length) == mmap.memrange
        backend.resolve(reg.lkey, mmap.addr, 64, remote=False, write=True)
    mmap.stop()
    assert all(isinstance(d.backend, LocalBackendDevice) and d.backend.num_registrations == 0 for d in devs)
    mmap.destroy()  # doca_dev_close is IN_USE while an mmap holds the device
    for d in devs:
        d.close()


def test_cannot_be_modified_after_start(make_mmap: MmapFactory, dev: Dev) -> None:
    """DOCA Core 3.3: a started mmap cannot be modified (set_* BAD_STATE, add/rm_dev NOT_PERMITTED)."""
    mmap = make_mmap()
    assert error_code(lambda: mmap.set_memrange(bytearray(8))) is DocaErrorCode.BAD_STATE
    assert error_code(lambda: mmap.set_permissions(RDMA_RW)) is DocaErrorCode.BAD_STATE
    assert error_code(lambda: mmap.add_dev(dev)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: mmap.rm_dev(dev)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(mmap.start) is DocaErrorCode.BAD_STATE


def test_stop_allows_configuration_again(make_mmap: MmapFactory, dev: Dev) -> None:
    """DOCA Core 3.3 (doca_mmap_stop): after stop, properties and devices change again."""
    mmap = make_mmap()
    mmap.stop()
    mmap.set_permissions(RDMA_RW)
    mmap.rm_dev(dev)
    mmap.add_dev(dev)
    mmap.start()
    assert mmap.permissions == RDMA_RW


def test_device_added_twice_or_missing(dev: Dev) -> None:
    """DOCA Core 3.3 (doca_mmap_add_dev/rm_dev): ALREADY_EXIST and NOT_FOUND."""
    mmap = Mmap()
    mmap.add_dev(dev)
    assert error_code(lambda: mmap.add_dev(dev)) is DocaErrorCode.ALREADY_EXIST
    mmap.rm_dev(dev)
    assert error_code(lambda: mmap.rm_dev(dev)) is DocaErrorCode.NOT_FOUND


def test_stop_and_destroy_refused_while_bufs_point_in(make_mmap: MmapFactory) -> None:
    """DOCA Core 3.3 (doca_mmap_stop/destroy): NOT_PERMITTED while buffers point into the mmap."""
    mmap = make_mmap()
    inventory = BufInventory(2)
    inventory.start()
    buf = inventory.get_by_addr(mmap, mmap.addr, 16)
    assert mmap.num_bufs == 1
    assert error_code(mmap.stop) is DocaErrorCode.NOT_PERMITTED
    assert error_code(mmap.destroy) is DocaErrorCode.NOT_PERMITTED
    assert mmap.started
    buf.dec_refcount()
    assert mmap.num_bufs == 0
    mmap.destroy()
    assert mmap.destroyed


def test_destroy_is_idempotent_and_unpins(dev: Dev) -> None:
    """Style rule 7: destroy twice is fine, later use is BAD_STATE, and the buffer is released."""
    memory = bytearray(16)
    mmap = Mmap()
    mmap.set_memrange(memory)
    mmap.add_dev(dev)
    mmap.start()
    with pytest.raises(BufferError):
        memory.extend(b"x")
    with mmap:
        pass
    mmap.destroy()
    memory.extend(b"x")  # released
    assert error_code(lambda: mmap.view(mmap.addr, 1)) is DocaErrorCode.BAD_STATE
    assert error_code(mmap.start) is DocaErrorCode.BAD_STATE
    assert mmap.devs == ()


# -- export ------------------------------------------------------------------------------------


def test_export_needs_rdma_permission(make_mmap: MmapFactory, dev: Dev) -> None:
    """DOCA Core 3.3 (doca_mmap_export_rdma): no RDMA permission is NOT_PERMITTED."""
    mmap = make_mmap(access=AccessFlag.LOCAL_READ_WRITE)
    assert error_code(lambda: mmap.export_rdma(dev)) is DocaErrorCode.NOT_PERMITTED
    assert not mmap.exported


def test_export_needs_start(dev: Dev) -> None:
    """DOCA Core 3.3 (doca_mmap_export_rdma): an un-started mmap is NOT_PERMITTED."""
    mmap = Mmap()
    mmap.set_permissions(RDMA_RW)
    mmap.set_memrange(bytearray(8))
    mmap.add_dev(dev)
    assert error_code(lambda: mmap.export_rdma(dev)) is DocaErrorCode.NOT_PERMITTED


def test_export_on_a_device_not_added_is_not_found(make_mmap: MmapFactory, rng: Any) -> None:
    """DOCA Core 3.3 (doca_mmap_export_rdma): a device not in the mmap is NOT_FOUND."""
    mmap = make_mmap(access=RDMA_RW)
    with Dev.open(local_devinfo("other0", rng=rng)) as other:
        assert error_code(lambda: mmap.export_rdma(other)) is DocaErrorCode.NOT_FOUND


def test_export_describes_range_key_rights_and_device(
    make_mmap: MmapFactory, dev: Dev, backend: LocalBackendDevice
) -> None:
    """DOCA Core 3.3 (doca_mmap_export_rdma): the descriptor has what a peer needs, and its rkey works."""
    memory = bytearray(256)
    mmap = make_mmap(memory, access=AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE)
    raw = mmap.export_rdma(dev)
    assert mmap.exported
    obj = json.loads(raw)
    assert obj == {
        "format": "rdmakit.mmap/1",
        "addr": mmap.addr,
        "length": 256,
        "rkey": mmap.registration(dev).rkey,
        "access": ["LOCAL_READ_WRITE", "RDMA_WRITE"],
        "device": "local0",
        "gid": "0000:0000:0000:0000:0000:ffff:7f00:0001",
        "mtu": 4096,
    }
    backend.resolve(obj["rkey"], obj["addr"] + 8, 4, remote=True, write=True)[:] = b"peer"
    assert memory[8:12] == b"peer"
    assert error_code(lambda: backend.resolve(obj["rkey"], obj["addr"], 4, remote=True, write=False)) is (
        DocaErrorCode.NOT_PERMITTED
    )


def test_stop_withdraws_the_export(make_mmap: MmapFactory, dev: Dev, backend: LocalBackendDevice) -> None:
    """DOCA Core 3.3 (doca_mmap_stop): stopping invalidates what was exported."""
    mmap = make_mmap(access=RDMA_RW)
    rkey = json.loads(mmap.export_rdma(dev))["rkey"]
    mmap.stop()
    assert not mmap.exported
    assert error_code(lambda: backend.resolve(rkey, mmap.addr, 1, remote=True, write=False)) is (
        DocaErrorCode.NOT_PERMITTED
    )


def test_create_from_export_is_a_remote_mmap(make_mmap: MmapFactory, dev: Dev) -> None:
    """DOCA Core 3.3 (doca_mmap_create_from_export): the peer's range and rights, no local memory."""
    local = make_mmap(access=RDMA_RW)
    remote = Mmap.create_from_export(local.export_rdma(dev), dev)
    assert remote.from_export
    assert remote.started
    assert remote.memrange == local.memrange
    assert remote.permissions == RDMA_RW
    assert isinstance(remote.descriptor, MmapDescriptor)
    assert remote.descriptor.rkey == local.registration(dev).rkey
    assert error_code(lambda: remote.view(remote.addr, 1)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: remote.set_memrange(bytearray(1))) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: remote.set_permissions(0)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: remote.add_dev(dev)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: remote.export_rdma(dev)) is DocaErrorCode.NOT_PERMITTED
    assert error_code(remote.stop) is DocaErrorCode.NOT_PERMITTED
    remote.destroy()


# -- descriptor codec --------------------------------------------------------------------------

GID = IPv6Address("::ffff:192.0.2.1")
DESCRIPTORS = [
    (
        MmapDescriptor(
            addr=0x1000, length=64, rkey=7, access=AccessFlag.RDMA_READ, device="d", gid=GID, mtu=1024
        ),
        b'{"access":["RDMA_READ"],"addr":4096,"device":"d","format":"rdmakit.mmap/1",'
        b'"gid":"0000:0000:0000:0000:0000:ffff:c000:0201","length":64,"mtu":1024,"rkey":7}',
    ),
    (
        MmapDescriptor(
            addr=(1 << 64) - 1,
            length=1,
            rkey=(1 << 32) - 1,
            access=AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC,
            device="mlx5_0",
            gid=IPv6Address("fe80::1"),
            mtu=4096,
        ),
        b'{"access":["LOCAL_READ_WRITE","RDMA_WRITE","RDMA_ATOMIC"],"addr":18446744073709551615,'
        b'"device":"mlx5_0","format":"rdmakit.mmap/1","gid":"fe80:0000:0000:0000:0000:0000:0000:0001",'
        b'"length":1,"mtu":4096,"rkey":4294967295}',
    ),
]


@pytest.mark.parametrize(("desc", "raw"), DESCRIPTORS)
def test_descriptor_codec_both_ways(desc: MmapDescriptor, raw: bytes) -> None:
    """The export descriptor encodes canonically and decodes to the same value."""
    assert desc.to_bytes() == raw
    assert MmapDescriptor.from_bytes(raw) == desc


def _valid() -> dict[str, Any]:
    valid: dict[str, Any] = json.loads(DESCRIPTORS[0][1])
    return valid


def _with(**changes: Any) -> bytes:
    obj = _valid()
    for key, value in changes.items():
        if value is _DROP:
            del obj[key]
        else:
            obj[key] = value
    return json.dumps(obj).encode()


_DROP = object()
BAD_DESCRIPTORS = [
    ("truncated", DESCRIPTORS[0][1][:-1], "descriptor"),
    ("empty", b"", "descriptor"),
    ("not utf-8", b"\xff" + DESCRIPTORS[0][1], "descriptor"),
    ("json list", b"[]", "descriptor"),
    ("NaN", _with(addr=float("nan")), "descriptor"),
    ("too long", b" " * 5000 + DESCRIPTORS[0][1], "descriptor"),
    ("deep nesting", b"[" * 4000, "descriptor"),
    ("huge int", b'{"addr": ' + b"9" * 5000 + b"}", "descriptor"),
    ("wrong format", _with(format="other/1"), "format"),
    ("future version", _with(format="rdmakit.mmap/2"), "format"),
    ("format type", _with(format=1), "format"),
    ("missing rkey", _with(rkey=_DROP), "rkey"),
    ("unknown field", _with(secret=1), "secret"),
    ("addr string", _with(addr="4096"), "addr"),
    ("addr bool", _with(addr=True), "addr"),
    ("addr negative", _with(addr=-1), "addr"),
    ("addr float", _with(addr=4096.0), "addr"),
    ("addr 2**64", _with(addr=1 << 64), "addr"),
    ("length zero", _with(length=0), "length"),
    ("range overflows", _with(addr=(1 << 64) - 8, length=9), "length"),
    ("rkey 2**32", _with(rkey=1 << 32), "rkey"),
    ("access string", _with(access="RDMA_READ"), "access"),
    ("access unknown", _with(access=["RDMA_EVERYTHING"]), "access"),
    ("access zero flag", _with(access=["LOCAL_READ_ONLY", "RDMA_READ"]), "access"),
    ("access twice", _with(access=["RDMA_READ", "RDMA_READ"]), "access"),
    ("access not RDMA", _with(access=["LOCAL_READ_WRITE"]), "access"),
    ("access member type", _with(access=[2]), "access"),
    ("device empty", _with(device=""), "device"),
    ("device type", _with(device=None), "device"),
    ("gid garbage", _with(gid="not-a-gid"), "gid"),
    ("gid ipv4", _with(gid="192.0.2.1"), "gid"),
    ("mtu 1500", _with(mtu=1500), "mtu"),
    ("duplicate key", DESCRIPTORS[0][1][:-1] + b',"rkey":8}', "rkey"),
]


@pytest.mark.parametrize(
    ("raw", "field"), [c[1:] for c in BAD_DESCRIPTORS], ids=[c[0] for c in BAD_DESCRIPTORS]
)
def test_bad_descriptor_is_invalid_value_naming_the_field(dev: Dev, raw: bytes, field: str) -> None:
    """DOCA Core 3.3 (doca_mmap_create_from_export): a bad descriptor is INVALID_VALUE, the peer's fault."""
    with pytest.raises(DocaError) as exc:
        Mmap.create_from_export(raw, dev)
    assert exc.value.code is DocaErrorCode.INVALID_VALUE
    assert exc.value.fault is Fault.PEER
    assert repr(field) in exc.value.message


def test_descriptor_must_be_bytes(dev: Dev) -> None:
    """A str or dict is not a descriptor."""
    not_bytes: list[Any] = [DESCRIPTORS[0][1].decode(), _valid()]
    for value in not_bytes:
        assert error_code(partial(Mmap.create_from_export, value, dev)) is DocaErrorCode.INVALID_VALUE


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)


@st.composite
def mutated_descriptors(draw: st.DrawFn) -> bytes:
    """A valid descriptor with fields dropped, replaced by any JSON, or added."""
    obj = _valid()
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from([*obj, "extra"]) if obj else st.just("extra"))
        if draw(st.booleans()) and key in obj:
            del obj[key]
        else:
            obj[key] = draw(JSON)
    return json.dumps(obj).encode()


@st.composite
def corrupted_descriptors(draw: st.DrawFn) -> bytes:
    """A valid descriptor truncated, or with bytes flipped."""
    raw = bytearray(DESCRIPTORS[draw(st.integers(0, 1))][1])
    if draw(st.booleans()):
        return bytes(raw[: draw(st.integers(0, len(raw) - 1))])
    for _ in range(draw(st.integers(1, 3))):
        raw[draw(st.integers(0, len(raw) - 1))] ^= draw(st.integers(1, 255))
    return bytes(raw)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(raw=st.binary(max_size=300) | mutated_descriptors() | corrupted_descriptors())
def test_create_from_export_fuzz_only_invalid_value(dev: Dev, raw: bytes) -> None:
    """DOCA Core 3.3: any descriptor either imports or fails with DocaError(INVALID_VALUE), nothing else."""
    code: DocaErrorCode | None
    try:
        remote = Mmap.create_from_export(raw, dev)
    except DocaError as exc:
        code = exc.code
    else:
        code = None
    if code is not None:
        assert code is DocaErrorCode.INVALID_VALUE
        return
    desc = remote.descriptor
    assert desc is not None
    assert MmapDescriptor.from_bytes(desc.to_bytes()) == desc
    assert desc.addr >= 0
    assert desc.addr + desc.length <= 1 << 64
    remote.destroy()


@settings(deadline=None)
@given(
    addr=st.integers(0, (1 << 64) - 1),
    length=st.integers(1, 1 << 64),
    rkey=st.integers(0, (1 << 32) - 1),
    access=st.sets(st.sampled_from([f for f in AccessFlag if f]), min_size=1),
    mtu=st.sampled_from([256, 512, 1024, 2048, 4096]),
)
def test_descriptor_round_trip(addr: int, length: int, rkey: int, access: set[AccessFlag], mtu: int) -> None:
    """Every valid descriptor survives encoding and decoding."""
    flags = AccessFlag.RDMA_READ
    for flag in access:
        flags |= flag
    length = min(length, (1 << 64) - addr)
    desc = MmapDescriptor(addr=addr, length=length, rkey=rkey, access=flags, device="x", gid=GID, mtu=mtu)
    assert MmapDescriptor.from_bytes(desc.to_bytes()) == desc


def test_format_constant() -> None:
    """The descriptor format names its version."""
    assert DESCRIPTOR_FORMAT == "rdmakit.mmap/1"
