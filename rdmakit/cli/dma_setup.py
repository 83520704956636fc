"""What the DMA programs set up alike: the DMA device (``-p``), its mmaps, the comm channel's flags.

Without a BlueField, ``-p``/``-r`` name an emulated device: any well-formed
PCI address is accepted, and a local device carrying that address stands in.
"""

import argparse
import dataclasses
import logging
import re

from rdmakit.cli.errors import CliError
from rdmakit.cli.options import TIMEOUT
from rdmakit.doca import AccessFlag, Dev, Dma, Mmap, devinfo_list, local_devinfo
from rdmakit.transport.comm_auth import SECRET_ENV, default_key_path

log = logging.getLogger("rdmakit.dma")

DEFAULT_TIMEOUT = 60.0
_PCI = re.compile(r"(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


def pci_address(value: str | None, flag: str) -> str | None:
    """`value` (given with `flag`) as a full PCI address, its domain added; None when not given."""
    if value is None:
        return None
    if not _PCI.fullmatch(value):
        raise CliError(f"{flag}: {value!r} is not a PCI address (BB:DD.F or DDDD:BB:DD.F)")
    return value.lower() if value.count(":") == 2 else f"0000:{value.lower()}"


def open_dev(pci: str | None) -> Dev:
    """The DMA device at `pci`, or an emulated one (a local device carrying that address)."""
    if pci is None:
        return Dev.open(local_devinfo("local0"))
    for info in devinfo_list():
        if info.matches(pci) and Dma.cap_is_supported(info):
            return Dev.open(info)
    log.info("no DMA device at %s: using an emulated one", pci)
    return Dev.open(dataclasses.replace(local_devinfo(f"emu-{pci}"), pci_addr=pci))


def started_mmap(dev: Dev, memory: memoryview, access: AccessFlag) -> Mmap:
    """An mmap of `memory` on `dev` with `access`, started (destroyed if it cannot start)."""
    mmap = Mmap()
    try:
        mmap.set_permissions(access)
        mmap.set_memrange(memory)
        mmap.add_dev(dev)
        mmap.start()
    except BaseException:
        mmap.destroy()
        raise
    return mmap


def add_service(p: argparse.ArgumentParser, default: str) -> None:
    """The comm channel's flags: ``--service``, ``--timeout``, ``--secret-file``."""
    p.add_argument(
        "--service", default=default, metavar="NAME",
        help=f"comm channel service name, the same on both sides: NAME, unix:PATH or tcp:HOST:PORT "
        f"(default {default})",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=TIMEOUT, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"how long to wait for the other side (default {DEFAULT_TIMEOUT:g})",
    )  # fmt: skip
    p.add_argument(
        "--secret-file", metavar="FILE",
        help="tcp: services: the file holding the secret both sides share, in hex, mode 0600 (default: "
        f"${SECRET_ENV}, else {default_key_path()}, made on first use)",
    )  # fmt: skip
