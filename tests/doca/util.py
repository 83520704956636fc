"""Helpers shared by the DOCA tests."""

import contextlib
from collections.abc import Callable, Iterator

import pytest

from rdmakit.doca import Dev, DocaError, DocaErrorCode, Mmap

#: The ``make_mmap`` fixture (tests/doca/conftest.py): ``make_mmap(size_or_buffer, access=...)``.
MmapFactory = Callable[..., Mmap]


@contextlib.contextmanager
def all_closed(dev: Dev) -> Iterator[Dev]:
    """`dev`, closed with whatever still uses it on the way out (`Dev.close_all`): test teardown."""
    try:
        yield dev
    finally:
        dev.close_all()


def error_code(call: Callable[[], object]) -> DocaErrorCode:
    """The code of the DocaError that ``call()`` must raise."""
    with pytest.raises(DocaError) as exc:
        call()
    return exc.value.code


def started_mmap(dev: Dev, size_or_bytes: int | bytes, permissions: int) -> tuple[Mmap, bytearray]:
    """A started mmap over fresh memory on `dev`, and that memory."""
    mem = bytearray(size_or_bytes)
    m = Mmap()
    m.set_permissions(permissions)
    m.set_memrange(mem)
    m.add_dev(dev)
    m.start()
    return m, mem
