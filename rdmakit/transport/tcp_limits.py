"""The TCP transport's stream preface, its limits and the counters of what it refused.

No I/O here: the values :mod:`rdmakit.transport.tcp` (the link) and
:mod:`rdmakit.transport.tcp_stream` (a stream's framing) are bound by; the
module docstring of :mod:`rdmakit.transport.tcp` says what each limit costs.
"""

import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

PREFACE_MAGIC = b"RDMAKIT\x02"
#: Bytes of a connection secret (128 bits, as RFC 4086 §8 asks of a key).
SECRET_LEN = 16
#: The magic, the sender's listener (its address as 16 bytes, IPv4-mapped for IPv4,
#: and its port), the QPN the stream is for, and that QP's secret.
PREFACE = struct.Struct(f">8s16sHI{SECRET_LEN}s")
PREFACE_LEN = PREFACE.size
#: Seconds an accepted connection may take to send its whole preface.
PREFACE_TIMEOUT = 5.0
#: Connections waiting for their preface; one more closes the oldest.
MAX_PENDING = 64
#: Authenticated incoming streams; one more is refused.
MAX_STREAMS = 1024
#: Bytes an outgoing stream queues beyond its socket before the device holds packets back.
MAX_QUEUED = 16 << 20
#: Seconds an outgoing stream's queue may stand still before its peer counts as gone.
STALL_TIMEOUT = 10.0
#: The read buffer of an authenticated stream.
READ_BUFFER = 4 << 20
#: Frames at least this long may be received straight into place (see ``TcpLink.place``).
DIRECT_MIN = 64 << 10
#: Reads of one stream per readiness while each ends with a frame placed (then the
#: other ready streams get their turn).
READ_TURN = 8

Addr = tuple[str, int]


def ip16(ip: str) -> bytes:
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    b = socket.inet_pton(fam, ip)
    return b if len(b) == 16 else b"\0" * 10 + b"\xff\xff" + b


def ip_str(b: bytes) -> str:
    if b[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, b[12:])
    return socket.inet_ntop(socket.AF_INET6, b)


@dataclass(slots=True)
class TcpCounters:
    """Streams the TCP link refused or closed, by reason (``SoftDevice`` counts them too)."""

    #: A preface without the magic.
    tcp_bad_preface: int = 0
    #: A preface claiming an address other than the socket's remote address.
    tcp_spoofed: int = 0
    #: A preface naming no grant of this device, or with the wrong secret.
    tcp_bad_secret: int = 0
    #: A preface from a peer device other than the one the granting QP is connected to.
    tcp_wrong_peer: int = 0
    #: Connections without a whole preface after ``PREFACE_TIMEOUT``.
    tcp_preface_timeout: int = 0
    #: Waiting connections closed to make room for a new one (``MAX_PENDING``).
    tcp_pending_dropped: int = 0
    #: Authenticated streams refused (``MAX_STREAMS``).
    tcp_streams_refused: int = 0
    #: Frames whose length is outside [BTH, the grant's MTU plus headers].
    tcp_bad_length: int = 0
    #: Frames for a QP the stream's secret does not open.
    tcp_unauthorised: int = 0
    #: Bytes from the far end of an outgoing stream.
    tcp_unexpected_data: int = 0
    #: Outgoing streams whose peer stopped reading (``STALL_TIMEOUT``).
    tcp_stalled: int = 0
    #: Transmit rounds in which a QP's packets waited for room in its stream (backpressure).
    tcp_held: int = 0


class Route(NamedTuple):
    """Where an outgoing stream goes: the peer device's listener, the peer QP, and the
    secret that QP's connection descriptor carried."""

    ip: str
    port: int
    qpn: int
    secret: bytes


class Placed(NamedTuple):
    """A frame whose payload was received straight into place: its headers, and the payload."""

    header: bytes
    payload: memoryview


#: ``place(peer ip, the first bytes of a frame body, body length)``: None, or the header
#: length and the buffer that takes the rest of the body (see ``SoftDevice``).
Placer = Callable[[str, memoryview, int], "tuple[int, memoryview] | None"]
