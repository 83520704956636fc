"""librdmacm's structures as ``rdmakit.verbs.rdmacm`` lays them out (x86-64 / LP64 offsets of rdma-core 44).

The expected numbers are ``offsetof``/``sizeof`` of ``rdma/rdma_cma.h`` and
``infiniband/verbs.h``; nothing here needs librdmacm or a device.
"""

import ctypes
from ipaddress import IPv4Address, IPv6Address

import pytest

from rdmakit.verbs import rdmacm as C

pytestmark = pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="LP64 layouts")


def _off(cls: type[ctypes.Structure], *path: str) -> int:
    off, t = 0, cls
    for name in path:
        off += int(getattr(t, name).offset)
        t = {f[0]: f[1] for f in t._fields_}[name]  # type: ignore[assignment]
    return off


def test_rdma_cm_id_head() -> None:
    assert _off(C.RdmaCmId, "route", "addr", "src") == 32
    assert _off(C.RdmaCmId, "route", "addr", "dst") == 160
    assert _off(C.RdmaCmId, "ps") == 344
    assert _off(C.RdmaCmId, "port_num") == 348


def test_event_and_conn_param() -> None:
    assert ctypes.sizeof(C.RdmaConnParam) == 24
    assert _off(C.RdmaConnParam, "private_data_len") == 8
    assert _off(C.RdmaConnParam, "srq") == 14
    assert _off(C.RdmaConnParam, "qp_num") == 16
    assert (_off(C.RdmaCmEvent, "event"), _off(C.RdmaCmEvent, "status"), _off(C.RdmaCmEvent, "conn")) == (
        16,
        20,
        24,
    )


def test_ibv_qp_attr() -> None:
    assert ctypes.sizeof(C.IbvQpAttr) == 144
    assert ctypes.sizeof(C.IbvAhAttr) == 32
    assert ctypes.sizeof(C.IbvGlobalRoute) == 24
    offsets = {
        "cap": 36, "ah_attr": 56, "alt_ah_attr": 88, "pkey_index": 120, "max_rd_atomic": 126,
        "port_num": 129, "timeout": 130, "rnr_retry": 132, "rate_limit": 136,
    }  # fmt: skip
    assert {name: _off(C.IbvQpAttr, name) for name in offsets} == offsets
    assert (_off(C.IbvAhAttr, "dlid"), _off(C.IbvAhAttr, "is_global"), _off(C.IbvAhAttr, "port_num")) == (
        24,
        29,
        30,
    )
    assert (_off(C.IbvGlobalRoute, "flow_label"), _off(C.IbvGlobalRoute, "sgid_index")) == (16, 20)


@pytest.mark.parametrize(
    ("ip", "port"),
    [(IPv4Address("10.77.0.2"), 7471), (IPv6Address("fd00::2"), 1), (IPv4Address("0.0.0.0"), 0)],
)
def test_sockaddr_round_trip(ip: IPv4Address | IPv6Address, port: int) -> None:
    raw = bytes(C.sockaddr(ip, port))
    assert len(raw) == 128
    family, net_port = int.from_bytes(raw[:2], "little"), int.from_bytes(raw[2:4], "big")
    assert family == (C.AF_INET if ip.version == 4 else C.AF_INET6)
    assert net_port == port
    assert C.sockaddr_ip(raw) == (ip, port)


def test_sockaddr_of_other_families_is_none() -> None:
    assert C.sockaddr_ip(bytes(128)) is None  # AF_UNSPEC
    assert C.sockaddr_ip(b"\x1b\x00" + bytes(126)) is None  # AF_IB
    assert C.sockaddr_ip(b"\x02\x00") is None  # short


def test_an_ipv4_mapped_ipv6_peer_is_ipv4() -> None:
    raw = bytes(C.sockaddr(IPv6Address("::ffff:10.0.0.9"), 80))
    assert C.sockaddr_ip(raw) == (IPv4Address("10.0.0.9"), 80)


def test_device_name_of_an_unbound_id() -> None:
    assert C.device_name(C.RdmaCmId()) is None


def test_load_binds_the_calls() -> None:
    try:
        lib = C.load()
    except OSError as e:
        pytest.skip(f"librdmacm.so.1 is not installed: {e}")
    assert lib.rdma_init_qp_attr.restype is ctypes.c_int
    assert lib.rdma_get_cm_event.argtypes[1] is ctypes.POINTER(ctypes.POINTER(C.RdmaCmEvent))
