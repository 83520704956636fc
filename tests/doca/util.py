"""Helpers shared by the DOCA tests."""

from collections.abc import Callable

import pytest

from rdmakit.doca import DocaError, DocaErrorCode


def error_code(call: Callable[[], object]) -> DocaErrorCode:
    """The code of the DocaError that ``call()`` must raise."""
    with pytest.raises(DocaError) as exc:
        call()
    return exc.value.code
