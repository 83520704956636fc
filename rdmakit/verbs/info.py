"""What a verbs device is and can do: its discovery record and limits.

Pure data and the functions that build it from sysfs (`rdmakit.verbs.sysfs`)
and ``ibv_query_device`` / ``ibv_query_port`` results; `rdmakit.verbs.device`
fills it from pyverbs and `rdmakit.verbs.discovery` lists it.
"""

from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address
from typing import Protocol

from rdmakit.verbs.sysfs import GidEntry, SysfsDevice

__all__ = [
    "ATOMIC_JOB_TYPES",
    "RDMA_JOB_TYPES",
    "VerbsCaps",
    "VerbsDeviceInfo",
    "caps_of",
    "device_info",
    "ip_addrs_of",
]

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
