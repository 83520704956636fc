"""Plain sockets the transport tests send from or capture on."""

import socket


def udp_sink(ip: str) -> socket.socket:
    """A UDP socket bound to an ephemeral port on `ip`, with room for a burst of datagrams."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((ip, 0))
    s.settimeout(5.0)
    return s
