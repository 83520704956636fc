"""Device discovery from /sys/class/infiniband, on fake sysfs trees."""

from ipaddress import IPv6Address
from pathlib import Path

import pytest

from rdmakit.verbs import VerbsError, scan, select_gid
from rdmakit.verbs.sysfs import find_device, read_device
from tests.verbs.fake_sysfs import RXE, ZERO, GidEntry, make_device


def test_rxe_like_device(tmp_path: Path) -> None:
    make_device(tmp_path, "rxe0", RXE, parent="ens2")
    (dev,) = scan(tmp_path / "class")
    assert (dev.name, dev.node_type, dev.netdev, dev.pci_addr) == ("rxe0", "1: CA", "ens2", None)
    (port,) = dev.ports
    assert port.active
    assert port.link_layer == "Ethernet"
    assert [g.index for g in port.gids] == [0, 1]  # the 14 empty slots are left out
    p, g = select_gid(dev)
    assert (p.num, g.index, g.gid, str(g.ip)) == (1, 1, IPv6Address("::ffff:10.77.0.2"), "10.77.0.2")


def test_mlx5_like_device_with_roce_v1_and_v2_entries(tmp_path: Path) -> None:
    """A ConnectX lists each address twice, RoCE v1 then v2; its PCI address comes from 'device'."""
    entries: list[GidEntry] = [
        ("fe80:0000:0000:0000:0ac0:ebff:fe12:3456", "IB/RoCE v1", "eth0"),
        ("fe80:0000:0000:0000:0ac0:ebff:fe12:3456", "RoCE v2", "eth0"),
        ("0000:0000:0000:0000:0000:ffff:c0a8:0105", "IB/RoCE v1", "eth0"),
        ("0000:0000:0000:0000:0000:ffff:c0a8:0105", "RoCE v2", "eth0"),
    ]
    make_device(tmp_path, "mlx5_0", {1: ("4: ACTIVE", entries)}, pci="0000:03:00.0")
    dev = read_device(tmp_path / "class" / "mlx5_0")
    assert dev.pci_addr == "0000:03:00.0"
    assert dev.netdev == "eth0"  # no 'parent' file: from the GID table
    _, g = select_gid(dev)
    assert (g.index, g.type) == (3, "RoCE v2")


def test_global_ipv6_gid_when_there_is_no_ipv4(tmp_path: Path) -> None:
    entries: list[GidEntry] = [
        ("fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2", "eth1"),
        ("fd00:0000:0000:0000:0000:0000:0000:0007", "RoCE v2", "eth1"),
    ]
    make_device(tmp_path, "rxe1", {1: ("4: ACTIVE", entries)})
    _, g = select_gid(read_device(tmp_path / "class" / "rxe1"))
    assert (g.index, g.ipv4, str(g.ip)) == (1, None, "fd00::7")


def test_holes_in_the_table_keep_their_indices(tmp_path: Path) -> None:
    entries: list[GidEntry] = [
        ("fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2", "eth1"),
        (ZERO, None, None),
        ("0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2", "eth1"),
    ]
    make_device(tmp_path, "rxe2", {1: ("4: ACTIVE", entries)})
    dev = read_device(tmp_path / "class" / "rxe2")
    assert [g.index for g in dev.ports[0].gids] == [0, 2]
    assert select_gid(dev)[1].index == 2


def test_active_port_first_and_explicit_choices(tmp_path: Path) -> None:
    v4: list[GidEntry] = [("0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2", "eth0")]
    v4b: list[GidEntry] = [("0000:0000:0000:0000:0000:ffff:0a00:0002", "RoCE v2", "eth1")]
    make_device(tmp_path, "mlx5_1", {1: ("1: DOWN", v4), 2: ("4: ACTIVE", v4b)})
    dev = read_device(tmp_path / "class" / "mlx5_1")
    assert select_gid(dev)[0].num == 2
    assert select_gid(dev, port=1)[1].ipv4 is not None
    assert select_gid(dev, port=1, gid_index=0)[1].index == 0
    for kw in ({"port": 3}, {"port": 1, "gid_index": 5}):
        with pytest.raises(VerbsError) as exc:
            select_gid(dev, **kw)
        assert exc.value.code == "NOT_FOUND"


def test_no_roce_v2_gid_is_not_found(tmp_path: Path) -> None:
    entries: list[GidEntry] = [("fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1", "eth0")]
    make_device(tmp_path, "old0", {1: ("4: ACTIVE", entries)})
    with pytest.raises(VerbsError) as exc:
        select_gid(read_device(tmp_path / "class" / "old0"))
    assert exc.value.code == "NOT_FOUND"


def test_missing_root_is_empty(tmp_path: Path) -> None:
    assert scan(tmp_path / "nothing") == []


@pytest.mark.parametrize("name", ["../elsewhere/class/rxe0", "..", "rxe0/../rxe0", "/tmp"])
def test_a_device_is_found_by_name_never_by_a_path(tmp_path: Path, name: str) -> None:
    """A device name stays a name: what is read lies under the class folder, never elsewhere."""
    make_device(tmp_path, "rxe0", RXE, parent="ens2")
    make_device(tmp_path / "elsewhere", "rxe0", RXE, parent="ens2")
    with pytest.raises(VerbsError) as exc:
        find_device(name, tmp_path / "class")
    assert exc.value.code == "NOT_FOUND"
    assert find_device("rxe0", tmp_path / "class").name == "rxe0"
