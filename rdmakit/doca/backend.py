"""The backend boundary: what the DOCA layer needs from a device.

A backend is a device driver below the DOCA object model: the soft-RoCE driver
(``rdmakit.transport``), the pyverbs backend (``rdmakit.verbs``) and the
in-tree `LocalBackendDevice`. The surface is a set of `typing.Protocol` s, so a
backend satisfies it structurally and never imports ``rdmakit.doca`` (layers
import downwards only). What crosses the boundary is the engine's verbs value
types (``rdmakit.engine.types``: `Access`, `SendWR`, `RecvWR`, `Completion`,
`QpCaps`; ``rdmakit.engine.states.QpState``), whose values are libibverbs'
own, plus ``memoryview``, ``ipaddress`` and plain JSON-able dicts.
"""

import random
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from enum import StrEnum
from ipaddress import IPv6Address
from typing import Protocol, runtime_checkable

from rdmakit.doca.errors import DocaError, DocaErrorCode, error_from_engine
from rdmakit.engine.errors import EngineError
from rdmakit.engine.memory import MemoryRegion, ProtectionDomain
from rdmakit.engine.states import QpState
from rdmakit.engine.types import SGE, Access, Completion, QpCaps, RecvWR, SendWR

__all__ = [
    "LOCAL_CAPS",
    "BackendCaps",
    "BackendDevice",
    "BackendQP",
    "DeviceCaps",
    "JobType",
    "LocalBackendDevice",
    "MemoryRegistration",
]


class JobType(StrEnum):
    """Names a device lists in ``caps.job_types`` for the jobs it can run.

    Plain strings, so a backend fills its capabilities without importing this
    module. Mirrors DOCA's per-library ``*_job_get_supported()`` queries.
    """

    DMA_MEMCPY = "dma.memcpy"
    RDMA_SEND = "rdma.send"
    RDMA_SEND_IMM = "rdma.send_imm"
    RDMA_RECV = "rdma.recv"
    RDMA_READ = "rdma.read"
    RDMA_WRITE = "rdma.write"
    RDMA_WRITE_IMM = "rdma.write_imm"
    RDMA_ATOMIC_CMP_SWP = "rdma.atomic_cmp_swp"
    RDMA_ATOMIC_FETCH_ADD = "rdma.atomic_fetch_add"


class BackendCaps(Protocol):
    """Device capabilities, as the DOCA capability queries report them."""

    @property
    def max_buf_size(self) -> int:
        """Largest single buffer (bytes) a job may reference."""

    @property
    def max_buf_list_len(self) -> int:
        """Longest buffer chain (``doca_buf`` list) a job may reference."""

    @property
    def max_qp_wr(self) -> int:
        """Largest send/receive queue depth of a QP."""

    @property
    def max_sge(self) -> int:
        """Most scatter/gather entries in one work request."""

    @property
    def job_types(self) -> Set[str]:
        """`JobType` values the device can execute."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceCaps:
    """A concrete `BackendCaps`."""

    max_buf_size: int = 1 << 31
    max_buf_list_len: int = 16
    max_qp_wr: int = 4096
    max_sge: int = 16
    job_types: frozenset[str] = frozenset()


class MemoryRegistration(Protocol):
    """A registered memory region (``ibv_mr``); the engine's `MemoryRegion` is one."""

    @property
    def addr(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def lkey(self) -> int: ...
    @property
    def rkey(self) -> int: ...


@runtime_checkable
class BackendQP(Protocol):
    """An RC queue pair with its own completion queue.

    Lifecycle: created in RESET; `connect` moves it to RTS (RESET -> INIT ->
    RTR -> RTS) with the peer's `export` output. Work requests are posted
    without blocking; `progress` does the backend's I/O (and, for the soft
    engine, its timers) without blocking; completions are collected with
    `poll`. In event-driven mode the caller waits for `fileno` to be
    readable, then calls `progress` and `poll`.
    """

    @property
    def qpn(self) -> int: ...
    @property
    def state(self) -> QpState: ...

    def export(self) -> dict[str, object]:
        """Connection info a peer needs (QPN, PSN, GID, MTU, ...), JSON-serialisable."""

    def connect(self, remote: Mapping[str, object]) -> None:
        """Bring the QP to RTS towards the peer described by its `export` output."""

    def post_send(self, wr: SendWR) -> None:
        """Post one send-queue work request (``ibv_post_send``)."""

    def post_recv(self, wr: RecvWR) -> None:
        """Post one receive-queue work request (``ibv_post_recv``)."""

    def poll(self, max_entries: int) -> Sequence[Completion]:
        """Up to `max_entries` completions, oldest first; never blocks (``ibv_poll_cq``)."""

    def progress(self) -> bool:
        """Do pending I/O and timers without blocking; True if anything happened."""

    def fileno(self) -> int:
        """A descriptor that is readable whenever `progress` has work to do."""

    def close(self) -> None:
        """Destroy the QP; idempotent. Outstanding work requests are dropped."""


@runtime_checkable
class BackendDevice(Protocol):
    """An open device: identity, memory registration and QP creation."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str:
        """``"local"``, ``"soft"``, ``"verbs"``, ..."""

    @property
    def gids(self) -> Sequence[IPv6Address]:
        """Port GIDs (RoCEv2: IPv4-mapped or IPv6 addresses), index order."""

    @property
    def mtu(self) -> int:
        """Active path MTU in bytes (256, 512, 1024, 2048 or 4096)."""

    @property
    def caps(self) -> BackendCaps: ...

    def register_memory(self, buffer: memoryview, addr: int, access: Access) -> MemoryRegistration:
        """Register `buffer` (1-D bytes) at virtual address `addr` (``ibv_reg_mr``).

        A read-only `buffer` is only ever passed without write access. Keys
        must be unpredictable.
        """

    def deregister(self, registration: MemoryRegistration) -> None:
        """Invalidate the keys of `registration` (``ibv_dereg_mr``); idempotent."""

    def create_qp(self, caps: QpCaps) -> BackendQP:
        """Create an RC QP in RESET."""

    def close(self) -> None:
        """Release the device; idempotent. Registrations and QPs become invalid."""


# ---------------------------------------------------------------------------
# LocalBackendDevice: a protection domain and nothing else.

LOCAL_CAPS = DeviceCaps(job_types=frozenset({JobType.DMA_MEMCPY}))


class LocalBackendDevice:
    """A real backend for one process: memory registration, no networking.

    Registration is the engine's `ProtectionDomain`, so keys come from the
    injected `rng`: unpredictable to other parties, replayable from a seed in
    tests. `resolve` does the key, range and permission checks a device does
    before touching registered memory; the DMA context and loopback tests use
    it. `create_qp` is NOT_SUPPORTED.
    """

    def __init__(
        self,
        name: str = "local0",
        *,
        rng: random.Random,
        gids: Sequence[IPv6Address] = (IPv6Address("::ffff:127.0.0.1"),),
        mtu: int = 4096,
        caps: BackendCaps = LOCAL_CAPS,
    ) -> None:
        self._name = name
        self._pd = ProtectionDomain(rng)
        self._gids = tuple(gids)
        self._mtu = mtu
        self._caps = caps
        self._closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def kind(self) -> str:
        return "local"

    @property
    def gids(self) -> Sequence[IPv6Address]:
        return self._gids

    @property
    def mtu(self) -> int:
        return self._mtu

    @property
    def caps(self) -> BackendCaps:
        return self._caps

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def num_registrations(self) -> int:
        return len(self._pd)

    def _check_open(self) -> None:
        if self._closed:
            raise DocaError(DocaErrorCode.BAD_STATE, f"device {self._name} is closed")

    def register_memory(self, buffer: memoryview, addr: int, access: Access) -> MemoryRegion:
        self._check_open()
        try:
            return self._pd.register(buffer, addr, access)
        except EngineError as exc:
            raise error_from_engine(exc) from exc

    def deregister(self, registration: MemoryRegistration) -> None:
        for mr in self._pd:
            if mr is registration:
                self._pd.deregister(mr)

    def resolve(self, key: int, addr: int, length: int, *, remote: bool, write: bool) -> memoryview:
        """The registered bytes ``[addr, addr+length)`` under `key`, after the checks.

        `remote` selects the rkey and remote rights (IBTA §10.6.3.3, an R_Key
        violation), else the lkey and local rights (§10.6.3.2). Any violation
        is NOT_PERMITTED, as a device reports a protection error.
        """
        self._check_open()
        if length < 0:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"negative length {length}")
        if remote:
            right = Access.REMOTE_WRITE if write else Access.REMOTE_READ
            view = self._pd.remote_slice(key, addr, length, right)
        else:
            view = self._pd.local_slice(SGE(addr, length, key), write)
        if view is None:
            side = "remote" if remote else "local"
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                f"{side} protection error: key {key:#x}, {addr:#x}+{length}, write={write}",
            )
        return view

    def create_qp(self, caps: QpCaps) -> BackendQP:
        raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{self._name} is a local device without networking")

    def close(self) -> None:
        for mr in self._pd:
            self._pd.deregister(mr)
        self._closed = True

    def __repr__(self) -> str:
        return f"<LocalBackendDevice {self._name} registrations={len(self._pd)}>"
