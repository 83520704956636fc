"""``rdmakit devices``: the RDMA devices this machine offers, like ibv_devices/ibv_devinfo.

Soft devices (RoCEv2 on UDP and the TCP transport) are listed for every local
address; any address of 127.0.0.0/8 also opens, unlisted. Verbs devices (rxe,
ConnectX) appear when pyverbs and a device are there; ``-l 60`` logs why not.
``-V`` also says which UDP data plane runs (native or pure Python).
"""

import argparse
import json
import logging
from ipaddress import IPv6Address

from rdmakit.cli.about import data_plane
from rdmakit.cli.errors import CliError
from rdmakit.cli.lifecycle import run
from rdmakit.cli.options import add_general_flags
from rdmakit.doca import DevInfo, DocaError, JobType, devinfo_list, find_devinfo
from rdmakit.verbs import pyverbs_missing

log = logging.getLogger("rdmakit.devices")

_JOB_NAMES = {
    JobType.RDMA_SEND: "send", JobType.RDMA_SEND_IMM: "send-imm", JobType.RDMA_RECV: "recv",
    JobType.RDMA_READ: "read", JobType.RDMA_WRITE: "write", JobType.RDMA_WRITE_IMM: "write-imm",
    JobType.RDMA_ATOMIC_CMP_SWP: "cmp-swap", JobType.RDMA_ATOMIC_FETCH_ADD: "fetch-add",
    JobType.DMA_MEMCPY: "dma-memcpy",
}  # fmt: skip


def _gid(g: IPv6Address) -> str:
    """A GID as ``ibv_devinfo -v`` prints it: IPv4-mapped GIDs show their IPv4 address."""
    return f"::ffff:{g.ipv4_mapped}" if g.ipv4_mapped is not None else str(g)


def _describe(info: DevInfo) -> dict[str, object]:
    return {
        "name": info.name,
        "kind": info.kind,
        "addresses": [str(a) for a in info.ip_addrs],
        "pci": info.pci_addr,
        "gids": [_gid(g) for g in info.gids],
        "mtu": info.mtu,
        "max_message_size": info.max_buf_size(),
        "max_buf_list_len": info.max_buf_list_len(),
        "jobs": [_JOB_NAMES.get(JobType(j), j) for j in sorted(info.caps.job_types)],
    }


def _devices(args: argparse.Namespace) -> int:
    if args.name:
        try:
            infos = [find_devinfo(args.name)]
        except DocaError:
            raise CliError(f"no device matches {args.name!r} (see 'rdmakit devices')") from None
    else:
        infos = devinfo_list()
    if not any(i.kind == "verbs" for i in infos):
        reason = (
            pyverbs_missing()
            or "pyverbs imports, but no verbs device (rxe, mlx5) is in /sys/class/infiniband"
        )
        log.debug("no verbs devices: %s", reason)
    rows = [_describe(i) for i in infos]
    if args.json_out:
        print(json.dumps(rows, indent=2))
        return 0
    if not args.verbose:
        print(f"    {'device':<24} {'kind':<10} {'mtu':>7}  gid")
        print(f"    {'------':<24} {'----':<10} {'---':>7}  ---")
        for r in rows:
            gids = r["gids"]
            assert isinstance(gids, list)
            print(f"    {r['name']!s:<24} {r['kind']!s:<10} {r['mtu']!s:>7}  {gids[0] if gids else '-'}")
        return 0
    print(f"UDP data plane: {data_plane()}\n")
    for r in rows:
        print(f"device: {r['name']}")
        for key, value in r.items():
            if key == "name":
                continue
            if isinstance(value, list):
                value = ", ".join(map(str, value)) or "-"
            print(f"\t{key + ':':<20}{value if value is not None else '-'}")
        print()
    return 0


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("devices", help="list RDMA devices (soft and verbs), like ibv_devinfo")
    # Here --json switches the output to JSON: devices takes no options file.
    add_general_flags(p, json_file=False)
    p.add_argument("name", nargs="?", help="only this device (a name or an address)")
    p.add_argument("--json", dest="json_out", action="store_true", help="machine-readable output")
    # Long only: -V is version in perftest, validate in rping, and -v version in every rdmakit program.
    p.add_argument("--verbose", action="store_true", help="every attribute, one per line")
    p.set_defaults(handler=run(p, _devices))
