"""DOCA Core for Python: the public names of ``rdmakit.doca``.

The modules below hold the implementation; import from here.
"""

from rdmakit.doca.backend import (
    LOCAL_CAPS,
    BackendCaps,
    BackendDevice,
    BackendQP,
    DeviceCaps,
    JobType,
    LocalBackendDevice,
    MemoryRegistration,
)
from rdmakit.doca.buf import (
    DEFAULT_MAX_LIST_LEN,
    MAX_REFCOUNT,
    Buf,
)
from rdmakit.doca.ctx import (
    Ctx,
    CtxState,
    Event,
    Job,
    StateChangedCallback,
    WorkQ,
)
from rdmakit.doca.device import (
    Dev,
    DevInfo,
    DevInfoProvider,
    devinfo_list,
    find_devinfo,
    local_devinfo,
    register_provider,
    register_resolver,
)
from rdmakit.doca.errors import (
    DocaError,
    DocaErrorCode,
    Fault,
    error_from_engine,
    error_from_os,
    error_from_wc_status,
)
from rdmakit.doca.graph import (
    Graph,
    GraphInstance,
    GraphJob,
    GraphNode,
    UserCallback,
)
from rdmakit.doca.inventory import (
    BufArray,
    BufInventory,
    BufPool,
)
from rdmakit.doca.mmap import (
    DESCRIPTOR_FORMAT,
    AccessFlag,
    Mmap,
    MmapDescriptor,
)
from rdmakit.doca.soft import SOFT_CAPS, SoftBackendDevice, SoftBackendQP, soft_devinfo
from rdmakit.doca.soft import install as _install_soft
from rdmakit.doca.sync_event import (
    U64_MAX,
    SyncEvent,
    SyncEventAddJob,
    SyncEventGetJob,
    SyncEventSetJob,
    SyncEventWaitEqJob,
    SyncEventWaitGtJob,
)

__all__ = [
    "DEFAULT_MAX_LIST_LEN",
    "DESCRIPTOR_FORMAT",
    "LOCAL_CAPS",
    "MAX_REFCOUNT",
    "SOFT_CAPS",
    "U64_MAX",
    "AccessFlag",
    "BackendCaps",
    "BackendDevice",
    "BackendQP",
    "Buf",
    "BufArray",
    "BufInventory",
    "BufPool",
    "Ctx",
    "CtxState",
    "Dev",
    "DevInfo",
    "DevInfoProvider",
    "DeviceCaps",
    "DocaError",
    "DocaErrorCode",
    "Event",
    "Fault",
    "Graph",
    "GraphInstance",
    "GraphJob",
    "GraphNode",
    "Job",
    "JobType",
    "LocalBackendDevice",
    "MemoryRegistration",
    "Mmap",
    "MmapDescriptor",
    "SoftBackendDevice",
    "SoftBackendQP",
    "StateChangedCallback",
    "SyncEvent",
    "SyncEventAddJob",
    "SyncEventGetJob",
    "SyncEventSetJob",
    "SyncEventWaitEqJob",
    "SyncEventWaitGtJob",
    "UserCallback",
    "WorkQ",
    "devinfo_list",
    "error_from_engine",
    "error_from_os",
    "error_from_wc_status",
    "find_devinfo",
    "local_devinfo",
    "register_provider",
    "register_resolver",
    "soft_devinfo",
]

_install_soft()
