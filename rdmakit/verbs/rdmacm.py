"""librdmacm's C interface as rdmakit uses it: structures, event types, the calls (``rdma/rdma_cma.h``).

pyverbs' ``pyverbs.cmid`` (rdma-core 44 up to the current release) wraps
librdmacm for one connection per event channel: its ``CMEvent`` exposes
neither ``rdma_cm_event.id``/``listen_id`` nor ``status`` (the REJ reason),
and it has no ``rdma_migrate_id`` and no access to the channel's descriptor.
A connection manager that serves a listener's many connections and reports
why a peer rejected it needs all of these, so ``rdmakit.verbs.cm`` calls
``librdmacm.so.1``, the library ``pyverbs.cmid`` links against, through
`ctypes`. Only the ABI-stable public structures are described (their
layout is the one ``rdma_cma.h`` and ``infiniband/verbs.h`` have had since
rdma-core 1); nothing here needs pyverbs or an RDMA device, only the
library for `load`.
"""

import ctypes
from enum import IntEnum
from ipaddress import IPv4Address, IPv6Address

__all__ = [
    "AF_INET",
    "AF_INET6",
    "RDMA_PS_TCP",
    "CmEventType",
    "IbvQpAttr",
    "RdmaCmEvent",
    "RdmaCmId",
    "RdmaConnParam",
    "RdmaEventChannel",
    "device_name",
    "load",
    "sockaddr",
    "sockaddr_ip",
]

#: ``RDMA_PS_TCP``: reliable connected QPs (``rdma_cma.h``; service IDs 0x0106xxxx).
RDMA_PS_TCP = 0x0106
#: Linux address families (``sys/socket.h``).
AF_INET = 2
AF_INET6 = 10
_SOCKADDR_STORAGE = 128
_IBV_SYSFS_NAME_MAX = 64


class CmEventType(IntEnum):
    """``enum rdma_cm_event_type``."""

    ADDR_RESOLVED = 0
    ADDR_ERROR = 1
    ROUTE_RESOLVED = 2
    ROUTE_ERROR = 3
    CONNECT_REQUEST = 4
    CONNECT_RESPONSE = 5
    CONNECT_ERROR = 6
    UNREACHABLE = 7
    REJECTED = 8
    ESTABLISHED = 9
    DISCONNECTED = 10
    DEVICE_REMOVAL = 11
    MULTICAST_JOIN = 12
    MULTICAST_ERROR = 13
    ADDR_CHANGE = 14
    TIMEWAIT_EXIT = 15


class RdmaEventChannel(ctypes.Structure):
    """``struct rdma_event_channel``: the descriptor of ``/dev/infiniband/rdma_cm``."""

    _fields_ = [("fd", ctypes.c_int)]


class _IbvGid(ctypes.Union):
    _fields_ = [("raw", ctypes.c_uint8 * 16), ("_align", ctypes.c_uint64 * 2)]


class _RdmaIbAddr(ctypes.Structure):
    _fields_ = [("sgid", _IbvGid), ("dgid", _IbvGid), ("pkey", ctypes.c_uint16)]


class _RdmaAddr(ctypes.Structure):
    _fields_ = [
        ("src", ctypes.c_uint8 * _SOCKADDR_STORAGE),
        ("dst", ctypes.c_uint8 * _SOCKADDR_STORAGE),
        ("ib", _RdmaIbAddr),
    ]


class _RdmaRoute(ctypes.Structure):
    _fields_ = [("addr", _RdmaAddr), ("path_rec", ctypes.c_void_p), ("num_paths", ctypes.c_int)]


class RdmaCmId(ctypes.Structure):
    """The public head of ``struct rdma_cm_id``, up to ``port_num``."""

    _fields_ = [
        ("verbs", ctypes.c_void_p),
        ("channel", ctypes.c_void_p),
        ("context", ctypes.c_void_p),
        ("qp", ctypes.c_void_p),
        ("route", _RdmaRoute),
        ("ps", ctypes.c_int),
        ("port_num", ctypes.c_uint8),
    ]


class RdmaConnParam(ctypes.Structure):
    """``struct rdma_conn_param``."""

    _fields_ = [
        ("private_data", ctypes.c_void_p),
        ("private_data_len", ctypes.c_uint8),
        ("responder_resources", ctypes.c_uint8),
        ("initiator_depth", ctypes.c_uint8),
        ("flow_control", ctypes.c_uint8),
        ("retry_count", ctypes.c_uint8),
        ("rnr_retry_count", ctypes.c_uint8),
        ("srq", ctypes.c_uint8),
        ("qp_num", ctypes.c_uint32),
    ]


class RdmaCmEvent(ctypes.Structure):
    """``struct rdma_cm_event`` with the connected (``param.conn``) member of its union."""

    _fields_ = [
        ("id", ctypes.c_void_p),
        ("listen_id", ctypes.c_void_p),
        ("event", ctypes.c_int),
        ("status", ctypes.c_int),
        ("conn", RdmaConnParam),
    ]


class IbvGlobalRoute(ctypes.Structure):
    _fields_ = [
        ("dgid", _IbvGid),
        ("flow_label", ctypes.c_uint32),
        ("sgid_index", ctypes.c_uint8),
        ("hop_limit", ctypes.c_uint8),
        ("traffic_class", ctypes.c_uint8),
    ]


class IbvAhAttr(ctypes.Structure):
    _fields_ = [
        ("grh", IbvGlobalRoute),
        ("dlid", ctypes.c_uint16),
        ("sl", ctypes.c_uint8),
        ("src_path_bits", ctypes.c_uint8),
        ("static_rate", ctypes.c_uint8),
        ("is_global", ctypes.c_uint8),
        ("port_num", ctypes.c_uint8),
    ]


class IbvQpAttr(ctypes.Structure):
    """``struct ibv_qp_attr``, as ``rdma_init_qp_attr`` fills it."""

    _fields_ = [
        ("qp_state", ctypes.c_int),
        ("cur_qp_state", ctypes.c_int),
        ("path_mtu", ctypes.c_int),
        ("path_mig_state", ctypes.c_int),
        ("qkey", ctypes.c_uint32),
        ("rq_psn", ctypes.c_uint32),
        ("sq_psn", ctypes.c_uint32),
        ("dest_qp_num", ctypes.c_uint32),
        ("qp_access_flags", ctypes.c_uint),
        ("cap", ctypes.c_uint32 * 5),
        ("ah_attr", IbvAhAttr),
        ("alt_ah_attr", IbvAhAttr),
        ("pkey_index", ctypes.c_uint16),
        ("alt_pkey_index", ctypes.c_uint16),
        ("en_sqd_async_notify", ctypes.c_uint8),
        ("sq_draining", ctypes.c_uint8),
        ("max_rd_atomic", ctypes.c_uint8),
        ("max_dest_rd_atomic", ctypes.c_uint8),
        ("min_rnr_timer", ctypes.c_uint8),
        ("port_num", ctypes.c_uint8),
        ("timeout", ctypes.c_uint8),
        ("retry_cnt", ctypes.c_uint8),
        ("rnr_retry", ctypes.c_uint8),
        ("alt_port_num", ctypes.c_uint8),
        ("alt_timeout", ctypes.c_uint8),
        ("rate_limit", ctypes.c_uint32),
    ]


def sockaddr(ip: IPv4Address | IPv6Address, port: int) -> ctypes.Array[ctypes.c_uint8]:
    """A ``sockaddr_in``/``sockaddr_in6`` for `ip`:`port`, in ``sockaddr_storage`` room."""
    buf = (ctypes.c_uint8 * _SOCKADDR_STORAGE)()
    if ip.version == 4:
        raw = AF_INET.to_bytes(2, "little") + port.to_bytes(2, "big") + ip.packed
    else:
        raw = AF_INET6.to_bytes(2, "little") + port.to_bytes(2, "big") + bytes(4) + ip.packed
    ctypes.memmove(buf, raw, len(raw))
    return buf


def sockaddr_ip(raw: bytes) -> tuple[IPv4Address | IPv6Address, int] | None:
    """The address and port of a ``sockaddr_storage``; None for another family."""
    if len(raw) < 28:
        return None
    family, port = int.from_bytes(raw[0:2], "little"), int.from_bytes(raw[2:4], "big")
    if family == AF_INET:
        return IPv4Address(raw[4:8]), port
    if family == AF_INET6:
        ip6 = IPv6Address(raw[8:24])
        return (ip6.ipv4_mapped or ip6), port
    return None


def device_name(cm_id: RdmaCmId) -> str | None:
    """``ibv_get_device_name(id->verbs->device)``: the device an id is bound to, None before binding.

    ``struct ibv_context`` starts with its ``ibv_device *``; ``struct
    ibv_device`` has its ``name`` after two pointers and two enums.
    """
    if not cm_id.verbs:
        return None
    dev = ctypes.c_void_p.from_address(cm_id.verbs).value
    if not dev:
        return None
    name = ctypes.string_at(dev + 24, _IBV_SYSFS_NAME_MAX)
    return name.split(b"\0", 1)[0].decode(errors="replace")


def _bind(lib: ctypes.CDLL, name: str, restype: object, *argtypes: object) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


def load() -> ctypes.CDLL:
    """``librdmacm.so.1`` with the prototypes of the calls rdmakit makes; OSError if it is missing."""
    lib = ctypes.CDLL("librdmacm.so.1", use_errno=True)
    vp, i = ctypes.c_void_p, ctypes.c_int
    ch = ctypes.POINTER(RdmaEventChannel)
    _bind(lib, "rdma_create_event_channel", ch)
    _bind(lib, "rdma_destroy_event_channel", None, ch)
    _bind(lib, "rdma_create_id", i, ch, ctypes.POINTER(vp), vp, i)
    _bind(lib, "rdma_destroy_id", i, vp)
    _bind(lib, "rdma_bind_addr", i, vp, vp)
    _bind(lib, "rdma_resolve_addr", i, vp, vp, vp, i)
    _bind(lib, "rdma_resolve_route", i, vp, i)
    _bind(lib, "rdma_listen", i, vp, i)
    _bind(lib, "rdma_connect", i, vp, ctypes.POINTER(RdmaConnParam))
    _bind(lib, "rdma_accept", i, vp, ctypes.POINTER(RdmaConnParam))
    _bind(lib, "rdma_reject", i, vp, vp, ctypes.c_uint8)
    _bind(lib, "rdma_disconnect", i, vp)
    _bind(lib, "rdma_establish", i, vp)
    _bind(lib, "rdma_init_qp_attr", i, vp, ctypes.POINTER(IbvQpAttr), ctypes.POINTER(i))
    _bind(lib, "rdma_get_cm_event", i, ch, ctypes.POINTER(ctypes.POINTER(RdmaCmEvent)))
    _bind(lib, "rdma_ack_cm_event", i, ctypes.POINTER(RdmaCmEvent))
    return lib
