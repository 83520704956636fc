"""rdma-core through pyverbs: the verbs backend (docs/verbs.md).

The DOCA layer's backend protocol (``rdmakit.doca.backend``) over a real verbs
device, a kernel soft-RoCE (rxe) or an RNIC: `VerbsDevice` (``ibv_context``,
``ibv_pd``, memory registration), `VerbsQP` (an RC QP with its CQ and
completion channel), ``rdmakit.verbs.srq.VerbsSRQ`` (a shared receive queue),
and ``rdmakit.verbs.cm.VerbsCm``, the connection manager (librdmacm). Only
``rdmakit.verbs.device``, ``.srq``, ``.pvcall`` (pyverbs calls, errors as
`VerbsError`) and ``.cm`` import pyverbs, and this package imports it only when
`VerbsDevice`, `VerbsQP` or `VerbsMR` is first used, so everything else here (discovery, the attribute and
work-request mapping, librdmacm's structures) works on machines without pyverbs.
"""

from typing import TYPE_CHECKING

from rdmakit.verbs.attrs import (
    COMPATIBLE_TRANSPORTS,
    IB_MTUS,
    ROCE_PORT,
    TRANSPORT,
    ConnectOptions,
    ConnectParams,
    PeerInfo,
    QpAttrMask,
    connect_params,
    export_descriptor,
    gid_text,
    mr_access,
    mtu_enum,
    mtu_from_enum,
    parse_peer,
    path_mtu,
    qp_access,
    transition_mask,
)
from rdmakit.verbs.buffers import buffer_address
from rdmakit.verbs.discovery import list_devices, pyverbs_missing
from rdmakit.verbs.errors import VerbsError
from rdmakit.verbs.info import RDMA_JOB_TYPES, VerbsCaps, VerbsDeviceInfo
from rdmakit.verbs.sysfs import SYSFS_ROOT, GidEntry, PortInfo, SysfsDevice, scan, select_gid
from rdmakit.verbs.wr import WrTracker, imm_from_verbs, imm_to_verbs

if TYPE_CHECKING:
    from rdmakit.verbs.device import VerbsDevice, VerbsMR, VerbsQP

__all__ = [
    "COMPATIBLE_TRANSPORTS",
    "IB_MTUS",
    "RDMA_JOB_TYPES",
    "ROCE_PORT",
    "SYSFS_ROOT",
    "TRANSPORT",
    "ConnectOptions",
    "ConnectParams",
    "GidEntry",
    "PeerInfo",
    "PortInfo",
    "QpAttrMask",
    "SysfsDevice",
    "VerbsCaps",
    "VerbsDevice",
    "VerbsDeviceInfo",
    "VerbsError",
    "VerbsMR",
    "VerbsQP",
    "WrTracker",
    "buffer_address",
    "connect_params",
    "export_descriptor",
    "gid_text",
    "imm_from_verbs",
    "imm_to_verbs",
    "list_devices",
    "mr_access",
    "mtu_enum",
    "mtu_from_enum",
    "parse_peer",
    "path_mtu",
    "pyverbs_missing",
    "qp_access",
    "scan",
    "select_gid",
    "transition_mask",
]

_LAZY = frozenset({"VerbsDevice", "VerbsMR", "VerbsQP"})


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from rdmakit.verbs import device  # imports pyverbs: ImportError without it

        return getattr(device, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
