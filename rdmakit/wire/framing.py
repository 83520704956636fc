"""Framing of RC packets on a byte stream (the TCP transport).

A frame is a 4-byte big-endian length followed by that many bytes: one packet
from the BTH to the end of the pad, without ICRC (the stream is already
checksummed). Frames may exceed a RoCE MTU; ``MAX_FRAME`` bounds every frame,
and a receiver that knows the connection's path MTU bounds them far tighter
(``max_frame_body``), so that a length it has not checked cannot make it
allocate more than one valid frame needs.
"""

import struct

from .errors import LocalWireError, WireError
from .opcodes import OPCODE_INFO
from .packet import BTH_LEN

FRAME_HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 26
#: The longest header set of any RC opcode: 40 bytes, BTH and AtomicETH (IBTA §9.2, §9.3.4).
MAX_HEADERS = BTH_LEN + max(info.ext_len for info in OPCODE_INFO.values())


def max_frame_body(mtu: int) -> int:
    """The longest frame body a connection of path MTU ``mtu`` carries: headers and
    one MTU of payload with its pad (an MTU is a multiple of 4, so the pad fits in it)."""
    return min(MAX_HEADERS + mtu, MAX_FRAME)


def frame_header(body_len: int) -> bytes:
    """The length prefix of a frame whose body is ``body_len`` bytes."""
    if not BTH_LEN <= body_len <= MAX_FRAME:
        raise LocalWireError(f"frame body of {body_len} bytes is out of range")
    return FRAME_HEADER.pack(body_len)


class FrameDecoder:
    """Incremental frame parser: ``feed`` bytes, then take ``next_frame`` until None.

    A length outside ``[BTH_LEN, max_body]`` (``max_body`` defaults to
    ``MAX_FRAME``; give ``max_frame_body(mtu)`` when the MTU is known) raises
    :class:`WireError` (the peer's fault) as soon as its 4 bytes are in, before
    the body arrives; the stream cannot be resynchronised after that, and every
    later ``next_frame`` raises again.
    """

    __slots__ = ("_buf", "_max", "_pos")

    def __init__(self, max_body: int = MAX_FRAME) -> None:
        if not BTH_LEN <= max_body <= MAX_FRAME:
            raise LocalWireError(f"max_body {max_body} is outside [{BTH_LEN}, {MAX_FRAME}]")
        self._buf = bytearray()
        self._max = max_body
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        try:
            self._buf += data
        except (TypeError, ValueError, BufferError) as e:
            raise LocalWireError(f"feed() takes a byte buffer: {e}") from None

    def next_frame(self) -> bytes | None:
        """The next whole frame body, or None if more bytes are needed."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (n,) = FRAME_HEADER.unpack_from(buf, pos)
        if not BTH_LEN <= n <= self._max:
            raise WireError(f"frame length {n} is out of range [{BTH_LEN}, {self._max}]")
        end = pos + 4 + n
        if len(buf) < end:
            return None
        self._pos = end
        with memoryview(buf) as mv, mv[pos + 4 : end] as body:
            return bytes(body)

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet returned as frames."""
        return len(self._buf) - self._pos
