"""What the RoCE-UDP port keeps per source, and the IPv4 IDs of other senders.

The ICRC covers the IPv4 header's Identification (RoCEv2 Annex A17.3.3
masks only TTL, checksum and flow fields), so a receiver must know the ID a
datagram was sent with. A GSO sender gives segment ``k`` of a batch ID ``k``
(rdmakit), which the codec finds whatever the network did to the batch
(``IcrcFlow.id_shift``); a sender without GSO uses ID 0; a kernel sender (rxe) counts its
own, which is followed per source address (``IdentWindow``) or solved for
(``solve_ident_diff``), within bounds: only for a connected peer's address,
not for a source seen to use our IDs, and at most ``MAX_RX_FLOWS`` sources
and ``MAX_IDENT_PEERS`` kernel senders are remembered.
"""

from rdmakit.wire import ICRC_LEN, IcrcFlow, Packet, unpack_icrc
from rdmakit.wire.ident import IdentWindow, solve_ident_diff

from .codec import SegmentCodec
from .fastpath import PYTHON
from .port import DeviceCounters, addr_bytes

#: passed the header checks (a QP connected to that address) get any.
MAX_RX_FLOWS = 256
#: Source addresses whose IPv4 IDs are followed (kernel senders) at most.
MAX_IDENT_PEERS = 256
#: Bad ICRCs in a row a source that uses our IPv4 IDs may send before the
#: solver is tried for it (a corrupted packet of ours is never "solved").
OURS_STRIKES = 4


class RxFlow:
    """What the receiver keeps about one source (address, port) of a connected peer."""

    __slots__ = ("icrc", "kernel", "ours", "states")

    def __init__(self, icrc: IcrcFlow) -> None:
        self.icrc = icrc
        #: ``icrc.states`` (cleared in place, never replaced).
        self.states = icrc.states
        #: Its packets carried our IPv4 IDs: bad ICRCs it may still send unsolved.
        self.ours = 0
        #: Its packets carried a kernel's IPv4 IDs (followed per address).
        self.kernel = False


class RxSources:
    """The receive state of each source (address, port) and IPv4-ID window of each address."""

    def __init__(self, local_ip: str, port: int, counters: DeviceCounters) -> None:
        self._local = addr_bytes(local_ip)
        self._v6 = len(self._local) == 16
        self._port = port
        self.counters = counters
        #: The port's segment codec (``UdpPort.codec`` sets it).
        self.codec: SegmentCodec = PYTHON
        #: Receive state per source (ip, port), at most ``MAX_RX_FLOWS`` (oldest dropped).
        self.flows: dict[tuple[str, int], RxFlow] = {}
        #: The IPv4 IDs of kernel senders per source ip, at most ``MAX_IDENT_PEERS``.
        self.idents: dict[str, IdentWindow] = {}

    def flow(self, src_ip: str, sport: int) -> RxFlow:
        src = addr_bytes(src_ip)
        if self._v6:
            icrc = IcrcFlow.ipv6(src, self._local, sport, self._port)
        else:
            icrc = IcrcFlow.ipv4(src, self._local, sport, self._port)
        flows = self.flows
        if len(flows) >= MAX_RX_FLOWS:
            del flows[next(iter(flows))]  # the oldest: bounded, whatever the sources do
        rx = flows[(src_ip, sport)] = RxFlow(icrc)
        return rx

    def kernel_ident(self, rx: RxFlow, src_ip: str) -> int | None:
        """The IPv4 ID a kernel sender's next packet most likely carries (``other_ident``'s first
        guess), for a native path to check its ICRC with; None if ``rx`` is not a kernel's."""
        ids = self.idents.get(src_ip) if rx.kernel else None
        return None if ids is None else ids.next()

    def kernel_ident_taken(self, src_ip: str, ident: int, now: float) -> None:
        """A packet whose ICRC checked with ``kernel_ident``'s ID was taken (as ``other_ident`` counts it)."""
        self.idents[src_ip].accept(ident, now)
        self.counters.icrc_solved += 1

    def _checked_with(self, rx: RxFlow, seg: memoryview, ident: int) -> Packet | None:
        """The segment decoded if its ICRC checks with IPv4 ID ``ident`` (its header passed), else None."""
        got = self.codec.check_decode(seg, ident, rx.states, rx.icrc)
        return got if type(got) is Packet else None

    def other_ident(self, rx: RxFlow, seg: memoryview, idx: int, src_ip: str, now: float) -> Packet | None:
        """Segment ``idx``'s ICRC checks with no IPv4 ID below ``SEGMENT_IDS``: the IDs kernel senders use.

        A kernel sender (rxe) counts its own: its next ID is tried, and the ID solved for (``IdentWindow``
        says when, and whether to believe it). Not for a source whose packets
        carried our IDs, unless its bad ICRCs go on.
        """
        if self._v6:
            return None  # IPv6 has no Identification
        c = self.counters
        if rx.ours:
            rx.ours -= 1
            return None
        ids = self.idents.get(src_ip)
        if ids is None:
            ids = self._ident_window(src_ip, now)
        nxt = ids.next()
        if nxt is not None and nxt != idx:
            pkt = self._checked_with(rx, seg, nxt)
            if pkt is not None:
                ids.accept(nxt, now)
                rx.kernel = True
                c.icrc_solved += 1
                return pkt
        if not ids.may_solve(now):
            c.solver_limited += 1
            return None
        c.solver_runs += 1
        end = len(seg) - ICRC_LEN
        ident = solve_ident_diff(end, rx.icrc.icrc(seg[:end]) ^ unpack_icrc(seg))
        if ident is None:
            c.icrc_unsolved += 1
            return None
        if not ids.accept(ident, now):
            c.solved_out_of_window += 1
            return None
        pkt = self._checked_with(rx, seg, ident)
        if pkt is not None:
            rx.kernel = True
            c.icrc_solved += 1
        return pkt

    def _ident_window(self, src_ip: str, now: float) -> IdentWindow:
        idents = self.idents
        if len(idents) >= MAX_IDENT_PEERS:
            del idents[next(iter(idents))]
        ids = idents[src_ip] = IdentWindow(now)
        return ids
