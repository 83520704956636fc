"""DOCA Device (DOCA Core 3.2): discovery, opening and capability queries.

Discovery is a registry of providers, each a callable returning `DevInfo` s.
The in-tree provider lists one `LocalBackendDevice` (``local0``); the soft
driver and the verbs backend plug in with `register_provider`. `Dev.open`
selects a device by `DevInfo`, name, IP address or PCI address.

A `Dev` is the parent of the memory maps and contexts it is added to. As
``doca_dev_close``, `Dev.close` refuses (IN_USE, naming them) while any of
them remains: they are closed first (pyverbs' children-before-parents rule).
`Dev.close_all` closes them itself, for error paths.

A device is opened under a `ProgressEngine` (the calling thread's unless one
is given), which runs the backend's pump. As in DOCA, contexts on other
engines may use the device too (one device, a progress engine per thread):
each engine a context of the device is connected to runs the pump as well
(`Dev._share_with`), the backend serialises its pump and its queue pairs'
calls (a soft device's lock; verbs is thread-safe), and a busy pump wakes
the other engines' waiters, so each collects its own contexts' completions
and runs their callbacks inside its own ``progress`` only.
"""

import ipaddress
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address
from typing import Protocol, Self

from rdmakit.doca.backend import BackendCaps, BackendDevice, DeviceCaps, Pump
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.local import LocalBackendDevice
from rdmakit.doca.pe import ProgressEngine, thread_engine

__all__ = [
    "Dev",
    "DevInfo",
    "DevInfoProvider",
    "devinfo_list",
    "find_devinfo",
    "local_devinfo",
    "register_provider",
    "register_resolver",
]


_NO_CAPS = DeviceCaps()
_NAMED = 4  # the objects an IN_USE refusal names; the rest are counted


@dataclass(frozen=True, slots=True, kw_only=True)
class DevInfo:
    """A device that can be opened (``doca_devinfo``) and its capabilities.

    `opener` creates the backend device; it is not part of the value.
    """

    name: str
    kind: str
    opener: Callable[[], BackendDevice] = field(repr=False, compare=False)
    ip_addrs: tuple[IPv4Address | IPv6Address, ...] = ()
    pci_addr: str | None = None
    gids: tuple[IPv6Address, ...] = ()
    mtu: int = 1024
    caps: BackendCaps = _NO_CAPS

    def max_buf_size(self) -> int:
        """Largest buffer a job on this device may reference."""
        return self.caps.max_buf_size

    def max_buf_list_len(self) -> int:
        """Longest buffer chain a job on this device may reference."""
        return self.caps.max_buf_list_len

    def is_job_supported(self, job_type: str) -> bool:
        """Whether jobs of `job_type` (a `JobType`) run on this device."""
        return job_type in self.caps.job_types

    def matches(self, spec: str) -> bool:
        """Whether `spec` names this device: its name, an IP address or its PCI address."""
        if spec == self.name:
            return True
        ip = _parse_ip(spec)
        if ip is not None:
            return any(_unmap(ip) == _unmap(own) for own in self.ip_addrs)
        pci = _normalize_pci(spec)
        return pci is not None and self.pci_addr is not None and pci == _normalize_pci(self.pci_addr)


def _parse_ip(spec: str) -> IPv4Address | IPv6Address | None:
    try:
        return ipaddress.ip_address(spec)
    except ValueError:
        return None


def _unmap(ip: IPv4Address | IPv6Address) -> IPv4Address | IPv6Address:
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _normalize_pci(spec: str) -> str | None:
    """``DDDD:BB:DD.F`` or ``BB:DD.F`` (DOCA accepts both) -> ``dddd:bb:dd.f``."""
    parts = spec.lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    if len(parts) != 3:
        return None
    domain, bus, devfn = parts
    dev, _, fn = devfn.partition(".")
    hexdigits = set("0123456789abcdef")
    fields = ((domain, 4), (bus, 2), (dev, 2), (fn, 1))
    if not all(len(f) == n and set(f) <= hexdigits for f, n in fields):
        return None
    return f"{domain}:{bus}:{dev}.{fn}"


DevInfoProvider = Callable[[], Iterable[DevInfo]]


def local_devinfo(name: str = "local0", *, rng: random.Random | None = None) -> DevInfo:
    """A `DevInfo` for a `LocalBackendDevice`.

    Each open gets a fresh backend whose keys come from `rng`, or from the
    OS CSPRNG (``random.SystemRandom``) when `rng` is None.
    """

    def opener() -> BackendDevice:
        return LocalBackendDevice(name, rng=rng if rng is not None else random.SystemRandom())

    probe = LocalBackendDevice(name, rng=random.Random(0))
    return DevInfo(
        name=name,
        kind=probe.kind,
        opener=opener,
        gids=tuple(probe.gids),
        mtu=probe.mtu,
        caps=probe.caps,
    )


def _local_provider() -> list[DevInfo]:
    return [local_devinfo()]


_providers: list[DevInfoProvider] = [_local_provider]


def register_provider(provider: DevInfoProvider) -> Callable[[], None]:
    """Add a device provider to discovery; returns a function that removes it."""
    if provider in _providers:
        raise DocaError(DocaErrorCode.ALREADY_EXIST, f"provider {provider!r} already registered")
    _providers.append(provider)

    def unregister() -> None:
        if provider in _providers:
            _providers.remove(provider)

    return unregister


DevInfoResolver = Callable[[str], "DevInfo | None"]
_resolvers: list[DevInfoResolver] = []


def register_resolver(resolver: DevInfoResolver) -> Callable[[], None]:
    """Add a resolver for device specs no listed device matches.

    The soft driver uses it for addresses it does not list (any of 127.0.0.0/8)
    and for ``tcp:ADDR``; it returns None for specs that are not its own.
    """
    _resolvers.append(resolver)

    def unregister() -> None:
        if resolver in _resolvers:
            _resolvers.remove(resolver)

    return unregister


def find_devinfo(spec: str) -> DevInfo:
    """The device `spec` names: a listed device's name, IP or PCI address, else a resolver's.

    NOT_FOUND when nothing matches.
    """
    for info in devinfo_list():
        if info.matches(spec):
            return info
    for resolve in list(_resolvers):
        found = resolve(spec)
        if found is not None:
            return found
    raise DocaError(DocaErrorCode.NOT_FOUND, f"no device matches {spec!r}", Fault.CALLER)


def devinfo_list() -> list[DevInfo]:
    """All devices of all providers, in provider registration order (``doca_devinfo_create_list``)."""
    found: list[DevInfo] = []
    for provider in list(_providers):
        try:
            found.extend(provider())
        except DocaError:
            raise
        except OSError as exc:
            raise DocaError(
                DocaErrorCode.DRIVER, f"device provider {provider!r} failed: {exc}", Fault.SYSTEM
            ) from exc
    return found


class _DevChild(Protocol):
    """A memory map or context that a device is added to."""

    def _on_dev_close(self, dev: "Dev") -> None: ...


class _DevPump:
    """A device's pump as its engines run it: a busy run wakes every engine sharing the device.

    `progress` is the backend pump's own while one engine runs it (an engine's progress makes no
    call of ours per device), and `_progress_waking` while several do.
    """

    __slots__ = ("_engines", "inner", "progress")

    def __init__(self, inner: Pump) -> None:
        self.inner = inner
        self._engines: tuple[ProgressEngine, ...] = ()
        self.progress: Callable[[], bool] = inner.progress

    @property
    def engines(self) -> tuple["ProgressEngine", ...]:
        """The engines to wake after a busy run; set while more than one engine runs the pump."""
        return self._engines

    @engines.setter
    def engines(self, engines: tuple["ProgressEngine", ...]) -> None:
        self._engines = engines
        self.progress = self._progress_waking if engines else self.inner.progress

    def _progress_waking(self) -> bool:
        busy = self.inner.progress()
        if busy:
            for pe in self._engines:  # whoever waits collects its contexts' completions
                pe.wake()
        return busy

    def fileno(self) -> int | None:
        return self.inner.fileno()


class Dev:
    """An open device (``doca_dev``). Use `Dev.open`; close with `close` or ``with``."""

    def __init__(self, info: DevInfo, backend: BackendDevice, pe: ProgressEngine | None = None) -> None:
        self._info = info
        self._backend: BackendDevice | None = backend
        self._children: list[_DevChild] = []
        self._pe = pe if pe is not None else thread_engine()
        self._pump = _DevPump(backend.pump)
        self._pe.add_pump(self._pump)
        self._engines: dict[ProgressEngine, int] = {}  # other engines with contexts here: how many

    @classmethod
    def open(cls, spec: DevInfo | str, *, pe: ProgressEngine | None = None) -> Self:
        """Open the device `spec` (``doca_dev_open``): a `DevInfo`, or a name, IP or PCI address.

        `pe` runs the device's pump; None: the calling thread's engine.
        """
        if isinstance(spec, DevInfo):
            info = spec
        else:
            info = find_devinfo(spec)
        backend = info.opener()
        try:
            return cls(info, backend, pe)
        except BaseException:
            backend.close()
            raise

    @property
    def pe(self) -> ProgressEngine:
        """The progress engine the device was opened under (others may pump it too)."""
        return self._pe

    @property
    def pump(self) -> Pump:
        """What the device's engines run: the backend's pump."""
        return self._pump

    @property
    def info(self) -> DevInfo:
        return self._info

    @property
    def name(self) -> str:
        return self._info.name

    @property
    def closed(self) -> bool:
        return self._backend is None

    @property
    def backend(self) -> BackendDevice:
        """The backend device; BAD_STATE once closed."""
        if self._backend is None:
            raise DocaError(DocaErrorCode.BAD_STATE, f"device {self.name} is closed")
        return self._backend

    def _adopt(self, child: _DevChild) -> None:
        self.backend  # noqa: B018 - raises BAD_STATE when closed
        self._children.append(child)

    def _disown(self, child: _DevChild) -> None:
        if child in self._children:
            self._children.remove(child)

    def _share_with(self, pe: ProgressEngine) -> None:
        """A context of the device is progressed by `pe`: `pe` runs the device's pump too."""
        if pe is self._pe or self._backend is None:
            return
        n = self._engines.get(pe, 0)
        if not n:
            pe.add_pump(self._pump)
        self._engines[pe] = n + 1
        self._pump.engines = (self._pe, *self._engines)

    def _unshare(self, pe: ProgressEngine) -> None:
        """Undo one `_share_with`."""
        n = self._engines.get(pe, 0)
        if not n:
            return
        if n > 1:
            self._engines[pe] = n - 1
            return
        del self._engines[pe]
        pe.remove_pump(self._pump)
        self._pump.engines = (self._pe, *self._engines) if self._engines else ()

    def rep_list(self) -> list[DevInfo]:
        """Representors (``doca_devinfo_rep_create_list``): none without a DPU."""
        raise DocaError(DocaErrorCode.NOT_SUPPORTED, "device representors need a BlueField DPU", Fault.SYSTEM)

    def open_rep(self, rep: DevInfo) -> "Dev":
        """Open a representor (``doca_dev_rep_open``): none without a DPU."""
        raise DocaError(DocaErrorCode.NOT_SUPPORTED, "device representors need a BlueField DPU", Fault.SYSTEM)

    def close(self) -> None:
        """Close the device (``doca_dev_close``); idempotent.

        IN_USE while a memory map or a context still uses it, naming them
        (``doca_dev.h``: "DOCA_ERROR_IN_USE - failed to deallocate device
        resources"): destroy the mmaps and contexts first, children before
        parents. `close_all` is the lenient teardown for error paths.
        """
        if self._backend is None:
            return
        if self._children:
            shown = self._children[:_NAMED]
            names = ", ".join(repr(c) for c in shown)
            more = len(self._children) - len(shown)
            if more:
                names += f" and {more} more"
            raise DocaError(
                DocaErrorCode.IN_USE,
                f"device {self.name} is still used by {len(self._children)} object(s): {names}; "
                "destroy them before closing the device",
                Fault.CALLER,
            )
        self._release()

    def close_all(self) -> None:
        """Close the children (contexts, memory-map registrations), then the device. Idempotent."""
        if self._backend is None:
            return
        for child in list(self._children):
            child._on_dev_close(self)
        self._children.clear()
        self._release()

    def _release(self) -> None:
        backend, self._backend = self._backend, None
        if backend is None:
            return
        self._pe.remove_pump(self._pump)
        for pe in self._engines:
            pe.remove_pump(self._pump)
        self._engines.clear()
        self._pump.engines = ()
        backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # An exception on the way out: tear everything down rather than mask it with IN_USE.
        if exc_info[0] is not None:
            self.close_all()
        else:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Dev {self.name} kind={self._info.kind} {state}>"
