"""``doca_dev.h``: closing a device."""

import pytest

from rdmakit.doca import DocaError, DocaErrorCode, Rdma
from tests.doca.fidelity.conftest import DuoFactory


def test_dev_close_is_in_use_while_mmaps_or_contexts_remain(make_duo: DuoFactory) -> None:
    """doca_dev_close: "DOCA_ERROR_IN_USE - failed to deallocate device resources": refused while an
    mmap or a context uses the device, and the message names them."""
    d = make_duo("task")
    dev = d.a.dev
    m, _ = d.a.mmap(16)
    with pytest.raises(DocaError) as refused:
        dev.close()
    assert refused.value.code is DocaErrorCode.IN_USE
    assert "Rdma" in str(refused.value)
    assert "Mmap" in str(refused.value)
    assert not dev.closed
    d.a.rdma.close()
    d.a.memory.remove(m)
    m.destroy()
    dev.close()
    assert dev.closed
    with pytest.raises(DocaError) as closed:
        Rdma(dev)
    assert closed.value.code is DocaErrorCode.BAD_STATE
