"""Memory a DPU can reach: what ``doca_mmap_export_pci`` exports, on one machine.

On a BlueField the DPU reads and writes host memory over PCIe, through an
mmap the host exported with ``doca_mmap_export_pci`` (`Mmap.export_dpu`).
Without one, a "host" process and a "DPU" process on the same machine play
the two roles and the PCIe path is the kernel's shared memory: the exported
range must lie in a `SharedMemory` (a memfd or a file, mapped
``MAP_SHARED``), and the importer maps the same pages. No socket is in the
data path.

- `SharedMemory(size)`, `SharedMemory.from_file`, `SharedMemory.from_fd`: the
  exporter's memory. Give its `buf` (or a slice of it, or a numpy array over
  it) to `Mmap.set_memrange`.
- `DpuDescriptor`: what `Mmap.export_dpu` returns, canonical JSON with
  ``"format": "rdmakit.mmap-dpu/2"``: the range's address, length and
  rights, the file's identity (device, inode), the range's offset in the
  file, and the machine's boot id, so that an import on another machine is
  refused (there the same range is reached by RDMA: `Mmap.export_rdma`).
- `import_region`: the importer's mapping (`SharedRegion`), used by
  `Mmap.create_from_export`, from the memory's file descriptor, which
  travels beside the descriptor over a Unix-socket comm channel
  (``SCM_RIGHTS``), whose peer's user the kernel has vouched for.

The pages come only from a descriptor handed over, never from a path or a
process id that a message names (``/proc/PID/fd/N``): opening such a path
would use the importer's privileges, with the rights the message claims,
on whatever file the named process has open. The rights are the ones the
descriptor itself carries: an export claiming PCI_READ_WRITE with a
descriptor open read-only is refused (``fcntl(F_GETFL)``; the file is never
reopened). An export with PCI_READ_ONLY is mapped read-only by the importer
(the MMU refuses writes) and registered without write access on the
importer's device.
"""

import contextlib
import fcntl
import json
import mmap as stdlib_mmap
import os
import stat
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from rdmakit.doca._fields import DescriptorReader
from rdmakit.doca._memory import PCI_FLAGS as _PCI_FLAGS
from rdmakit.doca._memory import AccessFlag, address_of
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault, error_from_os

__all__ = [
    "DPU_DESCRIPTOR_FORMAT",
    "DpuDescriptor",
    "SharedMemory",
]

DPU_DESCRIPTOR_FORMAT = "rdmakit.mmap-dpu/2"
_FORMAT_FAMILY = "rdmakit.mmap-dpu/"
_MAX_DESCRIPTOR = 4096
_FIELDS = (
    "format",
    "addr",
    "length",
    "access",
    "device",
    "st_dev",
    "st_ino",
    "offset",
    "boot_id",
)
_U64 = 1 << 64
_POPULATE = getattr(stdlib_mmap, "MAP_POPULATE", 0)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


_BOOT_ID = _boot_id()


# ---------------------------------------------------------------------------
# The exporter's memory

# Live SharedMemory objects, by id: `export_range` finds the one holding a range.
_live: "weakref.WeakValueDictionary[int, SharedMemory]" = weakref.WeakValueDictionary()


class SharedMemory:
    """Memory another process on this machine can map: a memfd or a file, mapped ``MAP_SHARED``.

    `buf` is the whole mapping as a memoryview. `close` unmaps it; IN_USE
    while an `Mmap` (or any other view) still holds it.
    """

    def __init__(self, size: int, *, name: str = "rdmakit") -> None:
        """`size` bytes of anonymous shared memory (a memfd), zero-filled."""
        if size <= 0:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"size must be positive, got {size}")
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
        except OSError as exc:
            raise error_from_os(exc, "memfd_create") from exc
        try:
            os.ftruncate(fd, size)
            self._map(fd, size, writable=True)
        except OSError as exc:
            os.close(fd)
            raise error_from_os(exc, f"allocating {size} bytes of shared memory") from exc
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def from_fd(cls, fd: int, *, writable: bool, size: int | None = None) -> Self:
        """Map the file open on `fd` (duplicated: the caller keeps its own).

        `size` (when given) first sets the file's length; otherwise the whole
        file is mapped. `writable` needs `fd` open for writing.
        """
        self = cls.__new__(cls)
        try:
            own = os.dup(fd)
        except OSError as exc:
            raise error_from_os(exc, f"dup({fd})") from exc
        try:
            os.set_inheritable(own, False)
            if size is not None:
                os.ftruncate(own, size)
            length = os.fstat(own).st_size
            if length <= 0:
                raise DocaError(DocaErrorCode.INVALID_VALUE, "cannot share an empty file")
            self._map(own, length, writable=writable)
        except OSError as exc:
            os.close(own)
            raise error_from_os(exc, "mapping shared memory") from exc
        except BaseException:
            os.close(own)
            raise
        return self

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, writable: bool = False) -> Self:
        """Map an existing regular file (read-only unless `writable`)."""
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise error_from_os(exc, f"opening {os.fspath(path)}") from exc
        try:
            return cls.from_fd(fd, writable=writable)
        finally:
            os.close(fd)

    def _map(self, fd: int, size: int, *, writable: bool) -> None:
        prot = stdlib_mmap.PROT_READ | (stdlib_mmap.PROT_WRITE if writable else 0)
        mapping = stdlib_mmap.mmap(fd, size, flags=stdlib_mmap.MAP_SHARED, prot=prot)
        self._fd = fd
        self._size = size
        self._writable = writable
        self._mapping: stdlib_mmap.mmap | None = mapping
        self._buf: memoryview | None = memoryview(mapping)
        self._addr = _address(self._buf)
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino)
        self._close_fd = weakref.finalize(self, os.close, fd)  # also if never closed
        _live[id(self)] = self

    @property
    def fd(self) -> int:
        """The descriptor of the memory: pass it over a comm channel with the export descriptor."""
        self._check_open()
        return self._fd

    @property
    def size(self) -> int:
        return self._size

    @property
    def writable(self) -> bool:
        return self._writable

    @property
    def addr(self) -> int:
        """Virtual address of the first byte in this process."""
        return self._addr

    @property
    def buf(self) -> memoryview:
        """The whole mapping (no copy)."""
        self._check_open()
        assert self._buf is not None
        return self._buf

    @property
    def closed(self) -> bool:
        return self._mapping is None

    def _check_open(self) -> None:
        if self._mapping is None:
            raise DocaError(DocaErrorCode.BAD_STATE, "shared memory is closed")

    def close(self) -> None:
        """Unmap and close; idempotent. IN_USE while other views of the memory exist."""
        mapping = self._mapping
        if mapping is None:
            return
        assert self._buf is not None
        self._buf.release()
        try:
            mapping.close()
        except BufferError:
            self._buf = memoryview(mapping)
            raise DocaError(
                DocaErrorCode.IN_USE, "shared memory is still in use (destroy the Mmap over it first)"
            ) from None
        self._mapping = self._buf = None
        self._close_fd()
        _live.pop(id(self), None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._mapping is None else f"fd={self._fd}"
        return f"<SharedMemory {self._addr:#x}+{self._size} {state}>"


def _address(view: memoryview) -> int:
    addr = address_of(view)
    if addr is None:
        raise DocaError(DocaErrorCode.NOT_SUPPORTED, "this Python cannot tell buffer addresses")
    return addr


def _find(addr: int, length: int) -> tuple[SharedMemory, int] | None:
    for shared in list(_live.values()):
        if not shared.closed and shared.addr <= addr and addr + length <= shared.addr + shared.size:
            return shared, addr - shared.addr
    return None


# ---------------------------------------------------------------------------
# The descriptor


_READER = DescriptorReader("DPU export descriptor", _FIELDS, _MAX_DESCRIPTOR)
_bad = _READER.bad


def _int(obj: dict[str, object], key: str, lo: int, hi: int) -> int:
    """An integer in [lo, hi)."""
    return _READER.get_int(obj, key, lo, hi - 1)


def _str(obj: dict[str, object], key: str) -> str:
    return _READER.get_str(obj, key, max_len=255)


@dataclass(frozen=True, slots=True, kw_only=True)
class DpuDescriptor:
    """What `Mmap.export_dpu` tells the DPU: the range, its rights and where its pages are."""

    addr: int  # the exporter's virtual address of the range (what buffer_info.txt carries)
    length: int
    access: AccessFlag  # includes PCI_READ_ONLY or PCI_READ_WRITE
    device: str  # the exporter's device
    st_dev: int  # identity of the memory's file
    st_ino: int
    offset: int  # of `addr` in the file
    boot_id: str  # the exporter's machine (Linux boot id)

    def to_bytes(self) -> bytes:
        obj = {
            "format": DPU_DESCRIPTOR_FORMAT,
            "addr": self.addr,
            "length": self.length,
            "access": [flag.name for flag in AccessFlag if flag in self.access],
            "device": self.device,
            "st_dev": self.st_dev,
            "st_ino": self.st_ino,
            "offset": self.offset,
            "boot_id": self.boot_id,
        }
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def matches(data: object) -> bool:
        """Whether `data` claims to be a DPU descriptor (its format field), valid or not."""
        if not isinstance(data, bytes | bytearray | memoryview) or len(data) > _MAX_DESCRIPTOR:
            return False
        try:
            obj = json.loads(bytes(data))
        except (ValueError, RecursionError):
            return False
        return (
            isinstance(obj, dict)
            and isinstance(obj.get("format"), str)
            and obj["format"].startswith(_FORMAT_FAMILY)
        )

    @classmethod
    def from_bytes(cls, data: object) -> Self:
        """Parse and validate; anything malformed is INVALID_VALUE naming the field [peer]."""
        obj = _READER.load(data)
        if obj["format"] != DPU_DESCRIPTOR_FORMAT:
            raise _bad("format", f"{obj['format']!r} is not {DPU_DESCRIPTOR_FORMAT!r}")
        access = _READER.flags(obj, "access", AccessFlag)
        if not access & _PCI_FLAGS or _PCI_FLAGS in access:
            raise _bad("access", "needs exactly one of PCI_READ_ONLY and PCI_READ_WRITE")
        addr = _int(obj, "addr", 0, _U64)
        return cls(
            addr=addr,
            length=_int(obj, "length", 1, _U64 - addr + 1),
            access=access,
            device=_str(obj, "device"),
            st_dev=_int(obj, "st_dev", 0, _U64),
            st_ino=_int(obj, "st_ino", 0, _U64),
            offset=_int(obj, "offset", 0, 1 << 63),
            boot_id=_str(obj, "boot_id"),
        )


def export_range(addr: int, length: int, access: AccessFlag, device: str) -> bytes:
    """The descriptor of ``[addr, addr+length)``, which must lie in a live `SharedMemory`.

    Called by `Mmap.export_dpu` after its own checks.
    """
    found = _find(addr, length)
    if found is None:
        raise DocaError(
            DocaErrorCode.NOT_SUPPORTED,
            f"export_dpu: {addr:#x}+{length} is not in shared memory; without a BlueField a DPU process "
            "reaches only memory from rdmakit.doca.SharedMemory",
        )
    shared, offset = found
    if AccessFlag.PCI_READ_WRITE in access and not shared.writable:
        raise DocaError(DocaErrorCode.INVALID_VALUE, "PCI_READ_WRITE over read-only shared memory")
    st_dev, st_ino = shared._ident
    desc = DpuDescriptor(
        addr=addr, length=length, access=access, device=device, st_dev=st_dev, st_ino=st_ino,
        offset=offset, boot_id=_BOOT_ID,
    )  # fmt: skip
    return desc.to_bytes()


# ---------------------------------------------------------------------------
# The importer's mapping


class SharedRegion:
    """The importer's mapping of an exported range: `view` is exactly the range."""

    def __init__(self, desc: DpuDescriptor, fd: int) -> None:
        """Map `desc`'s range from `fd` (taken over: closed by `close`)."""
        self.descriptor = desc
        writable = AccessFlag.PCI_READ_WRITE in desc.access
        granule = stdlib_mmap.ALLOCATIONGRANULARITY
        start = desc.offset - desc.offset % granule
        prot = stdlib_mmap.PROT_READ | (stdlib_mmap.PROT_WRITE if writable else 0)
        # MAP_POPULATE: take the page faults now, not in the middle of the first copy.
        self._mapping: stdlib_mmap.mmap | None = stdlib_mmap.mmap(
            fd, desc.offset + desc.length - start, flags=stdlib_mmap.MAP_SHARED | _POPULATE,
            prot=prot, offset=start,
        )  # fmt: skip
        whole = memoryview(self._mapping)
        self._view: memoryview | None = whole[desc.offset - start : desc.offset - start + desc.length]
        whole.release()
        self._close_fd = weakref.finalize(self, os.close, fd)  # also if never closed

    @property
    def view(self) -> memoryview:
        if self._view is None:
            raise DocaError(DocaErrorCode.BAD_STATE, "shared region is closed")
        return self._view

    @property
    def writable(self) -> bool:
        return AccessFlag.PCI_READ_WRITE in self.descriptor.access

    def close(self) -> None:
        """Unmap; idempotent. Views still held elsewhere keep the pages until they go."""
        mapping, self._mapping = self._mapping, None
        if mapping is None:
            return
        if self._view is not None:
            self._view.release()
            self._view = None
        with contextlib.suppress(BufferError):  # else unmapped when the last view is collected
            mapping.close()
        self._close_fd()


def import_region(data: bytes, *, fd: int | None) -> SharedRegion:
    """Map the range a DPU descriptor names (``doca_mmap_create_from_export`` on the DPU).

    The pages come from `fd` (duplicated: the caller keeps its own), the
    memory's descriptor received with `data` over a Unix-socket comm channel;
    it must be the exported file, open for writing if the export allows
    writes.
    """
    desc = DpuDescriptor.from_bytes(data)
    if desc.boot_id != _BOOT_ID:
        raise DocaError(
            DocaErrorCode.NOT_SUPPORTED,
            "the mmap was exported on another machine: there it is reached by RDMA (export_rdma)",
            Fault.PEER,
        )
    if fd is None:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE,
            "a DPU export (export_dpu) is imported with the memory's file descriptor, which comes with "
            "it over a Unix-socket comm channel; a TCP channel cannot carry one (use export_rdma there)",
        )
    try:
        own = os.dup(fd)
    except OSError as exc:
        raise error_from_os(exc, f"dup({fd})") from exc
    os.set_inheritable(own, False)
    try:
        st = os.fstat(own)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (desc.st_dev, desc.st_ino):
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                "the file descriptor sent is not the exported memory (a stale descriptor?)",
                Fault.PEER,
            )
        mode = fcntl.fcntl(own, fcntl.F_GETFL)
        if mode & os.O_PATH or (mode & os.O_ACCMODE) == os.O_WRONLY:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                "the memory's file descriptor is not open for reading",
                Fault.PEER,
            )
        if AccessFlag.PCI_READ_WRITE in desc.access and (mode & os.O_ACCMODE) != os.O_RDWR:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                "the export allows writes (PCI_READ_WRITE) but the memory's file descriptor is open "
                "read-only: the exporter cannot grant what it does not have",
                Fault.PEER,
            )
        if st.st_size < desc.offset + desc.length:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"exported memory is {st.st_size} bytes, the range ends at {desc.offset + desc.length}",
                Fault.PEER,
            )
        return SharedRegion(desc, own)
    except OSError as exc:
        os.close(own)
        raise error_from_os(exc, "mapping exported memory") from exc
    except BaseException:
        os.close(own)
        raise
