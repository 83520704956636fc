"""Verbs devices in DOCA discovery: ``rdmakit.verbs`` behind the backend protocol.

`install` registers a device provider when pyverbs is installed (otherwise it
only logs why at debug level on ``rdmakit.verbs``); the provider lists nothing,
and logs why, when pyverbs then fails to import or there is no usable device. Each verbs device (rxe0,
mlx5_0, ...) is listed under its own name with the addresses of its RoCE v2
GIDs, so ``Dev.open("rxe0")`` opens it. The adapters below give the DOCA layer
what it expects from every backend (``rdmakit.doca.backend``): failures as
`DocaError`, with the verbs backend's ``doca_error_t`` name and fault carried
over, a device `pump` that runs the completion channels of its QPs, and a
connection manager (`VerbsBackendCm`, librdmacm through ``rdmakit.verbs.cm``).
"""

import contextlib
import importlib.util
import logging
import select
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from contextlib import contextmanager
from dataclasses import replace
from ipaddress import IPv4Address, IPv6Address
from typing import TYPE_CHECKING

from rdmakit.doca.backend import BackendQP, BackendSRQ, CmEvent, ConnectAttrs, DeviceCaps
from rdmakit.doca.device import DevInfo, register_provider
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.engine.states import QpState
from rdmakit.engine.types import Access, Completion, QpCaps, RecvWR, SendWR
from rdmakit.verbs import ConnectOptions, VerbsDeviceInfo, VerbsError, list_devices

if TYPE_CHECKING:
    from rdmakit.verbs.device import VerbsDevice, VerbsMR, VerbsQP
    from rdmakit.verbs.srq import VerbsSRQ

__all__ = [
    "VerbsBackendCm",
    "VerbsBackendDevice",
    "VerbsBackendQP",
    "install",
    "to_doca_error",
    "verbs_devinfo",
]

log = logging.getLogger("rdmakit.verbs")

#: The local ACK timeout of a verbs QP whose `ConnectAttrs.timeout` is None.
_VERBS_TIMEOUT = ConnectOptions().timeout


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

    def __init__(self, qp: "VerbsQP", pump: "VerbsPump | None" = None) -> None:
        self.verbs = qp
        self._pump = pump
        # The QP's work-request tracker is shared by its poster and whichever thread pumps it.
        self._lock = pump.lock if pump is not None else threading.RLock()
        self.connect_attrs = ConnectAttrs()
        self.ready: Sized | None = None  # the CQ is the device's: only `poll` knows

    @property
    def qpn(self) -> int:
        return self.verbs.qpn

    @property
    def state(self) -> QpState:
        with _doca_errors():
            return self.verbs.state

    def export(self) -> dict[str, object]:
        return self.verbs.export()

    def init(self, access: Access) -> None:
        with self._lock, _doca_errors():
            if self.verbs.state is QpState.RESET:
                self.verbs.options = replace(self.verbs.options, access=int(access))
                self.verbs.init()

    def to_error(self) -> None:
        with self._lock, _doca_errors():
            self.verbs.to_error()

    def apply_connect_attrs(self) -> "VerbsQP":
        """`connect_attrs` into the verbs QP's options, for `connect` or a connection manager."""
        a = self.connect_attrs
        self.verbs.options = replace(
            self.verbs.options, max_rd_atomic=a.max_rd_atomic, max_dest_rd_atomic=a.max_dest_rd_atomic,
            min_rnr_timer=a.min_rnr_timer, timeout=_VERBS_TIMEOUT if a.timeout is None else a.timeout,
            retry_cnt=a.retry_cnt, rnr_retry=a.rnr_retry, hop_limit=a.hop_limit,
        )  # fmt: skip
        return self.verbs

    def connect(self, remote: Mapping[str, object]) -> None:
        self.apply_connect_attrs()
        with self._lock, _doca_errors():
            self.verbs.connect(remote)

    def transport_fault(self) -> str | None:
        return None  # rdma-core reports a lost peer by completion status only

    def reset(self) -> None:
        with self._lock, _doca_errors():
            self.verbs.reset()

    def post_send(self, wr: SendWR) -> None:
        with self._lock, _doca_errors():
            self.verbs.post_send(wr)

    def post_recv(self, wr: RecvWR) -> None:
        with self._lock, _doca_errors():
            self.verbs.post_recv(wr)

    def poll(self, max_entries: int) -> Sequence[Completion]:
        with self._lock, _doca_errors():
            return self.verbs.poll(max_entries)

    def progress(self) -> bool:
        with self._lock, _doca_errors():
            return self.verbs.progress()

    def fileno(self) -> int | None:
        """The completion channel's descriptor; None when it is unknown (polling only)."""
        try:
            return self.verbs.fileno()
        except VerbsError:
            return None

    def close(self) -> None:
        if self._pump is not None:
            self._pump.forget(self)  # before the channel's descriptor is closed
        with self._lock, _doca_errors():
            self.verbs.close()


class VerbsBackendSRQ:
    """A `VerbsSRQ` as a DOCA ``BackendSRQ`` (errors as `DocaError`)."""

    def __init__(
        self, srq: "VerbsSRQ", registry: dict[int, "VerbsBackendSRQ"], lock: threading.RLock
    ) -> None:
        self.verbs = srq
        self.max_wr = srq.max_wr
        self._registry = registry
        self._lock = lock  # the device's: the SRQ's tracker is read by every QP's completions

    def post_recv(self, wr: RecvWR) -> None:
        with self._lock, _doca_errors():
            self.verbs.post_recv(wr)

    def close(self) -> None:
        self._registry.pop(id(self), None)
        with self._lock, _doca_errors():
            self.verbs.close()


class VerbsPump:
    """A verbs device's `Pump`: the completion channels of its QPs, in one epoll set.

    `progress` consumes each QP's completion events and re-arms its CQ
    (`VerbsQP.progress`); the hardware (or the kernel's rxe) does the rest.
    """

    def __init__(self) -> None:
        self._qps: list[VerbsBackendQP] = []
        self._epoll = select.epoll()
        #: Serialises the device's pump with its QPs' calls: engines of several threads may run it.
        self.lock = threading.RLock()

    def add(self, qp: VerbsBackendQP) -> None:
        self._qps.append(qp)
        fd = qp.fileno()
        if fd is not None:
            self._epoll.register(fd, select.EPOLLIN)

    def forget(self, qp: VerbsBackendQP) -> None:
        if qp in self._qps:
            self._qps.remove(qp)
            fd = qp.fileno()
            if fd is not None and not self._epoll.closed:
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)

    def qp(self, qpn: int) -> VerbsBackendQP | None:
        """The device's QP with number `qpn`, if it has one."""
        return next((q for q in self._qps if q.qpn == qpn), None)

    def watch(self, fd: int) -> None:
        """Wake waiters on the pump when `fd` (a connection manager's channel) is readable."""
        self._epoll.register(fd, select.EPOLLIN)

    def unwatch(self, fd: int) -> None:
        if not self._epoll.closed:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)

    def progress(self) -> bool:
        busy = False
        with self.lock:
            for qp in list(self._qps):
                if qp.progress():
                    busy = True
        return busy

    def fileno(self) -> int | None:
        return self._epoll.fileno()

    def close(self) -> None:
        self._qps.clear()
        self._epoll.close()


class VerbsBackendDevice:
    """A `VerbsDevice` as a DOCA ``BackendDevice``."""

    kind = "verbs"

    def __init__(self, dev: "VerbsDevice") -> None:
        self.verbs = dev
        self.caps = _doca_caps(dev.info)
        self.pump = VerbsPump()
        self._cm: VerbsBackendCm | None = None
        self._srqs: dict[int, VerbsBackendSRQ] = {}  # by id: QPs may only use the device's own

    @property
    def name(self) -> str:
        return self.verbs.name

    @property
    def gids(self) -> Sequence[IPv6Address]:
        return self.verbs.gids

    @property
    def gid_index(self) -> int:
        return self.verbs.gid_index

    @property
    def gid(self) -> IPv6Address:
        """The RoCE v2 GID of the device's address (`rdmakit.verbs.sysfs.select_gid`)."""
        return self.verbs.gid

    def gid_at(self, index: int) -> IPv6Address | None:
        return self.verbs.gid_at(index)

    @property
    def mtu(self) -> int:
        return self.verbs.mtu

    def register_memory(self, buffer: memoryview, addr: int, access: Access) -> "VerbsMR":
        with _doca_errors():
            return self.verbs.register_memory(buffer, addr, access)

    def deregister(self, registration: object) -> None:
        with _doca_errors():
            self.verbs.deregister(registration)

    def local_view(self, lkey: int, addr: int, length: int, *, write: bool) -> memoryview | None:
        return self.verbs.local_view(lkey, addr, length, write=write)

    def cm(self) -> "VerbsBackendCm":
        if self._cm is None:
            if self.verbs.closed:
                raise DocaError(DocaErrorCode.BAD_STATE, f"{self.name} is closed")
            self._cm = VerbsBackendCm(self)
        return self._cm

    def create_srq(self, max_wr: int, max_sge: int) -> VerbsBackendSRQ:
        with _doca_errors():
            srq = VerbsBackendSRQ(self.verbs.create_srq(max_wr, max_sge), self._srqs, self.pump.lock)
        self._srqs[id(srq)] = srq
        return srq

    def create_qp(
        self, caps: QpCaps, gid_index: int | None = None, srq: BackendSRQ | None = None
    ) -> VerbsBackendQP:
        mine = None if srq is None else self._srqs.get(id(srq))
        if srq is not None and mine is not srq:  # IBTA §10.2.9: a QP and its SRQ share a PD
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{srq!r} is not an SRQ of {self.name}")
        with _doca_errors():
            own = self.verbs.create_qp(caps, gid_index, None if mine is None else mine.verbs)
            qp = VerbsBackendQP(own, self.pump)
        self.pump.add(qp)
        return qp

    def close(self) -> None:
        if self._cm is not None:
            self._cm.close()
        self.pump.close()
        with _doca_errors():
            self.verbs.close()


class VerbsBackendCm:
    """A verbs device's `BackendCm`: librdmacm (``rdmakit.verbs.cm.VerbsCm``) for the device's own QPs.

    A QP is one of the device's `VerbsBackendQP` s, found by number; its
    `ConnectAttrs` give the RC timers of the RTR/RTS transitions, the kernel's
    CM the rest (``rdma_init_qp_attr``). The CM's event channel is in the
    device pump's epoll set, so a waiter on the pump wakes for CM events;
    they are read by `poll_events` only.
    """

    def __init__(self, dev: VerbsBackendDevice) -> None:
        from rdmakit.verbs.cm import VerbsCm

        self._dev = dev
        with _doca_errors():
            self.verbs: VerbsCm = VerbsCm(dev.verbs)
        self._fd = self.verbs.fileno()
        dev.pump.watch(self._fd)
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise DocaError(DocaErrorCode.BAD_STATE, f"{self._dev.name}'s connection manager is closed")

    def _qp(self, qp: BackendQP) -> "VerbsQP":
        own = self._dev.pump.qp(qp.qpn)
        if own is None:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"QP {qp.qpn:#x} is not one of {self._dev.name}'s")
        return own.apply_connect_attrs()

    def listen(self, port: int) -> None:
        self._check()
        with _doca_errors():
            self.verbs.listen(port)

    def stop_listen(self, port: int) -> None:
        self.verbs.stop_listen(port)

    def connect(
        self, qp: BackendQP, addr: IPv4Address | IPv6Address, port: int, private_data: bytes, timeout: float
    ) -> int:
        self._check()
        with _doca_errors():
            return self.verbs.connect(self._qp(qp), addr, port, private_data, timeout)

    def accept(self, conn: int, qp: BackendQP, private_data: bytes) -> None:
        self._check()
        with _doca_errors():
            self.verbs.accept(conn, self._qp(qp), private_data)

    def reject(self, conn: int, private_data: bytes) -> None:
        with _doca_errors():
            self.verbs.reject(conn, private_data)

    def disconnect(self, conn: int) -> None:
        self.verbs.disconnect(conn)

    def poll_events(self) -> Sequence[CmEvent]:
        if self._closed:
            return ()
        return self.verbs.poll()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._dev.pump.unwatch(self._fd)
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
