"""The addresses a descriptor may name: one peer, reachable by unicast.

A connection descriptor tells this side where to send (``ip``) and which
source GID the peer's packets carry (``gid``); an mmap descriptor names the
exporting port's ``gid``. Refused, each naming the field:

- unspecified: ``0.0.0.0/8`` (RFC 1122 §3.2.1.3: "this network", a source
  only) and ``::`` (RFC 4291 §2.5.2);
- broadcast: ``255.255.255.255`` (limited broadcast, RFC 919) and the
  directed broadcast address of any subnet this host is on (RFC 922; read
  from the kernel's FIB, ``/proc/net/fib_trie``);
- multicast: ``224.0.0.0/4`` (RFC 5771) and ``ff00::/8`` (RFC 4291 §2.7).
  An RC connection has exactly one peer (IB multicast serves UD QPs only);
- an ``ip`` written as IPv4-mapped IPv6 (``::ffff:a.b.c.d``): an IPv4 peer
  is written as IPv4;
- a ``gid`` that is not ``ip``'s RoCEv2 GID: ``::ffff:a.b.c.d`` for IPv4, the
  address itself for IPv6 (IBTA Vol. 1 Annex A17, RoCEv2). Packets go to ``ip``,
  while rxe accepts packets only from the QP's destination GID (``rxe_recv.c``
  ``check_addr``): a mismatch names two different peers.

The same rules apply to a GID on its own: an IPv4-mapped GID is checked as
its IPv4 address.
"""

import itertools
from ipaddress import IPv4Address, IPv4Network, IPv6Address

__all__ = ["address_problem", "gid_mismatch", "gid_text", "local_broadcasts", "roce_gid"]

_THIS_NETWORK = IPv4Network("0.0.0.0/8")
_LIMITED_BROADCAST = IPv4Address("255.255.255.255")
_FIB_TRIE = "/proc/net/fib_trie"


def local_broadcasts() -> frozenset[IPv4Address]:
    """The directed broadcast addresses of this host's IPv4 subnets (empty where unknown)."""
    try:
        with open(_FIB_TRIE) as f:
            lines = f.read().splitlines()
    except OSError:
        return frozenset()
    found: set[IPv4Address] = set()
    for prev, line in itertools.pairwise(lines):
        if line.strip() == "/32 link BROADCAST":
            try:
                found.add(IPv4Address(prev.split()[-1]))
            except (ValueError, IndexError):
                continue
    return frozenset(found)


def _ipv4_problem(ip: IPv4Address) -> str | None:
    if ip in _THIS_NETWORK:
        return "is unspecified (0.0.0.0/8 names no host)"
    if ip == _LIMITED_BROADCAST:
        return "is the limited broadcast address"
    if ip.is_multicast:
        return "is a multicast address (224.0.0.0/4); an RC connection has one peer"
    if ip in local_broadcasts():
        return "is the broadcast address of a local subnet"
    return None


def address_problem(ip: IPv4Address | IPv6Address, *, gid: bool = False) -> str | None:
    """Why `ip` cannot name a peer, or None when it can.

    With `gid`, an IPv4-mapped address is a RoCEv2 GID and is judged as its
    IPv4 address; otherwise it is refused (an IPv4 peer is written as IPv4).
    """
    if isinstance(ip, IPv4Address):
        return _ipv4_problem(ip)
    mapped = ip.ipv4_mapped
    if mapped is not None:
        if not gid:
            return f"is IPv4-mapped; write the IPv4 address ({mapped})"
        return _ipv4_problem(mapped)
    if ip.is_unspecified:
        return "is unspecified (::)"
    if ip.is_multicast:
        return "is a multicast address (ff00::/8); an RC connection has one peer"
    return None


def roce_gid(ip: IPv4Address | IPv6Address) -> IPv6Address:
    """The RoCEv2 GID of `ip`: IPv4-mapped for IPv4, the address itself for IPv6."""
    if isinstance(ip, IPv4Address):
        return IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    return ip


def gid_text(gid: IPv6Address) -> str:
    """`gid` as people write it: ``::ffff:a.b.c.d`` when IPv4-mapped."""
    mapped = gid.ipv4_mapped
    return f"::ffff:{mapped}" if mapped is not None else str(gid)


def gid_mismatch(gid: IPv6Address, ip: IPv4Address | IPv6Address) -> str | None:
    """Why `gid` is not `ip`'s RoCEv2 GID, or None when it is."""
    want = roce_gid(ip)
    if gid == want:
        return None
    return f"{gid_text(gid)} is not the RoCEv2 GID of ip {ip} ({gid_text(want)})"
