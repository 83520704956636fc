"""RoCEv2 datagrams inside captured link-layer frames (for capture and decoding).

`parse_frame` takes a frame as a capture holds it (pcap link types Ethernet,
Linux cooked v1/v2, raw IP, BSD loopback) and returns the RoCEv2 datagram it
carries, with everything the ICRC covers, or None for other traffic. IPv4
packets with options are returned with ``icrc_ok`` None: rxe assumes a
20-byte header, so their ICRC is undefined. A UD SEND ONLY (the connection
manager's QP1 traffic) is decoded with its DETH (`rdmakit.wire.ud`) and, when
its payload is a CM MAD, the MAD (`rdmakit.wire.cm`); `describe_ud` prints
both with every field the message sets.
"""

import struct
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address

from .cm import CmaHeader, CmAttr, CmMad, RejReason, decode_cm
from .errors import WireError
from .icrc import IP_PROTO_UDP, ROCE_UDP_PORT, icrc_of_ip_packet, unpack_icrc
from .packet import BTH_LEN, ICRC_LEN, Packet, decode
from .ud import GSI_QPN, UD_SEND_ONLY, UdSend, decode_ud_send

LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_LINUX_SLL2 = 276
_ETH_IPV4, _ETH_IPV6, _ETH_VLAN = 0x0800, 0x86DD, 0x8100


@dataclass(frozen=True, slots=True, kw_only=True)
class RoceDatagram:
    """One RoCEv2 packet as seen on the wire."""

    src: IPv4Address | IPv6Address
    dst: IPv4Address | IPv6Address
    sport: int
    dport: int
    ip_id: int | None  # IPv4 only
    df: bool | None
    packet: Packet | None  # None when the BTH and what follows do not decode (or a UD SEND)
    error: str  # why neither ``packet`` nor ``ud`` is there
    icrc: int
    icrc_ok: bool | None  # None when the ICRC is undefined (IPv4 options)
    ud: UdSend | None = None  # a UD SEND ONLY with its DETH
    mad: CmMad | None = None  # the CM MAD a UD SEND to QP1 carries
    mad_error: str = ""  # why a QP1 payload is not a CM MAD

    @property
    def decoded(self) -> bool:
        return self.packet is not None or self.ud is not None


def _ip_offset(linktype: int, frame: bytes) -> int | None:
    if linktype == LINKTYPE_ETHERNET:
        if len(frame) < 14:
            return None
        off, (etype,) = 14, struct.unpack_from("!H", frame, 12)
        while etype == _ETH_VLAN and len(frame) >= off + 4:
            (etype,) = struct.unpack_from("!H", frame, off + 2)
            off += 4
        return off if etype in (_ETH_IPV4, _ETH_IPV6) else None
    if linktype == LINKTYPE_LINUX_SLL:
        return (
            16
            if len(frame) >= 16 and struct.unpack_from("!H", frame, 14)[0] in (_ETH_IPV4, _ETH_IPV6)
            else None
        )
    if linktype == LINKTYPE_LINUX_SLL2:
        return (
            20
            if len(frame) >= 20 and struct.unpack_from("!H", frame, 0)[0] in (_ETH_IPV4, _ETH_IPV6)
            else None
        )
    if linktype == LINKTYPE_RAW:
        return 0
    if linktype == LINKTYPE_NULL:
        return 4 if len(frame) >= 4 else None
    return None


def parse_frame(linktype: int, frame: bytes, port: int = ROCE_UDP_PORT) -> RoceDatagram | None:
    """The RoCEv2 datagram in ``frame`` (UDP to ``port``), or None for anything else."""
    off = _ip_offset(linktype, frame)
    if off is None or len(frame) < off + 1:
        return None
    version = frame[off] >> 4
    ip_id: int | None = None
    df: bool | None = None
    if version == 4:
        if len(frame) < off + 20:
            return None
        ihl = (frame[off] & 0x0F) * 4
        total, ident, flags_frag, proto = struct.unpack_from("!2xHHHxB", frame, off)
        if proto != IP_PROTO_UDP or flags_frag & 0x3FFF:  # not UDP, or a fragment
            return None
        ip_id, df = ident, bool(flags_frag & 0x4000)
        src, dst = ip_address(frame[off + 12 : off + 16]), ip_address(frame[off + 16 : off + 20])
        end, udp = off + total, off + ihl
    elif version == 6:
        if len(frame) < off + 40 or frame[off + 6] != IP_PROTO_UDP:
            return None
        (plen,) = struct.unpack_from("!H", frame, off + 4)
        src, dst = ip_address(frame[off + 8 : off + 24]), ip_address(frame[off + 24 : off + 40])
        end, udp, ihl = off + 40 + plen, off + 40, 40
    else:
        return None
    if len(frame) < end or end < udp + 8:
        return None
    sport, dport = struct.unpack_from("!HH", frame, udp)
    if dport != port:
        return None
    body = frame[udp + 8 : end]
    if len(body) < BTH_LEN + ICRC_LEN:
        return RoceDatagram(src=src, dst=dst, sport=sport, dport=dport, ip_id=ip_id, df=df, packet=None,
                            error="shorter than a BTH and an ICRC", icrc=0, icrc_ok=False)  # fmt: skip
    icrc = unpack_icrc(body)
    icrc_ok: bool | None = None
    if version == 6 or ihl == 20:
        icrc_ok = icrc_of_ip_packet(frame[off : end - ICRC_LEN]) == icrc
    pkt: Packet | None = None
    ud: UdSend | None = None
    mad: CmMad | None = None
    error = mad_error = ""
    try:
        if body[0] == UD_SEND_ONLY:
            ud = decode_ud_send(body[:-ICRC_LEN])
            if ud.dest_qp == GSI_QPN:
                try:
                    mad = decode_cm(ud.payload)
                except WireError as e:
                    mad_error = str(e)
        else:
            pkt = decode(body[:-ICRC_LEN])
    except WireError as e:
        error = str(e)
    return RoceDatagram(src=src, dst=dst, sport=sport, dport=dport, ip_id=ip_id, df=df, packet=pkt,
                        error=error, icrc=icrc, icrc_ok=icrc_ok, ud=ud, mad=mad,
                        mad_error=mad_error)  # fmt: skip


def describe_ud(ud: UdSend, mad: CmMad | None, mad_error: str = "") -> str:
    """One line of a UD SEND ONLY: BTH, DETH and, to QP1, the CM MAD with every field it sets
    (IBTA §9.3.3 DETH; §12.6 the CM messages, their fields named as in `rdmakit.wire.cm`)."""
    parts = [
        f"UD_SEND_ONLY QP={ud.dest_qp:#08x} PSN={ud.psn}",
        f"DETH(qkey={ud.qkey:#010x} src_qp={ud.src_qp:#08x})",
    ]
    if mad is None:
        if mad_error:
            parts.append(f"MAD?({mad_error})")
        parts.append(f"payload={len(ud.payload)}")
        return " ".join(parts)
    fields = [f"tid={mad.tid:#x}"] + [
        f"{name}={_field_text(mad.attr, name, value)}" for name, value in mad.values.items()
    ]
    if mad.attr is CmAttr.REQ:
        try:
            h = CmaHeader.decode(mad.private_data)
            fields.append(f"cma_hdr(src={h.src}:{h.src_port} dst={h.dst})")
        except WireError:
            pass
    used = len(mad.private_data.rstrip(b"\0"))
    if used:
        fields.append(f"private_data={used}")
    parts.append(f"CM {mad.attr.name}({' '.join(fields)})")
    return " ".join(parts)


def _field_text(attr: CmAttr, name: str, value: int) -> str:
    if attr is CmAttr.REJ and name == "reason":
        try:
            return f"{value}({RejReason(value).name})"
        except ValueError:
            return str(value)
    if name.endswith("_gid"):
        gid = IPv6Address(value)
        return f"::ffff:{gid.ipv4_mapped}" if gid.ipv4_mapped is not None else str(gid)
    if name.endswith(("guid", "service_id", "comm_id", "qpn", "qkey", "psn")):
        return f"{value:#x}"
    return str(value)


def describe(pkt: Packet) -> str:
    """One line of a packet's transport headers, in the IBTA's names."""
    from .packet import parse_syndrome

    parts = [f"{pkt.opcode.name} QP={pkt.dest_qp:#08x} PSN={pkt.psn}"]
    if pkt.ackreq:
        parts.append("A")
    if pkt.se:
        parts.append("SE")
    if pkt.reth is not None:
        parts.append(f"RETH(va={pkt.reth.va:#x} rkey={pkt.reth.rkey:#x} len={pkt.reth.dma_len})")
    if pkt.aeth is not None:
        try:
            kind, value = parse_syndrome(pkt.aeth.syndrome)
            parts.append(f"AETH({kind.name} {value:#04x} MSN={pkt.aeth.msn})")
        except WireError:
            parts.append(f"AETH(syndrome={pkt.aeth.syndrome:#04x} MSN={pkt.aeth.msn})")
    if pkt.atomic_eth is not None:
        a = pkt.atomic_eth
        parts.append(f"AtomicETH(va={a.va:#x} rkey={a.rkey:#x} swap_add={a.swap_add} compare={a.compare})")
    if pkt.atomic_ack is not None:
        parts.append(f"AtomicAckETH(orig={pkt.atomic_ack})")
    if pkt.imm is not None:
        parts.append(f"ImmDt={pkt.imm:#010x}")
    if pkt.ieth is not None:
        parts.append(f"IETH(rkey={pkt.ieth:#x})")
    if len(pkt.payload):
        parts.append(f"payload={len(pkt.payload)}")
    return " ".join(parts)
