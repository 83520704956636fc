"""RDMA devices as the kernel lists them in ``/sys/class/infiniband``.

Pure file reading, no pyverbs: names, ports, port states and the GID table
with each entry's type and network device. A RoCE device's GID table holds one
entry per address of its network device (``ib_core`` ``roce_gid_mgmt.c``);
rxe0 over a NIC with 10.77.0.2 has, on Linux 6.1::

    ports/1/gids/0             fe80:0000:0000:0000:5054:00ff:fe77:0002
    ports/1/gid_attrs/types/0  RoCE v2
    ports/1/gids/1             0000:0000:0000:0000:0000:ffff:0a4d:0002
    ports/1/gid_attrs/types/1  RoCE v2
    ports/1/gids/2             0000:0000:0000:0000:0000:0000:0000:0000 (type: EINVAL)

The default GID is the port's first RoCE v2 IPv4-mapped one (RoCEv2 Annex
A17.8: packets then carry IPv4 headers from that address), else its first
RoCE v2 GID that is not link-local.
"""

import os
import re
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

from rdmakit.verbs.errors import VerbsError

__all__ = [
    "ROCE_V2",
    "SYSFS_ROOT",
    "GidEntry",
    "PortInfo",
    "SysfsDevice",
    "event_fds",
    "find_device",
    "read_device",
    "scan",
    "select_gid",
]

SYSFS_ROOT = Path("/sys/class/infiniband")
#: ``gid_attrs/types/N`` of a RoCEv2 entry (``ib_core`` ``gid_type_str``).
ROCE_V2 = "RoCE v2"
#: ``ibv_port_state`` IBV_PORT_ACTIVE (IBTA Vol. 1 §14.2.5.6 PortState).
PORT_ACTIVE = 4
_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True, slots=True, kw_only=True)
class GidEntry:
    """One populated entry of a port's GID table."""

    index: int
    gid: IPv6Address
    type: str  # "RoCE v2", "IB/RoCE v1"
    netdev: str | None = None

    @property
    def roce_v2(self) -> bool:
        return self.type == ROCE_V2

    @property
    def ipv4(self) -> IPv4Address | None:
        """The IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), else None."""
        return self.gid.ipv4_mapped

    @property
    def ip(self) -> IPv4Address | IPv6Address:
        """The address RoCEv2 packets of this GID carry: IPv4 if mapped, else the GID."""
        return self.gid.ipv4_mapped or self.gid


@dataclass(frozen=True, slots=True, kw_only=True)
class PortInfo:
    """A port: its state (``ibv_port_state``), link layer and populated GIDs in index order."""

    num: int
    state: int
    link_layer: str
    gids: tuple[GidEntry, ...] = ()

    @property
    def active(self) -> bool:
        return self.state == PORT_ACTIVE

    def gid_entry(self, index: int) -> GidEntry | None:
        """The populated entry at GID table index `index`, None for an empty slot."""
        return next((g for g in self.gids if g.index == index), None)

    def default_gid(self) -> GidEntry | None:
        """The first RoCE v2 IPv4-mapped GID, else the first RoCE v2 global one, else None."""
        v2 = [g for g in self.gids if g.roce_v2]
        for g in v2:
            if g.ipv4 is not None:
                return g
        for g in v2:
            if not g.gid.is_link_local:
                return g
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class SysfsDevice:
    """An RDMA device: ``ibv_get_device_list`` name, its network device and PCI address."""

    name: str
    node_type: str = ""
    netdev: str | None = None
    pci_addr: str | None = None
    ports: tuple[PortInfo, ...] = ()


def _read(path: Path | str) -> str | None:
    """The stripped contents of a sysfs attribute, None if it cannot be read (EINVAL, absent)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def _leading_int(text: str | None) -> int:
    """``"4: ACTIVE"`` -> 4; unreadable -> 0."""
    if not text:
        return 0
    head = text.split(":", 1)[0].strip()
    return int(head) if head.isdigit() else 0


_ZERO_TEXT = "0000:0000:0000:0000:0000:0000:0000:0000"


def _read_port(path: Path, num: int) -> PortInfo:
    # A RoCE port has a table of up to 1024 GIDs (rxe: 1024), mostly empty:
    # plain os calls and no parsing of empty slots keep this cheap.
    entries: list[GidEntry] = []
    gid_dir = f"{path}/gids"
    try:
        indices = sorted(int(n) for n in os.listdir(gid_dir) if n.isdigit())
    except OSError:
        indices = []
    for i in indices:
        text = _read(f"{gid_dir}/{i}")
        if not text or text == _ZERO_TEXT:
            continue  # an empty slot
        gid_type = _read(f"{path}/gid_attrs/types/{i}")
        if gid_type is None:
            continue
        try:
            gid = IPv6Address(text)
        except ValueError:
            continue
        entries.append(GidEntry(index=i, gid=gid, type=gid_type, netdev=_read(f"{path}/gid_attrs/ndevs/{i}")))
    return PortInfo(
        num=num,
        state=_leading_int(_read(path / "state")),
        link_layer=_read(path / "link_layer") or "",
        gids=tuple(entries),
    )


def read_device(path: Path) -> SysfsDevice:
    """The device whose sysfs folder is `path` (``/sys/class/infiniband/NAME``)."""
    ports_dir = path / "ports"
    nums = sorted(int(p.name) for p in ports_dir.iterdir() if p.name.isdigit()) if ports_dir.is_dir() else []
    ports = tuple(_read_port(ports_dir / str(n), n) for n in nums)
    netdev = _read(path / "parent")  # rxe/siw: the network device it runs over
    if not netdev:
        netdev = next((g.netdev for p in ports for g in p.gids if g.netdev), None)
    pci: str | None = None
    try:
        target = (path / "device").resolve(strict=True).name.lower()
        pci = target if _PCI.match(target) else None
    except OSError:
        pass
    return SysfsDevice(
        name=path.name,
        node_type=_read(path / "node_type") or "",
        netdev=netdev or None,
        pci_addr=pci,
        ports=ports,
    )


def scan(root: Path = SYSFS_ROOT) -> list[SysfsDevice]:
    """Every device under `root`, sorted by name; empty if `root` does not exist."""
    try:
        paths = sorted(root.iterdir())
    except OSError:
        return []
    return [read_device(p) for p in paths if p.is_dir()]


def select_gid(
    dev: SysfsDevice, port: int | None = None, gid_index: int | None = None
) -> tuple[PortInfo, GidEntry]:
    """The port and GID a QP of `dev` uses.

    Without `port`, the first active port that has a default GID; without
    `gid_index`, that port's default GID (see the module docstring). NOT_FOUND
    when nothing fits.
    """
    ports = [p for p in dev.ports if port is None or p.num == port]
    if not ports:
        raise VerbsError("NOT_FOUND", f"{dev.name} has no port {port}")
    if port is None:
        ports = sorted(ports, key=lambda p: not p.active)
    for p in ports:
        if gid_index is not None:
            entry = next((g for g in p.gids if g.index == gid_index), None)
            if entry is None:
                raise VerbsError("NOT_FOUND", f"{dev.name} port {p.num} has no GID at index {gid_index}")
            return p, entry
        chosen = p.default_gid()
        if chosen is not None:
            return p, chosen
    raise VerbsError(
        "NOT_FOUND", f"{dev.name}: no port with a RoCE v2 GID (is its network device addressed?)"
    )


def find_device(name: str | None, root: Path = SYSFS_ROOT) -> SysfsDevice:
    """The device `name` under `root`, or without a name the first one `select_gid` accepts.

    NOT_FOUND when there is none.
    """
    if name is not None:
        path = root / name
        if "/" in name or name in ("", ".", "..") or not path.is_dir():  # a name, never a path elsewhere
            raise VerbsError("NOT_FOUND", f"no verbs device {name!r} in {root}")
        return read_device(path)
    for dev in scan(root):
        try:
            select_gid(dev)
        except VerbsError:
            continue
        return dev
    raise VerbsError("NOT_FOUND", f"no verbs device with a RoCE v2 GID in {root}", "system")


#: Completion channels and a context's async events are anonymous inodes of this name
#: (``ib_uverbs`` ``uverbs_std_types.c``, ``anon_inode_getfile("[infinibandevent]")``).
_EVENT_FD_LINK = "anon_inode:[infinibandevent]"


def event_fds() -> set[int]:
    """This process's ``[infinibandevent]`` descriptors (completion channels, async events)."""
    fds: set[int] = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == _EVENT_FD_LINK:
                fds.add(int(name))
        except OSError:
            continue
    return fds
