"""Fake /sys/class/infiniband trees, laid out as the kernel's ib_core shows devices."""

from pathlib import Path

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


#: A GID table entry: (GID, its type or None, its netdev or None); None leaves the file out.
GidEntry = tuple[str, str | None, str | None]
#: Port number -> (its state line, its GID table from index 0).
Ports = dict[int, tuple[str, list[GidEntry]]]


def make_device(
    root: Path,
    name: str,
    ports: Ports,
    *,
    parent: str | None = None,
    pci: str | None = None,
    table: int = 16,
) -> Path:
    """A device folder like the kernel's: ports/N/{state,link_layer,gids,gid_attrs/{types,ndevs}}.

    An empty slot has a zero GID and unreadable attributes (EINVAL): here, no file.
    """
    dev = root / "class" / name
    for num, (state, entries) in ports.items():
        port = dev / "ports" / str(num)
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / sub).mkdir(parents=True)
        (port / "state").write_text(f"{state}\n")
        (port / "link_layer").write_text("Ethernet\n")
        for i in range(table):
            gid, gid_type, ndev = entries[i] if i < len(entries) else (ZERO, None, None)
            (port / "gids" / str(i)).write_text(gid + "\n")
            if gid_type is not None:
                (port / "gid_attrs" / "types" / str(i)).write_text(gid_type + "\n")
            if ndev is not None:
                (port / "gid_attrs" / "ndevs" / str(i)).write_text(ndev + "\n")
    (dev / "node_type").write_text("1: CA\n")
    if parent:
        (dev / "parent").write_text(parent + "\n")
    if pci:
        pci_dir = root / "devices" / "pci0000:00" / pci
        pci_dir.mkdir(parents=True)
        (dev / "device").symlink_to(pci_dir)
    return dev


# rxe0 over ens2 with 10.77.0.2, as the lab guest's kernel 6.1 shows it.
RXE: Ports = {
    1: (
        "4: ACTIVE",
        [
            ("fe80:0000:0000:0000:5054:00ff:fe77:0002", "RoCE v2", "ens2"),
            ("0000:0000:0000:0000:0000:ffff:0a4d:0002", "RoCE v2", "ens2"),
        ],
    )
}
