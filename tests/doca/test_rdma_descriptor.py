"""The connection descriptor ``rdmakit.connection/1`` and descriptor files (docs/descriptors.md).

One table of (descriptor, bytes) cases run both ways, a table of malformed
descriptors each naming its field, and a fuzz harness with one invariant:
parse it, or raise ``DocaError(INVALID_VALUE)`` from the peer, never anything else.
"""

import json
import os
from collections.abc import Callable
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rdmakit.doca import (
    CONNECTION_FORMAT,
    MAX_DESCRIPTOR_SIZE,
    AccessFlag,
    ConnectionDescriptor,
    DocaError,
    DocaErrorCode,
    Fault,
    MmapDescriptor,
    SoftBackendQP,
    read_connection_descriptor,
    read_descriptor,
    read_mmap_descriptor,
    write_descriptor,
)
from rdmakit.doca._addresses import address_problem
from tests.doca.rdma_harness import Pair

GID = IPv6Address("::ffff:127.0.0.2")
SECRET = "00112233445566778899aabbccddeeff"
GOOD: dict[str, Any] = {
    "format": CONNECTION_FORMAT,
    "transport": "roce-udp",
    "gid": GID.exploded,
    "ip": "127.0.0.2",
    "port": 4791,
    "qpn": 0x1234,
    "psn": 0xABCDEF,
    "mtu": 4096,
}


def _with(**changes: Any) -> bytes:
    obj = {k: v for k, v in (GOOD | changes).items() if v is not ...}
    return json.dumps(obj).encode()


def _field_error(data: object) -> DocaError:
    with pytest.raises(DocaError) as exc:
        ConnectionDescriptor.from_bytes(data)
    assert exc.value.code is DocaErrorCode.INVALID_VALUE
    assert exc.value.fault is Fault.PEER  # the bytes came from the other side
    return exc.value


# -- the spec ---------------------------------------------------------------------------------------

CASES = [
    (
        ConnectionDescriptor(
            transport="roce-udp",
            gid=GID,
            ip=IPv4Address("127.0.0.2"),
            port=4791,
            qpn=0x1234,
            psn=0xABCDEF,
            mtu=4096,
        ),
        b'{"format":"rdmakit.connection/1","gid":"0000:0000:0000:0000:0000:ffff:7f00:0002","ip":"127.0.0.2",'
        b'"mtu":4096,"port":4791,"psn":11259375,"qpn":4660,"transport":"roce-udp"}',
    ),
    (
        ConnectionDescriptor(
            transport="tcp",
            gid=IPv6Address("fd00::7"),
            ip=IPv6Address("fd00::7"),
            port=1,
            qpn=2,
            psn=0,
            mtu=1 << 20,
            secret=SECRET,
        ),
        b'{"format":"rdmakit.connection/1","gid":"fd00:0000:0000:0000:0000:0000:0000:0007","ip":"fd00::7",'
        b'"mtu":1048576,"port":1,"psn":0,"qpn":2,"secret":"00112233445566778899aabbccddeeff","transport":"tcp"}',
    ),
    (
        ConnectionDescriptor(
            transport="verbs",
            gid=IPv6Address("::ffff:10.0.0.1"),
            ip=IPv4Address("10.0.0.1"),
            port=65535,
            qpn=(1 << 24) - 1,
            psn=(1 << 24) - 1,
            mtu=256,
        ),
        b'{"format":"rdmakit.connection/1","gid":"0000:0000:0000:0000:0000:ffff:0a00:0001","ip":"10.0.0.1",'
        b'"mtu":256,"port":65535,"psn":16777215,"qpn":16777215,"transport":"verbs"}',
    ),
]


@pytest.mark.parametrize(("desc", "data"), CASES)
def test_encoding_both_ways(desc: ConnectionDescriptor, data: bytes) -> None:
    """docs/descriptors.md: the canonical encoding is sorted compact JSON; parsing gives the value back."""
    assert desc.to_bytes() == data
    assert ConnectionDescriptor.from_bytes(data) == desc
    pretty = json.dumps(json.loads(data), indent=2).encode() + b"\n"
    assert ConnectionDescriptor.from_bytes(pretty) == desc  # any JSON layout of the object


BAD = [
    ("truncated", _with()[:-1], "descriptor"),
    ("empty", b"", "descriptor"),
    ("not utf-8", b'{"format":"\xff"}', "descriptor"),
    ("array", b"[1, 2]", "descriptor"),
    ("NaN", _with(mtu=float("nan")), "descriptor"),
    ("too long", _with(ip="1" * MAX_DESCRIPTOR_SIZE), "descriptor"),
    ("no format", _with(format=...), "format"),
    ("foreign format", _with(format="doca.rdma"), "format"),
    ("next version", _with(format="rdmakit.connection/2"), "format"),
    ("mmap descriptor", _with(format="rdmakit.mmap/1"), "format"),
    ("format not a string", _with(format=1), "format"),
    ("duplicate key", _with()[:-1] + b', "qpn": 7}', "qpn"),
    ("unknown field", _with(lid=3), "lid"),
    ("unknown transport", _with(transport="ib"), "transport"),
    ("gid not IPv6", _with(gid="fe80::zz"), "gid"),
    ("gid not a string", _with(gid=0), "gid"),
    ("ip not an address", _with(ip="localhost"), "ip"),
    ("port 0", _with(port=0), "port"),
    ("port 65536", _with(port=65536), "port"),
    ("port as text", _with(port="4791"), "port"),
    ("qpn 0", _with(qpn=0), "qpn"),
    ("qpn 1 (GSI)", _with(qpn=1), "qpn"),
    ("qpn 2**24", _with(qpn=1 << 24), "qpn"),
    ("qpn float", _with(qpn=5.0), "qpn"),
    ("qpn bool", _with(qpn=True), "qpn"),
    ("psn negative", _with(psn=-1), "psn"),
    ("psn 2**24", _with(psn=1 << 24), "psn"),
    ("mtu 1500", _with(mtu=1500), "mtu"),
    ("mtu 8192 on RoCE", _with(mtu=8192), "mtu"),
    ("mtu 3000 on TCP", _with(transport="tcp", mtu=3000, secret=SECRET), "mtu"),
    ("mtu 2**21 on TCP", _with(transport="tcp", mtu=1 << 21, secret=SECRET), "mtu"),
    ("TCP without its secret", _with(transport="tcp", mtu=4096), "secret"),
    ("TCP secret too short", _with(transport="tcp", mtu=4096, secret=SECRET[:-2]), "secret"),
    ("TCP secret in capitals", _with(transport="tcp", mtu=4096, secret=SECRET.upper()), "secret"),
    ("TCP secret not hex", _with(transport="tcp", mtu=4096, secret="g" * 32), "secret"),
    ("TCP secret a number", _with(transport="tcp", mtu=4096, secret=1), "secret"),
    ("a secret on RoCE", _with(secret=SECRET), "secret"),
    *[(f"missing {f}", _with(**{f: ...}), f) for f in GOOD if f != "format"],
]


@pytest.mark.parametrize(("name", "data", "field"), BAD, ids=[b[0] for b in BAD])
def test_malformed_descriptor_names_the_field(name: str, data: bytes, field: str) -> None:
    """rdmakit.connection/1: a truncated, tampered or foreign descriptor is INVALID_VALUE naming the field."""
    err = _field_error(data)
    assert f"field {field!r}" in err.message, err.message


def test_every_truncation_is_refused() -> None:
    """Any strict prefix of a descriptor is refused, never half-parsed."""
    data = _with()
    for n in range(len(data)):
        _field_error(data[:n])


def test_non_bytes_are_refused() -> None:
    """Only bytes-like descriptors parse."""
    for value in (None, "text", 42, GOOD):
        _field_error(value)


def test_building_an_invalid_descriptor_in_process_fails() -> None:
    """The value type checks its fields like the parser does (a backend bug surfaces at once)."""
    with pytest.raises(DocaError):
        ConnectionDescriptor(
            transport="roce-udp", gid=GID, ip=IPv4Address("1.2.3.4"), port=4791, qpn=1, psn=0, mtu=4096
        )


# -- fuzz -----------------------------------------------------------------------------------------


def _parse_or_invalid(data: bytes) -> None:
    error: DocaError | None = None
    try:
        desc = ConnectionDescriptor.from_bytes(data)
    except DocaError as exc:  # anything else propagates and fails the test
        error = exc
    if error is None:
        assert ConnectionDescriptor.from_bytes(desc.to_bytes()) == desc
        return
    assert error.code is DocaErrorCode.INVALID_VALUE
    assert error.fault is Fault.PEER
    assert "field '" in error.message


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
@example(b"{}")
@example(b'{"format":"rdmakit.connection/1"}')
def test_fuzz_random_bytes(data: bytes) -> None:
    """Invariant: parse, or INVALID_VALUE from the peer; never another exception."""
    _parse_or_invalid(data)


@settings(max_examples=300)
@given(st.data())
def test_fuzz_tampered_descriptors(data: st.DataObject) -> None:
    """Byte flips, cuts and insertions in a valid descriptor: parse, or INVALID_VALUE naming a field."""
    raw = bytearray(_with())
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        i = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if action == "flip" and raw:
            raw[i] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del raw[i : i + data.draw(st.integers(1, 8))]
        else:
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=4))
    _parse_or_invalid(bytes(raw))


@settings(max_examples=100)
@given(
    transport=st.sampled_from(["roce-udp", "verbs"]),
    ip=st.ip_addresses().filter(lambda ip: address_problem(ip) is None),  # one unicast peer
    port=st.integers(1, 65535),
    qpn=st.integers(2, (1 << 24) - 1),
    psn=st.integers(0, (1 << 24) - 1),
    mtu=st.sampled_from([256, 512, 1024, 2048, 4096]),
)
def test_round_trip(
    transport: Any, ip: IPv4Address | IPv6Address, port: int, qpn: int, psn: int, mtu: int
) -> None:
    """Every valid value survives encoding and parsing unchanged."""
    gid = IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed) if ip.version == 4 else IPv6Address(ip.packed)
    desc = ConnectionDescriptor(transport=transport, gid=gid, ip=ip, port=port, qpn=qpn, psn=psn, mtu=mtu)
    assert ConnectionDescriptor.from_bytes(desc.to_bytes()) == desc


# -- what Rdma.export says ------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_export_describes_this_side(transport: Any, new_ip: Callable[[], str]) -> None:
    """doca_rdma_export: this side's transport, address, QPN and the PSN of its first request."""
    p = Pair(transport, "poll", new_ip)
    try:
        p.start()
        da = ConnectionDescriptor.from_bytes(p.a.rdma.export())
        db = ConnectionDescriptor.from_bytes(p.b.rdma.export())
        assert da.transport == ("roce-udp" if transport == "udp" else "tcp")
        assert da.ip == ip_address(p.a.dev.name.split(":", 1)[1])
        assert da.port == 4791
        assert da.gid == IPv6Address(b"\0" * 10 + b"\xff\xff" + da.ip.packed)
        assert da.qpn == p.a.rdma.qpn
        p.connect()
        qa, qb = p.a.rdma._qp, p.b.rdma._qp
        assert isinstance(qa, SoftBackendQP)
        assert isinstance(qb, SoftBackendQP)
        # ibv_rc_pingpong semantics: a sends from its own PSN, b expects it (and the other way round).
        assert qa.engine_qp.attrs.sq_psn == da.psn == qb.engine_qp.attrs.rq_psn
        assert qb.engine_qp.attrs.sq_psn == db.psn == qa.engine_qp.attrs.rq_psn
        assert qa.engine_qp.attrs.dest_qpn == db.qpn
    finally:
        p.close()


# -- files ----------------------------------------------------------------------------------------


def test_write_then_read_a_descriptor_file(tmp_path: Path) -> None:
    """rdma_common.c write_file/read_file: the bytes go through a file unchanged."""
    data = CASES[0][1]
    path = tmp_path / "local_connection_desc_path.txt"
    write_descriptor(path, data)
    assert path.read_bytes() == data
    assert read_descriptor(path) == data
    assert read_connection_descriptor(str(path)) == CASES[0][0]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_existing_file_is_not_overwritten(tmp_path: Path) -> None:
    """rdma_common.c write_file keeps an existing file: ALREADY_EXIST; overwrite=True replaces it."""
    path = tmp_path / "desc.json"
    path.write_bytes(b"old")
    with pytest.raises(DocaError) as exc:
        write_descriptor(path, CASES[0][1])
    assert exc.value.code is DocaErrorCode.ALREADY_EXIST
    assert str(path) in exc.value.message
    assert path.read_bytes() == b"old"
    write_descriptor(path, CASES[1][1], overwrite=True)
    assert read_connection_descriptor(path) == CASES[1][0]
    assert sorted(os.listdir(tmp_path)) == ["desc.json"]


def test_file_errors_name_the_file_and_the_field(tmp_path: Path) -> None:
    """A missing file is NOT_FOUND; a bad one INVALID_VALUE naming both the file and the field."""
    missing = tmp_path / "nope.json"
    with pytest.raises(DocaError) as exc:
        read_descriptor(missing)
    assert exc.value.code is DocaErrorCode.NOT_FOUND
    assert str(missing) in exc.value.message
    cut = tmp_path / "cut.json"
    cut.write_bytes(CASES[0][1][:40])
    bad_qpn = tmp_path / "bad_qpn.json"
    bad_qpn.write_bytes(_with(qpn="x"))
    for path, field in ((cut, "descriptor"), (bad_qpn, "qpn")):
        for reader in (read_descriptor, read_connection_descriptor):
            with pytest.raises(DocaError) as exc:
                reader(path)
            assert exc.value.code is DocaErrorCode.INVALID_VALUE
            assert str(path) in exc.value.message
            assert f"field {field!r}" in exc.value.message
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_DESCRIPTOR_SIZE + 10))
    with pytest.raises(DocaError, match="larger than"):
        read_descriptor(big)
    with pytest.raises(DocaError) as exc:
        write_descriptor(tmp_path / "no_such_dir" / "x.json", CASES[0][1])
    assert exc.value.code is DocaErrorCode.NOT_FOUND


def test_mmap_descriptor_files(tmp_path: Path) -> None:
    """read_descriptor takes either kind (by its format); read_mmap_descriptor only an mmap export."""
    mmap_desc = MmapDescriptor(
        addr=0x1000, length=64, rkey=7, access=AccessFlag.RDMA_READ, device="udp:127.0.0.2", gid=GID, mtu=4096
    ).to_bytes()
    mpath, cpath = tmp_path / "remote_resource_desc_path.txt", tmp_path / "conn.txt"
    write_descriptor(mpath, mmap_desc)
    write_descriptor(cpath, CASES[0][1])
    assert read_descriptor(mpath) == mmap_desc
    assert read_mmap_descriptor(mpath).rkey == 7
    with pytest.raises(DocaError) as exc:
        read_mmap_descriptor(cpath)
    assert exc.value.code is DocaErrorCode.INVALID_VALUE
    assert str(cpath) in exc.value.message
    with pytest.raises(DocaError) as exc:
        read_connection_descriptor(mpath)
    assert "memory-map descriptor" in exc.value.message


def test_descriptor_files_are_read_by_the_file_reading_rule(tmp_path: Path) -> None:
    """A link, or a file of procfs, is NOT_PERMITTED: only the caller's (or root's) own regular file."""
    path = tmp_path / "desc.json"
    path.write_bytes(CASES[0][1])
    link = tmp_path / "link.json"
    link.symlink_to(path)
    for bad, why in ((link, "is a symbolic link"), (Path("/proc/self/environ"), "is on procfs")):
        for reader in (read_descriptor, read_connection_descriptor, read_mmap_descriptor):
            with pytest.raises(DocaError) as exc:
                reader(bad)
            assert exc.value.code is DocaErrorCode.NOT_PERMITTED
            assert f"{bad} {why}" in exc.value.message
    assert read_connection_descriptor(path) == CASES[0][0]
