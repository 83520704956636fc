"""DOCA Core for Python: the public names of ``rdmakit.doca``.

The modules below hold the implementation; import from here.
"""

from rdmakit.doca.backend import (
    BackendCaps,
    BackendCm,
    BackendDevice,
    BackendQP,
    BackendSRQ,
    CmEvent,
    CmEventKind,
    ConnectAttrs,
    DeviceCaps,
    JobType,
    MemoryRegistration,
    Pump,
)
from rdmakit.doca.buf import (
    DEFAULT_MAX_LIST_LEN,
    MAX_REFCOUNT,
    Buf,
)
from rdmakit.doca.comm_channel import (
    COMCH_MAX_MSG_LIMIT,
    COMCH_MAX_MSG_SIZE,
    CommChannel,
    CommChannelServer,
)
from rdmakit.doca.ctx import (
    Ctx,
    CtxState,
    Event,
    Job,
    StateChangedCallback,
)
from rdmakit.doca.descriptor import (
    CONNECTION_FORMAT,
    MAX_DESCRIPTOR_SIZE,
    ConnectionDescriptor,
    Transport,
    read_connection_descriptor,
    read_descriptor,
    read_mmap_descriptor,
    write_descriptor,
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
from rdmakit.doca.dma import (
    Dma,
    DmaMemcpyJob,
)
from rdmakit.doca.dma_tasks import DmaTaskMemcpy
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
from rdmakit.doca.local import LOCAL_CAPS, LocalBackendDevice
from rdmakit.doca.mmap import (
    DESCRIPTOR_FORMAT,
    AccessFlag,
    Mmap,
    MmapDescriptor,
)
from rdmakit.doca.pe import PE, PeContext, ProgressEngine, thread_engine
from rdmakit.doca.rdma import (
    RDMA_PERMISSIONS,
    Rdma,
    RdmaAtomicCmpSwpJob,
    RdmaAtomicFetchAddJob,
    RdmaJob,
    RdmaOpcode,
    RdmaReadJob,
    RdmaRecvJob,
    RdmaResult,
    RdmaSendImmJob,
    RdmaSendJob,
    RdmaState,
    RdmaTransportType,
    RdmaWriteImmJob,
    RdmaWriteJob,
)
from rdmakit.doca.rdma_cm import ConnectionCallback, ConnectionRequestCallback, RdmaAddr
from rdmakit.doca.rdma_conns import MAX_NUM_CONNECTIONS, RdmaConnection
from rdmakit.doca.rdma_props import MTU_SIZES
from rdmakit.doca.rdma_tasks import (
    RdmaTaskAtomicCmpSwp,
    RdmaTaskAtomicFetchAdd,
    RdmaTaskRead,
    RdmaTaskReceive,
    RdmaTaskSend,
    RdmaTaskSendImm,
    RdmaTaskWrite,
    RdmaTaskWriteImm,
)
from rdmakit.doca.shm import (
    DPU_DESCRIPTOR_FORMAT,
    DpuDescriptor,
    SharedMemory,
)
from rdmakit.doca.soft import SOFT_CAPS, SoftBackendDevice, SoftBackendQP, SoftBackendSRQ, soft_devinfo
from rdmakit.doca.soft import install as _install_soft
from rdmakit.doca.soft_cm import SoftBackendCm, soft_cm
from rdmakit.doca.sync_event import (
    U64_MAX,
    SyncEvent,
    SyncEventAddJob,
    SyncEventGetJob,
    SyncEventSetJob,
    SyncEventWaitEqJob,
    SyncEventWaitGtJob,
)
from rdmakit.doca.sync_event_remote import (
    RdmaTaskRemoteNetSyncEventGet,
    RdmaTaskRemoteNetSyncEventNotifyAdd,
    RdmaTaskRemoteNetSyncEventNotifySet,
    SyncEventRemoteNet,
)
from rdmakit.doca.sync_event_tasks import (
    SyncEventTaskGet,
    SyncEventTaskNotifyAdd,
    SyncEventTaskNotifySet,
    SyncEventTaskWaitGt,
)
from rdmakit.doca.tasks import Task, TaskCallback, TaskConf, TaskState
from rdmakit.doca.verbs_glue import install as _install_verbs
from rdmakit.doca.workq import WorkQ

__all__ = [
    "COMCH_MAX_MSG_LIMIT",
    "COMCH_MAX_MSG_SIZE",
    "CONNECTION_FORMAT",
    "DEFAULT_MAX_LIST_LEN",
    "DESCRIPTOR_FORMAT",
    "DPU_DESCRIPTOR_FORMAT",
    "LOCAL_CAPS",
    "MAX_DESCRIPTOR_SIZE",
    "MAX_NUM_CONNECTIONS",
    "MAX_REFCOUNT",
    "MTU_SIZES",
    "PE",
    "RDMA_PERMISSIONS",
    "SOFT_CAPS",
    "U64_MAX",
    "AccessFlag",
    "BackendCaps",
    "BackendCm",
    "BackendDevice",
    "BackendQP",
    "BackendSRQ",
    "Buf",
    "BufArray",
    "BufInventory",
    "BufPool",
    "CmEvent",
    "CmEventKind",
    "CommChannel",
    "CommChannelServer",
    "ConnectAttrs",
    "ConnectionCallback",
    "ConnectionDescriptor",
    "ConnectionRequestCallback",
    "Ctx",
    "CtxState",
    "Dev",
    "DevInfo",
    "DevInfoProvider",
    "DeviceCaps",
    "Dma",
    "DmaMemcpyJob",
    "DmaTaskMemcpy",
    "DocaError",
    "DocaErrorCode",
    "DpuDescriptor",
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
    "PeContext",
    "ProgressEngine",
    "Pump",
    "Rdma",
    "RdmaAddr",
    "RdmaAtomicCmpSwpJob",
    "RdmaAtomicFetchAddJob",
    "RdmaConnection",
    "RdmaJob",
    "RdmaOpcode",
    "RdmaReadJob",
    "RdmaRecvJob",
    "RdmaResult",
    "RdmaSendImmJob",
    "RdmaSendJob",
    "RdmaState",
    "RdmaTaskAtomicCmpSwp",
    "RdmaTaskAtomicFetchAdd",
    "RdmaTaskRead",
    "RdmaTaskReceive",
    "RdmaTaskRemoteNetSyncEventGet",
    "RdmaTaskRemoteNetSyncEventNotifyAdd",
    "RdmaTaskRemoteNetSyncEventNotifySet",
    "RdmaTaskSend",
    "RdmaTaskSendImm",
    "RdmaTaskWrite",
    "RdmaTaskWriteImm",
    "RdmaTransportType",
    "RdmaWriteImmJob",
    "RdmaWriteJob",
    "SharedMemory",
    "SoftBackendCm",
    "SoftBackendDevice",
    "SoftBackendQP",
    "SoftBackendSRQ",
    "StateChangedCallback",
    "SyncEvent",
    "SyncEventAddJob",
    "SyncEventGetJob",
    "SyncEventRemoteNet",
    "SyncEventSetJob",
    "SyncEventTaskGet",
    "SyncEventTaskNotifyAdd",
    "SyncEventTaskNotifySet",
    "SyncEventTaskWaitGt",
    "SyncEventWaitEqJob",
    "SyncEventWaitGtJob",
    "Task",
    "TaskCallback",
    "TaskConf",
    "TaskState",
    "Transport",
    "UserCallback",
    "WorkQ",
    "devinfo_list",
    "error_from_engine",
    "error_from_os",
    "error_from_wc_status",
    "find_devinfo",
    "local_devinfo",
    "read_connection_descriptor",
    "read_descriptor",
    "read_mmap_descriptor",
    "register_provider",
    "register_resolver",
    "soft_cm",
    "soft_devinfo",
    "thread_engine",
    "write_descriptor",
]

_install_soft()
_install_verbs()
