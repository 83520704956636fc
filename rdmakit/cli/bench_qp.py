"""What ``rdmakit perftest`` and ``rdmakit rc-pingpong`` share: devices, QPs, memory, the pump.

`open_device` opens what ``-d`` names through the backend layer: a soft
device on UDP (an address, ``udp:ADDR``) or a verbs device (``rxe0``, an
RNIC). A ``tcp:`` device is refused: the tools' exchange carries a LID, QPN,
PSN and GID and nothing else, so there is no room for the TCP transport's
connection secret. `TestQp` is one RC QP with its own CQ; `Memory` is a
page-aligned registered buffer (the tools use page-aligned buffers, and
atomics need 8-byte alignment).
"""

import dataclasses
import mmap
import os
import time
from collections.abc import Callable, Sequence
from ipaddress import IPv6Address

from rdmakit.cli.errors import EXIT_USAGE, CliError
from rdmakit.cli.session import no_such_device
from rdmakit.doca import DocaError, DocaErrorCode
from rdmakit.doca._addresses import gid_text
from rdmakit.doca.backend import BackendDevice, BackendQP, MemoryRegistration
from rdmakit.doca.device import DevInfo, devinfo_list, find_devinfo
from rdmakit.doca.verbs_glue import VerbsBackendDevice
from rdmakit.engine.types import Access, Completion, QpCaps, RecvWR, SendWR, WcStatus
from rdmakit.transport.driver import wait_readable
from rdmakit.verbs.buffers import buffer_address
from rdmakit.wire import ROCE_UDP_PORT

__all__ = ["Memory", "TestQp", "first_device", "oob_timeout", "open_device", "pump", "soft_gid_problem"]

ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
TCP_REFUSED = (
    "the TCP transport cannot run this program: its out-of-band exchange carries a LID, QPN, PSN and GID "
    "and has no room for the TCP transport's connection secret (use a UDP device or a verbs device)"
)


#: Seconds a pump polls an idle device before it blocks: `rdmakit bench`'s ``--spin-us`` default.
SPIN = 200e-6


def oob_timeout() -> float:
    """Seconds allowed for each out-of-band step (``RDMAKIT_OOB_TIMEOUT``, default 60)."""
    try:
        return max(float(os.environ.get("RDMAKIT_OOB_TIMEOUT", "60")), 0.1)
    except ValueError:
        return 60.0


def open_device(spec: str | None, gid_index: int | None, port: int | None = None) -> BackendDevice:
    """The device `spec` names (``-d``; None: the first, as the C tools take); `gid_index` and `port`
    select a verbs device's GID and port, and a soft device's by rxe's table (`soft_gid_problem`)."""
    if spec is None:
        info = first_device()
    elif spec.startswith("tcp:"):
        raise CliError(TCP_REFUSED)
    else:
        try:
            info = find_devinfo(spec)
        except DocaError as e:
            if e.code is DocaErrorCode.NOT_FOUND:
                raise no_such_device(spec) from e
            raise
    if info.kind == "soft-tcp":
        raise CliError(TCP_REFUSED)
    if info.kind == "soft-udp":
        problem = soft_gid_problem(info.name, info.gids[0], gid_index)
        if problem:
            raise CliError(problem, EXIT_USAGE)
        if port not in (None, 1):
            raise CliError(f"{info.name} has one port, 1, not {port}", EXIT_USAGE)
        return info.opener()
    if info.kind == "verbs":
        from rdmakit.verbs import VerbsDevice

        return VerbsBackendDevice(VerbsDevice(info.name, port=port, gid_index=gid_index))
    raise CliError(f"{info.name} is a {info.kind} device without RoCE", EXIT_USAGE)


def first_device() -> DevInfo:
    """What the C tools take without ``-d`` (the first of ``ibv_get_device_list``): the first device
    of ``rdmakit devices`` that speaks RoCE, a verbs device before the soft ones."""
    roce = [i for i in devinfo_list() if i.kind in ("verbs", "soft-udp")]
    verbs = [i for i in roce if i.kind == "verbs"]
    if not roce:
        raise CliError("no RDMA device found (see 'rdmakit devices')")
    return (verbs or roce)[0]


#: A soft device's GIDs in rxe's order (``rxe_init_ports`` and the netdev's addresses): index 0 is the
#: link-local IPv6 GID (from the MAC), then one RoCEv2 GID per address, IPv4 ones as IPv4-mapped.
SOFT_GID_INDEX = 1


def soft_gid_problem(name: str, gid: IPv6Address, gid_index: int | None) -> str | None:
    """Why `gid_index` (``-x``/``-g``) cannot select a soft device's one GID, or None: as on rxe, index
    1 is the address and 0 the link-local IPv6 GID, which a soft device on one address does not serve."""
    if gid_index in (None, SOFT_GID_INDEX) or (gid_index == 0 and gid.is_link_local):
        return None
    if gid_index == 0:
        return (
            f"GID index 0 is rxe's link-local IPv6 GID (fe80::…); {name} serves only {gid_text(gid)}, "
            f"which rxe lists at index {SOFT_GID_INDEX}: use -x/-g {SOFT_GID_INDEX} or leave it out"
        )
    return (
        f"{name} has no GID index {gid_index}: its GID {gid_text(gid)} is index {SOFT_GID_INDEX}, as on rxe "
        f"(0 is rxe's link-local one); use -x/-g {SOFT_GID_INDEX} or leave it out"
    )


def device_gid(qp: BackendQP) -> IPv6Address:
    return IPv6Address(str(qp.export()["gid"]))


class Memory:
    """A page-aligned anonymous mapping registered on a device."""

    def __init__(self, dev: BackendDevice, length: int, access: Access = ALL_ACCESS) -> None:
        self._map = mmap.mmap(-1, max(length, 1))
        self.view = memoryview(self._map)
        self.addr = buffer_address(self.view)
        self.length = length
        self.mr: MemoryRegistration = dev.register_memory(self.view, self.addr, access)
        self._dev = dev

    @property
    def lkey(self) -> int:
        return self.mr.lkey

    @property
    def rkey(self) -> int:
        return self.mr.rkey

    def close(self) -> None:
        """Deregister; the mapping goes when the last view of it does (the engine may hold some)."""
        self._dev.deregister(self.mr)


class TestQp:
    """One RC QP of a test: the backend QP, its PSN and GID, and the attributes it connects with."""

    def __init__(self, dev: BackendDevice, *, send_depth: int, recv_depth: int) -> None:
        caps = QpCaps(max_send_wr=max(send_depth, 1), max_recv_wr=max(recv_depth, 1), max_unacked_psns=128)
        self.dev = dev
        self.qp = dev.create_qp(caps)
        self.qp.init(ALL_ACCESS)
        mine = self.qp.export()
        self.qpn = int(mine["qpn"])  # type: ignore[call-overload]
        self.psn = int(mine["psn"])  # type: ignore[call-overload]
        self.gid = IPv6Address(str(mine["gid"]))
        self.mtu = int(mine["mtu"])  # type: ignore[call-overload]

    def set_options(self, **values: int) -> None:
        """Set RTR/RTS attributes (`ConnectAttrs` fields) for `connect`."""
        self.qp.connect_attrs = dataclasses.replace(self.qp.connect_attrs, **values)

    def connect(self, *, gid: IPv6Address, qpn: int, psn: int, mtu: int) -> None:
        """RTR and RTS towards the peer the out-of-band exchange described."""
        if gid == IPv6Address(0):
            raise CliError(
                "the peer sent no GID: RoCE needs one (run the peer with -g/-x and a RoCE GID index)"
            )
        if (gid.ipv4_mapped is None) != (self.gid.ipv4_mapped is None):
            raise CliError(f"GID families differ: local {self.gid}, remote {gid} (use the same IP version)")
        ip = gid.ipv4_mapped or gid
        remote = {
            "transport": "verbs", "gid": str(gid), "ip": str(ip), "port": ROCE_UDP_PORT,
            "qpn": qpn, "psn": psn, "mtu": mtu,
        }  # fmt: skip
        try:
            self.qp.connect(remote)
        except DocaError as e:
            raise CliError(f"cannot connect QP {self.qpn:#x} to {gid} QP {qpn:#x}: {e}") from e

    def post_send(self, wr: SendWR) -> None:
        self.qp.post_send(wr)

    def post_recv(self, wr: RecvWR) -> None:
        self.qp.post_recv(wr)

    def close(self) -> None:
        self.qp.close()


def pump(
    qps: Sequence[TestQp],
    on_completion: Callable[[int, Completion], None],
    done: Callable[[], bool],
    timeout: float,
    what: str,
    idle: Callable[[], bool] | None = None,
    spin: float = SPIN,
) -> None:
    """Progress `qps` and hand every completion to `on_completion(qp index, wc)` until `done()`.

    `idle` (optional) is called on every turn and may post work (True if it
    did). A failed completion ends the test with its status, as the tools'
    ``NOTIFY_COMP_ERROR_*`` do; so does `timeout` seconds without progress.
    When nothing moves, the device is polled for `spin` seconds before the
    pump blocks on its descriptor (the C tools poll their CQs without end).
    """
    deadline = time.monotonic() + timeout
    device_pump = qps[0].dev.pump
    fd = device_pump.fileno()
    idle_since: float | None = None
    while not done():
        busy = device_pump.progress()
        for i, tq in enumerate(qps):
            for wc in tq.qp.poll(64):
                busy = True
                if wc.status is not WcStatus.SUCCESS:
                    fault = tq.qp.transport_fault()
                    why = f": {fault}" if fault else ""
                    raise CliError(f"{what}: completion with error {wc.status.name} (wr_id {wc.wr_id}){why}")
                on_completion(i, wc)
        if idle is not None:
            busy |= idle()
        now = time.monotonic()
        if busy:
            deadline = now + timeout
            idle_since = None
            continue
        if done():
            return
        if idle_since is None:
            idle_since = now
        if now - idle_since < spin:
            continue
        if now > deadline:
            raise CliError(f"{what}: no progress for {timeout:g} s", status=3)
        if fd is None:
            time.sleep(0)  # a pump without a descriptor is polled
        else:
            wait_readable(fd, min(0.05, deadline - now))
