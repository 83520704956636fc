"""The backend boundary: every backend's objects, the QP state machine, the connect attributes, and
the in-tree LocalBackendDevice (DOCA Core 3.2/3.3 underneath).

What each backend promises on a pair of devices (data movement, protection, flushes) is
``rdmakit.testing.backend.check_backend_pair``'s, run in test_backend_conformance.py and, on a verbs
device, in the lab; here are the QP transitions one at a time, with what each changes.
"""

import dataclasses
import random
from collections.abc import Callable, Iterator
from typing import Literal

import pytest

from rdmakit.cli import bench_qp
from rdmakit.doca import (
    BackendDevice,
    BackendQP,
    ConnectAttrs,
    DocaError,
    DocaErrorCode,
    Fault,
    LocalBackendDevice,
    SoftBackendDevice,
)
from rdmakit.doca.soft import SoftBackendQP
from rdmakit.engine.states import QpState
from rdmakit.engine.types import SGE, Access, QpCaps, RecvWR, SendWR, WcStatus, WrOpcode
from rdmakit.transport.connect import DEFAULT_TIMEOUT
from rdmakit.verbs.buffers import buffer_address

RW = Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE
Transport = Literal["roce-udp", "tcp"]


def _state(qp: BackendQP) -> QpState:
    """The QP's state now (a call, so that a check after an action is not narrowed away)."""
    return qp.state


@pytest.fixture(params=["roce-udp", "tcp"])
def soft_pair(
    request: pytest.FixtureRequest, new_ip: Callable[[], str]
) -> Iterator[tuple[SoftBackendDevice, ...]]:
    transport: Transport = request.param
    devs = (SoftBackendDevice(transport, new_ip()), SoftBackendDevice(transport, new_ip()))
    yield devs
    for dev in devs:
        dev.close()


def _drain(devs: tuple[BackendDevice, ...], qp: BackendQP, n: int) -> list[tuple[int, WcStatus]]:
    """`n` completions of `qp` (the devices' pumps run until they come)."""
    got: list[tuple[int, WcStatus]] = []
    for _ in range(100_000):
        for dev in devs:
            dev.pump.progress()
        got += [(wc.wr_id, wc.status) for wc in qp.poll(n - len(got))]
        if len(got) == n:
            return got
    raise AssertionError(f"{n - len(got)} completions never came: {got}")


def _refused(call: Callable[[], object], code: DocaErrorCode) -> None:
    with pytest.raises(DocaError) as exc:
        call()
    assert exc.value.code is code, exc.value


def test_every_backends_objects_satisfy_the_protocols(
    rng: random.Random, soft_pair: tuple[SoftBackendDevice, ...]
) -> None:
    """At run time too: the devices and the QPs they create are BackendDevice and BackendQP."""
    local = LocalBackendDevice(rng=rng)
    assert isinstance(local, BackendDevice)
    for dev in soft_pair:
        assert isinstance(dev, BackendDevice)
        qp = dev.create_qp(QpCaps())
        assert isinstance(qp, BackendQP)
        assert qp.connect_attrs == ConnectAttrs()
        qp.close()
    assert not isinstance(object(), BackendQP)


def test_init_reset_and_to_error_move_the_qp_with_visible_effects(
    soft_pair: tuple[SoftBackendDevice, ...],
) -> None:
    """IBTA Vol. 1 §10.3.1: what each state allows, and what the transitions do to posted work."""
    a, _ = soft_pair
    buf = bytearray(64)
    view = memoryview(buf)
    reg = a.register_memory(view, buffer_address(view), RW)
    recv = RecvWR(wr_id=1, sg_list=(SGE(reg.addr, 64, reg.lkey),))
    send = SendWR(wr_id=2, opcode=WrOpcode.SEND, sg_list=(SGE(reg.addr, 8, reg.lkey),))
    qp = a.create_qp(QpCaps())
    assert _state(qp) is QpState.RESET
    _refused(lambda: qp.post_recv(recv), DocaErrorCode.BAD_STATE)  # RESET takes no work
    qp.to_error()  # a no-op in RESET
    assert _state(qp) is QpState.RESET

    qp.init(Access.REMOTE_WRITE | Access.LOCAL_WRITE)
    assert _state(qp) is QpState.INIT
    qp.post_recv(recv)  # INIT takes receives before the peer is known ...
    _refused(lambda: qp.post_send(send), DocaErrorCode.BAD_STATE)  # ... and no sends
    qp.init(Access.REMOTE_READ)  # a no-op outside RESET: the access of the first init stays
    assert _state(qp) is QpState.INIT
    assert qp.engine_qp.attrs.access == Access.REMOTE_WRITE | Access.LOCAL_WRITE
    assert list(qp.poll(8)) == []

    qp.to_error()  # ERR: what was posted completes flushed, and so does what is posted later
    assert _state(qp) is QpState.ERR
    assert _drain(soft_pair, qp, 1) == [(1, WcStatus.WR_FLUSH_ERR)]
    qp.post_recv(dataclasses.replace(recv, wr_id=3))
    qp.post_send(send)
    assert sorted(_drain(soft_pair, qp, 2)) == [(2, WcStatus.WR_FLUSH_ERR), (3, WcStatus.WR_FLUSH_ERR)]
    qp.to_error()  # ERR already
    assert _state(qp) is QpState.ERR

    psns = {qp.export()["psn"]}
    qp.init(RW)
    qp.post_recv(recv)
    qp.reset()  # RESET: outstanding work goes without completions, the PSN is drawn again
    assert _state(qp) is QpState.RESET
    for _ in range(100):
        for dev in soft_pair:
            dev.pump.progress()
    assert list(qp.poll(8)) == []
    _refused(lambda: qp.post_recv(recv), DocaErrorCode.BAD_STATE)
    for _ in range(2):
        psns.add(qp.export()["psn"])
        qp.reset()
    assert len(psns) > 1  # three 24-bit draws from the CSPRNG are not all equal
    qp.init(RW)
    assert _state(qp) is QpState.INIT
    assert qp.engine_qp.attrs.access == RW  # a fresh INIT takes the new access
    qp.close()


def test_connect_attrs_are_what_connect_sets(soft_pair: tuple[SoftBackendDevice, ...]) -> None:
    """BackendQP.connect_attrs reach the QP's RTR/RTS attributes; by default the transport's timeout."""
    a, b = soft_pair
    qa, qb = a.create_qp(QpCaps()), b.create_qp(QpCaps())
    qa.connect_attrs = ConnectAttrs(
        max_rd_atomic=4, max_dest_rd_atomic=2, min_rnr_timer=20, timeout=9, retry_cnt=3, rnr_retry=5
    )
    qa.init(RW)
    qa.connect(qb.export())
    qb.connect(qa.export())
    got = qa.engine_qp.attrs
    assert (got.state, got.max_rd_atomic, got.max_dest_rd_atomic, got.min_rnr_timer) == (
        QpState.RTS,
        4,
        2,
        20,
    )
    assert (got.timeout, got.retry_cnt, got.rnr_retry) == (9, 3, 5)
    default = qb.engine_qp.attrs
    assert (default.timeout, default.retry_cnt, default.rnr_retry) == (DEFAULT_TIMEOUT[b.transport], 6, 7)
    assert (default.max_rd_atomic, default.max_dest_rd_atomic, default.min_rnr_timer) == (16, 16, 12)
    qa.close()
    qb.close()


def test_the_cli_sets_connect_attrs_through_the_protocol(new_ip: Callable[[], str]) -> None:
    """perftest's and rc-pingpong's set_options: ConnectAttrs fields, on any backend's QP."""
    a, b = SoftBackendDevice("roce-udp", new_ip()), SoftBackendDevice("roce-udp", new_ip())
    try:
        ta = bench_qp.TestQp(a, send_depth=1, recv_depth=1)
        tb = bench_qp.TestQp(b, send_depth=1, recv_depth=1)
        ta.set_options(max_dest_rd_atomic=1, max_rd_atomic=1, min_rnr_timer=14, rnr_retry=6, hop_limit=1)
        assert ta.qp.connect_attrs == ConnectAttrs(
            max_dest_rd_atomic=1, max_rd_atomic=1, min_rnr_timer=14, rnr_retry=6, hop_limit=1
        )
        with pytest.raises(TypeError):
            ta.set_options(no_such_attribute=1)
        ta.connect(gid=tb.gid, qpn=tb.qpn, psn=tb.psn, mtu=tb.mtu)
        assert isinstance(ta.qp, SoftBackendQP)
        got = ta.qp.engine_qp.attrs
        assert (got.max_rd_atomic, got.max_dest_rd_atomic, got.min_rnr_timer, got.rnr_retry) == (1, 1, 14, 6)
        ta.close()
        tb.close()
    finally:
        a.close()
        b.close()


# -- the local backend -----------------------------------------------------------------------------


def _keys(seed: int, n: int) -> list[tuple[int, int]]:
    dev = LocalBackendDevice(rng=random.Random(seed))
    buf = memoryview(bytearray(64))
    return [(r.lkey, r.rkey) for r in (dev.register_memory(buf, 0x1000, RW) for _ in range(n))]


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
