"""What a connection manager reports to a backend's user, the same for every backend.

These are ``rdma_cm``'s events (``rdma_cm_event_type``, the ones RC uses), one
level above :mod:`rdmakit.engine.cm`'s IB CM events (REQ, REP and REJ
received): the verbs backend's librdmacm reports them as they are, the soft
backend translates its ``rdmakit.transport.cma`` events into them, and
``rdmakit.doca`` hands them to the DOCA connection callbacks.
"""

from dataclasses import dataclass
from enum import StrEnum
from ipaddress import IPv4Address, IPv6Address

#: Requests a server that serves one client accepts at once, each with a QP of its own, until
#: one is ESTABLISHED (its sender received the REP where it claimed to be, and answered): the
#: oldest is dropped for a new one. One stranger's REQ cannot take the place of the client.
ACCEPT_CANDIDATES = 4


class CmEventKind(StrEnum):
    """What a connection manager reports (``rdma_cm_event_type``, the ones RC uses)."""

    CONNECT_REQUEST = "connect_request"  # passive: a REQ for a listened port
    ESTABLISHED = "established"  # either side: the QP is in RTS
    REJECTED = "rejected"  # active: a REJ came back (`CmEvent.reason`)
    UNREACHABLE = "unreachable"  # either side: no answer within the timeout
    DISCONNECTED = "disconnected"  # either side: DREQ sent or received, QP flushed


@dataclass(frozen=True, slots=True, kw_only=True)
class CmEvent:
    """One connection-manager event; `conn` is the backend's handle of that connection."""

    kind: CmEventKind
    conn: int
    private_data: bytes = b""
    reason: int | None = None  # REJ reason (IBTA Vol. 1 Table 112), REJECTED only
    peer: tuple[IPv4Address | IPv6Address, int] | None = None  # address, port
    local_port: int = 0  # CONNECT_REQUEST: the listened port the REQ named
    #: CONNECT_REQUEST: the requester's CA GUID (the REQ's Local CA GUID, IBTA Vol. 1 §12.6.5);
    #: 0 where the backend does not see it (librdmacm does not report it).
    peer_guid: int = 0
    detail: str = ""  # one line for a person
