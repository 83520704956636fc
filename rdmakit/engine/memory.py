"""Protection domains and memory regions (IBTA Vol. 1 §10.6).

A ``ProtectionDomain`` holds the memory registration table. Registering a
buffer gives a ``MemoryRegion`` with an L_Key (for the local side's
scatter/gather lists) and an R_Key (for the peer's RETH and AtomicETH). Both
are drawn from the injected random source: unpredictable to a peer, unique
within the domain, never 0.

Addresses are the caller's: ``addr`` is the virtual address the region
answers to (what a peer puts in a RETH), mapped onto the buffer's first byte.
"""

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from .errors import EngineError
from .types import SGE, Access

_KEY_BITS = 32
_ADDR_MAX = (1 << 64) - 1
_WRITABLE = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC
_ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
_LOCAL_WRITE = int(Access.LOCAL_WRITE)

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRegion:
    """A registered buffer (``ibv_mr``); ``view`` is its bytes, zero copy."""

    addr: int
    length: int
    lkey: int
    rkey: int
    access: Access
    view: memoryview = field(repr=False, compare=False)
    #: ``access`` as a plain int: the per-packet checks test it (Flag ``&`` costs ~0.5 µs).
    bits: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits", int(self.access))

    def contains(self, addr: int, length: int) -> bool:
        return self.addr <= addr and addr + length <= self.addr + self.length


class ProtectionDomain:
    """The memory registration table shared by the QPs of one PD (``ibv_pd``)."""

    __slots__ = ("_by_lkey", "_rng", "generation", "remote_table")

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        #: Bumped by every deregistration: a responder holding a slice resolved
        #: earlier re-checks its R_Key before writing through it again.
        self.generation = 0
        self._by_lkey: dict[int, MemoryRegion] = {}
        #: R_Key -> (addr, length, access bits, view): what ``remote_slice`` checks, and the
        #: native data plane with it (read-only outside this class).
        self.remote_table: dict[int, tuple[int, int, int, memoryview]] = {}

    def _new_key(self) -> int:
        while True:
            key = self._rng.getrandbits(_KEY_BITS)
            if key and key not in self._by_lkey and key not in self.remote_table:
                return key

    def register(self, buffer: Buffer, addr: int, access: Access) -> MemoryRegion:
        """Register ``buffer`` at virtual address ``addr`` (``ibv_reg_mr``).

        As in verbs, REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too, and a
        read-only buffer cannot be registered with any write access.
        """
        try:
            view = memoryview(buffer)
        except TypeError:
            raise EngineError("INVALID_VALUE", f"{type(buffer).__name__} is not a buffer") from None
        if not view.c_contiguous:
            raise EngineError("INVALID_VALUE", "the buffer is not contiguous")
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        if int(access) & ~int(_ALL_ACCESS):
            raise EngineError("INVALID_VALUE", f"unknown access bits {int(access):#x}")
        access = Access(access)
        if access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) and not access & Access.LOCAL_WRITE:
            raise EngineError("INVALID_VALUE", "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE (ibv_reg_mr)")
        if view.readonly and access & _WRITABLE:
            raise EngineError("INVALID_VALUE", "a read-only buffer cannot be registered writable")
        if addr < 0 or addr + len(view) > _ADDR_MAX + 1:
            raise EngineError("INVALID_VALUE", f"address {addr:#x} is outside the 64-bit space")
        lkey = self._new_key()
        rkey = self._new_key()
        while rkey == lkey:
            rkey = self._new_key()
        mr = MemoryRegion(addr=addr, length=len(view), lkey=lkey, rkey=rkey, access=access, view=view)
        self._by_lkey[lkey] = mr
        self.remote_table[rkey] = (addr, mr.length, mr.bits, mr.view)
        return mr

    def deregister(self, mr: MemoryRegion) -> None:
        """Remove ``mr`` (``ibv_dereg_mr``); idempotent.

        Work requests already posted keep the slices resolved at post time;
        packets arriving later no longer find the R_Key.
        """
        if self._by_lkey.get(mr.lkey) is mr:
            del self._by_lkey[mr.lkey]
        entry = self.remote_table.get(mr.rkey)
        if entry is not None and entry[3] is mr.view:
            del self.remote_table[mr.rkey]
        self.generation += 1

    def __iter__(self) -> Iterator[MemoryRegion]:
        return iter(list(self._by_lkey.values()))

    def __len__(self) -> int:
        return len(self._by_lkey)

    def local_slice(self, sge: SGE, write: bool) -> memoryview | None:
        """The bytes an SGE names, or None on a local protection error (IBTA §10.6.3.2).

        ``write`` asks for LOCAL_WRITE (the engine will store into it). A
        zero-length SGE names no bytes and is always valid.
        """
        if sge.length == 0:
            return _EMPTY
        mr = self._by_lkey.get(sge.lkey)
        if mr is None or sge.length < 0 or not mr.contains(sge.addr, sge.length):
            return None
        if write and not mr.bits & _LOCAL_WRITE:
            return None
        off = sge.addr - mr.addr
        return mr.view[off : off + sge.length]

    def remote_slice(self, rkey: int, va: int, length: int, access: int) -> memoryview | None:
        """The bytes a peer may touch, or None on an R_Key violation.

        The R_Key must exist, the range lie inside its region and the region
        grant ``access``, :class:`Access` bits (rxe ``check_rkey()``: all
        three give NAK remote access error).
        """
        entry = self.remote_table.get(rkey)
        if entry is None:
            return None
        addr, size, bits, view = entry
        if not bits & access or not (addr <= va and va + length <= addr + size):
            return None
        off = va - addr
        return view[off : off + length]


_EMPTY = memoryview(b"")


def gather(segs: list[memoryview], off: int, n: int) -> bytes:
    """``n`` bytes at ``off`` of the concatenated segments (a packet spanning SGEs: one copy)."""
    parts = []
    for seg in segs:
        size = len(seg)
        if off >= size:
            off -= size
            continue
        take = min(size - off, n)
        parts.append(seg[off : off + take])
        n -= take
        off = 0
        if n == 0:
            break
    return b"".join(parts)


def scatter(segs: list[memoryview], off: int, data: bytes | bytearray | memoryview) -> None:
    """Store ``data`` at ``off`` of the concatenated segments; the caller checked the bounds."""
    n = len(data)
    pos = 0
    for seg in segs:
        size = len(seg)
        if off >= size:
            off -= size
            continue
        take = min(size - off, n - pos)
        seg[off : off + take] = data[pos : pos + take]
        pos += take
        off = 0
        if pos == n:
            return
