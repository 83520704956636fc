"""Congestion Notification Packets on the UDP port (RoCEv2 Annex A17.9).

A CNP is one datagram, BTH + 16 reserved bytes + ICRC (``rdmakit.wire.cnp``),
sent from the device's socket to the peer's RoCE port for the peer's QP. Its
ICRC is computed, as for the connection manager's datagrams
(:mod:`rdmakit.transport.gsi`), with IPv4 ID 0: the ID the socket gives a
datagram sent alone. On the way in, the ID a UDP socket does not show is
solved for (``rdmakit.wire.ident``), as for QP1; a CNP that fails its ICRC
or its format is refused (None), never raised.
"""

from rdmakit.wire import ICRC_LEN, WireError, icrc_ipv4, icrc_ipv6, pack_icrc, unpack_icrc
from rdmakit.wire.cnp import CNP_LEN, decode_cnp, encode_cnp
from rdmakit.wire.ident import solve_ipv4_ident

from .port import addr_bytes

__all__ = ["check_cnp", "cnp_datagram"]


def cnp_datagram(local: bytes, peer_ip: str, port: int, dest_qpn: int) -> list[bytes]:
    """The parts of a CNP from ``local`` (packed address, our port ``port``) to ``dest_qpn``
    at ``peer_ip`` (its RoCE port is ``port`` too)."""
    body = encode_cnp(dest_qpn)
    dst = addr_bytes(peer_ip)
    if len(local) == 16:
        icrc = icrc_ipv6(local, dst, port, port, body)
    else:
        icrc = icrc_ipv4(local, dst, port, port, body, ident=0)
    return [body, pack_icrc(icrc)]


def check_cnp(seg: memoryview, src_ip: str, sport: int, local: bytes, port: int) -> int | None:
    """The DestQP of the CNP ``seg`` (BTH .. ICRC) from ``src_ip``:``sport``, or None if its
    ICRC or its format is wrong."""
    if len(seg) != CNP_LEN + ICRC_LEN:
        return None
    body = seg[:CNP_LEN]
    received = unpack_icrc(seg)
    try:
        src = addr_bytes(src_ip)
    except OSError:
        return None
    if len(local) == 16:
        good = icrc_ipv6(src, local, sport, port, body) == received
    else:
        good = solve_ipv4_ident(src, local, sport, port, body, received) is not None
    if not good:
        return None
    try:
        return decode_cnp(body)
    except WireError:
        return None
