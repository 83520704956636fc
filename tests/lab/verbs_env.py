"""What the lab's in-guest verbs tests need: pyverbs, a RoCEv2 device, and (for the CM) rdma_ucm.

`marks` is a module's ``pytestmark``: skipped, with the reason, where a need
is missing. `DEVICES` are the verbs devices found, `NAME` the one the tests
use (``RDMAKIT_RXE_DEV``, else the first).
"""

import os
from pathlib import Path

import pytest

from rdmakit.verbs import VerbsDeviceInfo, list_devices, pyverbs_missing

_MISSING = pyverbs_missing()
DEVICES: list[VerbsDeviceInfo] = list_devices() if _MISSING is None else []
NAME = os.environ.get("RDMAKIT_RXE_DEV") or (DEVICES[0].name if DEVICES else "")


def marks(*, rdma_cm: bool = False) -> list[pytest.MarkDecorator]:
    """``[lab]``, and a skip with its reason when pyverbs, a device or (`rdma_cm`) rdma_ucm is missing."""
    why = None
    if _MISSING is not None:
        why = _MISSING
    elif not DEVICES:
        why = "no verbs device with a RoCE v2 GID"
    elif rdma_cm and not Path("/dev/infiniband/rdma_cm").exists():
        why = "no /dev/infiniband/rdma_cm: modprobe rdma_ucm"
    return [pytest.mark.lab] if why is None else [pytest.mark.lab, pytest.mark.skip(reason=why)]
