"""Connection set-up: what one side of an RC connection tells the other, and the
QP transitions that use it (IBTA §12.7 REQ/REP fields, §11.2.5.3 modify QP).
"""

import ipaddress
from dataclasses import dataclass

from rdmakit.engine import EngineError, QpState, QueuePair

from .device import SoftDevice
from .port import PeerAddress, TransportName
from .tcp_limits import SECRET_LEN, Route

#: The path MTU a QP's window (``QpCaps.max_unacked_psns``, in PSNs) is counted at. A
#: smaller path MTU gets proportionally more PSNs, so the bytes a QP keeps in flight
#: do not shrink with the MTU: rxe's 128 PSNs (``RXE_MAX_UNACKED_PSNS``) hold 512 KiB
#: at 4096 bytes but 128 KiB at 1024, a millisecond of a 1 Gbit/s path, less than a
#: userspace round trip between two hosts.
WINDOW_MTU = 4096
#: 16 (268 ms) rather than hardware's usual 14: a Python pump starved of CPU
#: must not mistake its own delay for loss. TCP delivers reliably, so its timer
#: only has to notice a peer that stopped.
DEFAULT_TIMEOUT = {"roce-udp": 16, "tcp": 18}


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """What one side of an RC connection tells the other (IBTA §12.7 REQ/REP fields).

    ``secret`` (TCP only, hex): what a stream to this QP must present
    (:mod:`rdmakit.transport.tcp`); whoever holds the endpoint holds it.
    """

    transport: TransportName
    gid: str
    ip: str
    port: int
    qpn: int
    psn: int
    mtu: int
    secret: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectOptions:
    """RTR/RTS attributes (IBTA §11.2.5.3).

    ``retry_cnt`` is 6, not 7: rxe (and this engine) never exhaust 7, and a peer
    that vanished must end in RETRY_EXC_ERR, not a hang. ``rnr_retry`` 7 waits
    for receives as long as it takes (IBTA §9.7.5.2.8), as perftest does.
    """

    access: int = 0xF
    max_rd_atomic: int = 16
    max_dest_rd_atomic: int = 16
    min_rnr_timer: int = 12
    timeout: int | None = None
    retry_cnt: int = 6
    rnr_retry: int = 7


def local_endpoint(dev: SoftDevice, qp: QueuePair, psn: int, mtu: int | None = None) -> Endpoint:
    """What the peer needs to connect to ``qp``; on TCP it carries ``qp``'s secret."""
    mtu = min(mtu or dev.max_mtu, dev.max_mtu)
    return Endpoint(
        transport=dev.transport,
        gid=dev.gid,
        ip=dev.ip,
        port=dev.port,
        qpn=qp.qpn,
        psn=psn,
        mtu=mtu,
        secret=dev.tcp_secret(qp, mtu).hex() if dev.tcp_port is not None else "",
    )


def init_qp(qp: QueuePair, access: int = 0xF) -> None:
    """RESET → INIT, after which receives may be posted (IBTA §10.3.1)."""
    qp.modify(QpState.INIT, port=1, pkey_index=0, access=access)


def connect_qp(
    dev: SoftDevice, qp: QueuePair, psn: int, peer: Endpoint, opts: ConnectOptions | None = None
) -> None:
    """Bring ``qp`` from RESET (or INIT) to RTS against ``peer``.

    An endpoint's ``psn`` is the PSN its first request carries (the IB CM
    "starting PSN", as ``ibv_rc_pingpong`` and perftest use it): this side sends
    from its own ``psn`` and expects the peer's.
    """
    o = opts or ConnectOptions()
    if peer.transport != dev.transport:
        raise EngineError("INVALID_VALUE", f"peer speaks {peer.transport}, this device {dev.transport}")
    route = _tcp_route(peer) if dev.tcp_port is not None else None
    mtu = min(peer.mtu, dev.max_mtu)
    if qp.state is QpState.RESET:
        init_qp(qp, o.access)
    qp.modify(
        QpState.RTR,
        path_mtu=mtu,
        dest_qpn=peer.qpn,
        rq_psn=peer.psn,
        max_dest_rd_atomic=o.max_dest_rd_atomic,
        min_rnr_timer=o.min_rnr_timer,
        remote=PeerAddress(peer.ip, peer.port),
    )
    qp.modify(
        QpState.RTS,
        timeout=DEFAULT_TIMEOUT[dev.transport] if o.timeout is None else o.timeout,
        retry_cnt=o.retry_cnt,
        rnr_retry=o.rnr_retry,
        sq_psn=psn,
        max_rd_atomic=o.max_rd_atomic,
    )
    if route is not None:
        dev.connect_tcp(qp, route)
    elif mtu < WINDOW_MTU:
        qp.window = min(qp.caps.max_unacked_psns * (WINDOW_MTU // mtu), (1 << 22) - 1)


def _tcp_route(peer: Endpoint) -> Route:
    try:
        ip = str(ipaddress.ip_address(peer.ip))
    except ValueError:
        raise EngineError("INVALID_VALUE", f"a tcp peer's ip {peer.ip[:64]!r} is not an IP address") from None
    try:
        secret = bytes.fromhex(peer.secret)
    except ValueError:
        secret = b""
    if len(secret) != SECRET_LEN:
        want = f"its {SECRET_LEN}-byte secret, as {2 * SECRET_LEN} hex digits"
        raise EngineError("INVALID_VALUE", f"a tcp peer's endpoint must carry {want}")
    return Route(ip, peer.port, peer.qpn, secret)
