"""QP attributes, transition masks, connection descriptors and MR access: pure values.

Everything ``ibv_modify_qp`` and ``ibv_reg_mr`` get is decided here, without
pyverbs, so it is testable anywhere; ``rdmakit.verbs.device`` only copies these
values into pyverbs objects.

Connection descriptors are the dicts ``export()`` returns, the same keys for the
soft engine (``rdmakit.doca.soft``) and this backend: ``transport`` (``"verbs"``
or ``"roce-udp"``: both speak RoCEv2 on UDP 4791), ``gid``, ``ip``, ``port``,
``qpn``, ``psn``, ``mtu`` (bytes). A descriptor's ``psn`` is the PSN of the
exporter's first request (the IB CM starting PSN, as ``ibv_rc_pingpong``
uses it): the importer expects it (``rq_psn``) and sends from its own
(``sq_psn``).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntFlag
from ipaddress import IPv4Address, IPv6Address, ip_address

from rdmakit.engine.states import QpState
from rdmakit.engine.types import Access
from rdmakit.verbs.errors import VerbsError

__all__ = [
    "COMPATIBLE_TRANSPORTS",
    "IB_MTUS",
    "ROCE_PORT",
    "TRANSPORT",
    "ConnectOptions",
    "ConnectParams",
    "PeerInfo",
    "QpAttrMask",
    "connect_params",
    "export_descriptor",
    "gid_text",
    "mr_access",
    "mtu_enum",
    "mtu_from_enum",
    "parse_peer",
    "path_mtu",
    "qp_access",
    "transition_mask",
]

#: The ``transport`` a verbs QP exports.
TRANSPORT = "verbs"
#: Peers a verbs QP connects to: another verbs QP, or the soft engine on UDP.
COMPATIBLE_TRANSPORTS = frozenset({"verbs", "roce-udp"})
#: RoCEv2's UDP destination port (RoCEv2 Annex A17.2.1); verbs devices send to no other.
ROCE_PORT = 4791
_U24 = (1 << 24) - 1


class QpAttrMask(IntFlag):
    """``ibv_qp_attr_mask`` (``infiniband/verbs.h``): which attributes a modify sets."""

    STATE = 1 << 0
    CUR_STATE = 1 << 1
    EN_SQD_ASYNC_NOTIFY = 1 << 2
    ACCESS_FLAGS = 1 << 3
    PKEY_INDEX = 1 << 4
    PORT = 1 << 5
    QKEY = 1 << 6
    AV = 1 << 7
    PATH_MTU = 1 << 8
    TIMEOUT = 1 << 9
    RETRY_CNT = 1 << 10
    RNR_RETRY = 1 << 11
    RQ_PSN = 1 << 12
    MAX_QP_RD_ATOMIC = 1 << 13
    ALT_PATH = 1 << 14
    MIN_RNR_TIMER = 1 << 15
    SQ_PSN = 1 << 16
    MAX_DEST_RD_ATOMIC = 1 << 17
    PATH_MIG_STATE = 1 << 18
    CAP = 1 << 19
    DEST_QPN = 1 << 20


_M = QpAttrMask
_S = QpState
#: The attributes an RC QP's transitions require (IBTA Vol. 1 §11.2.5.2 table 91;
#: Linux ``qp_state_table``; pyverbs ``qp.pyx`` ``_get_comp_mask``).
_RC_REQUIRED: dict[tuple[QpState, QpState], QpAttrMask] = {
    (_S.RESET, _S.INIT): _M.STATE | _M.PKEY_INDEX | _M.PORT | _M.ACCESS_FLAGS,
    (_S.INIT, _S.RTR): (
        _M.STATE | _M.AV | _M.PATH_MTU | _M.DEST_QPN | _M.RQ_PSN | _M.MAX_DEST_RD_ATOMIC | _M.MIN_RNR_TIMER
    ),
    (_S.RTR, _S.RTS): _M.STATE | _M.TIMEOUT | _M.RETRY_CNT | _M.RNR_RETRY | _M.SQ_PSN | _M.MAX_QP_RD_ATOMIC,
}


def transition_mask(from_state: QpState, to_state: QpState) -> QpAttrMask:
    """The ``attr_mask`` for ``ibv_modify_qp`` from `from_state` to `to_state` (RC).

    Any state may go to RESET or ERR with the state alone (IBTA §10.3.1);
    the forward path is RESET -> INIT -> RTR -> RTS. Others are BAD_STATE.
    """
    if to_state in (_S.RESET, _S.ERR):
        return _M.STATE
    mask = _RC_REQUIRED.get((from_state, to_state))
    if mask is None:
        raise VerbsError("BAD_STATE", f"no RC transition {from_state.name} -> {to_state.name}")
    return mask


#: IB MTUs in bytes -> ``ibv_mtu`` (IBTA Vol. 1 §9.4 / PortInfo NeighborMTU encoding).
IB_MTUS: dict[int, int] = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}


def mtu_enum(mtu: int) -> int:
    """Bytes -> ``ibv_mtu``; INVALID_VALUE if `mtu` is not an IB MTU."""
    try:
        return IB_MTUS[mtu]
    except KeyError:
        raise VerbsError("INVALID_VALUE", f"{mtu} is not an IB MTU (256..4096, powers of two)") from None


def mtu_from_enum(value: int) -> int:
    """``ibv_mtu`` -> bytes."""
    for size, enum in IB_MTUS.items():
        if enum == value:
            return size
    raise VerbsError("DRIVER", f"unknown ibv_mtu {value}", "system")


def path_mtu(peer_mtu: int, own_mtu: int) -> int:
    """The largest IB MTU both sides carry: the path MTU both must use.

    rxe drops FIRST/MIDDLE packets that are not exactly one path MTU long
    (``rxe_resp.c`` ``check_length``), so the two ends must agree: the soft
    engine takes ``min(peer, own)`` too.
    """
    limit = min(peer_mtu, own_mtu)
    fits = [m for m in IB_MTUS if m <= limit]
    if not fits:
        raise VerbsError(
            "INVALID_VALUE", f"path MTU below 256 bytes (peer {peer_mtu}, own {own_mtu})", "peer"
        )
    return max(fits)


def gid_text(gid: IPv6Address) -> str:
    """A GID as eight groups of four hex digits, the form ``pyverbs.addr.GID`` parses."""
    p = gid.packed
    return ":".join(p[i : i + 2].hex() for i in range(0, 16, 2))


_ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
_NEEDS_LOCAL_WRITE = Access.REMOTE_WRITE | Access.REMOTE_ATOMIC


def mr_access(access: int, *, readonly: bool) -> Access:
    """The ``ibv_access_flags`` to register memory with, after the checks.

    `readonly` is the memory's own permission (a read-only buffer: ``bytes``,
    an ``mmap`` opened with ``ACCESS_READ``). The device itself does not catch
    writes to such memory (rxe pins a ``bytes`` object's heap pages writable),
    so they are refused here. IBTA Vol. 1 §10.6.3.1 (and ``ib_check_mr_access``):
    remote write or atomic access needs local write.
    """
    if int(access) & ~int(_ALL_ACCESS) or access < 0:  # int: ~ of an IntFlag keeps only members
        raise VerbsError("INVALID_VALUE", f"unknown access flags {access:#x}")
    flags = Access(access)
    if flags & _NEEDS_LOCAL_WRITE and not flags & Access.LOCAL_WRITE:
        raise VerbsError("INVALID_VALUE", f"{flags!r} needs LOCAL_WRITE (IBTA §10.6.3.1)")
    if readonly and flags & Access.LOCAL_WRITE:
        raise VerbsError("INVALID_VALUE", f"read-only memory cannot be registered with {flags!r}")
    return flags


def qp_access(access: int) -> Access:
    """A QP's ``qp_access_flags``: the remote operations its responder allows (IBTA §10.6.3.1).

    Unlike an MR's, they need no LOCAL_WRITE (it has no meaning for a QP).
    """
    if int(access) & ~int(_ALL_ACCESS) or access < 0:
        raise VerbsError("INVALID_VALUE", f"unknown QP access flags {access:#x}")
    return Access(access)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerInfo:
    """A peer's connection descriptor, checked."""

    transport: str
    gid: IPv6Address
    ip: IPv4Address | IPv6Address
    port: int
    qpn: int
    psn: int
    mtu: int


def _int_field(remote: Mapping[str, object], key: str, low: int, high: int) -> int:
    value = remote.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise VerbsError("INVALID_VALUE", f"descriptor field {key!r} is {value!r}, not an integer", "peer")
    if not low <= value <= high:
        raise VerbsError(
            "INVALID_VALUE", f"descriptor field {key!r} = {value} is outside {low}..{high}", "peer"
        )
    return value


def parse_peer(remote: Mapping[str, object]) -> PeerInfo:
    """Check a peer's descriptor; INVALID_VALUE (the peer's fault) or NOT_SUPPORTED.

    ``gid`` may be left out when ``ip`` is given (the GID is then its RoCEv2
    GID, IPv4-mapped for IPv4). When both are given they must name the same
    address: rxe accepts a packet only from its QP's destination GID
    (``rxe_recv.c`` ``check_addr``).
    """
    transport = remote.get("transport")
    if transport not in COMPATIBLE_TRANSPORTS:
        raise VerbsError(
            "NOT_SUPPORTED", f"a verbs QP cannot connect to a {transport!r} peer (RoCEv2 on UDP only)"
        )
    raw_gid, raw_ip = remote.get("gid"), remote.get("ip")
    try:
        ip = ip_address(str(raw_ip)) if raw_ip is not None else None
        if raw_gid is not None:
            gid = IPv6Address(str(raw_gid))
        elif ip is not None:
            gid = IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed) if ip.version == 4 else IPv6Address(ip)
        else:
            raise VerbsError("INVALID_VALUE", "descriptor has neither 'gid' nor 'ip'", "peer")
    except ValueError as e:
        raise VerbsError("INVALID_VALUE", f"bad address in descriptor: {e}", "peer") from e
    gid_ip = gid.ipv4_mapped or gid
    if ip is not None and ip != gid_ip:
        raise VerbsError("INVALID_VALUE", f"descriptor gid {gid} and ip {ip} disagree", "peer")
    port = _int_field(remote, "port", 1, 65535) if "port" in remote else ROCE_PORT
    if port != ROCE_PORT:
        raise VerbsError("NOT_SUPPORTED", f"a verbs device sends RoCEv2 to UDP {ROCE_PORT} only, not {port}")
    return PeerInfo(
        transport=str(transport),
        gid=gid,
        ip=gid_ip,
        port=port,
        qpn=_int_field(remote, "qpn", 2, _U24),  # QP0 and QP1 are special (IBTA §3.5.3)
        psn=_int_field(remote, "psn", 0, _U24),
        mtu=_int_field(remote, "mtu", 256, 1 << 31),
    )


def export_descriptor(*, gid: IPv6Address, qpn: int, psn: int, mtu: int) -> dict[str, object]:
    """This side's descriptor (JSON-able), the keys of ``SoftBackendQP.export``."""
    return {
        "transport": TRANSPORT,
        "gid": gid_text(gid),
        "ip": str(gid.ipv4_mapped or gid),
        "port": ROCE_PORT,
        "qpn": qpn,
        "psn": psn,
        "mtu": mtu,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectOptions:
    """RTR/RTS attributes a verbs QP connects with (IBTA §11.2.5.3).

    As the soft engine's (``rdmakit.transport.connect.ConnectOptions``):
    ``retry_cnt`` 6, not 7, because rxe never exhausts 7 and a vanished peer
    must end in RETRY_EXC_ERR, not a hang; ``rnr_retry`` 7 waits for receives
    as long as it takes. ``timeout`` 14 (4.096 µs × 2^14 ≈ 67 ms) is the usual
    hardware value (pyverbs' tests, perftest): the device's kernel or firmware
    runs the timer, not a Python pump that may be starved of CPU (the soft
    engine uses 16 on UDP for that reason).
    ``hop_limit`` becomes the IP TTL (pyverbs' ``GlobalRoute`` default is 1).
    ``max_rd_atomic`` and ``max_dest_rd_atomic`` are capped at the device's
    ``max_qp_init_rd_atom`` / ``max_qp_rd_atom``.
    """

    access: int = int(_ALL_ACCESS)
    max_rd_atomic: int = 16
    max_dest_rd_atomic: int = 16
    min_rnr_timer: int = 12
    timeout: int = 14
    retry_cnt: int = 6
    rnr_retry: int = 7
    hop_limit: int = 64
    traffic_class: int = 0
    pkey_index: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectParams:
    """Every value the RESET -> INIT -> RTR -> RTS modifies set."""

    # INIT
    port_num: int
    pkey_index: int
    access: int
    # RTR
    path_mtu: int  # bytes
    dest_qpn: int
    rq_psn: int
    max_dest_rd_atomic: int
    min_rnr_timer: int
    dgid: str  # gid_text form
    sgid_index: int
    hop_limit: int
    traffic_class: int
    # RTS
    sq_psn: int
    timeout: int
    retry_cnt: int
    rnr_retry: int
    max_rd_atomic: int


def connect_params(
    peer: PeerInfo,
    *,
    own_psn: int,
    own_mtu: int,
    port_num: int,
    sgid_index: int,
    options: ConnectOptions = ConnectOptions(),
    max_rd_atomic: int = 128,
    max_dest_rd_atomic: int = 128,
) -> ConnectParams:
    """The attributes that bring a QP to RTS towards `peer` (``ibv_rc_pingpong`` style PSNs)."""
    o = options
    for name, value, high in (
        ("min_rnr_timer", o.min_rnr_timer, 31),
        ("timeout", o.timeout, 31),
        ("retry_cnt", o.retry_cnt, 7),
        ("rnr_retry", o.rnr_retry, 7),
        ("hop_limit", o.hop_limit, 255),
        ("traffic_class", o.traffic_class, 255),
    ):
        if not 0 <= value <= high:
            raise VerbsError("INVALID_VALUE", f"{name} = {value} is outside 0..{high}")
    if not 0 <= own_psn <= _U24:
        raise VerbsError("INVALID_VALUE", f"PSN {own_psn} is not 24 bits")
    return ConnectParams(
        port_num=port_num,
        pkey_index=o.pkey_index,
        access=int(qp_access(o.access)),
        path_mtu=path_mtu(peer.mtu, own_mtu),
        dest_qpn=peer.qpn,
        rq_psn=peer.psn,
        max_dest_rd_atomic=max(1, min(o.max_dest_rd_atomic, max_dest_rd_atomic)),
        min_rnr_timer=o.min_rnr_timer,
        dgid=gid_text(peer.gid),
        sgid_index=sgid_index,
        hop_limit=o.hop_limit,
        traffic_class=o.traffic_class,
        sq_psn=own_psn,
        timeout=o.timeout,
        retry_cnt=o.retry_cnt,
        rnr_retry=o.rnr_retry,
        max_rd_atomic=max(1, min(o.max_rd_atomic, max_rd_atomic)),
    )
