"""A sync event shared between a host process and a DPU process (DOCA Core §3.4.6.4, ``doca_sync_event.h``).

On a BlueField the host exports its sync event to the DPU
(``doca_sync_event_export_to_dpu``), sends the blob over the comm channel, and
the DPU builds its own handle on the same counter from it
(``doca_sync_event_create_from_export``); each side then updates and waits on
one 64-bit value. Without a BlueField the two sides are processes on one
machine: the counter lives in a page of its own, a sealed memfd (`shared_page`),
and the blob travels with that page's descriptor over the comm channel's Unix
socket (``SCM_RIGHTS``), as DMA Copy's memory does. The blob alone names no
memory: ``create_from_export`` needs the descriptor that came with it.

Everything about an export is hostile input to the side that imports it: the
blob has one exact format, and the descriptor must be a regular file of one
page whose size is sealed (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``), so
the exporter can neither shrink the page under the importer (which would make
its reads fault) nor swap it for something else.

Updates from the other process are atomic with this process's as far as
`update_add` goes (a POSIX record lock on the page serialises the
read-modify-write of both processes); they wake nothing, so waits look at the
counter every millisecond and wait tasks at every progress, as with a
remote-net publisher.
"""

import fcntl
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault

__all__ = ["DPU_EXPORT_SIZE"]

_BLOB = struct.Struct(">16sII")  # magic, version, page size
_MAGIC = b"RDMAKIT-SE-DPU\0\0"
_VERSION = 1
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
#: Bytes of the blob `SyncEvent.export_to_dpu` returns.
DPU_EXPORT_SIZE = _BLOB.size


def shared_page() -> tuple[int, mmap.mmap]:
    """A sealed one-page memfd and its mapping: where a sync event's counter lives."""
    fd = os.memfd_create("doca-sync-event", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, mmap.PAGESIZE)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        return fd, mmap.mmap(fd, mmap.PAGESIZE)
    except BaseException:
        os.close(fd)
        raise


def export_blob() -> bytes:
    return _BLOB.pack(_MAGIC, _VERSION, mmap.PAGESIZE)


def import_page(blob: bytes, fd: int | None) -> tuple[int, mmap.mmap]:
    """Check an export (`blob` and the descriptor sent with it); our own duplicate and its mapping."""
    if not isinstance(blob, bytes | bytearray) or len(blob) != _BLOB.size:
        raise DocaError(DocaErrorCode.INVALID_VALUE, f"a sync event export is {_BLOB.size} bytes", Fault.PEER)
    magic, version, page = _BLOB.unpack(blob)
    if magic != _MAGIC or version != _VERSION:
        raise DocaError(DocaErrorCode.INVALID_VALUE, "not an rdmakit sync event export", Fault.PEER)
    if page != mmap.PAGESIZE:
        raise DocaError(DocaErrorCode.INVALID_VALUE, f"the export's page is {page} bytes", Fault.PEER)
    if fd is None:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE,
            "the export came without the page's file descriptor (send it with the blob over a Unix socket)",
        )
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != mmap.PAGESIZE:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE, "the export's descriptor is not a one-page file", Fault.PEER
        )
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        seals = 0
    if seals & _SEALS != _SEALS:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE, "the export's page is not sealed against resizing", Fault.PEER
        )
    own = os.dup(fd)
    try:
        return own, mmap.mmap(own, mmap.PAGESIZE)
    except BaseException:
        os.close(own)
        raise


@contextmanager
def page_locked(fd: int) -> Iterator[None]:
    """The page's read-modify-write lock, shared by every process that maps it."""
    fcntl.lockf(fd, fcntl.LOCK_EX, 8, 0)
    try:
        yield
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN, 8, 0)
