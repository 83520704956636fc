"""QP1, the General Services Interface, of a soft RoCE-UDP device: CM MADs in and out.

What arrives for destination QP 1 on the device's UDP port is checked the
way rxe checks GSI traffic (``rxe_recv.c``), cheapest first, so that a
hostile datagram costs no more than a valid MAD: the UD SEND ONLY header
and its DETH, P_Key 0xFFFF (or its limited form 0x7FFF), Q_Key 0x80010000
(``IB_QP1_QKEY``), the CM MAD's common header (256 bytes, base version 1,
class 0x07: ``rdmakit.wire.cm.check_cm_header``); then the ICRC. A UDP
socket does not show the IPv4 Identification the ICRC covers: ID 0 (an
rdmakit sender) is tried, then the sender's next ID (a kernel sender,
followed per address by an `IdentWindow`), and only then is the ID solved
for (``rdmakit.wire.ident``), under the sender's own token bucket and one
for all senders (`SOLVE_RATE` a second). A packet no believed ID explains is
dropped. The MAD goes to the device's `CmEndpoint` with the sender's IP as
its peer. Everything refused is counted in `GsiCounters`, never raised.

Replies leave from the device's own socket to the peer's RoCE port, with
IPv4 ID 0 in their ICRC (the ID an unconnected DF socket gives them).
"""

import ipaddress
import struct
from dataclasses import dataclass, fields

from rdmakit.engine.cm import CmEndpoint
from rdmakit.wire import ICRC_LEN, WireError, icrc_ipv4, icrc_ipv6, pack_icrc
from rdmakit.wire.cm import check_cm_header, decode_cm, encode_cm
from rdmakit.wire.ident import IdentWindow, TokenBucket, solve_ident_diff
from rdmakit.wire.ud import GSI_QKEY, GSI_QPN, UdSend, decode_ud_send, encode_ud_send

from .port import addr_bytes
from .roce_sources import MAX_IDENT_PEERS
from .udp import UdpLink

__all__ = ["Gsi", "GsiCounters"]

_ICRC = struct.Struct("<I")
_PKEYS = (0xFFFF, 0x7FFF)
#: MADs waiting for socket space at most; older ones are dropped (the CM resends what matters).
_MAX_BACKLOG = 256
#: IPv4 ID solver runs a second QP1 allows over all senders, and the burst it saves up (each sender
#: has its own bucket too, `IdentWindow`'s). CM MADs are few: a kernel peer's first one is solved,
#: its next ones are its next ID.
SOLVE_RATE = 100.0
SOLVE_BURST = 16


@dataclass
class GsiCounters:
    mads_in: int = 0
    mads_out: int = 0
    bad_icrc: int = 0
    not_ud: int = 0  # malformed UD, wrong Q_Key or P_Key
    not_cm: int = 0  # a MAD of another class, or not a MAD
    solver_runs: int = 0  # IPv4 IDs solved for (neither 0 nor the sender's next)
    solver_limited: int = 0  # dropped: no token left in the sender's bucket or the global one

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Gsi:
    """The CM endpoint of one device, fed from and sending on its UDP link."""

    def __init__(self, link: UdpLink, local_ip: str, cm: CmEndpoint) -> None:
        self.link = link
        self.cm = cm
        self.counters = GsiCounters()
        self._local = ipaddress.ip_address(local_ip).packed
        self._v6 = len(self._local) == 16
        self._backlog: list[tuple[list[bytes], tuple[str, int]]] = []
        #: The IPv4 IDs of kernel senders per address, at most ``MAX_IDENT_PEERS`` (oldest dropped).
        self._idents: dict[str, IdentWindow] = {}
        self._solves = TokenBucket(SOLVE_RATE, SOLVE_BURST, 0.0)

    # -- in ---------------------------------------------------------------------------------------------

    def receive(self, seg: memoryview, src_ip: str, sport: int, now: float) -> None:
        """One UDP payload (BTH .. ICRC) that named QP 1."""
        c = self.counters
        end = len(seg) - ICRC_LEN
        body = seg[:end]
        try:
            ud = decode_ud_send(body)
        except WireError:
            c.not_ud += 1
            return
        if ud.dest_qp != GSI_QPN or ud.qkey != GSI_QKEY or ud.pkey not in _PKEYS:
            c.not_ud += 1
            return
        try:
            check_cm_header(memoryview(ud.payload))
        except WireError:
            c.not_cm += 1
            return
        try:
            src = addr_bytes(src_ip)
        except OSError:
            c.not_ud += 1
            return
        if not self._icrc_checks(body, src, sport, _ICRC.unpack_from(seg, end)[0], src_ip, now):
            return
        try:
            mad = decode_cm(ud.payload)
        except WireError:
            c.not_cm += 1
            return
        c.mads_in += 1
        self.cm.receive(src_ip, mad, now)

    def _icrc_checks(
        self, body: memoryview, src: bytes, sport: int, received: int, src_ip: str, now: float
    ) -> bool:
        """Whether an IPv4 ID the sender may have used (or IPv6) makes ``received`` the ICRC."""
        c, port = self.counters, self.link.port
        if self._v6:
            if icrc_ipv6(src, self._local, sport, port, body) == received:
                return True
            c.bad_icrc += 1
            return False
        diff = icrc_ipv4(src, self._local, sport, port, body, ident=0) ^ received
        if not diff:
            return True  # an rdmakit sender
        ids = self._idents.get(src_ip)
        if ids is not None:
            nxt = ids.next()
            if nxt is not None and icrc_ipv4(src, self._local, sport, port, body, ident=nxt) == received:
                ids.accept(nxt, now)  # a kernel sender's next ID
                return True
        else:
            if len(self._idents) >= MAX_IDENT_PEERS:
                del self._idents[next(iter(self._idents))]  # bounded, whatever the sources do
            ids = self._idents[src_ip] = IdentWindow(now)
        if not ids.may_solve(now) or not self._solves.take(now):
            c.solver_limited += 1
            return False
        c.solver_runs += 1
        ident = solve_ident_diff(len(body), diff)
        if ident is None or not ids.accept(ident, now):
            c.bad_icrc += 1
            return False
        return True

    # -- out --------------------------------------------------------------------------------------------

    def transmit(self, now: float) -> bool:
        """Send what the CM produced; what the socket does not take waits for the next call."""
        if not self._backlog and not self.cm.has_output:
            return False  # the common case, at every turn of the pump
        out = self.cm.poll_transmit()
        for peer, mad in out:
            self._backlog.append(self._datagram(str(peer), encode_cm(mad)))
        if len(self._backlog) > _MAX_BACKLOG:  # the CM retransmits what is dropped here
            del self._backlog[: len(self._backlog) - _MAX_BACKLOG]
        while self._backlog:
            parts, addr = self._backlog[0]
            if not self.link.send(parts, addr):
                break
            self._backlog.pop(0)
            self.counters.mads_out += 1
        return bool(out)

    def _datagram(self, peer_ip: str, mad: bytes) -> tuple[list[bytes], tuple[str, int]]:
        body = encode_ud_send(UdSend(dest_qp=GSI_QPN, src_qp=GSI_QPN, qkey=GSI_QKEY, payload=mad))
        dst = ipaddress.ip_address(peer_ip).packed
        port = self.link.port
        if self._v6:
            icrc = icrc_ipv6(self._local, dst, port, port, body)
        else:
            icrc = icrc_ipv4(self._local, dst, port, port, body, ident=0)
        return [body, pack_icrc(icrc)], (peer_ip, port)

    def close(self, now: float) -> None:
        """The device is closing: every connected connection sends its DREQ now (one try; the
        socket closes after this, so the peer learns it from the DREQ or from its QP's retries)."""
        if self.cm.disconnect_all(now):
            self.transmit(now)

    def deadline(self) -> float | None:
        return self.cm.get_timer()

    def handle_timer(self, now: float) -> None:
        self.cm.handle_timer(now)
