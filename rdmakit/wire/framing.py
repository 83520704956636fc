"""Framing of RC packets on a byte stream (the TCP transport).

A frame is a 4-byte big-endian length followed by that many bytes: one packet
from the BTH to the end of the pad, without ICRC (the stream is already
checksummed). Frames may exceed a RoCE MTU; ``MAX_FRAME`` bounds them so that a
garbage length cannot make a receiver allocate without limit.
"""

import struct

from .errors import WireError
from .packet import BTH_LEN

FRAME_HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 26


def frame_header(body_len: int) -> bytes:
    if not BTH_LEN <= body_len <= MAX_FRAME:
        raise WireError(f"frame body of {body_len} bytes is out of range")
    return FRAME_HEADER.pack(body_len)


class FrameDecoder:
    """Incremental frame parser: ``feed`` bytes, then take ``next_frame`` until None."""

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_frame(self) -> bytes | None:
        """The next whole frame body, or None if more bytes are needed."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (n,) = FRAME_HEADER.unpack_from(buf, pos)
        if not BTH_LEN <= n <= MAX_FRAME:
            raise WireError(f"frame length {n} is out of range")
        end = pos + 4 + n
        if len(buf) < end:
            return None
        self._pos = end
        return bytes(buf[pos + 4 : end])

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos
