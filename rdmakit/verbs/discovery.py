"""Which verbs devices this machine has, and why there are none when there are none.

`list_devices` lists the devices that can run RC QPs over RoCEv2: a device in
``/sys/class/infiniband`` with a RoCE v2 GID, opened once through pyverbs for
its port MTU and limits. Without pyverbs, without a device, or when a device
cannot be opened, the list is shorter and the reason is logged at debug level
on the ``rdmakit.verbs`` logger: a machine without RDMA is normal, not an error.
"""

import importlib
import logging
from pathlib import Path

from rdmakit.verbs.errors import VerbsError
from rdmakit.verbs.info import VerbsDeviceInfo
from rdmakit.verbs.sysfs import SYSFS_ROOT, scan, select_gid

__all__ = [
    "list_devices",
    "pyverbs_missing",
]

log = logging.getLogger("rdmakit.verbs")


def pyverbs_missing() -> str | None:
    """Why pyverbs cannot be used here, or None when it imports."""
    try:
        importlib.import_module("pyverbs.device")
    except ImportError as e:
        return (
            f"pyverbs is not importable ({e}); on Debian install python3-pyverbs "
            "(scripts/install-verbs-deps.sh), elsewhere pip install rdmakit[verbs]"
        )
    return None


def list_devices(sysfs_root: Path = SYSFS_ROOT) -> list[VerbsDeviceInfo]:
    """The usable verbs devices; empty (reason at debug level) when there are none."""
    reason = pyverbs_missing()
    if reason is not None:
        log.debug("no verbs devices: %s", reason)
        return []
    found = scan(sysfs_root)
    if not found:
        log.debug("no verbs devices: nothing in %s (no RDMA driver or device)", sysfs_root)
        return []
    from rdmakit.verbs.device import describe  # imports pyverbs

    out: list[VerbsDeviceInfo] = []
    for dev in found:
        try:
            port, entry = select_gid(dev)
            out.append(describe(dev, port.num, entry))
        except VerbsError as e:
            log.debug("verbs device %s left out: %s", dev.name, e)
    return out
