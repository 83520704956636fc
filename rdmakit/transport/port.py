"""What a soft device's ports share: where a QP's packets go, the counters, the port shape.

A port is one link of a :class:`~rdmakit.transport.device.SoftDevice`
(:mod:`rdmakit.transport.roce_udp` or :mod:`rdmakit.transport.tcp_port`). It
reads its link and feeds each packet to the QP its BTH names, and sends what
the QPs produced; the device's pump calls nothing else.
"""

import socket
from dataclasses import dataclass, fields
from typing import Literal, Protocol

from rdmakit.engine import QueuePair

from .tcp_limits import TcpCounters

TransportName = Literal["roce-udp", "tcp"]


@dataclass(frozen=True, slots=True)
class PeerAddress:
    """Where a QP's packets go: the peer device's address and port."""

    ip: str
    port: int


@dataclass(slots=True)
class DeviceCounters(TcpCounters):
    """What the device saw that the engine never did (like rxe's hw counters).

    The ``tcp_*`` counters (:class:`~rdmakit.transport.tcp_limits.TcpCounters`)
    are the TCP transport's refusals, by kind; they stay 0 on UDP.
    """

    packets_in: int = 0
    packets_out: int = 0
    icrc_ok: int = 0
    #: Verified with the sender's own IPv4 ID (a kernel peer: predicted or solved).
    icrc_solved: int = 0
    bad_icrc: int = 0
    #: IPv4-ID solver runs, runs refused by the rate bound, IDs solved outside the window,
    #: and packets whose ICRC no IPv4 ID makes check (corrupted on the way, or forged).
    solver_runs: int = 0
    solver_limited: int = 0
    solved_out_of_window: int = 0
    icrc_unsolved: int = 0
    malformed: int = 0
    unknown_qp: int = 0
    wrong_source: int = 0
    dropped_state: int = 0
    backlog_max: int = 0
    #: Packets whose payload was received straight into the target memory (TCP).
    placed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Port(Protocol):
    """One link of a device, as its pump drives it."""

    port: int

    def receive(self, now: float, readable: bool | None) -> bool:
        """Drain the link until it would block; True if anything was read."""
        ...

    def transmit(self, now: float) -> bool:
        """Send what the QPs have; True if anything was sent."""
        ...

    def forget(self, qp: QueuePair) -> None:
        """``qp`` was destroyed or reset: drop what the port keeps for it."""
        ...

    def wake(self, qp: QueuePair) -> None:
        """``qp`` may have something to send (its doorbell rang, or a timer of it fired)."""
        ...

    def sweep(self) -> None:
        """Look at every QP at the next transmit (the safety net of an active set)."""
        ...

    def visited(self) -> list[QueuePair]:
        """The QPs received for, woken or transmitted for since the last call: those whose
        deadline may have moved (``deadlines``). Each call hands them out once."""
        ...

    def deadline(self) -> float | None:
        """The port's own earliest deadline (None: none)."""
        ...

    def fault(self, qpn: int) -> str | None:
        """Why the port failed QP ``qpn``, if it did."""
        ...

    def wants_write(self) -> bool: ...
    def fileno(self) -> int: ...
    def close(self) -> None: ...


def addr_bytes(ip: str) -> bytes:
    return socket.inet_pton(socket.AF_INET6 if ":" in ip else socket.AF_INET, ip)
