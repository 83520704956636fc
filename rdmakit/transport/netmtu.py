"""The MTUs a RoCEv2 port may use, from the network it sits on.

- A soft device's active MTU (``port_mtu``) is the largest IB MTU whose RoCEv2
  packet fits the interface holding its address, as rxe's ``rxe_set_mtu()``
  takes ``eth_mtu_int_to_enum(netdev->mtu)`` (rxe_param.h): 1500 → 1024,
  9000 → 4096, loopback's 65536 → 4096.
- A QP's path MTU (``route_mtu``) is also bounded by the route to its peer: a
  connected UDP socket's ``IP_MTU`` (``IPV6_MTU``) is the route's MTU, lowered
  by what path-MTU discovery learned (ICMP "fragmentation needed", ICMPv6
  "packet too big"), as ``cma.c`` asks ``iboe_get_mtu`` of the route's MTU.

The bytes a RoCEv2 packet adds to its payload (``ROCE_OVERHEAD``): IPv4 20 or
IPv6 40, UDP 8, BTH 12, the largest extension header (AtomicETH 28: RETH 16
and ImmDt 4 are smaller together) and the ICRC 4 (Annex A17.3, IBTA §9.3).
"""

import errno
import ipaddress
import os
import socket
import struct

from rdmakit.wire import ROCE_UDP_PORT

#: The IB path MTUs in bytes (IBTA §9.4: 256 … 4096).
IB_MTUS = (256, 512, 1024, 2048, 4096)
_IPV4, _IPV6, _UDP, _BTH, _LARGEST_ETH, _ICRC = 20, 40, 8, 12, 28, 4
#: What RoCEv2 adds to a payload over IPv4 and IPv6.
ROCE_OVERHEAD = {4: _IPV4 + _UDP + _BTH + _LARGEST_ETH + _ICRC, 6: _IPV6 + _UDP + _BTH + _LARGEST_ETH + _ICRC}
#: The MTU assumed when the interface or route cannot be asked (rxe's default, 1024).
UNKNOWN_MTU = 1024
_IP_MTU, _IPV6_MTU = 14, 24  # <linux/in.h>, <linux/in6.h>
# rtnetlink (linux/rtnetlink.h, linux/if_addr.h)
_RTM_GETADDR, _NLM_F_REQUEST, _NLM_F_DUMP, _NLMSG_DONE, _NLMSG_ERROR = 22, 1, 0x300, 3, 2
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_NLMSG = struct.Struct("=IHHII")
_IFADDRMSG = struct.Struct("=BBBBI")
_RTATTR = struct.Struct("=HH")
#: Bound on the netlink answer read (a host's addresses).
_MAX_NETLINK = 1 << 22


def ib_mtu(link_mtu: int, version: int = 4) -> int:
    """The largest IB MTU whose RoCEv2 packet fits ``link_mtu`` bytes of IP (256 if none does, as rxe)."""
    room = link_mtu - ROCE_OVERHEAD[version]
    return max((m for m in IB_MTUS if m <= room), default=IB_MTUS[0])


def _addresses() -> list[tuple[int, int, bytes]]:
    """``(interface index, prefix length, address)`` of every address of this host (RTM_GETADDR)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:  # NETLINK_ROUTE
        s.settimeout(2.0)
        body = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        s.send(_NLMSG.pack(_NLMSG.size + len(body), _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + body)
        out: list[tuple[int, int, bytes]] = []
        total = 0
        while total < _MAX_NETLINK:
            data = s.recv(1 << 16)
            total += len(data)
            off = 0
            while off + _NLMSG.size <= len(data):
                length, typ = _NLMSG.unpack_from(data, off)[:2]
                if typ in (_NLMSG_DONE, _NLMSG_ERROR) or length < _NLMSG.size:
                    return out
                msg = data[off + _NLMSG.size : off + length]
                off += (length + 3) & ~3
                if len(msg) < _IFADDRMSG.size:
                    continue
                _family, prefix, _flags, _scope, index = _IFADDRMSG.unpack_from(msg)
                a = _IFADDRMSG.size
                addr = b""
                while a + _RTATTR.size <= len(msg):
                    alen, atype = _RTATTR.unpack_from(msg, a)
                    if alen < _RTATTR.size:
                        break
                    if atype in (_IFA_ADDRESS, _IFA_LOCAL) and alen - _RTATTR.size in (4, 16):
                        addr = msg[a + _RTATTR.size : a + alen]  # IFA_LOCAL (after ADDRESS) wins on IPv4
                    a += (alen + 3) & ~3
                if addr:
                    out.append((index, prefix, addr))
            if not data:
                break
    return out


def interface_of(ip: str) -> str | None:
    """The name of the interface holding ``ip``, or of the one whose prefix holds it (127.0.0.2: lo)."""
    a = ipaddress.ip_address(ip)
    best: tuple[int, int] | None = None  # (prefix length, index)
    try:
        addrs = _addresses()
    except OSError:
        return None
    for index, prefix, raw in addrs:
        if len(raw) != len(a.packed):
            continue
        net = ipaddress.ip_network((int.from_bytes(raw, "big"), prefix), strict=False)
        if a in net:
            score = (128 + 1 if raw == a.packed else prefix, index)
            if best is None or score > best:
                best = score
    if best is None:
        return None
    try:
        return socket.if_indextoname(best[1])
    except OSError:
        return None


def link_mtu(interface: str) -> int | None:
    """The MTU of ``interface`` (sysfs), or None."""
    try:
        with open(os.path.join("/sys/class/net", os.path.basename(interface), "mtu")) as f:
            return int(f.read(32).strip())
    except (OSError, ValueError):
        return None


def port_mtu(ip: str) -> int:
    """A soft device's active MTU: ``ib_mtu`` of the MTU of the interface holding ``ip``."""
    name = interface_of(ip)
    mtu = link_mtu(name) if name is not None else None
    return UNKNOWN_MTU if mtu is None else ib_mtu(mtu, ipaddress.ip_address(ip).version)


def route_link_mtu(dst: str, src: str | None = None) -> int | None:
    """The IP MTU of the route from ``src`` to ``dst`` as the kernel knows it now (PMTU included), or None.

    A UDP socket is connected, which sends nothing, and asked for ``IP_MTU``.
    """
    ip = ipaddress.ip_address(dst)
    v6 = ip.version == 6
    try:
        with socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM) as s:
            if src is not None:
                s.bind((src, 0))
            s.connect((str(ip), ROCE_UDP_PORT))
            level, opt = (socket.IPPROTO_IPV6, _IPV6_MTU) if v6 else (socket.IPPROTO_IP, _IP_MTU)
            return int(s.getsockopt(level, opt))
    except OSError:
        return None


def route_mtu(dst: str, limit: int = 4096, src: str | None = None) -> int:
    """The largest IB MTU (at most ``limit``) that fits the route to ``dst`` (``UNKNOWN_MTU``: cannot ask)."""
    mtu = route_link_mtu(dst, src)
    if mtu is None:
        return min(UNKNOWN_MTU, limit)
    return min(ib_mtu(mtu, ipaddress.ip_address(dst).version), limit)


def too_big_message(dst: str, size: int, path_mtu: int, src: str | None = None) -> str:
    """What to say when a ``size``-byte datagram to ``dst`` is refused (EMSGSIZE): the MTUs and the fix."""
    route = route_link_mtu(dst, src)
    fits = ib_mtu(route, ipaddress.ip_address(dst).version) if route is not None else None
    on = f"the route to {dst} carries {route}-byte IP packets" if route is not None else f"the route to {dst}"
    fix = f"-m {fits}" if fits is not None and fits < path_mtu else "a smaller -m"
    return (
        f"{os.strerror(errno.EMSGSIZE)}: a {size}-byte RoCEv2 datagram at path MTU {path_mtu} does not fit; "
        f"{on} (path MTU discovery); connect again with {fix}"
    )
