"""The backend boundary and the in-tree LocalBackendDevice (DOCA Core 3.2/3.3 underneath)."""

import random

import pytest

from rdmakit.doca import BackendDevice, DocaError, DocaErrorCode, Fault, LocalBackendDevice
from rdmakit.engine.types import Access, QpCaps

RW = Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE


def _keys(seed: int, n: int) -> list[tuple[int, int]]:
    dev = LocalBackendDevice(rng=random.Random(seed))
    buf = memoryview(bytearray(64))
    return [(r.lkey, r.rkey) for r in (dev.register_memory(buf, 0x1000, RW) for _ in range(n))]


def test_local_device_satisfies_the_protocol(rng: random.Random) -> None:
    """The local backend is a BackendDevice (structurally, as transport and verbs will be)."""
    assert isinstance(LocalBackendDevice(rng=rng), BackendDevice)


def test_keys_replay_from_the_seed(seed: int) -> None:
    """Style rule 1: keys come from the injected random source, so a seed replays them."""
    assert _keys(seed, 20) == _keys(seed, 20)


def test_keys_differ_between_seeds(seed: int) -> None:
    """Keys are not a counter: two seeds give different keys."""
    assert _keys(seed, 20) != _keys(seed + 1, 20)


def test_keys_are_unique_and_nonzero(rng: random.Random) -> None:
    """No two live registrations share a key, and 0 is never a key."""
    dev = LocalBackendDevice(rng=rng)
    buf = memoryview(bytearray(8))
    regs = [dev.register_memory(buf, 0, RW) for _ in range(500)]
    keys = [k for r in regs for k in (r.lkey, r.rkey)]
    assert len(set(keys)) == len(keys)
    assert all(0 < k < 1 << 32 for k in keys)
    assert dev.num_registrations == 500


def test_read_only_buffer_cannot_be_registered_for_write(rng: random.Random) -> None:
    """A read-only buffer is registered only without write access (the caller's mistake)."""
    dev = LocalBackendDevice(rng=rng)
    ro = memoryview(b"abc")
    dev.register_memory(ro, 0, Access.REMOTE_READ)
    with pytest.raises(DocaError) as exc:
        dev.register_memory(ro, 0, Access.LOCAL_WRITE)
    assert exc.value.code is DocaErrorCode.INVALID_VALUE
    assert exc.value.fault is Fault.CALLER


def test_remote_write_requires_local_write(rng: random.Random) -> None:
    """IBTA Vol. 1 §10.6.3.1: REMOTE_WRITE without LOCAL_WRITE is rejected."""
    dev = LocalBackendDevice(rng=rng)
    with pytest.raises(DocaError) as exc:
        dev.register_memory(memoryview(bytearray(8)), 0, Access.REMOTE_WRITE)
    assert exc.value.code is DocaErrorCode.INVALID_VALUE


def test_resolve_checks_key_range_and_permission(rng: random.Random) -> None:
    """IBTA §10.6.3: registered memory is reached only with the right key, range and access right."""
    dev = LocalBackendDevice(rng=rng)
    mem = bytearray(range(16))
    reg = dev.register_memory(memoryview(mem), 0x1000, Access.REMOTE_READ)
    assert bytes(dev.resolve(reg.rkey, 0x1004, 4, remote=True, write=False)) == bytes([4, 5, 6, 7])
    assert bytes(dev.resolve(reg.lkey, 0x1000, 2, remote=False, write=False)) == bytes([0, 1])
    violations = [
        (reg.lkey, 0x1004, 4, True, False),  # lkey used as rkey
        (reg.rkey ^ 1, 0x1004, 4, True, False),  # wrong key
        (reg.rkey, 0x100E, 4, True, False),  # past the end
        (reg.rkey, 0x0FFF, 1, True, False),  # before the start
        (reg.rkey, 0x1000, 4, True, True),  # no REMOTE_WRITE
        (reg.lkey, 0x1000, 4, False, True),  # no LOCAL_WRITE
        (reg.rkey, 0x1000, 4, False, False),  # rkey used as lkey
    ]
    for key, addr, length, remote, write in violations:
        with pytest.raises(DocaError) as exc:
            dev.resolve(key, addr, length, remote=remote, write=write)
        assert exc.value.code is DocaErrorCode.NOT_PERMITTED, (key, addr, length, remote, write)


def test_resolved_view_writes_through(rng: random.Random) -> None:
    """A resolved view is the registered memory itself, not a copy."""
    dev = LocalBackendDevice(rng=rng)
    mem = bytearray(8)
    reg = dev.register_memory(memoryview(mem), 0x2000, RW)
    dev.resolve(reg.rkey, 0x2002, 2, remote=True, write=True)[:] = b"hi"
    assert mem == b"\0\0hi\0\0\0\0"


def test_deregister_invalidates_keys(rng: random.Random) -> None:
    """After deregistration neither key reaches the memory; deregistering again is harmless."""
    dev = LocalBackendDevice(rng=rng)
    reg = dev.register_memory(memoryview(bytearray(8)), 0, RW)
    dev.deregister(reg)
    dev.deregister(reg)
    assert dev.num_registrations == 0
    for key, remote in ((reg.rkey, True), (reg.lkey, False)):
        with pytest.raises(DocaError) as exc:
            dev.resolve(key, 0, 1, remote=remote, write=False)
        assert exc.value.code is DocaErrorCode.NOT_PERMITTED


def test_local_device_has_no_qps(rng: random.Random) -> None:
    """The local backend does no networking: QP creation is NOT_SUPPORTED, a system limit."""
    with pytest.raises(DocaError) as exc:
        LocalBackendDevice(rng=rng).create_qp(QpCaps())
    assert exc.value.code is DocaErrorCode.NOT_SUPPORTED
    assert exc.value.fault is Fault.SYSTEM


def test_closed_device_refuses_registration(rng: random.Random) -> None:
    """A closed device registers nothing (BAD_STATE) and has dropped its registrations."""
    dev = LocalBackendDevice(rng=rng)
    dev.register_memory(memoryview(bytearray(8)), 0, RW)
    dev.close()
    dev.close()
    assert dev.num_registrations == 0
    with pytest.raises(DocaError) as exc:
        dev.register_memory(memoryview(bytearray(8)), 0, RW)
    assert exc.value.code is DocaErrorCode.BAD_STATE
