"""Helpers shared by the DOCA tests."""

from collections.abc import Callable

import pytest

from rdmakit.doca import DocaError, DocaErrorCode, Mmap

#: The ``make_mmap`` fixture (tests/doca/conftest.py): ``make_mmap(size_or_buffer, access=...)``.
MmapFactory = Callable[..., Mmap]


def error_code(call: Callable[[], object]) -> DocaErrorCode:
    """The code of the DocaError that ``call()`` must raise."""
    with pytest.raises(DocaError) as exc:
        call()
    return exc.value.code
