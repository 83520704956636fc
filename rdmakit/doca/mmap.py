"""DOCA Memory Map (DOCA Core 3.3, ``doca_mmap.h``).

An `Mmap` names one memory range, the access rights devices get to it, and the
devices it is registered with. Lifecycle::

    Mmap() -> set_memrange / set_permissions / add_dev -> start -> [export_rdma]
           -> stop (back to configurable) -> destroy

Rules (each from ``doca_mmap.h``):

- ``set_memrange`` is mandatory and allowed once (NOT_PERMITTED the second time).
- ``set_*`` on a started mmap is BAD_STATE; ``add_dev``/``rm_dev`` on a started,
  exported or imported mmap is NOT_PERMITTED.
- ``start`` registers the range with every added device.
- ``stop`` and ``destroy`` are NOT_PERMITTED while any `Buf` points into the
  range (``doca_mmap_stop``/``doca_mmap_destroy``).
- ``export_rdma`` needs a started local mmap with an RDMA permission.

Addresses. The range's address is the buffer's real virtual address, read
through the buffer protocol (``rdmakit.verbs.buffer_address``), so it is what
a verbs backend registers and what a peer writes to. Should the buffer protocol
give no address (0), a unique synthetic address
above 2**62 is used instead: no Linux user-space pointer is that high, so
synthetic and real ranges never overlap. Either way the mmap holds a
``memoryview`` export of the buffer until ``destroy``, which pins it: a
``bytearray`` cannot be resized and an ``mmap.mmap`` cannot be closed meanwhile.
"""

import itertools
import json
from dataclasses import dataclass
from ipaddress import IPv6Address
from typing import TYPE_CHECKING, Self

from rdmakit.doca._addresses import address_problem
from rdmakit.doca._fields import DescriptorReader
from rdmakit.doca._memory import PCI_FLAGS as _PCI_FLAGS
from rdmakit.doca._memory import RDMA_FLAGS as _RDMA_FLAGS
from rdmakit.doca._memory import WRITE_FLAGS as _WRITE_FLAGS
from rdmakit.doca._memory import AccessFlag, address_of, verbs_access
from rdmakit.doca.backend import MemoryRegistration
from rdmakit.doca.device import Dev
from rdmakit.doca.errors import DocaError, DocaErrorCode
from rdmakit.doca.shm import DpuDescriptor, SharedRegion, export_range, import_region
from rdmakit.engine.types import Access

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from 3.12

__all__ = [
    "DESCRIPTOR_FORMAT",
    "AccessFlag",
    "Mmap",
    "MmapDescriptor",
]


_ALL_MASK = int(sum(AccessFlag))
_U64 = 1 << 64
_U32 = 1 << 32


# ---------------------------------------------------------------------------
# Buffer addresses


_synthetic_base = itertools.count(1 << 62, 1 << 40)  # 1 TiB apart; ranges are smaller


def _as_bytes_view(buffer: "Buffer") -> memoryview:
    try:
        view = memoryview(buffer)
    except TypeError as exc:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE, f"{type(buffer).__name__} does not support the buffer protocol"
        ) from exc
    if not view.c_contiguous:
        raise DocaError(DocaErrorCode.INVALID_VALUE, "memory range must be C-contiguous")
    view = view.cast("B")
    if view.nbytes == 0:
        raise DocaError(DocaErrorCode.INVALID_VALUE, "memory range must not be empty")
    return view


# ---------------------------------------------------------------------------
# Export descriptor

DESCRIPTOR_FORMAT = "rdmakit.mmap/1"
_MAX_DESCRIPTOR = 4096
_MTUS = frozenset({256, 512, 1024, 2048, 4096})
_FIELDS = ("format", "addr", "length", "rkey", "access", "device", "gid", "mtu")


_READER = DescriptorReader("mmap descriptor", _FIELDS, _MAX_DESCRIPTOR)
_bad = _READER.bad


def _get_int(obj: dict[str, object], key: str, lo: int, hi: int) -> int:
    """An integer in [lo, hi)."""
    return _READER.get_int(obj, key, lo, hi - 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class MmapDescriptor:
    """What ``export_rdma`` tells a peer: the range, its rkey and rights, and the device.

    Serialised as canonical JSON with ``"format": "rdmakit.mmap/1"``. (DOCA's
    own descriptor is an undocumented binary blob; this one is rdmakit's.)
    """

    addr: int
    length: int
    rkey: int
    access: AccessFlag
    device: str
    gid: IPv6Address
    mtu: int

    def to_bytes(self) -> bytes:
        obj = {
            "format": DESCRIPTOR_FORMAT,
            "addr": self.addr,
            "length": self.length,
            "rkey": self.rkey,
            "access": [flag.name for flag in AccessFlag if flag in self.access],
            "device": self.device,
            "gid": self.gid.exploded,
            "mtu": self.mtu,
        }
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: object) -> Self:
        """Parse and validate; anything malformed raises INVALID_VALUE naming the field."""
        obj = _READER.load(data)
        fmt = _READER.get_str(obj, "format")
        if fmt != DESCRIPTOR_FORMAT:
            raise _bad("format", f"{fmt!r} is not {DESCRIPTOR_FORMAT!r}")
        addr = _get_int(obj, "addr", 0, _U64)
        length = _get_int(obj, "length", 1, _U64 - addr + 1)
        rkey = _get_int(obj, "rkey", 0, _U32)
        access = _READER.flags(obj, "access", AccessFlag)
        if not access & _RDMA_FLAGS:
            raise _bad("access", "grants no RDMA access")
        device = _READER.get_str(obj, "device")
        if not 0 < len(device) <= 255:
            raise _bad("device", "must be 1 to 255 characters")
        gid_text = _READER.get_str(obj, "gid")
        try:
            gid = IPv6Address(gid_text)
        except ValueError as exc:
            raise _bad("gid", f"{gid_text!r} is not a GID") from exc
        problem = address_problem(gid, gid=True)
        if problem is not None:
            raise _bad("gid", f"{gid_text[:64]} {problem}")
        mtu = _get_int(obj, "mtu", 0, (1 << 20) + 1)
        if mtu not in _MTUS and not (mtu > 4096 and mtu & (mtu - 1) == 0):  # > 4096: a soft TCP device
            raise _bad("mtu", f"{mtu} is not an IB MTU (nor a power of two up to 2**20, for TCP)")
        return cls(addr=addr, length=length, rkey=rkey, access=access, device=device, gid=gid, mtu=mtu)


# ---------------------------------------------------------------------------
# Mmap


class Mmap:
    """A DOCA memory map (``doca_mmap``). Not thread-safe, like DOCA's."""

    def __init__(self) -> None:
        self._view: memoryview | None = None
        self._addr = 0
        self._length = 0
        self._synthetic = False
        self._permissions = AccessFlag.LOCAL_READ_WRITE  # DOCA's default
        self._devs: list[Dev] = []
        self._regs: dict[Dev, MemoryRegistration] = {}
        self._started = False
        self._exported = False
        self._destroyed = False
        self._remote: MmapDescriptor | DpuDescriptor | None = None
        self._shared: SharedRegion | None = None  # the pages of a DPU import (rdmakit.doca.shm)
        self._num_bufs = 0

    # -- properties ---------------------------------------------------------

    @property
    def addr(self) -> int:
        """Start address of the range (0 before `set_memrange`)."""
        return self._addr

    @property
    def length(self) -> int:
        return self._length

    @property
    def memrange(self) -> tuple[int, int]:
        """``(addr, length)`` (``doca_mmap_get_memrange``); BAD_STATE if never set."""
        if not self._length:
            raise DocaError(DocaErrorCode.BAD_STATE, "memrange was never set")
        return self._addr, self._length

    @property
    def synthetic_addr(self) -> bool:
        """True when `addr` is a synthetic address rather than the buffer's own."""
        return self._synthetic

    @property
    def permissions(self) -> AccessFlag:
        return self._permissions

    @property
    def devs(self) -> tuple[Dev, ...]:
        return tuple(self._devs)

    @property
    def started(self) -> bool:
        return self._started

    @property
    def exported(self) -> bool:
        return self._exported

    @property
    def from_export(self) -> bool:
        """True for a remote mmap made by `create_from_export` (no local memory)."""
        return self._remote is not None

    @property
    def descriptor(self) -> "MmapDescriptor | DpuDescriptor | None":
        """The peer's descriptor of a remote mmap; None for a local one."""
        return self._remote

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    @property
    def num_bufs(self) -> int:
        """`Buf` s pointing into the range (``doca_mmap_get_num_bufs``)."""
        return self._num_bufs

    # -- checks ---------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._destroyed:
            raise DocaError(DocaErrorCode.BAD_STATE, "mmap is destroyed")

    def _check_configurable(self, what: str) -> None:
        self._check_alive()
        if self._remote is not None:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, f"{what}: mmap was created from an export")
        if self._started:
            raise DocaError(DocaErrorCode.BAD_STATE, f"{what}: mmap is started")

    def _check_dev_list_mutable(self, what: str) -> None:
        self._check_alive()
        if self._remote is not None or self._started or self._exported:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, f"{what}: mmap is started, exported or imported")

    def _check_writable_memory(self) -> None:
        if self._view is not None and self._view.readonly and self._permissions & _WRITE_FLAGS:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"read-only memory cannot be mapped with {(self._permissions & _WRITE_FLAGS)!r}",
            )

    def _check_no_bufs(self, what: str) -> None:
        if self._num_bufs:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED, f"{what}: {self._num_bufs} buffers still point into the mmap"
            )

    # -- configuration ----------------------------------------------------------

    def set_memrange(self, buffer: "Buffer") -> None:
        """Map `buffer`: any C-contiguous buffer (bytearray, bytes, memoryview, numpy, mmap.mmap).

        A read-only buffer is accepted only with permissions that grant no write.
        """
        self._check_configurable("set_memrange")
        if self._view is not None:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "memrange can be set only once")
        view = _as_bytes_view(buffer)
        addr = address_of(view)
        self._synthetic = addr is None
        if addr is None:
            addr = next(_synthetic_base)
        self._view, self._addr, self._length = view, addr, view.nbytes
        try:
            self._check_writable_memory()
        except DocaError:
            self._view, self._addr, self._length = None, 0, 0
            view.release()
            raise

    def set_permissions(self, access: int) -> None:
        """Set the `AccessFlag` s devices get (``doca_mmap_set_permissions``)."""
        self._check_configurable("set_permissions")
        if access & ~_ALL_MASK or access < 0:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"undefined access flags {access:#x}")
        flags = AccessFlag(access)
        if AccessFlag.PCI_READ_ONLY | AccessFlag.PCI_READ_WRITE in flags:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "PCI_READ_ONLY and PCI_READ_WRITE are exclusive")
        previous, self._permissions = self._permissions, flags
        try:
            self._check_writable_memory()
        except DocaError:
            self._permissions = previous
            raise

    def add_dev(self, dev: Dev) -> None:
        """Register the mmap on `dev` at `start` (``doca_mmap_add_dev``)."""
        self._check_dev_list_mutable("add_dev")
        if dev in self._devs:
            raise DocaError(DocaErrorCode.ALREADY_EXIST, f"{dev.name} is already added")
        dev._adopt(self)
        self._devs.append(dev)

    def rm_dev(self, dev: Dev) -> None:
        """Undo `add_dev` (``doca_mmap_rm_dev``)."""
        self._check_dev_list_mutable("rm_dev")
        if dev not in self._devs:
            raise DocaError(DocaErrorCode.NOT_FOUND, f"{dev.name} was not added")
        self._devs.remove(dev)
        dev._disown(self)

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Finalise the configuration and register the range with every added device."""
        self._check_configurable("start")
        if self._view is None:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "start: memrange was never set")
        self._check_writable_memory()
        access = verbs_access(self._permissions)
        try:
            for dev in self._devs:
                self._regs[dev] = dev.backend.register_memory(self._view, self._addr, access)
        except BaseException:
            self._deregister_all()
            raise
        self._started = True

    def _deregister_all(self) -> None:
        regs, self._regs = self._regs, {}
        for dev, reg in regs.items():
            if not dev.closed:
                dev.backend.deregister(reg)

    def stop(self) -> None:
        """Deregister from the devices and allow configuration again (``doca_mmap_stop``)."""
        self._check_alive()
        if self._remote is not None:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "stop: mmap was created from an export")
        if not self._started:
            raise DocaError(DocaErrorCode.BAD_STATE, "stop: mmap is not started")
        self._check_no_bufs("stop")
        self._deregister_all()
        self._started = False
        self._exported = False

    def destroy(self) -> None:
        """Stop, release the buffer and leave the devices; idempotent (``doca_mmap_destroy``)."""
        if self._destroyed:
            return
        self._check_no_bufs("destroy")
        self._deregister_all()
        self._started = False
        for dev in self._devs:
            dev._disown(self)
        self._devs.clear()
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._shared is not None:
            self._shared.close()
            self._shared = None
        self._destroyed = True

    close = destroy

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()

    def _on_dev_close(self, dev: Dev) -> None:
        reg = self._regs.pop(dev, None)
        if reg is not None:
            dev.backend.deregister(reg)
        if dev in self._devs:
            self._devs.remove(dev)

    # -- use ------------------------------------------------------------------------

    def registration(self, dev: Dev) -> MemoryRegistration:
        """The keys of the range on `dev` (lkey for local jobs, rkey for peers)."""
        self._check_alive()
        reg = self._regs.get(dev)
        if reg is None:
            raise DocaError(
                DocaErrorCode.NOT_FOUND, f"mmap is not registered on {dev.name} (added and started?)"
            )
        return reg

    def export_rdma(self, dev: Dev) -> bytes:
        """A descriptor a peer passes to `create_from_export` (``doca_mmap_export_rdma``)."""
        self._check_alive()
        if self._remote is not None:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "cannot re-export an imported mmap")
        if not self._started:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "export_rdma: mmap is not started")
        if not self._permissions & _RDMA_FLAGS:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "export_rdma: no RDMA_READ/WRITE/ATOMIC permission")
        reg = self.registration(dev)
        backend = dev.backend
        desc = MmapDescriptor(
            addr=self._addr,
            length=self._length,
            rkey=reg.rkey,
            access=self._permissions,
            device=dev.name,
            gid=backend.gid,  # the RoCE v2 GID the device's queue pairs use, never link-local
            mtu=backend.mtu,
        )
        self._exported = True
        return desc.to_bytes()

    def export_dpu(self, dev: Dev) -> bytes:
        """A descriptor the DPU passes to `create_from_export` (``doca_mmap_export_pci``).

        Needs a started local mmap, registered on `dev`, with PCI_READ_ONLY or
        PCI_READ_WRITE. Without a BlueField the DPU is another process on this
        machine, and the range must lie in a `SharedMemory` (NOT_SUPPORTED
        otherwise): see ``rdmakit.doca.shm``.
        """
        self._check_alive()
        if self._remote is not None:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "cannot re-export an imported mmap")
        if not self._started:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "export_dpu: mmap is not started")
        if not self._permissions & _PCI_FLAGS:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, "export_dpu: no PCI_READ_ONLY/READ_WRITE permission")
        self.registration(dev)
        descriptor = export_range(self._addr, self._length, self._permissions, dev.name)
        self._exported = True
        return descriptor

    export_pci = export_dpu

    @classmethod
    def create_from_export(cls, descriptor: bytes, dev: Dev, *, fd: int | None = None) -> Self:
        """A remote mmap from a peer's descriptor (``doca_mmap_create_from_export``).

        From `export_rdma`: the peer's address range, rkey and permissions but
        no local memory; `dev` is the local device that will reach the peer.
        From `export_dpu`: the host's range, reachable through `dev` by jobs
        (registered on it, writable only with PCI_READ_WRITE), still without
        a local `view`; `fd` is the memory's descriptor, which came with the
        descriptor over a Unix-socket comm channel (required).
        """
        if DpuDescriptor.matches(descriptor):
            return cls._create_from_dpu_export(descriptor, dev, fd)
        if fd is not None:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "fd goes only with an export_dpu descriptor")
        desc = MmapDescriptor.from_bytes(descriptor)
        mmap = cls()
        dev._adopt(mmap)
        mmap._remote = desc
        mmap._addr, mmap._length = desc.addr, desc.length
        mmap._permissions = desc.access
        mmap._devs.append(dev)
        mmap._started = True
        return mmap

    @classmethod
    def _create_from_dpu_export(cls, descriptor: bytes, dev: Dev, fd: int | None) -> Self:
        dev.backend  # noqa: B018 - raises BAD_STATE when closed
        region = import_region(descriptor, fd=fd)
        desc = region.descriptor
        access = Access.LOCAL_WRITE if region.writable else Access.NONE
        try:
            reg = dev.backend.register_memory(region.view, desc.addr, access)
        except BaseException:
            region.close()
            raise
        mmap = cls()
        dev._adopt(mmap)
        mmap._remote, mmap._shared, mmap._regs[dev] = desc, region, reg
        mmap._addr, mmap._length, mmap._permissions = desc.addr, desc.length, desc.access
        mmap._devs.append(dev)
        mmap._started = True
        return mmap

    def view(self, addr: int, length: int) -> memoryview:
        """The local bytes ``[addr, addr+length)`` of the range (no copy)."""
        self._check_alive()
        if self._view is None:
            if self._remote is not None:
                raise DocaError(DocaErrorCode.NOT_PERMITTED, "a remote mmap has no local memory")
            raise DocaError(DocaErrorCode.BAD_STATE, "memrange was never set")
        offset = addr - self._addr
        if length < 0 or offset < 0 or offset + length > self._length:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{addr:#x}+{length} is outside the mmap")
        return self._view[offset : offset + length]

    def contains(self, addr: int, length: int) -> bool:
        """Whether ``[addr, addr+length)`` lies inside the range."""
        return length >= 0 and self._addr <= addr and addr + length <= self._addr + self._length

    def __repr__(self) -> str:
        if self._destroyed:
            state = "destroyed"
        elif isinstance(self._remote, MmapDescriptor):
            state = f"remote rkey={self._remote.rkey:#x}"
        elif self._remote is not None:
            state = f"exported by {self._remote.device}"
        else:
            state = "started" if self._started else "idle"
        return f"<Mmap {self._addr:#x}+{self._length} {self._permissions!r} {state}>"
