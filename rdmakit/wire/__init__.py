"""RoCEv2 wire format: opcodes, headers, packets, ICRC and stream framing."""

from .errors import LocalWireError, WireError
from .framing import FRAME_HEADER, MAX_FRAME, MAX_HEADERS, FrameDecoder, frame_header, max_frame_body
from .icrc import (
    CRC32_IMPL,
    IP_PROTO_UDP,
    ROCE_UDP_PORT,
    SEGMENT_IDS,
    IcrcFlow,
    crc32,
    icrc_ipv4,
    icrc_ipv6,
    icrc_of_ip_packet,
    pack_icrc,
    unpack_icrc,
)
from .opcodes import MIDDLE_OPCODES, OPCODE_INFO, Kind, Opcode, OpInfo, Position
from .packet import (
    AETH,
    BTH_LEN,
    CODEC_LAYOUTS,
    CREDIT_COUNTS,
    CREDITS_UNLIMITED,
    DEFAULT_PKEY,
    ICRC_LEN,
    RETH,
    AckKind,
    AtomicETH,
    NakCode,
    Packet,
    Payload,
    Train,
    ack_syndrome,
    credit_code,
    decode,
    encode,
    encode_headers,
    nak_syndrome,
    pad_bytes,
    pad_len,
    parse_syndrome,
    rnr_syndrome,
)
from .psn import PSN_BITS, PSN_HALF, PSN_MASK, psn_add, psn_diff

__all__ = [
    "AETH", "BTH_LEN", "CODEC_LAYOUTS", "CRC32_IMPL", "CREDITS_UNLIMITED", "CREDIT_COUNTS", "DEFAULT_PKEY",
    "FRAME_HEADER", "ICRC_LEN", "IP_PROTO_UDP", "MAX_FRAME", "MAX_HEADERS", "MIDDLE_OPCODES", "OPCODE_INFO",
    "PSN_BITS",
    "PSN_HALF", "PSN_MASK", "RETH", "ROCE_UDP_PORT", "SEGMENT_IDS", "AckKind", "AtomicETH", "FrameDecoder",
    "IcrcFlow", "Kind",
    "LocalWireError", "NakCode", "OpInfo", "Opcode", "Packet", "Payload", "Position", "Train", "WireError",
    "ack_syndrome", "crc32", "credit_code", "decode", "encode", "encode_headers", "frame_header",
    "icrc_ipv4", "icrc_ipv6", "icrc_of_ip_packet", "max_frame_body", "nak_syndrome", "pack_icrc", "pad_bytes",
    "pad_len",
    "parse_syndrome", "psn_add", "psn_diff", "rnr_syndrome", "unpack_icrc",
]  # fmt: skip
