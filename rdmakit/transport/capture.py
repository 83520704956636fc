"""Packet capture: a Linux packet socket, and pcap files (read and write).

`PacketSocket` needs CAP_NET_RAW. On ``lo`` every packet is seen twice (as it
leaves and as it arrives); the outgoing copy is dropped, as libpcap does.
"""

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from rdmakit.wire.frames import LINKTYPE_ETHERNET

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
_PCAP_MAGIC_US, _PCAP_MAGIC_NS = 0xA1B2C3D4, 0xA1B23C4D
_GLOBAL = struct.Struct("<IHHiIII")
_RECORD = struct.Struct("<IIII")

Frame = tuple[float, bytes]


class CaptureError(Exception):
    """A capture that cannot start or a file that is not pcap."""


class PacketSocket:
    """Frames from one interface (``any`` for all), with receive timestamps."""

    def __init__(self, iface: str, snaplen: int = 65535) -> None:
        try:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        except PermissionError as e:
            raise CaptureError("capturing needs root (CAP_NET_RAW)") from e
        if iface != "any":
            try:
                s.bind((iface, 0))
            except OSError as e:
                s.close()
                raise CaptureError(f"no interface {iface!r}: {e.strerror}") from e
        s.settimeout(0.2)
        self.sock = s
        self.snaplen = snaplen
        self.linktype = LINKTYPE_ETHERNET

    def frames(self, until: float | None = None) -> Iterator[Frame]:
        """Frames until the monotonic time ``until`` (forever if None)."""
        while until is None or time.monotonic() < until:
            try:
                data, addr = self.sock.recvfrom(self.snaplen)
            except TimeoutError:
                continue
            if addr[2] == PACKET_OUTGOING and addr[0] == "lo":
                continue
            yield time.time(), data

    def close(self) -> None:
        self.sock.close()


def read_pcap(path: str | Path) -> tuple[int, Iterator[Frame]]:
    """The link type of a pcap file and an iterator over its frames."""
    f = open(path, "rb")  # noqa: SIM115 (closed by the iterator)
    head = f.read(_GLOBAL.size)
    if len(head) < _GLOBAL.size:
        f.close()
        raise CaptureError(f"{path}: not a pcap file (too short)")
    magic = struct.unpack_from("<I", head)[0]
    if magic in (_PCAP_MAGIC_US, _PCAP_MAGIC_NS):
        order = "<"
    elif struct.unpack_from(">I", head)[0] in (_PCAP_MAGIC_US, _PCAP_MAGIC_NS):
        order = ">"
        magic = struct.unpack_from(">I", head)[0]
    else:
        f.close()
        raise CaptureError(f"{path}: not a pcap file (pcapng is not supported; convert with editcap -F pcap)")
    linktype = struct.unpack_from(order + "I", head, 20)[0] & 0xFFFF
    scale = 1e-9 if magic == _PCAP_MAGIC_NS else 1e-6
    rec = struct.Struct(order + "IIII")

    def frames() -> Iterator[Frame]:
        with f:
            while True:
                hdr = f.read(rec.size)
                if len(hdr) < rec.size:
                    return
                sec, frac, incl, _orig = rec.unpack(hdr)
                data = f.read(incl)
                if len(data) < incl:
                    return  # a capture cut short
                yield sec + frac * scale, data

    return linktype, frames()


class PcapWriter:
    """Writes frames as a classic pcap file (microsecond timestamps)."""

    def __init__(self, out: BinaryIO, linktype: int, snaplen: int = 65535) -> None:
        self.out = out
        out.write(_GLOBAL.pack(_PCAP_MAGIC_US, 2, 4, 0, 0, snaplen, linktype))

    def write(self, ts: float, frame: bytes) -> None:
        sec = int(ts)
        self.out.write(_RECORD.pack(sec, int((ts - sec) * 1e6), len(frame), len(frame)))
        self.out.write(frame)
        self.out.flush()
