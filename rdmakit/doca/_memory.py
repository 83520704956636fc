"""Memory a DOCA mmap names: the access flags and the address of a buffer.

The leaf under `rdmakit.doca.mmap` (the memory map) and `rdmakit.doca.shm`
(the memory a DPU reaches): both use the flags of ``enum doca_access_flag``
and read buffer addresses the same way, and neither needs the other for it.
"""

from enum import IntFlag

from rdmakit.engine.types import Access
from rdmakit.verbs.buffers import buffer_address

__all__ = [
    "PCI_FLAGS",
    "RDMA_FLAGS",
    "WRITE_FLAGS",
    "AccessFlag",
    "address_of",
    "verbs_access",
]


class AccessFlag(IntFlag):
    """``enum doca_access_flag`` (``doca_types.h``)."""

    LOCAL_READ_ONLY = 0  # a local device may read, not write
    LOCAL_READ_WRITE = 1 << 0  # a local device may read and write
    RDMA_READ = 1 << 1  # a remote device may read over RDMA
    RDMA_WRITE = 1 << 2  # a remote device may write over RDMA
    RDMA_ATOMIC = 1 << 3  # a remote device may run atomics over RDMA
    PCI_READ_ONLY = 1 << 4  # a device on the same PCI may read (doca_mmap_export_pci)
    PCI_READ_WRITE = 1 << 5  # a device on the same PCI may read and write
    PCI_RELAXED_ORDERING = 1 << 6  # the system may reorder accesses to the memory


RDMA_FLAGS = AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC
PCI_FLAGS = AccessFlag.PCI_READ_ONLY | AccessFlag.PCI_READ_WRITE
#: Permissions under which a device writes into the memory.
WRITE_FLAGS = (
    AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC | AccessFlag.PCI_READ_WRITE
)


def verbs_access(flags: AccessFlag) -> Access:
    """DOCA permissions -> ``ibv_access_flags`` (remote write/atomic imply local write)."""
    access = Access.NONE
    if flags & (AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC):
        access |= Access.LOCAL_WRITE
    if flags & AccessFlag.RDMA_READ:
        access |= Access.REMOTE_READ
    if flags & AccessFlag.RDMA_WRITE:
        access |= Access.REMOTE_WRITE
    if flags & AccessFlag.RDMA_ATOMIC:
        access |= Access.REMOTE_ATOMIC
    return access


def address_of(view: memoryview) -> int | None:
    """The virtual address of `view`'s first byte (C-contiguous), or None where it has none."""
    return buffer_address(view) or None
