"""Which verbs devices this machine has, and why there are none when there are none.

`list_devices` lists the devices that can run RC QPs over RoCEv2: a device in
``/sys/class/infiniband`` with a RoCE v2 GID, opened once through pyverbs for
its port MTU and limits. Without pyverbs, without a device, or when a device
cannot be opened, the list is shorter and the reason is logged at debug level
on the ``rdmakit.verbs`` logger: a machine without RDMA is normal, not an error.
"""

import importlib
import logging
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import Protocol

from rdmakit.verbs.errors import VerbsError
from rdmakit.verbs.sysfs import SYSFS_ROOT, GidEntry, SysfsDevice, scan, select_gid

__all__ = [
    "RDMA_JOB_TYPES",
    "VerbsCaps",
    "VerbsDeviceInfo",
    "list_devices",
    "pyverbs_missing",
]

log = logging.getLogger("rdmakit.verbs")

#: DOCA job types (``rdmakit.doca.JobType`` values) an RC QP runs.
RDMA_JOB_TYPES = frozenset(
    {"rdma.send", "rdma.send_imm", "rdma.recv", "rdma.read", "rdma.write", "rdma.write_imm"}
)
ATOMIC_JOB_TYPES = frozenset({"rdma.atomic_cmp_swp", "rdma.atomic_fetch_add"})


@dataclass(frozen=True, slots=True, kw_only=True)
class VerbsCaps:
    """Device limits (``ibv_query_device``) in the shape of the DOCA layer's ``BackendCaps``."""

    max_buf_size: int = 1 << 31
    max_buf_list_len: int = 16
    max_qp_wr: int = 4096
    max_sge: int = 16
    max_cqe: int = 1 << 16
    max_qp_rd_atom: int = 16
    max_qp_init_rd_atom: int = 16
    job_types: frozenset[str] = field(default=RDMA_JOB_TYPES | ATOMIC_JOB_TYPES)


@dataclass(frozen=True, slots=True, kw_only=True)
class VerbsDeviceInfo:
    """A verbs device as discovered: where its QPs live (port, GID) and what it can do.

    `gids` is the port's populated GID table in index order; `gid` (at
    `gid_index`) is the one QPs use, and `ip_addrs` the addresses of the
    port's RoCE v2 GIDs.
    """

    name: str
    port: int
    gid_index: int
    gid: IPv6Address
    gids: tuple[IPv6Address, ...]
    ip_addrs: tuple[IPv4Address | IPv6Address, ...]
    mtu: int
    caps: VerbsCaps
    netdev: str | None = None
    pci_addr: str | None = None


#: ``IBV_ATOMIC_NONE`` (``enum ibv_atomic_cap``).
_ATOMIC_NONE = 0


class _DeviceAttr(Protocol):
    """The fields of ``ibv_device_attr`` read here, as pyverbs' ``DeviceAttr`` has them."""

    atomic_caps: int
    max_mr_size: int
    max_sge: int
    max_qp_wr: int
    max_cqe: int
    max_qp_rd_atom: int
    max_qp_init_rd_atom: int


def caps_of(attr: _DeviceAttr) -> VerbsCaps:
    """A device's limits from its ``ibv_query_device`` attributes."""
    jobs = RDMA_JOB_TYPES if attr.atomic_caps == _ATOMIC_NONE else RDMA_JOB_TYPES | ATOMIC_JOB_TYPES
    return VerbsCaps(
        max_buf_size=min(1 << 31, int(attr.max_mr_size)),  # RETH DMA length (IBTA §9.3.3)
        max_buf_list_len=int(attr.max_sge),
        max_qp_wr=int(attr.max_qp_wr),
        max_sge=int(attr.max_sge),
        max_cqe=int(attr.max_cqe),
        max_qp_rd_atom=int(attr.max_qp_rd_atom),
        max_qp_init_rd_atom=int(attr.max_qp_init_rd_atom),
        job_types=jobs,
    )


def device_info(
    dev: SysfsDevice, port: int, entry: GidEntry, *, mtu: int, caps: VerbsCaps
) -> VerbsDeviceInfo:
    """The discovery record of `dev`'s `port` using GID `entry`, with the port MTU and limits."""
    gids = next(p.gids for p in dev.ports if p.num == port)
    return VerbsDeviceInfo(
        name=dev.name,
        port=port,
        gid_index=entry.index,
        gid=entry.gid,
        gids=tuple(g.gid for g in gids),
        ip_addrs=ip_addrs_of(gids),
        mtu=mtu,
        caps=caps,
        netdev=entry.netdev or dev.netdev,
        pci_addr=dev.pci_addr,
    )


def ip_addrs_of(entries: tuple[GidEntry, ...]) -> tuple[IPv4Address | IPv6Address, ...]:
    """The addresses of the RoCE v2 GIDs that are not link-local, in index order."""
    out: list[IPv4Address | IPv6Address] = []
    for g in entries:
        if g.roce_v2 and not g.gid.is_link_local and g.ip not in out:
            out.append(g.ip)
    return tuple(out)


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
