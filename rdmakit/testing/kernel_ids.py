"""A soft device that numbers its datagrams' IPv4 IDs as kernel rxe does (for tests and benchmarks).

Linux numbers the datagrams to one destination with a counter
(``ip_idents_reserve()``): +1 per packet, with a random jump after a quiet
spell, and rxe's ICRC covers that ID (RoCEv2 Annex A17.3.3 does not mask it).
A UDP socket cannot choose its IDs, so ``KernelIds`` computes each packet's
ICRC with the ID the kernel would have used and sends it as usual: the
receiver must work out the ID from the ICRC, as it must for rxe.
"""

from collections.abc import Callable
from typing import Any

from rdmakit.transport import fastpath
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.port import addr_bytes
from rdmakit.transport.udp import UdpLink
from rdmakit.wire import icrc_ipv4, pack_icrc


class KernelIds:
    """Makes ``dev``'s datagrams carry the ICRC of IPv4 IDs counted from ``first`` (``jumps``:
    packet number -> an extra step before it); ``sent`` lists the IDs used."""

    def __init__(self, dev: SoftDevice, first: int, jumps: dict[int, int]) -> None:
        self.dev, self.ident, self.jumps = dev, first, jumps
        self.sent: list[int] = []

    def install(self, setattr_: Callable[[Any, str, Any], None]) -> None:
        """Send every packet of ``dev`` one by one through ``UdpLink.send``, replaced by means of
        ``setattr_`` (``pytest.MonkeyPatch.setattr``, or a caller's own that restores it)."""
        link, real_send = self.dev.udp, UdpLink.send
        port = self.dev.udp_port
        assert port is not None
        port._runs, port.codec = False, fastpath.PYTHON  # every packet through UdpLink.send
        assert link is not None
        assert not link.gso

        def send(link_: UdpLink, parts: list[bytes], addr: tuple[str, int]) -> bool:
            if link_ is not link:
                return real_send(link_, parts, addr)
            body = b"".join(parts)[:-4]
            self.ident = (self.ident + 1 + self.jumps.get(len(self.sent), 0)) & 0xFFFF
            src, dst = addr_bytes(link.ip), addr_bytes(addr[0])
            self.sent.append(self.ident)
            ic = icrc_ipv4(src, dst, link.port, addr[1], body, ident=self.ident)
            return real_send(link_, [body, pack_icrc(ic)], addr)

        setattr_(UdpLink, "send", send)
