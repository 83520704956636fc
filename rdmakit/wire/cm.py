"""Communication Management MADs (IBTA Vol. 1 ch. 12, §13.4 MAD header): a table-driven codec.

Every CM message is a 256-byte MAD sent to QP1: a 24-byte MAD header (base
version 1, management class 0x07, class version 2, method SEND 0x03, the
transaction ID and the attribute ID naming the message), then 232 bytes of
message. Each message's fields are one row of `LAYOUTS` in the notation of
the IBTA tables (Table 106 REQ, 107 MRA, 108 REJ, 110 REP, 111 RTU, 112 DREQ,
113 DREP): byte offset, bit offset from the byte's most significant bit,
width in bits, all big-endian, offsets counted from the end of the MAD
header. The same table encodes and decodes, so a field has one place.

The decoder is for hostile input: anything but exactly one CM MAD of a known
attribute raises `WireError`. The encoder checks every value fits its field
(`LocalWireError`). Fields a message omits are zero; private data is padded
with zeros to the message's private-data length.

`CmaHeader` is the 36-byte header ``rdma_cm`` puts at the start of a REQ's
private data (Linux ``cma.c``, ``struct cma_hdr``): version 0, the IP version
in the high nibble of byte 1, the source port, then the source and
destination addresses (IPv4 in the last 4 of 16 bytes, zeros before).
`service_id` builds the 64-bit service ID of an ``rdma_cm`` port space and port.
"""

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from ipaddress import IPv4Address, IPv6Address, ip_address
from types import MappingProxyType
from typing import NamedTuple

from .errors import LocalWireError, WireError

__all__ = [
    "CMA_HDR_LEN",
    "CM_CLASS",
    "CM_CLASS_VERSION",
    "LAYOUTS",
    "MAD_LEN",
    "MAX_ACCEPT_PRIVATE",
    "MAX_CONNECT_PRIVATE",
    "MAX_REJECT_PRIVATE",
    "CmAttr",
    "CmMad",
    "CmaHeader",
    "Field",
    "Layout",
    "PortSpace",
    "RejReason",
    "check_cm_header",
    "decode_cm",
    "encode_cm",
    "service_id",
]

MAD_LEN = 256
MAD_HDR_LEN = 24
CM_DATA_LEN = MAD_LEN - MAD_HDR_LEN
BASE_VERSION = 1
CM_CLASS = 0x07
CM_CLASS_VERSION = 2
METHOD_SEND = 0x03
_MAD_HDR = struct.Struct("!BBBBHHQHHI")


class CmAttr(IntEnum):
    """CM attribute IDs (IBTA Table 104; Linux ``ib_cm.h``)."""

    REQ = 0x10
    MRA = 0x11
    REJ = 0x12
    REP = 0x13
    RTU = 0x14
    DREQ = 0x15
    DREP = 0x16
    SIDR_REQ = 0x17
    SIDR_REP = 0x18


class RejReason(IntEnum):
    """REJ reasons this stack sends or meets (IBTA Table 109; Linux ``enum ib_cm_rej_reason``)."""

    NO_QP = 1
    NO_EEC = 2
    NO_RESOURCES = 3
    TIMEOUT = 4
    UNSUPPORTED_REQ = 5
    INVALID_COMM_ID = 6
    INVALID_COMM_INSTANCE = 7
    INVALID_SERVICE_ID = 8  # no listener
    INVALID_TRANSPORT_TYPE = 9
    STALE_CONN = 10
    RDC_NOT_EXIST = 11
    INVALID_GID = 12
    INVALID_LID = 13
    INVALID_SL = 14
    INVALID_TRAFFIC_CLASS = 15
    INVALID_HOP_LIMIT = 16
    INVALID_PACKET_RATE = 17
    INVALID_ALT_GID = 18
    PORT_CM_REDIRECT = 24
    INVALID_MTU = 26
    INSUFFICIENT_RESP_RESOURCES = 27
    CONSUMER_DEFINED = 28  # rdma_reject
    INVALID_RNR_RETRY = 29
    DUPLICATE_LOCAL_COMM_ID = 30
    INVALID_CLASS_VERSION = 31
    INVALID_FLOW_LABEL = 32
    INVALID_ALT_FLOW_LABEL = 33


class Field(NamedTuple):
    """One row of an IBTA message table: ``byte[bit]``, `bits` wide, big-endian."""

    name: str
    byte: int
    bit: int
    bits: int


class Layout(NamedTuple):
    """A message: its fields and where its private data lies."""

    fields: tuple[Field, ...]
    private_offset: int
    private_len: int


def _f(name: str, byte: int, bits: int, bit: int = 0) -> Field:
    return Field(name, byte, bit, bits)


_COMM_IDS = (_f("local_comm_id", 0, 32), _f("remote_comm_id", 4, 32))

#: The messages, from the IBTA tables named above (offsets after the MAD header).
LAYOUTS: Mapping[CmAttr, Layout] = MappingProxyType(
    {
        CmAttr.REQ: Layout(
            (
                _f("local_comm_id", 0, 32),
                _f("vendor_id", 5, 24),
                _f("service_id", 8, 64),
                _f("local_ca_guid", 16, 64),
                _f("local_qkey", 28, 32),
                _f("local_qpn", 32, 24),
                _f("responder_resources", 35, 8),
                _f("local_eecn", 36, 24),
                _f("initiator_depth", 39, 8),
                _f("remote_eecn", 40, 24),
                _f("remote_cm_response_timeout", 43, 5),
                _f("transport_type", 43, 2, bit=5),
                _f("e2e_flow_control", 43, 1, bit=7),
                _f("starting_psn", 44, 24),
                _f("local_cm_response_timeout", 47, 5),
                _f("retry_count", 47, 3, bit=5),
                _f("pkey", 48, 16),
                _f("path_mtu", 50, 4),
                _f("rdc_exists", 50, 1, bit=4),
                _f("rnr_retry_count", 50, 3, bit=5),
                _f("max_cm_retries", 51, 4),
                _f("srq", 51, 1, bit=4),
                _f("extended_transport_type", 51, 3, bit=5),
                _f("primary_local_lid", 52, 16),
                _f("primary_remote_lid", 54, 16),
                _f("primary_local_gid", 56, 128),
                _f("primary_remote_gid", 72, 128),
                _f("primary_flow_label", 88, 20),
                _f("primary_packet_rate", 91, 6, bit=2),
                _f("primary_traffic_class", 92, 8),
                _f("primary_hop_limit", 93, 8),
                _f("primary_sl", 94, 4),
                _f("primary_subnet_local", 94, 1, bit=4),
                _f("primary_local_ack_timeout", 95, 5),
                _f("alternate_local_lid", 96, 16),
                _f("alternate_remote_lid", 98, 16),
                _f("alternate_local_gid", 100, 128),
                _f("alternate_remote_gid", 116, 128),
                _f("alternate_flow_label", 132, 20),
                _f("alternate_packet_rate", 135, 6, bit=2),
                _f("alternate_traffic_class", 136, 8),
                _f("alternate_hop_limit", 137, 8),
                _f("alternate_sl", 138, 4),
                _f("alternate_subnet_local", 138, 1, bit=4),
                _f("alternate_local_ack_timeout", 139, 5),
                _f("sap_supported", 139, 1, bit=5),
            ),
            140,
            92,
        ),
        CmAttr.MRA: Layout(
            (*_COMM_IDS, _f("message_mraed", 8, 2), _f("service_timeout", 9, 5)),
            10,
            222,
        ),
        CmAttr.REJ: Layout(
            (
                *_COMM_IDS,
                _f("message_rejected", 8, 2),
                _f("rejected_info_length", 9, 7),
                _f("reason", 10, 16),
                _f("ari", 12, 576),
            ),
            84,
            148,
        ),
        CmAttr.REP: Layout(
            (
                *_COMM_IDS,
                _f("local_qkey", 8, 32),
                _f("local_qpn", 12, 24),
                _f("vendor_id_h", 15, 8),
                _f("local_eecn", 16, 24),
                _f("vendor_id_m", 19, 8),
                _f("starting_psn", 20, 24),
                _f("vendor_id_l", 23, 8),
                _f("responder_resources", 24, 8),
                _f("initiator_depth", 25, 8),
                _f("target_ack_delay", 26, 5),
                _f("failover_accepted", 26, 2, bit=5),
                _f("e2e_flow_control", 26, 1, bit=7),
                _f("rnr_retry_count", 27, 3),
                _f("srq", 27, 1, bit=3),
                _f("local_ca_guid", 28, 64),
            ),
            36,
            196,
        ),
        CmAttr.RTU: Layout(_COMM_IDS, 8, 224),
        CmAttr.DREQ: Layout((*_COMM_IDS, _f("remote_qpn", 8, 24)), 12, 220),
        CmAttr.DREP: Layout(_COMM_IDS, 8, 224),
        CmAttr.SIDR_REQ: Layout(
            (_f("request_id", 0, 32), _f("pkey", 4, 16), _f("service_id", 8, 64)), 16, 216
        ),
        CmAttr.SIDR_REP: Layout(
            (
                _f("request_id", 0, 32),
                _f("status", 4, 8),
                _f("additional_info_length", 5, 8),
                _f("vendor_id_h", 6, 16),
                _f("qpn", 8, 24),
                _f("vendor_id_l", 11, 8),
                _f("service_id", 12, 64),
                _f("qkey", 20, 32),
                _f("additional_info", 24, 576),
            ),
            96,
            136,
        ),
    }
)


def _names(layout: Layout) -> frozenset[str]:
    return frozenset(f.name for f in layout.fields)


_NAMES = {attr: _names(layout) for attr, layout in LAYOUTS.items()}


@dataclass(frozen=True, slots=True)
class CmMad:
    """One CM message: its attribute, transaction ID, field values and private data."""

    attr: CmAttr
    tid: int
    values: Mapping[str, int] = field(default_factory=dict)
    private_data: bytes = b""
    status: int = 0
    attr_mod: int = 0

    def __getitem__(self, name: str) -> int:
        """A field's value (0 when not given); KeyError for a field the message does not have."""
        if name not in _NAMES[self.attr]:
            raise KeyError(f"{self.attr.name} has no field {name!r}")
        return self.values.get(name, 0)


def _put(buf: bytearray, f: Field, value: int) -> None:
    span = (f.bit + f.bits + 7) // 8
    shift = span * 8 - f.bit - f.bits
    mask = ((1 << f.bits) - 1) << shift
    start = MAD_HDR_LEN + f.byte
    word = int.from_bytes(buf[start : start + span], "big")
    word = (word & ~mask) | (value << shift)
    buf[start : start + span] = word.to_bytes(span, "big")


def _get(data: memoryview, f: Field) -> int:
    span = (f.bit + f.bits + 7) // 8
    start = MAD_HDR_LEN + f.byte
    word = int.from_bytes(data[start : start + span], "big")
    return (word >> (span * 8 - f.bit - f.bits)) & ((1 << f.bits) - 1)


def encode_cm(mad: CmMad) -> bytes:
    """The 256-byte MAD; `LocalWireError` for an unknown field or a value that does not fit."""
    try:
        layout = LAYOUTS[CmAttr(mad.attr)]
    except (ValueError, KeyError):
        raise LocalWireError(f"{mad.attr!r} is not a CM attribute") from None
    unknown = set(mad.values) - _NAMES[CmAttr(mad.attr)]
    if unknown:
        raise LocalWireError(f"{CmAttr(mad.attr).name} has no field(s) {', '.join(sorted(unknown))}")
    if len(mad.private_data) > layout.private_len:
        raise LocalWireError(
            f"{CmAttr(mad.attr).name} private data is at most {layout.private_len} bytes, "
            f"got {len(mad.private_data)}"
        )
    for name, top in (("tid", 64), ("status", 16), ("attr_mod", 32)):
        value = getattr(mad, name)
        if type(value) is not int or not 0 <= value < 1 << top:
            raise LocalWireError(f"MAD {name} {value!r} does not fit in {top} bits")
    buf = bytearray(MAD_LEN)
    _MAD_HDR.pack_into(
        buf, 0, BASE_VERSION, CM_CLASS, CM_CLASS_VERSION, METHOD_SEND, mad.status, 0, mad.tid, mad.attr, 0,
        mad.attr_mod,
    )  # fmt: skip
    for f in layout.fields:
        value = mad.values.get(f.name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << f.bits:
            raise LocalWireError(f"{CmAttr(mad.attr).name}.{f.name} {value!r} does not fit in {f.bits} bits")
        if value:
            _put(buf, f, int(value))
    start = MAD_HDR_LEN + layout.private_offset
    buf[start : start + len(mad.private_data)] = mad.private_data
    return bytes(buf)


def check_cm_header(view: memoryview) -> CmAttr:
    """The attribute of a CM MAD's common header (IBTA §13.4.2), the cheap part of `decode_cm`:
    length, base version, class, class version, method; `WireError` for anything else."""
    if len(view) != MAD_LEN:
        raise WireError(f"a MAD is {MAD_LEN} bytes, got {len(view)}")
    base, mclass, cversion, method, _, _, _, attr_id, _, _ = _MAD_HDR.unpack_from(view)
    if base != BASE_VERSION:
        raise WireError(f"MAD base version {base} is not {BASE_VERSION}")
    if mclass != CM_CLASS:
        raise WireError(f"management class {mclass:#04x} is not CM ({CM_CLASS:#04x})")
    if cversion != CM_CLASS_VERSION:
        raise WireError(f"CM class version {cversion} is not {CM_CLASS_VERSION}")
    if method != METHOD_SEND:
        raise WireError(f"MAD method {method:#04x} is not SEND")
    try:
        return CmAttr(attr_id)
    except ValueError:
        raise WireError(f"CM attribute {attr_id:#06x} is unknown") from None


def decode_cm(data: bytes | bytearray | memoryview) -> CmMad:
    """One CM MAD from a UD payload; `WireError` unless it is exactly that."""
    view = memoryview(data).cast("B")
    attr = check_cm_header(view)
    _, _, _, _, status, _, tid, _, _, attr_mod = _MAD_HDR.unpack_from(view)
    layout = LAYOUTS[attr]
    values = {f.name: v for f in layout.fields if (v := _get(view, f))}
    start = MAD_HDR_LEN + layout.private_offset
    private = bytes(view[start : start + layout.private_len])
    return CmMad(attr, tid, MappingProxyType(values), private, status, attr_mod)


# -- rdma_cm ----------------------------------------------------------------------------------------


class PortSpace(IntEnum):
    """``enum rdma_ucm_port_space`` (librdmacm ``rdma_cma.h``)."""

    IPOIB = 0x0002
    TCP = 0x0106
    UDP = 0x0111
    IB = 0x013F


def service_id(ps: PortSpace, port: int) -> int:
    """The CM service ID of an ``rdma_cm`` listener: ``ps << 16 | port`` (``cma.c`` cma_get_service_id)."""
    if type(port) is not int or not 0 <= port <= 0xFFFF:
        raise LocalWireError(f"port {port!r} is not a 16-bit port")
    return (int(ps) << 16) | port


CMA_HDR_LEN = 36
_CMA_HDR = struct.Struct("!BBH16s16s")
#: The user's private data in ``rdma_cm``'s TCP port space (``rdma_connect(3)``, ``rdma_accept(3)``,
#: ``rdma_reject(3)``): a REQ's less the `CmaHeader` before it, a REP's and a REJ's whole.
MAX_CONNECT_PRIVATE = LAYOUTS[CmAttr.REQ].private_len - CMA_HDR_LEN
MAX_ACCEPT_PRIVATE = LAYOUTS[CmAttr.REP].private_len
MAX_REJECT_PRIVATE = LAYOUTS[CmAttr.REJ].private_len


class CmaHeader(NamedTuple):
    """``struct cma_hdr``: the first 36 bytes of an ``rdma_cm`` REQ's private data."""

    src: IPv4Address | IPv6Address
    dst: IPv4Address | IPv6Address
    src_port: int

    def encode(self) -> bytes:
        src, dst = ip_address(self.src), ip_address(self.dst)
        if src.version != dst.version:
            raise LocalWireError("cma_hdr addresses must be of one IP version")
        if type(self.src_port) is not int or not 0 <= self.src_port <= 0xFFFF:
            raise LocalWireError(f"cma_hdr port {self.src_port!r} is not a 16-bit port")
        return _CMA_HDR.pack(0, src.version << 4, self.src_port, _addr16(src), _addr16(dst))

    @classmethod
    def decode(cls, private_data: bytes | bytearray | memoryview) -> "CmaHeader":
        """From a REQ's private data; `WireError` if it does not start with a version-0 header."""
        view = memoryview(private_data).cast("B")
        if len(view) < CMA_HDR_LEN:
            raise WireError(f"cma_hdr needs {CMA_HDR_LEN} bytes, got {len(view)}")
        version, ipv, port, src, dst = _CMA_HDR.unpack_from(view)
        if version != 0:
            raise WireError(f"cma_hdr version {version} is not 0")
        ip_version = ipv >> 4
        if ip_version == 4:
            if any(src[:12]) or any(dst[:12]):
                raise WireError("cma_hdr IPv4 addresses must have 12 zero bytes before them")
            return cls(IPv4Address(src[12:]), IPv4Address(dst[12:]), port)
        if ip_version == 6:
            return cls(IPv6Address(src), IPv6Address(dst), port)
        raise WireError(f"cma_hdr IP version {ip_version} is neither 4 nor 6")


def _addr16(addr: IPv4Address | IPv6Address) -> bytes:
    return addr.packed if addr.version == 6 else bytes(12) + addr.packed
