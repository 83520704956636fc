"""Why a soft device cannot open on an address another process holds, and what to do instead.

A soft RoCE device is one UDP socket (port 4791 on its address), bound by one
process: the kernel lets one socket have an address and port, and datagrams
for every QP of the device arrive on it. Kernel rxe is one device in the
kernel that every process shares; the soft engine runs inside a process, so
two programs on one machine each need an address of their own. On loopback
that costs nothing: every address of 127.0.0.0/8 is this machine's (Linux
routes the whole block to ``lo``), so ``127.0.0.2``, ``127.0.0.3`` … work
without configuration although ``ip addr`` lists only ``127.0.0.1``.
"""

import ipaddress
import os
from pathlib import Path

__all__ = ["address_in_use", "udp_holders"]

#: At most this many processes' descriptors are looked through for the holder.
MAX_PROCS = 4096


def _udp_inodes(ip: str, port: int) -> set[str]:
    """Inodes of the UDP sockets bound to `port` on `ip` or on every address (``/proc/net/udp*``)."""
    found: set[str] = set()
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local_ip, _, local_port = fields[1].rpartition(":")
            if int(local_port, 16) == port and _hex_ip_matches(local_ip, ip):
                found.add(fields[9])
    return found


def _hex_ip_matches(hex_ip: str, ip: str) -> bool:
    """``/proc/net/udp``'s address (host-order 32-bit words) is `ip`, or the wildcard."""
    if set(hex_ip) == {"0"}:
        return True
    if len(hex_ip) != 8 or ":" in ip:
        return len(hex_ip) == 32  # IPv6 tables: any bound socket on the port may be it
    try:
        raw = bytes.fromhex(hex_ip)[::-1]
    except ValueError:
        return False
    return ".".join(str(b) for b in raw) == ip


def udp_holders(ip: str, port: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes holding a UDP socket on `ip`:`port` that this user may see."""
    inodes = _udp_inodes(ip, port)
    if not inodes:
        return []
    want = {f"socket:[{i}]" for i in inodes}
    holders: list[tuple[int, str]] = []
    for n, entry in enumerate(os.scandir("/proc")):
        if n >= MAX_PROCS:
            break
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
            if any(os.readlink(f"/proc/{entry.name}/fd/{fd}") in want for fd in fds):
                cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes()[:200].replace(b"\0", b" ")
                holders.append((int(entry.name), cmd.decode(errors="replace").strip()))
        except OSError:
            continue
    return holders


def address_in_use(ip: str, port: int) -> str:
    """The explanation for EADDRINUSE on a soft device's `ip`:`port`, naming the holder when visible."""
    holders = udp_holders(ip, port)
    who = "another process"
    if holders:
        pid, cmd = holders[0]
        who = f"process {pid} ({cmd[:120]})" if cmd else f"process {pid}"
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        addr = None
    if isinstance(addr, ipaddress.IPv4Address) and addr.is_loopback and int(addr) & 0xFF < 0xFE:
        other = f"{addr + 1}, say (every 127.x.y.z is this machine's)"
    else:
        other = "another address of this machine"
    return (
        f"UDP {ip}:{port} is held by {who}: a soft RoCE device is one process's socket (kernel rxe is "
        "one device every process shares; the soft engine runs inside its process). Give each program an "
        f"address of its own: {other}, with -d (rping: -a, its client -I; demo: --device-a/--device-b)"
    )
