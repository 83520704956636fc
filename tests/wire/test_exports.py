"""The public façade of rdmakit.wire (trio's test_exports, in small)."""

import types

import rdmakit.wire as wire
from rdmakit.wire import errors, framing, icrc, opcodes, packet, psn

#: What other layers code against (docs/architecture.md §1): it may grow, never shrink.
STABLE = {
    "AETH", "BTH_LEN", "CRC32_IMPL", "CREDITS_UNLIMITED", "DEFAULT_PKEY", "FRAME_HEADER",
    "ICRC_LEN", "MAX_FRAME", "MIDDLE_OPCODES", "OPCODE_INFO", "PSN_BITS", "PSN_HALF", "PSN_MASK", "RETH",
    "ROCE_UDP_PORT", "AckKind", "AtomicETH", "FrameDecoder", "Kind", "NakCode", "OpInfo",
    "Opcode", "Packet", "Payload", "Position", "WireError", "ack_syndrome", "crc32", "decode",
    "encode", "encode_headers", "frame_header", "icrc_ipv4", "icrc_ipv6", "icrc_of_ip_packet",
    "nak_syndrome", "pack_icrc", "pad_bytes", "pad_len", "parse_syndrome", "psn_add",
    "psn_diff", "rnr_syndrome", "unpack_icrc",
}  # fmt: skip


def test_all_names_exist_and_are_unique() -> None:
    assert len(wire.__all__) == len(set(wire.__all__))
    for name in wire.__all__:
        assert hasattr(wire, name), name


def test_stable_names_are_still_exported() -> None:
    assert set(wire.__all__) >= STABLE


def test_every_public_name_of_the_modules_is_reexported() -> None:
    for mod in (errors, framing, icrc, opcodes, packet, psn):
        for name, value in vars(mod).items():
            if name.startswith("_") or isinstance(value, types.ModuleType):
                continue
            if getattr(value, "__module__", mod.__name__) != mod.__name__:
                continue  # imported from elsewhere
            if name in {"Crc32"}:  # a type alias for annotations only
                continue
            assert name in wire.__all__, f"{mod.__name__}.{name} is public but not in rdmakit.wire"


def test_error_hierarchy() -> None:
    assert issubclass(wire.WireError, ValueError)
    assert issubclass(wire.LocalWireError, wire.WireError)
