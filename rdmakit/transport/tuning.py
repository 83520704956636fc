"""Socket tuning of the TCP transport's streams, in one place.

The TCP transport (`rdmakit.transport.tcp`) and the raw-stream baseline of
``rdmakit bench`` (`rdmakit.transport.baseline`) both call these, so the
baseline a WRITE is divided by gets exactly the transport's tuning: no Nagle,
a large send buffer, the kernel's receive autotuning (no ``SO_RCVBUF``), and
reads of a large message straight into place that wake only once a good part
of the rest has arrived (``SO_RCVLOWAT``).
"""

import contextlib
import socket

#: Send buffer of outgoing streams.
STREAM_SEND_BUFFER = 32 << 20
#: Most bytes a direct read waits for before the stream counts as readable (SO_RCVLOWAT).
RCVLOWAT_MAX = 256 << 10


def tune_stream_sender(sock: socket.socket, send_buffer: int = STREAM_SEND_BUFFER) -> None:
    """A sending stream's options: ``TCP_NODELAY`` and a large ``SO_SNDBUF``."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)


def direct_lowat(remaining: int) -> int:
    """The ``SO_RCVLOWAT`` for a read that still wants ``remaining`` bytes in place."""
    return max(1, min(remaining, RCVLOWAT_MAX))


def set_rcvlowat(sock: socket.socket, n: int) -> None:
    """Set ``SO_RCVLOWAT`` (best effort: a kernel that refuses it keeps waking at 1 byte)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)
