"""Descriptors name one unicast peer, and the GID its packets carry (docs/descriptors.md, "Addresses").

The attack: a descriptor (a file, a comm-channel message) that points this
side's traffic at everyone (a broadcast or multicast address), at nothing
(unspecified), or at one host while claiming another's GID. Each is refused
with ``DocaError(INVALID_VALUE)`` from the peer, naming the field, by the
parser, by the file reader and by ``Rdma.connect``; legitimate IPv4 and IPv6
descriptors still connect and move data.
"""

import json
import socket
from collections.abc import Callable, Iterator
from functools import partial
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path
from typing import Any

import pytest

from rdmakit.doca import (
    CONNECTION_FORMAT,
    AccessFlag,
    ConnectionDescriptor,
    DocaError,
    DocaErrorCode,
    Fault,
    MmapDescriptor,
    RdmaState,
    RdmaWriteJob,
    SoftBackendQP,
    _addresses,
    read_connection_descriptor,
    read_mmap_descriptor,
)
from rdmakit.engine import QpState
from tests.doca.rdma_harness import ALL_RDMA, Pair, TransportName, result


def _gid(ip: str) -> str:
    """RoCEv2: the GID of an IPv4 address is IPv4-mapped, of an IPv6 address the address itself."""
    a = ip_address(ip)
    return str(IPv6Address(b"\0" * 10 + b"\xff\xff" + a.packed) if isinstance(a, IPv4Address) else a)


def _connection(ip: str, gid: str | None = None) -> bytes:
    obj: dict[str, Any] = {
        "format": CONNECTION_FORMAT,
        "transport": "roce-udp",
        "gid": gid if gid is not None else _gid(ip),
        "ip": ip,
        "port": 4791,
        "qpn": 0x1234,
        "psn": 0x42,
        "mtu": 4096,
    }
    return json.dumps(obj).encode()


def _mmap(gid: str) -> bytes:
    obj = {
        "format": "rdmakit.mmap/1",
        "addr": 0x10000,
        "length": 64,
        "rkey": 0x1234,
        "access": ["RDMA_WRITE"],
        "device": "udp:127.0.0.2",
        "gid": gid,
        "mtu": 4096,
    }
    return json.dumps(obj).encode()


def _refused(
    call: Callable[[], object], field: str, code: DocaErrorCode = DocaErrorCode.INVALID_VALUE
) -> DocaError:
    with pytest.raises(DocaError) as exc:
        call()
    err = exc.value
    assert err.code is code, err
    assert err.fault is Fault.PEER, err
    assert f"field {field!r}" in err.message, err.message
    return err


NONSENSE = [
    pytest.param("0.0.0.0", id="v4-unspecified"),
    pytest.param("0.1.2.3", id="v4-this-network"),
    pytest.param("255.255.255.255", id="v4-limited-broadcast"),
    pytest.param("224.0.0.1", id="v4-multicast-all-hosts"),
    pytest.param("239.255.255.250", id="v4-multicast-ssdp"),
    pytest.param("::", id="v6-unspecified"),
    pytest.param("ff02::1", id="v6-multicast-all-nodes"),
    pytest.param("ff0e::1:3", id="v6-multicast-global"),
]


@pytest.mark.parametrize("ip", NONSENSE)
def test_connection_descriptor_refuses_nonsense_ip(ip: str) -> None:
    err = _refused(lambda: ConnectionDescriptor.from_bytes(_connection(ip)), "ip")
    assert ip in err.message


def test_connection_descriptor_refuses_ipv4_written_as_ipv6() -> None:
    _refused(lambda: ConnectionDescriptor.from_bytes(_connection("::ffff:127.0.0.2")), "ip")


def test_connection_descriptor_refuses_a_local_subnet_broadcast() -> None:
    """The directed broadcast of a subnet this host is on (lo's 127.255.255.255 on Linux)."""
    broadcasts = _addresses.local_broadcasts()
    assert IPv4Address("127.255.255.255") in broadcasts, broadcasts
    for bcast in broadcasts:
        _refused(partial(ConnectionDescriptor.from_bytes, _connection(str(bcast))), "ip")


def test_local_broadcasts_come_from_the_kernel_fib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fib = tmp_path / "fib_trie"
    fib.write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     +-- 10.9.8.0/24 2 0 2\n        |-- 10.9.8.0\n"
        "           /24 link UNICAST\n        |-- 10.9.8.7\n           /32 host LOCAL\n"
        "        |-- 10.9.8.255\n           /32 link BROADCAST\n"
    )
    monkeypatch.setattr(_addresses, "_FIB_TRIE", str(fib))
    _refused(lambda: ConnectionDescriptor.from_bytes(_connection("10.9.8.255")), "ip")
    assert ConnectionDescriptor.from_bytes(_connection("10.9.8.7")).ip == IPv4Address("10.9.8.7")


MISMATCHED = [
    pytest.param("127.0.0.2", "::ffff:127.0.0.3", id="v4-another-host"),
    pytest.param("127.0.0.2", "::127.0.0.2", id="v4-compatible-not-mapped"),
    pytest.param("127.0.0.2", "fe80::2", id="v4-with-link-local-gid"),
    pytest.param("fd00::7", "fd00::8", id="v6-another-host"),
    pytest.param("fd00::7", "::ffff:127.0.0.2", id="v6-with-v4-gid"),
    pytest.param("127.0.0.2", "::", id="v4-with-unspecified-gid"),
]


@pytest.mark.parametrize(("ip", "gid"), MISMATCHED)
def test_connection_descriptor_refuses_a_gid_that_is_not_the_ips(ip: str, gid: str) -> None:
    err = _refused(lambda: ConnectionDescriptor.from_bytes(_connection(ip, gid)), "gid")
    assert "RoCEv2 GID" in err.message


def test_a_descriptor_built_in_process_follows_the_same_rules() -> None:
    with pytest.raises(DocaError) as exc:
        ConnectionDescriptor(
            transport="tcp", gid=IPv6Address("::ffff:0.0.0.0"), ip=IPv4Address("0.0.0.0"),
            port=4791, qpn=2, psn=0, mtu=4096,
        )  # fmt: skip
    assert exc.value.code is DocaErrorCode.INVALID_VALUE
    assert "'ip'" in exc.value.message


BAD_GIDS = [
    pytest.param("::", id="unspecified"),
    pytest.param("ff02::1", id="v6-multicast"),
    pytest.param("::ffff:0.0.0.0", id="v4-unspecified"),
    pytest.param("::ffff:255.255.255.255", id="v4-limited-broadcast"),
    pytest.param("::ffff:224.0.0.251", id="v4-multicast"),
    pytest.param("::ffff:127.255.255.255", id="v4-local-broadcast"),
]


@pytest.mark.parametrize("gid", BAD_GIDS)
def test_mmap_descriptor_refuses_nonsense_gid(gid: str) -> None:
    _refused(lambda: MmapDescriptor.from_bytes(_mmap(gid)), "gid")


def test_descriptor_files_name_the_file_and_field(tmp_path: Path) -> None:
    conn, mmap = tmp_path / "conn.json", tmp_path / "mmap.json"
    conn.write_bytes(_connection("255.255.255.255"))
    mmap.write_bytes(_mmap("ff02::1"))
    assert str(conn) in _refused(lambda: read_connection_descriptor(conn), "ip").message
    assert str(mmap) in _refused(lambda: read_mmap_descriptor(mmap), "gid").message


# -- through the DOCA layer -------------------------------------------------------------------


def _free_port(family: socket.AddressFamily, kind: socket.SocketKind) -> int:
    with socket.socket(family, kind) as s:
        s.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _v6_loopback(transport: TransportName) -> Callable[[], str]:
    kind = socket.SOCK_DGRAM if transport == "udp" else socket.SOCK_STREAM
    return lambda: f"[::1]:{_free_port(socket.AF_INET6, kind)}"


@pytest.fixture(params=["udp", "tcp"])
def transport(request: pytest.FixtureRequest) -> TransportName:
    value: TransportName = request.param
    return value


@pytest.fixture(params=["ipv4", "ipv6"])
def pair(
    request: pytest.FixtureRequest, transport: TransportName, new_ip: Callable[[], str]
) -> Iterator[Pair]:
    addresses = new_ip if request.param == "ipv4" else _v6_loopback(transport)
    p = Pair(transport, "poll", addresses, perms_b=ALL_RDMA)
    try:
        yield p
    finally:
        p.close()


def test_connect_refuses_a_tampered_address_and_stays_unconnected(pair: Pair) -> None:
    """Rdma.connect with the peer's descriptor pointed at a broadcast, multicast or foreign GID:
    CONNECTION_ABORTED (doca_rdma_connect: "if connection failed or connection details object was
    corrupted"), naming the field."""
    pair.start()
    good = json.loads(pair.b.rdma.export())
    v6 = ip_address(good["ip"]).version == 6
    everyone, nobody, elsewhere = (
        ("ff02::1", "::", "fd00::99") if v6 else ("255.255.255.255", "224.0.0.1", "127.0.0.99")
    )
    tampered = [
        ("ip", {"ip": everyone, "gid": _gid(everyone)}),
        ("ip", {"ip": nobody, "gid": _gid(nobody)}),
        ("gid", {"gid": _gid(elsewhere)}),
    ]
    for field, change in tampered:
        connect = partial(pair.a.rdma.connect, json.dumps(good | change).encode())
        _refused(connect, field, DocaErrorCode.CONNECTION_ABORTED)
        assert pair.a.rdma.rdma_state is not RdmaState.CONNECTED


def test_the_soft_backend_checks_addresses_itself(pair: Pair) -> None:
    """A caller that hands the backend a dict without a ConnectionDescriptor gets the same refusal."""
    pair.start()
    qp = pair.a.rdma._qp
    assert isinstance(qp, SoftBackendQP)
    good = json.loads(pair.b.rdma.export())
    del good["format"]
    v6 = ip_address(good["ip"]).version == 6
    everyone, elsewhere = ("ff02::1", "fd00::99") if v6 else ("255.255.255.255", "127.0.0.99")
    for change in ({"ip": everyone, "gid": _gid(everyone)}, {"gid": _gid(elsewhere)}):
        with pytest.raises(DocaError) as exc:
            qp.connect(good | change)
        assert exc.value.code is DocaErrorCode.INVALID_VALUE
        assert exc.value.fault is Fault.PEER
        assert qp.state is not QpState.RTS


def test_legitimate_descriptors_connect_and_move_data(pair: Pair) -> None:
    """IPv4 and IPv6 soft devices, UDP and TCP: the checks refuse nothing a real peer exports."""
    pair.up()
    desc = ConnectionDescriptor.from_bytes(pair.b.rdma.export())
    assert desc.gid == IPv6Address(_gid(str(desc.ip)))
    mb, mem_b = pair.b.mmap(256, AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE)
    remote = pair.share(mb)
    ma, _ = pair.a.mmap(b"across a checked descriptor\0")
    (ev,) = pair.run(
        RdmaWriteJob(ctx=pair.a.rdma, src_buf=pair.a.data(ma, 0, 28), dst_buf=pair.a.room(remote, 0, 256))
    )
    assert ev.ok, ev.error
    assert result(ev).length == 28
    assert bytes(mem_b[:28]) == b"across a checked descriptor\0"
