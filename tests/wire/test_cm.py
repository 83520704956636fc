"""The CM MAD codec and UD SEND ONLY (IBTA Vol. 1 ch. 12, §9.3.3), checked against Wireshark's dissector.

tshark's InfiniBand dissector (``packet-infiniband.c``) is code nobody here
wrote: each message is encoded here, framed as RoCEv2 with a valid ICRC,
written to a pcap with scapy and decoded by tshark, field by field.
"""

import contextlib
import random
import shutil
import subprocess
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

import pytest

from rdmakit.wire import WireError, icrc_ipv4, pack_icrc
from rdmakit.wire.cm import (
    CM_CLASS,
    LAYOUTS,
    MAD_LEN,
    CmaHeader,
    CmAttr,
    CmMad,
    PortSpace,
    RejReason,
    decode_cm,
    encode_cm,
    service_id,
)
from rdmakit.wire.errors import LocalWireError
from rdmakit.wire.ud import GSI_QKEY, UdSend, decode_ud_send, encode_ud_send

CM_DATA = MAD_LEN - 24


def _random_mad(rng: random.Random, attr: CmAttr) -> CmMad:
    layout = LAYOUTS[attr]
    values = {f.name: rng.getrandbits(f.bits) for f in layout.fields}
    private = rng.randbytes(rng.randint(0, layout.private_len))
    return CmMad(attr, rng.getrandbits(64), values, private, rng.getrandbits(16), rng.getrandbits(32))


@pytest.mark.parametrize("attr", list(CmAttr))
def test_layouts_tile_the_message(attr: CmAttr) -> None:
    """Fields do not overlap, lie before the private data, and private data ends the 232 bytes."""
    layout = LAYOUTS[attr]
    bits: set[int] = set()
    for f in layout.fields:
        span = set(range(f.byte * 8 + f.bit, f.byte * 8 + f.bit + f.bits))
        assert not span & bits, f.name
        assert max(span) < layout.private_offset * 8, f.name
        bits |= span
    assert layout.private_offset + layout.private_len == CM_DATA


@pytest.mark.parametrize("attr", list(CmAttr))
def test_round_trip(attr: CmAttr) -> None:
    rng = random.Random(int(attr))
    for _ in range(50):
        mad = _random_mad(rng, attr)
        data = encode_cm(mad)
        assert len(data) == MAD_LEN
        back = decode_cm(data)
        assert (back.attr, back.tid, back.status, back.attr_mod) == (
            mad.attr,
            mad.tid,
            mad.status,
            mad.attr_mod,
        )
        assert {k: back[k] for k in mad.values} == dict(mad.values)
        assert back.private_data == mad.private_data.ljust(LAYOUTS[attr].private_len, b"\0")


def test_encoder_refuses_what_does_not_fit() -> None:
    with pytest.raises(LocalWireError, match="local_qpn"):
        encode_cm(CmMad(CmAttr.REQ, 1, {"local_qpn": 1 << 24}))
    with pytest.raises(LocalWireError, match="no field"):
        encode_cm(CmMad(CmAttr.RTU, 1, {"local_qpn": 1}))
    with pytest.raises(LocalWireError, match="at most 92"):
        encode_cm(CmMad(CmAttr.REQ, 1, {}, bytes(93)))
    with pytest.raises(LocalWireError, match="tid"):
        encode_cm(CmMad(CmAttr.REQ, 1 << 64))
    with pytest.raises(KeyError):
        CmMad(CmAttr.RTU, 1)["local_qpn"]


def test_decoder_takes_only_cm_mads() -> None:
    """Hostile input: every malformed MAD is a WireError, never another exception."""
    good = encode_cm(CmMad(CmAttr.DREQ, 7, {"local_comm_id": 1}))
    bad = {
        "short": good[:-1],
        "long": good + b"\0",
        "base version": bytes([2]) + good[1:],
        "class": good[:1] + bytes([0x81]) + good[2:],
        "class version": good[:2] + bytes([1]) + good[3:],
        "method": good[:3] + bytes([0x81]) + good[4:],
        "attribute": good[:16] + b"\x00\x20" + good[18:],
    }
    for what, data in bad.items():
        with pytest.raises(WireError):
            decode_cm(data)
        assert what  # the case, in a failure's traceback
    rng = random.Random(5)
    for _ in range(2000):
        noise = bytearray(rng.randbytes(MAD_LEN))
        noise[:4] = bytes([1, CM_CLASS, 2, 3])
        with contextlib.suppress(WireError):
            decode_cm(noise)


def test_service_id_and_cma_header() -> None:
    """cma.c: rping's port 7174 in the TCP port space is service ID 0x0000000001061C06."""
    assert service_id(PortSpace.TCP, 7174) == 0x0000000001061C06
    hdr = CmaHeader(IPv4Address("10.77.0.1"), IPv4Address("10.77.0.2"), 40000)
    data = hdr.encode()
    assert data[:4] == bytes([0, 0x40]) + (40000).to_bytes(2, "big")
    assert data[4:20] == bytes(12) + bytes([10, 77, 0, 1])
    assert CmaHeader.decode(data + b"user data") == hdr
    v6 = CmaHeader(IPv6Address("fd00::1"), IPv6Address("fd00::2"), 1)
    assert CmaHeader.decode(v6.encode()) == v6
    for junk in (
        data[:35],
        bytes([1]) + data[1:],
        data[:1] + bytes([0x50]) + data[2:],
        data[:4] + b"\1" + data[5:],
    ):
        with pytest.raises(WireError):
            CmaHeader.decode(junk)


def test_ud_send_round_trip_and_refusals() -> None:
    pkt = UdSend(dest_qp=1, src_qp=1, qkey=GSI_QKEY, payload=b"abcde", psn=0x123456)
    data = encode_ud_send(pkt)
    assert len(data) == 12 + 8 + 8  # BTH, DETH, 5 bytes padded to 8
    assert decode_ud_send(data) == pkt
    with pytest.raises(WireError):
        decode_ud_send(data[:19])
    with pytest.raises(WireError):
        decode_ud_send(b"\x04" + data[1:])  # RC SEND ONLY
    with pytest.raises(LocalWireError):
        encode_ud_send(pkt._replace(src_qp=1 << 24))


# -- against Wireshark ------------------------------------------------------------------------------

SRC, DST = "10.77.0.1", "10.77.0.2"


def _tshark(tmp_path: Path, mad: CmMad, fields: list[str]) -> list[str]:
    scapy = pytest.importorskip("scapy.all")
    body = encode_ud_send(UdSend(dest_qp=1, src_qp=1, qkey=GSI_QKEY, payload=encode_cm(mad)))
    icrc = icrc_ipv4(IPv4Address(SRC).packed, IPv4Address(DST).packed, 0xD872, 4791, body, ident=1)
    frame = (
        scapy.Ether()
        / scapy.IP(src=SRC, dst=DST, id=1, flags="DF")
        / scapy.UDP(sport=0xD872, dport=4791)
        / scapy.Raw(body + pack_icrc(icrc))
    )
    path = tmp_path / "cm.pcap"
    scapy.wrpcap(str(path), [frame])
    args = ["tshark", "-r", str(path), "-T", "fields", "-E", "separator=|"]
    for f in fields:
        args += ["-e", f]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    return out.strip().split("|")


needs_tshark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")


def _gid(ip: str) -> int:
    """The RoCE GID of an IPv4 address: ::ffff:a.b.c.d."""
    return int.from_bytes(bytes(10) + b"\xff\xff" + IPv4Address(ip).packed, "big")


R = "infiniband.cm.req."


@needs_tshark
def test_tshark_reads_a_req_as_rdma_cm_sends_it(tmp_path: Path) -> None:
    mad = CmMad(
        CmAttr.REQ,
        0x0000_1234_AABB_CCDD,
        {
            "local_comm_id": 0xAABBCCDD,
            "service_id": service_id(PortSpace.TCP, 7174),
            "local_qpn": 0x000123,
            "responder_resources": 4,
            "initiator_depth": 3,
            "remote_cm_response_timeout": 22,
            "starting_psn": 0xABCDEF,
            "local_cm_response_timeout": 20,
            "retry_count": 7,
            "pkey": 0xFFFF,
            "path_mtu": 3,
            "rnr_retry_count": 6,
            "max_cm_retries": 15,
            "primary_local_gid": _gid(SRC),
            "primary_remote_gid": _gid(DST),
            "primary_hop_limit": 64,
            "primary_local_ack_timeout": 18,
        },
        CmaHeader(IPv4Address(SRC), IPv4Address(DST), 40000).encode() + b"user",
    )
    got = _tshark(
        tmp_path,
        mad,
        [
            "infiniband.deth.q_key", "infiniband.deth.srcqp", "infiniband.mad.transactionid",
            "infiniband.mad.attributeid", f"{R}serviceid.dport", f"{R}localqpn", f"{R}responderres",
            f"{R}initdepth", f"{R}remoteresptout", f"{R}startpsn", f"{R}localresptout", f"{R}retrcount",
            f"{R}pkey", f"{R}pppmtu", f"{R}rnrretrcount", f"{R}maxcmretr", f"{R}prim_localgid_ipv4",
            f"{R}prim_remotegid_ipv4", f"{R}prim_hoplim", f"{R}prim_localacktout", f"{R}ip_cm.ipv",
            f"{R}ip_cm.sport", f"{R}ip_cm.sip4", f"{R}ip_cm.dip4",
        ],
    )  # fmt: skip
    assert [int(v, 0) if v[:1].isdigit() and "." not in v else v for v in got] == [
        GSI_QKEY, 1, 0x0000_1234_AABB_CCDD, 0x10, 7174, 0x123, 4, 3, 22, 0xABCDEF, 20, 7, 0xFFFF, 3, 6, 15,
        SRC, DST, 64, 18, 4, 40000, SRC, DST,
    ]  # fmt: skip


@needs_tshark
@pytest.mark.parametrize(
    ("attr", "values", "fields", "expect"),
    [
        (
            CmAttr.REP,
            {"remote_comm_id": 0x11223344, "local_qpn": 0x456, "starting_psn": 0x654321,
             "responder_resources": 2, "initiator_depth": 5, "target_ack_delay": 9, "rnr_retry_count": 7},
            ["infiniband.cm.rep.remotecommid", "infiniband.cm.rep.localqpn", "infiniband.cm.rep.startpsn",
             "infiniband.cm.rep.respres", "infiniband.cm.rep.initdepth", "infiniband.cm.rep.tgtackdelay",
             "infiniband.cm.rep.rnrretrcount"],
            [0x11223344, 0x456, 0x654321, 2, 5, 9, 7],
        ),
        (
            CmAttr.REJ,
            {"local_comm_id": 5, "remote_comm_id": 6, "message_rejected": 0,
             "reason": RejReason.INVALID_SERVICE_ID},
            ["infiniband.cm.rej.localcommid", "infiniband.cm.rej.remotecommid", "infiniband.cm.rej.msgrej",
             "infiniband.cm.rej.reason"],
            [5, 6, 0, 8],
        ),
        (
            CmAttr.RTU,
            {"local_comm_id": 0xDEADBEEF, "remote_comm_id": 0x01020304},
            ["infiniband.cm.rtu.localcommid", "infiniband.cm.rtu.remotecommid"],
            [0xDEADBEEF, 0x01020304],
        ),
        (
            CmAttr.DREQ,
            {"local_comm_id": 9, "remote_comm_id": 10},
            ["infiniband.cm.dreq.localcommid", "infiniband.cm.dreq.remotecommid"],
            [9, 10],
        ),
        (
            CmAttr.DREP,
            {"local_comm_id": 11, "remote_comm_id": 12},
            ["infiniband.cm.drsp.localcommid", "infiniband.cm.drsp.remotecommid"],
            [11, 12],
        ),
    ],
)  # fmt: skip
def test_tshark_reads_the_other_messages(
    tmp_path: Path, attr: CmAttr, values: dict[str, int], fields: list[str], expect: list[int]
) -> None:
    got = _tshark(tmp_path, CmMad(attr, 0x42, values), ["infiniband.mad.attributeid", *fields])
    assert [int(v, 0) for v in got] == [int(attr), *expect]
