"""The out-of-band messages of ``ibv_rc_pingpong`` and perftest, as bytes.

Pure functions: each message has a fixed length, is built exactly as the C
tools build it, and is parsed strictly: anything but the exact format (length,
separators, hex digit counts, terminating NUL) raises `OobFormatError`, whose
text is one line naming the message. No socket here (``rdmakit.transport.oob``
moves the bytes).

Sources: rdma-core ``libibverbs/examples/rc_pingpong.c`` (``pp_client_exch_dest``,
``pp_server_exch_dest``) and ``pingpong.c`` (``gid_to_wire_gid``); perftest
``src/perftest_communication.c`` (``ethernet_write_keys``/``ethernet_read_keys``,
``exchange_versions``, ``check_sys_data``, ``check_mtu``, ``xchg_bw_reports``,
``ctx_close_connection``) and ``perftest_communication.h`` (``KEY_PRINT_FMT_GID``,
``KEY_MSG_SIZE_GID``), at tag v4.5-0.17 (Debian bookworm's perftest 4.5+0.17,
which announces version 6.06) and v6.29.
"""

import math
import re
import struct
from dataclasses import dataclass
from ipaddress import IPv6Address

__all__ = [
    "ANNOUNCED_VERSION",
    "BW_REPORT_PARTS",
    "DONE",
    "KEY_MSG_LEN",
    "MIN_PEER_VERSION",
    "MTU_MSG_LEN",
    "PINGPONG_MSG_LEN",
    "SYS_INT_LEN",
    "VERSION_LEN",
    "BwReport",
    "OobFormatError",
    "PerftestDest",
    "PingpongDest",
    "decode_mtu",
    "decode_sys_int",
    "decode_version",
    "encode_mtu",
    "encode_sys_int",
    "encode_version",
    "ib_mtu_bytes",
    "ib_mtu_enum",
    "version_value",
]


class OobFormatError(ValueError):
    """A peer's out-of-band message is not in the format the tools use."""


# -- ibv_rc_pingpong ----------------------------------------------------------------------

#: ``sizeof "0000:000000:000000:00000000000000000000000000000000"``: the text and its NUL.
PINGPONG_MSG_LEN = 52
#: What the client writes after reading the server's message (``sizeof "done"``).
DONE = b"done\0"
_PINGPONG_RE = re.compile(rb"([0-9a-f]{4}):([0-9a-f]{6}):([0-9a-f]{6}):([0-9a-f]{32})\0", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class PingpongDest:
    """``struct pingpong_dest`` of rc_pingpong.c: LID, QPN, PSN and GID (zero: none)."""

    lid: int
    qpn: int
    psn: int
    gid: IPv6Address

    def encode(self) -> bytes:
        """``sprintf("%04x:%06x:%06x:%s")`` with ``gid_to_wire_gid`` (the raw GID in hex), NUL."""
        _check_range("LID", self.lid, 16)
        _check_range("QPN", self.qpn, 24)
        _check_range("PSN", self.psn, 24)
        text = f"{self.lid:04x}:{self.qpn:06x}:{self.psn:06x}:{self.gid.packed.hex()}"
        return text.encode() + b"\0"

    @classmethod
    def decode(cls, msg: bytes) -> "PingpongDest":
        if len(msg) != PINGPONG_MSG_LEN:
            raise OobFormatError(
                f"rc_pingpong address message: {len(msg)} bytes, expected {PINGPONG_MSG_LEN}"
            )
        m = _PINGPONG_RE.fullmatch(msg)
        if m is None:
            raise OobFormatError(f"rc_pingpong address message is not LID:QPN:PSN:GID: {_shown(msg)}")
        lid, qpn, psn, gid = m.groups()
        return cls(
            lid=int(lid, 16), qpn=int(qpn, 16), psn=int(psn, 16), gid=IPv6Address(bytes.fromhex(gid.decode()))
        )


# -- perftest -------------------------------------------------------------------------------

#: ``MAX_VERSION``: the version string travels in a 16-byte NUL-padded field.
VERSION_LEN = 16
#: The version rdmakit announces: Debian bookworm's perftest 4.5+0.17 reports
#: 6.06 (its configure.ac). Every peer from 5.70 on speaks to it with the same
#: steps, and a peer from 6.28 on skips its parameter-negotiation struct for
#: it (``negotiate_params``: ``rem_version < 6.28``), a raw C struct holding a
#: host-endian ``ibv_device_attr`` that has no fixed layout to check.
ANNOUNCED_VERSION = "6.06"
#: ``check_version_compatibility``: perftest refuses older peers.
MIN_PEER_VERSION = 5.70
#: ``check_sys_data``: cycle buffer and cache line size, each a big-endian int.
SYS_INT_LEN = 4
#: ``check_mtu`` with a peer from 5.31 on: ``sprintf("%d", enum ibv_mtu)`` in 2 bytes.
MTU_MSG_LEN = 2
#: ``KEY_MSG_SIZE_GID``: the key message with a GID, as on RoCE.
KEY_MSG_LEN = 108
_VERSION_RE = re.compile(rb"([0-9]{1,4}(?:\.[0-9]{1,6})?)[0-9A-Za-z.+~_-]{0,9}\0*")
_KEY_RE = re.compile(
    rb"([0-9a-f]{4}):([0-9a-f]{4}):([0-9a-f]{6}):([0-9a-f]{6}):([0-9a-f]{8}):([0-9a-f]{16}):"
    rb"((?:[0-9a-f]{2}:){16})([0-9a-f]{8}):\0",
    re.IGNORECASE,
)
#: ``enum ibv_mtu``: 1 → 256 bytes ... 5 → 4096.
_IB_MTU = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


def ib_mtu_enum(mtu: int) -> int:
    for k, v in _IB_MTU.items():
        if v == mtu:
            return k
    raise ValueError(f"{mtu} is not an IB MTU (256, 512, 1024, 2048, 4096)")


def ib_mtu_bytes(enum: int) -> int:
    return _IB_MTU[enum]


def encode_version(version: str = ANNOUNCED_VERSION) -> bytes:
    raw = version.encode()
    if len(raw) >= VERSION_LEN:
        raise ValueError(f"version {version!r} does not fit {VERSION_LEN} bytes with its NUL")
    return raw.ljust(VERSION_LEN, b"\0")


def decode_version(msg: bytes) -> str:
    """The peer's version string (digits and dots first, as ``atof`` reads it)."""
    if len(msg) != VERSION_LEN:
        raise OobFormatError(f"perftest version: {len(msg)} bytes, expected {VERSION_LEN}")
    if b"\0" not in msg:
        raise OobFormatError(f"perftest version is not NUL-terminated: {_shown(msg)}")
    m = _VERSION_RE.fullmatch(msg)
    if m is None:
        raise OobFormatError(f"perftest version is not a version number: {_shown(msg)}")
    return msg.split(b"\0", 1)[0].decode()


def version_value(version: str) -> float:
    """The number perftest compares (``atof``): "6.06" → 6.06."""
    m = re.match(r"[0-9]+(?:\.[0-9]*)?", version)
    if m is None:
        raise OobFormatError(f"perftest version {version!r} is not a number")
    return float(m.group())


def encode_sys_int(value: int) -> bytes:
    return struct.pack(">i", value)


def decode_sys_int(msg: bytes, what: str, limit: int) -> int:
    """One ``check_sys_data`` int, bounded by `limit` (a peer cannot make us allocate at will)."""
    if len(msg) != SYS_INT_LEN:
        raise OobFormatError(f"perftest {what}: {len(msg)} bytes, expected {SYS_INT_LEN}")
    (value,) = struct.unpack(">i", msg)
    if not 0 < value <= limit:
        raise OobFormatError(f"perftest {what} {value} is out of range (1..{limit})")
    return int(value)


def encode_mtu(mtu_bytes: int) -> bytes:
    return str(ib_mtu_enum(mtu_bytes)).encode() + b"\0"


def decode_mtu(msg: bytes) -> int:
    """The peer's active MTU in bytes."""
    if len(msg) != MTU_MSG_LEN or msg[1:] != b"\0" or msg[:1] not in (b"1", b"2", b"3", b"4", b"5"):
        raise OobFormatError(f"perftest MTU message is not an IB MTU enum: {_shown(msg)}")
    return _IB_MTU[int(msg[:1])]


@dataclass(frozen=True, slots=True, kw_only=True)
class PerftestDest:
    """perftest's ``struct pingpong_dest`` as the key message carries it on RoCE."""

    lid: int
    out_reads: int
    qpn: int
    psn: int
    rkey: int
    vaddr: int
    gid: IPv6Address
    srqn: int = 0

    def encode(self) -> bytes:
        """``sprintf(KEY_PRINT_FMT_GID, ...)`` and its NUL: 108 bytes."""
        _check_range("LID", self.lid, 16)
        _check_range("outstanding reads", self.out_reads, 16)
        _check_range("QPN", self.qpn, 24)
        _check_range("PSN", self.psn, 24)
        _check_range("rkey", self.rkey, 32)
        _check_range("address", self.vaddr, 64)
        _check_range("SRQN", self.srqn, 32)
        gid = "".join(f"{b:02x}:" for b in self.gid.packed)
        text = (
            f"{self.lid:04x}:{self.out_reads:04x}:{self.qpn:06x}:{self.psn:06x}:"
            f"{self.rkey:08x}:{self.vaddr:016x}:{gid}{self.srqn:08x}:"
        )
        out = text.encode() + b"\0"
        assert len(out) == KEY_MSG_LEN
        return out

    @classmethod
    def decode(cls, msg: bytes) -> "PerftestDest":
        if len(msg) != KEY_MSG_LEN:
            raise OobFormatError(f"perftest key message: {len(msg)} bytes, expected {KEY_MSG_LEN}")
        m = _KEY_RE.fullmatch(msg)
        if m is None:
            raise OobFormatError(f"perftest key message is not in KEY_PRINT_FMT_GID: {_shown(msg)}")
        lid, out_reads, qpn, psn, rkey, vaddr, gid, srqn = m.groups()
        return cls(
            lid=int(lid, 16),
            out_reads=int(out_reads, 16),
            qpn=int(qpn, 16),
            psn=int(psn, 16),
            rkey=int(rkey, 16),
            vaddr=int(vaddr, 16),
            gid=IPv6Address(bytes.fromhex(gid.replace(b":", b"").decode())),
            srqn=int(srqn, 16),
        )


#: ``xchg_bw_reports`` with a peer from 5.33 on: five separate exchanges,
#: ``size`` and ``iters`` as big-endian u64, then ``bw_peak``, ``bw_avg`` and
#: ``msgRate_avg`` as byte-swapped (big-endian) doubles.
BW_REPORT_PARTS = (("size", ">Q"), ("iters", ">Q"), ("bw_peak", ">d"), ("bw_avg", ">d"), ("msg_rate", ">d"))
#: Bounds for a peer's report (perftest's MAX_SIZE 8 MiB, MAX_ITER 10^8, times 2^14 QPs).
_MAX_REPORT_SIZE = 1 << 31
_MAX_REPORT_ITERS = 100_000_000 * 16384


@dataclass(frozen=True, slots=True, kw_only=True)
class BwReport:
    """``struct bw_report_data``: what a bw test measured (bandwidth in the report's unit)."""

    size: int
    iters: int
    bw_peak: float
    bw_avg: float
    msg_rate: float

    def parts(self) -> list[bytes]:
        return [struct.pack(fmt, getattr(self, name)) for name, fmt in BW_REPORT_PARTS]

    @classmethod
    def from_parts(cls, parts: list[bytes]) -> "BwReport":
        if len(parts) != len(BW_REPORT_PARTS):
            raise OobFormatError(f"perftest report: {len(parts)} fields, expected {len(BW_REPORT_PARTS)}")
        values: dict[str, float] = {}
        for (name, fmt), raw in zip(BW_REPORT_PARTS, parts, strict=True):
            if len(raw) != 8:
                raise OobFormatError(f"perftest report {name}: {len(raw)} bytes, expected 8")
            (values[name],) = struct.unpack(fmt, raw)
        size, iters = int(values["size"]), int(values["iters"])
        if not 0 < size <= _MAX_REPORT_SIZE or not 0 < iters <= _MAX_REPORT_ITERS:
            raise OobFormatError(f"perftest report: size {size} or iterations {iters} out of range")
        for name in ("bw_peak", "bw_avg", "msg_rate"):
            if not math.isfinite(values[name]) or values[name] < 0:
                raise OobFormatError(f"perftest report: {name} {values[name]} is not a rate")
        return cls(
            size=size,
            iters=iters,
            bw_peak=values["bw_peak"],
            bw_avg=values["bw_avg"],
            msg_rate=values["msg_rate"],
        )


def _check_range(what: str, value: int, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise ValueError(f"{what} {value:#x} does not fit {bits} bits")


def _shown(msg: bytes) -> str:
    """A peer's bytes made printable and short for a one-line error."""
    text = msg[:60].decode("ascii", "backslashreplace").encode("unicode_escape").decode()
    return repr(text + ("..." if len(msg) > 60 else ""))
