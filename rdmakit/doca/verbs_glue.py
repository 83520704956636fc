"""Verbs devices in DOCA discovery: ``rdmakit.verbs`` behind the backend protocol.

`install` registers a device provider when pyverbs is installed (otherwise it
only logs why at debug level on ``rdmakit.verbs``); the provider lists nothing,
and logs why, when pyverbs then fails to import or there is no usable device. Each verbs device (rxe0,
mlx5_0, ...) is listed under its own name with the addresses of its RoCE v2
GIDs, so ``Dev.open("rxe0")`` opens it. The adapters below give the DOCA layer
what it expects from every backend: failures as `DocaError`, with the verbs
backend's ``doca_error_t`` name and fault carried over.
"""

import importlib.util
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from ipaddress import IPv6Address
from typing import TYPE_CHECKING

from rdmakit.doca.backend import DeviceCaps
from rdmakit.doca.device import DevInfo, register_provider
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.engine.states import QpState
from rdmakit.engine.types import Access, Completion, QpCaps, RecvWR, SendWR
from rdmakit.verbs import ConnectOptions, VerbsDeviceInfo, VerbsError, list_devices

if TYPE_CHECKING:
    from rdmakit.verbs.device import VerbsDevice, VerbsMR, VerbsQP

__all__ = ["VerbsBackendDevice", "VerbsBackendQP", "install", "to_doca_error", "verbs_devinfo"]

log = logging.getLogger("rdmakit.verbs")


def to_doca_error(exc: VerbsError) -> DocaError:
    """The `DocaError` for a `VerbsError`: same ``doca_error_t`` name, same fault."""
    return DocaError(DocaErrorCode[exc.code], exc.message, Fault(exc.fault))


@contextmanager
def _doca_errors() -> Iterator[None]:
    try:
        yield
    except VerbsError as e:
        raise to_doca_error(e) from e


class VerbsBackendQP:
    """A `VerbsQP` as a DOCA ``BackendQP`` (errors as `DocaError`)."""

    def __init__(self, qp: "VerbsQP") -> None:
        self.verbs = qp

    @property
    def qpn(self) -> int:
        return self.verbs.qpn

    @property
    def state(self) -> QpState:
        with _doca_errors():
            return self.verbs.state

    @property
    def options(self) -> ConnectOptions:
        """The QP's RTR/RTS attributes; set them on ``.verbs.options`` (before `init`/`connect`)."""
        return self.verbs.options

    def export(self) -> dict[str, object]:
        return self.verbs.export()

    def init(self) -> None:
        with _doca_errors():
            self.verbs.init()

    def connect(self, remote: Mapping[str, object]) -> None:
        with _doca_errors():
            self.verbs.connect(remote)

    def reset(self) -> None:
        with _doca_errors():
            self.verbs.reset()

    def post_send(self, wr: SendWR) -> None:
        with _doca_errors():
            self.verbs.post_send(wr)

    def post_recv(self, wr: RecvWR) -> None:
        with _doca_errors():
            self.verbs.post_recv(wr)

    def poll(self, max_entries: int) -> Sequence[Completion]:
        with _doca_errors():
            return self.verbs.poll(max_entries)

    def progress(self) -> bool:
        with _doca_errors():
            return self.verbs.progress()

    def fileno(self) -> int:
        with _doca_errors():
            return self.verbs.fileno()

    def close(self) -> None:
        with _doca_errors():
            self.verbs.close()


class VerbsBackendDevice:
    """A `VerbsDevice` as a DOCA ``BackendDevice``."""

    kind = "verbs"

    def __init__(self, dev: "VerbsDevice") -> None:
        self.verbs = dev
        self.caps = _doca_caps(dev.info)

    @property
    def name(self) -> str:
        return self.verbs.name

    @property
    def gids(self) -> Sequence[IPv6Address]:
        return self.verbs.gids

    @property
    def mtu(self) -> int:
        return self.verbs.mtu

    def register_memory(self, buffer: memoryview, addr: int, access: Access) -> "VerbsMR":
        with _doca_errors():
            return self.verbs.register_memory(buffer, addr, access)

    def deregister(self, registration: object) -> None:
        with _doca_errors():
            self.verbs.deregister(registration)

    def create_qp(self, caps: QpCaps) -> VerbsBackendQP:
        with _doca_errors():
            return VerbsBackendQP(self.verbs.create_qp(caps))

    def close(self) -> None:
        with _doca_errors():
            self.verbs.close()


def _doca_caps(info: VerbsDeviceInfo) -> DeviceCaps:
    c = info.caps
    return DeviceCaps(
        max_buf_size=c.max_buf_size,
        max_buf_list_len=c.max_buf_list_len,
        max_qp_wr=c.max_qp_wr,
        max_sge=c.max_sge,
        job_types=c.job_types,
    )


def _opener(info: VerbsDeviceInfo) -> Callable[[], VerbsBackendDevice]:
    def open_device() -> VerbsBackendDevice:
        from rdmakit.verbs.device import VerbsDevice

        with _doca_errors():
            return VerbsBackendDevice(VerbsDevice(info.name, port=info.port, gid_index=info.gid_index))

    return open_device


def verbs_devinfo(info: VerbsDeviceInfo) -> DevInfo:
    """The DOCA `DevInfo` of a discovered verbs device."""
    return DevInfo(
        name=info.name,
        kind="verbs",
        opener=_opener(info),
        ip_addrs=info.ip_addrs,
        pci_addr=info.pci_addr,
        gids=info.gids,
        mtu=info.mtu,
        caps=_doca_caps(info),
    )


def _provider() -> list[DevInfo]:
    return [verbs_devinfo(info) for info in list_devices()]


_unregister: Callable[[], None] | None = None


def install() -> bool:
    """Add verbs devices to DOCA discovery if pyverbs is installed; idempotent. True if added.

    Cheap enough for ``import rdmakit.doca``: pyverbs is only located here
    (``importlib.util.find_spec``); the provider imports it at the first
    discovery, and lists nothing (reason at debug level) if that fails.
    """
    global _unregister
    if _unregister is not None:
        return True
    try:
        found = importlib.util.find_spec("pyverbs") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        log.debug(
            "verbs devices are not discoverable: pyverbs is not installed "
            "(Debian: python3-pyverbs, scripts/install-verbs-deps.sh; elsewhere: pip install rdmakit[verbs])"
        )
        return False
    _unregister = register_provider(_provider)
    return True


def uninstall() -> None:
    """Undo `install` (tests)."""
    global _unregister
    if _unregister is not None:
        _unregister()
        _unregister = None
