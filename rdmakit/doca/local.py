"""The in-tree local device: a protection domain and nothing else (``local0``).

A `LocalBackendDevice` is a real `rdmakit.doca.backend.BackendDevice` for one
process: memory registration with the engine's key checks, a memory view for
the DMA context, no networking (`create_qp` is NOT_SUPPORTED) and nothing to
pump.
"""

import random
from collections.abc import Sequence
from ipaddress import IPv6Address

from rdmakit.doca.backend import (
    BackendCaps,
    BackendCm,
    BackendQP,
    BackendSRQ,
    DeviceCaps,
    JobType,
    MemoryRegistration,
    Pump,
)
from rdmakit.doca.errors import DocaError, DocaErrorCode, error_from_engine
from rdmakit.engine.errors import EngineError
from rdmakit.engine.memory import MemoryRegion, ProtectionDomain
from rdmakit.engine.types import SGE, Access, QpCaps

__all__ = ["LOCAL_CAPS", "LocalBackendDevice"]


class _IdlePump:
    """The `Pump` of a device with no I/O of its own: nothing to do, nothing to wait for."""

    def progress(self) -> bool:
        return False

    def fileno(self) -> int | None:
        return None


_IDLE_PUMP = _IdlePump()


LOCAL_CAPS = DeviceCaps(job_types=frozenset({JobType.DMA_MEMCPY}))


class LocalBackendDevice:
    """A real backend for one process: memory registration, no networking.

    Registration is the engine's `ProtectionDomain`, so keys come from the
    injected `rng`: unpredictable to other parties, replayable from a seed in
    tests. `resolve` does the key, range and permission checks a device does
    before touching registered memory, as `local_view` does for the DMA
    context. `create_qp` is NOT_SUPPORTED.
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
    def gid_index(self) -> int:
        return 0

    @property
    def gid(self) -> IPv6Address:
        return self._gids[0]

    def gid_at(self, index: int) -> IPv6Address | None:
        return self._gids[index] if 0 <= index < len(self._gids) else None

    @property
    def pump(self) -> Pump:
        return _IDLE_PUMP

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

    def local_view(self, lkey: int, addr: int, length: int, *, write: bool) -> memoryview | None:
        if self._closed:
            return None
        return self._pd.local_slice(SGE(addr, length, lkey), write)

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

    def cm(self) -> BackendCm:
        raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{self._name}: no connection manager yet")

    def create_qp(
        self, caps: QpCaps, gid_index: int | None = None, srq: BackendSRQ | None = None
    ) -> BackendQP:
        raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{self._name} is a local device without networking")

    def create_srq(self, max_wr: int, max_sge: int) -> BackendSRQ:
        raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{self._name} is a local device without networking")

    def close(self) -> None:
        for mr in self._pd:
            self._pd.deregister(mr)
        self._closed = True

    def __repr__(self) -> str:
        return f"<LocalBackendDevice {self._name} registrations={len(self._pd)}>"
