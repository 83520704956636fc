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

from rdmakit.cli.errors import CliError
from rdmakit.doca import DocaError, DocaErrorCode
from rdmakit.doca.backend import BackendDevice, BackendQP, MemoryRegistration
from rdmakit.doca.device import find_devinfo
from rdmakit.doca.verbs_glue import VerbsBackendDevice
from rdmakit.engine.types import Access, Completion, QpCaps, RecvWR, SendWR, WcStatus
from rdmakit.transport.driver import wait_readable
from rdmakit.verbs.buffers import buffer_address
from rdmakit.wire import ROCE_UDP_PORT

__all__ = ["Memory", "TestQp", "oob_timeout", "open_device", "pump"]

ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
TCP_REFUSED = (
    "the TCP transport cannot run this program: its out-of-band exchange carries a LID, QPN, PSN and GID "
    "and has no room for the TCP transport's connection secret (use a UDP device or a verbs device)"
)


def oob_timeout() -> float:
    """Seconds allowed for each out-of-band step (``RDMAKIT_OOB_TIMEOUT``, default 60)."""
    try:
        return max(float(os.environ.get("RDMAKIT_OOB_TIMEOUT", "60")), 0.1)
    except ValueError:
        return 60.0


def open_device(spec: str | None, gid_index: int | None, port: int | None = None) -> BackendDevice:
    """The device `spec` names (``-d``); `gid_index` and `port` select a verbs device's GID and port."""
    if spec is None:
        raise CliError(
            "no device given: use -d with a soft device's address (e.g. -d 127.0.0.2) or a verbs device"
        )
    if spec.startswith("tcp:"):
        raise CliError(TCP_REFUSED)
    try:
        info = find_devinfo(spec)
    except DocaError as e:
        if e.code is DocaErrorCode.NOT_FOUND:
            raise CliError(f"no such device: {spec!r} (see 'rdmakit devices')") from e
        raise
    if info.kind == "soft-tcp":
        raise CliError(TCP_REFUSED)
    if info.kind == "soft-udp":
        if gid_index not in (None, 0):
            raise CliError(f"{info.name} has one GID, index 0, not {gid_index}")
        if port not in (None, 1):
            raise CliError(f"{info.name} has one port, 1, not {port}")
        return info.opener()
    if info.kind == "verbs":
        from rdmakit.verbs import VerbsDevice

        return VerbsBackendDevice(VerbsDevice(info.name, port=port, gid_index=gid_index))
    raise CliError(f"{info.name} is a {info.kind} device without RoCE")


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
) -> None:
    """Progress `qps` and hand every completion to `on_completion(qp index, wc)` until `done()`.

    `idle` (optional) is called on every turn and may post work (True if it
    did). A failed completion ends the test with its status, as the tools'
    ``NOTIFY_COMP_ERROR_*`` do; so does `timeout` seconds without progress.
    """
    deadline = time.monotonic() + timeout
    device_pump = qps[0].dev.pump
    fd = device_pump.fileno()
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
            continue
        if done():
            return
        if now > deadline:
            raise CliError(f"{what}: no progress for {timeout:g} s", status=3)
        if fd is None:
            time.sleep(0)  # a pump without a descriptor is polled
        else:
            wait_readable(fd, min(0.05, deadline - now))
