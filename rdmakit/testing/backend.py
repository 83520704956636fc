"""The backend conformance suite: what every ``rdmakit.doca.backend`` implementation promises.

`check_backend_pair` is to a backend what trio's ``check_two_way_stream`` is
to a stream: one function, given a factory of two devices that can reach each
other, that runs every promise of `BackendDevice` and `BackendQP` the DOCA
layer relies on and raises ``AssertionError`` naming the one that broke. The
soft backend runs it on UDP and TCP in the test suite and the verbs backend
on a real device in the lab (``tests/lab``).

Each check gets fresh devices from the factory and closes them. Memory is
registered at its real address (``rdmakit.verbs.buffer_address``), as a verbs
device requires and ``rdmakit.doca.Mmap`` does. Completions are awaited by
running both devices' pumps, as a `ProgressEngine` does, for at most
`timeout` seconds each.
"""

import sys
import time
from collections.abc import Callable, Sequence
from ipaddress import IPv6Address

from rdmakit.doca.backend import BackendDevice, BackendQP, MemoryRegistration
from rdmakit.engine.states import QpState
from rdmakit.engine.types import SGE, Access, Completion, QpCaps, RecvWR, SendWR, WcOpcode, WcStatus, WrOpcode
from rdmakit.verbs.buffers import buffer_address

__all__ = ["BackendPairFactory", "check_backend_pair"]

#: Makes two open devices whose QPs can connect to each other.
BackendPairFactory = Callable[[], tuple[BackendDevice, BackendDevice]]

_ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
_IB_MTUS = (256, 512, 1024, 2048, 4096)
_SIZE = 1 << 14


class _Memory:
    """A registered buffer of one device."""

    def __init__(self, dev: BackendDevice, size: int = _SIZE, access: Access = _ALL) -> None:
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)
        self.addr = buffer_address(self.view)
        self.reg: MemoryRegistration = dev.register_memory(self.view, self.addr, access)

    def sge(self, offset: int, length: int) -> SGE:
        return SGE(self.addr + offset, length, self.reg.lkey)

    def aligned(self, offset: int) -> int:
        """The first offset at or after `offset` whose address is 8-byte aligned (atomics)."""
        return offset + (-(self.addr + offset)) % 8


def _wait(devs: Sequence[BackendDevice], qp: BackendQP, n: int, timeout: float) -> list[Completion]:
    got: list[Completion] = []
    end = time.monotonic() + timeout
    while len(got) < n:
        busy = False
        for dev in devs:
            if dev.pump.progress():
                busy = True
        got.extend(qp.poll(n - len(got)))
        if time.monotonic() > end:
            raise AssertionError(f"{n - len(got)} of {n} completions never came on QP {qp.qpn:#x}: got {got}")
        if not busy:
            time.sleep(0)
    return got


def _one(devs: Sequence[BackendDevice], qp: BackendQP, timeout: float) -> Completion:
    (wc,) = _wait(devs, qp, 1, timeout)
    return wc


def _expect(qp: BackendQP, state: QpState, what: str) -> None:
    got = qp.state
    assert got is state, f"{what} left QP {qp.qpn:#x} in {got.name}, not {state.name}"


def _connected(a: BackendDevice, b: BackendDevice) -> tuple[BackendQP, BackendQP]:
    qa, qb = a.create_qp(QpCaps()), b.create_qp(QpCaps())
    _expect(qa, QpState.RESET, "create_qp")
    qa.init(_ALL)
    qb.init(_ALL)
    _expect(qa, QpState.INIT, "init")
    qa.connect(qb.export())
    qb.connect(qa.export())
    _expect(qa, QpState.RTS, "connect")
    _expect(qb, QpState.RTS, "connect")
    return qa, qb


def _ok(wc: Completion, opcode: WcOpcode, what: str) -> None:
    assert wc.status is WcStatus.SUCCESS, f"{what}: completion {wc.status.name}"
    assert wc.opcode is opcode, f"{what}: completion opcode {wc.opcode.name}, expected {opcode.name}"


def check_identity(a: BackendDevice) -> None:
    """Protocol membership, the GID a QP uses, the MTU, the pump."""
    assert isinstance(a, BackendDevice), f"{a!r} lacks members of BackendDevice"
    assert isinstance(a.name, str)
    assert a.name
    assert isinstance(a.kind, str)
    assert a.kind
    assert a.gid_at(a.gid_index) == a.gid, "gid is not the GID at gid_index"
    assert isinstance(a.gid, IPv6Address)
    assert not a.gid.is_link_local, f"the default GID {a.gid} is link-local"
    assert a.gid in a.gids
    assert a.gid_at(-1) is None
    assert a.gid_at(1 << 20) is None
    assert a.mtu in _IB_MTUS or a.mtu > 4096, f"MTU {a.mtu}"
    assert a.caps.max_sge >= 1
    assert a.pump is a.pump, "a device's pump is one object for its lifetime"
    fd = a.pump.fileno()
    assert fd is None or fd >= 0
    assert isinstance(a.pump.progress(), bool)


def check_memory(a: BackendDevice) -> None:
    """local_view reaches the registered bytes; protection errors are None; deregister invalidates."""
    mem = _Memory(a, 64)
    reg = mem.reg
    assert (reg.addr, reg.length) == (mem.addr, 64)
    view = a.local_view(reg.lkey, mem.addr + 8, 16, write=True)
    assert view is not None, "local_view refused a registered range"
    view[:] = b"x" * 16
    assert mem.buf[8:24] == b"x" * 16, "local_view is not the registered memory"
    assert a.local_view(reg.lkey, mem.addr + 60, 8, write=False) is None, "a range past the end"
    assert a.local_view(reg.lkey ^ 0x5A5A5A, mem.addr, 8, write=False) is None, "an unknown lkey"
    ro = _Memory(a, 32, Access.NONE)
    assert a.local_view(ro.reg.lkey, ro.addr, 8, write=False) is not None
    assert a.local_view(ro.reg.lkey, ro.addr, 8, write=True) is None, "a write without LOCAL_WRITE"
    a.deregister(reg)
    a.deregister(reg)  # idempotent
    assert a.local_view(reg.lkey, mem.addr, 8, write=False) is None, "a deregistered lkey"


def check_export(a: BackendDevice) -> None:
    """export describes the QP and the device's GID; init is a no-op outside RESET."""
    qp = a.create_qp(QpCaps())
    qp.init(Access.REMOTE_READ)
    qp.init(_ALL)  # INIT already: nothing happens
    _expect(qp, QpState.INIT, "a second init")
    desc = qp.export()
    assert desc["qpn"] == qp.qpn
    assert IPv6Address(str(desc["gid"])) == a.gid, f"export names GID {desc['gid']}, the device's is {a.gid}"
    qp.close()
    qp.close()  # idempotent


def check_operations(a: BackendDevice, b: BackendDevice, timeout: float) -> None:
    """SEND, SEND with immediate, WRITE, WRITE with immediate, READ and both atomics complete."""
    devs = (a, b)
    qa, qb = _connected(a, b)
    ma, mb = _Memory(a), _Memory(b)
    ma.buf[:5] = b"hello"
    qb.post_recv(RecvWR(wr_id=1, sg_list=(mb.sge(0, 64),)))
    qa.post_send(SendWR(wr_id=2, opcode=WrOpcode.SEND, sg_list=(ma.sge(0, 5),)))
    _ok(_one(devs, qa, timeout), WcOpcode.SEND, "SEND at the requester")
    wc = _one(devs, qb, timeout)
    _ok(wc, WcOpcode.RECV, "SEND at the responder")
    assert (wc.wr_id, wc.byte_len, bytes(mb.buf[:5])) == (1, 5, b"hello")

    qb.post_recv(RecvWR(wr_id=3, sg_list=(mb.sge(64, 64),)))
    qa.post_send(SendWR(wr_id=4, opcode=WrOpcode.SEND_WITH_IMM, sg_list=(ma.sge(0, 2),), imm_data=0x01020304))
    _ok(_one(devs, qa, timeout), WcOpcode.SEND, "SEND with immediate")
    wc = _one(devs, qb, timeout)
    assert (wc.status, wc.byte_len, wc.imm_data) == (WcStatus.SUCCESS, 2, 0x01020304), wc

    payload = bytes(range(256)) * 16
    ma.buf[: len(payload)] = payload
    qa.post_send(
        SendWR(
            wr_id=5,
            opcode=WrOpcode.RDMA_WRITE,
            sg_list=(ma.sge(0, len(payload)),),
            remote_addr=mb.addr + 4096,
            rkey=mb.reg.rkey,
        )
    )
    _ok(_one(devs, qa, timeout), WcOpcode.RDMA_WRITE, "WRITE")
    assert bytes(mb.buf[4096 : 4096 + len(payload)]) == payload, "WRITE did not land"

    qb.post_recv(RecvWR(wr_id=6))
    qa.post_send(
        SendWR(
            wr_id=7,
            opcode=WrOpcode.RDMA_WRITE_WITH_IMM,
            sg_list=(ma.sge(0, 8),),
            remote_addr=mb.addr + 8192,
            rkey=mb.reg.rkey,
            imm_data=7,
        )
    )
    _ok(_one(devs, qa, timeout), WcOpcode.RDMA_WRITE, "WRITE with immediate")
    wc = _one(devs, qb, timeout)
    _ok(wc, WcOpcode.RECV_RDMA_WITH_IMM, "WRITE with immediate at the responder")
    assert (wc.imm_data, bytes(mb.buf[8192:8200])) == (7, payload[:8])

    mb.buf[12288:12300] = b"read me back"
    qa.post_send(
        SendWR(
            wr_id=8,
            opcode=WrOpcode.RDMA_READ,
            sg_list=(ma.sge(8192, 12),),
            remote_addr=mb.addr + 12288,
            rkey=mb.reg.rkey,
        )
    )
    _ok(_one(devs, qa, timeout), WcOpcode.RDMA_READ, "READ")
    assert bytes(ma.buf[8192:8204]) == b"read me back", "READ did not land"

    word = mb.aligned(12800)
    mb.buf[word : word + 8] = (40).to_bytes(8, sys.byteorder)
    result = ma.aligned(12800)
    qa.post_send(
        SendWR(
            wr_id=9,
            opcode=WrOpcode.ATOMIC_FETCH_AND_ADD,
            sg_list=(ma.sge(result, 8),),
            remote_addr=mb.addr + word,
            rkey=mb.reg.rkey,
            compare_add=2,
        )
    )
    _ok(_one(devs, qa, timeout), WcOpcode.FETCH_ADD, "ATOMIC_FETCH_AND_ADD")
    assert int.from_bytes(ma.buf[result : result + 8], sys.byteorder) == 40, "fetch-add's original value"
    assert int.from_bytes(mb.buf[word : word + 8], sys.byteorder) == 42, "fetch-add's sum"
    qa.post_send(
        SendWR(
            wr_id=10,
            opcode=WrOpcode.ATOMIC_CMP_AND_SWP,
            sg_list=(ma.sge(result, 8),),
            remote_addr=mb.addr + word,
            rkey=mb.reg.rkey,
            compare_add=42,
            swap=7,
        )
    )
    _ok(_one(devs, qa, timeout), WcOpcode.COMP_SWAP, "ATOMIC_CMP_AND_SWP")
    assert int.from_bytes(ma.buf[result : result + 8], sys.byteorder) == 42
    assert int.from_bytes(mb.buf[word : word + 8], sys.byteorder) == 7, "compare-swap did not swap"


def check_error_and_reset(a: BackendDevice, b: BackendDevice, timeout: float) -> None:
    """to_error flushes what is posted (WR_FLUSH_ERR) and is idempotent; reset goes back to RESET."""
    devs = (a, b)
    qa, qb = _connected(a, b)
    mb = _Memory(b, 64)
    qb.post_recv(RecvWR(wr_id=11, sg_list=(mb.sge(0, 64),)))
    qb.post_recv(RecvWR(wr_id=12, sg_list=(mb.sge(0, 64),)))
    qb.to_error()
    _expect(qb, QpState.ERR, "to_error")
    qb.to_error()  # ERR already: nothing happens
    flushed = [(wc.wr_id, wc.status) for wc in _wait(devs, qb, 2, timeout)]
    assert flushed == [(11, WcStatus.WR_FLUSH_ERR), (12, WcStatus.WR_FLUSH_ERR)], flushed
    qb.reset()
    _expect(qb, QpState.RESET, "reset")
    qb.to_error()  # RESET: nothing happens
    _expect(qb, QpState.RESET, "to_error in RESET")
    qb.init(_ALL)
    _expect(qb, QpState.INIT, "init after reset")
    qa.close()
    qb.close()


def check_gid_index(a: BackendDevice) -> None:
    """create_qp with gid_index exports the GID at that index."""
    qp = a.create_qp(QpCaps(), a.gid_index)
    assert IPv6Address(str(qp.export()["gid"])) == a.gid
    qp.close()


def check_backend_pair(make_devices: BackendPairFactory, *, timeout: float = 20.0) -> None:
    """Run every check on fresh devices from `make_devices`; raises AssertionError on a broken promise."""
    single: tuple[Callable[[BackendDevice], None], ...] = (
        check_identity,
        check_memory,
        check_export,
        check_gid_index,
    )
    pair: tuple[Callable[[BackendDevice, BackendDevice, float], None], ...] = (
        check_operations,
        check_error_and_reset,
    )
    for check in single:
        a, b = make_devices()
        try:
            check(a)
        finally:
            _close_twice(a, b)
    for check2 in pair:
        a, b = make_devices()
        try:
            check2(a, b, timeout)
        finally:
            _close_twice(a, b)


def _close_twice(*devs: BackendDevice) -> None:
    for dev in devs:
        dev.close()
        dev.close()  # idempotent
