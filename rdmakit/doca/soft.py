"""The soft backend: rdmakit's own RoCEv2 engine behind the DOCA backend protocol.

Device names are ``udp:ADDR`` (RoCEv2 on UDP 4791) and ``tcp:ADDR`` (the same
packets framed on TCP). Discovery lists both for every local address; any
address of 127.0.0.0/8 opens too, so two soft devices can share one machine
(``udp:127.0.0.2`` and ``udp:127.0.0.3``). A plain address means UDP.

A device opened twice in one process is one socket: `Dev` handles share it
by reference count. Each handle's `pump` is a `Driver` of its own, run by the
progress engine the `Dev` was opened under (``rdmakit.doca.pe``).

R_Keys, L_Keys, QPNs and initial PSNs are capabilities a peer must not guess
(RoCE carries them in clear and authenticates nothing, IBTA Vol. 1 §10.6.3,
Annex A17): a soft device opened here draws them from the OS CSPRNG
(``random.SystemRandom``, as Python's ``secrets`` does), never from the
Mersenne Twister, whose state 624 consecutive outputs give away. The sans-IO
engine takes whatever source it is handed, so tests still replay from a seed.
"""

import errno
import ipaddress
import itertools
import random
import threading
from collections.abc import Mapping, Sequence, Sized
from ipaddress import IPv6Address

from rdmakit.doca._addresses import address_problem, gid_mismatch
from rdmakit.doca._soft_pump import SoftPump, bell_of
from rdmakit.doca.backend import BackendCm, BackendSRQ, ConnectAttrs, DeviceCaps, JobType
from rdmakit.doca.device import DevInfo, register_provider, register_resolver
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault, error_from_engine, error_from_os
from rdmakit.doca.soft_cm import soft_cm
from rdmakit.engine import (
    Access,
    Completion,
    CompletionQueue,
    EngineError,
    MemoryRegion,
    QpCaps,
    QpState,
    QueuePair,
    RecvWR,
    SendWR,
    SharedReceiveQueue,
)
from rdmakit.engine.types import SGE
from rdmakit.transport.connect import ConnectOptions, Endpoint, connect_qp, init_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.transport.in_use import address_in_use
from rdmakit.transport.netmtu import port_mtu
from rdmakit.transport.port import TransportName
from rdmakit.transport.tcp_port import TCP_MTU
from rdmakit.wire import PSN_MASK, ROCE_UDP_PORT

__all__ = ["SOFT_CAPS", "SoftBackendDevice", "SoftBackendQP", "SoftBackendSRQ", "soft_devinfo"]

_RDMA_JOBS = frozenset(
    {
        JobType.RDMA_SEND, JobType.RDMA_SEND_IMM, JobType.RDMA_RECV, JobType.RDMA_READ,
        JobType.RDMA_WRITE, JobType.RDMA_WRITE_IMM, JobType.RDMA_ATOMIC_CMP_SWP,
        JobType.RDMA_ATOMIC_FETCH_ADD, JobType.DMA_MEMCPY,
    }
)  # fmt: skip
#: What a soft device can do: messages up to 2 GiB (RETH DMA length, IBTA
#: §9.3.3; rxe_resp_check_length()), 16-entry gather/scatter lists.
SOFT_CAPS = DeviceCaps(
    max_buf_size=1 << 31, max_buf_list_len=16, max_qp_wr=4096, max_sge=16, job_types=_RDMA_JOBS
)
_KIND = {"roce-udp": "soft-udp", "tcp": "soft-tcp"}
_PREFIX = {"roce-udp": "udp", "tcp": "tcp"}
#: Transports a soft device of each kind can connect to: a verbs QP (rxe, a
#: ConnectX NIC) speaks RoCEv2 on UDP too.
_COMPATIBLE = {"roce-udp": {"roce-udp", "verbs"}, "tcp": {"tcp"}}

# One socket per address and port in a process (the OS allows one bind), shared by Dev handles.
_lock = threading.Lock()
_shared: dict[tuple[str, str, int], tuple[SoftDevice, int]] = {}


def _acquire(transport: TransportName, ip: str, port: int) -> SoftDevice:
    key = (transport, ip, port)
    with _lock:
        got = _shared.get(key)
        if got is not None:
            dev, refs = got
            _shared[key] = (dev, refs + 1)
            return dev
    try:
        dev = SoftDevice(ip, transport=transport, port=port, rng=random.SystemRandom())
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise DocaError(DocaErrorCode.IN_USE, address_in_use(ip, port), Fault.CALLER) from e
        raise error_from_os(e, f"cannot open a {transport} soft device on {ip}:{port}") from e
    with _lock:
        _shared[key] = (dev, 1)
    return dev


def _release(dev: SoftDevice) -> None:
    key = (dev.transport, dev.ip, dev.port)
    with _lock:
        got = _shared.get(key)
        if got is None:
            return
        _, refs = got
        if refs > 1:
            _shared[key] = (dev, refs - 1)
            return
        del _shared[key]
    dev.close()


class SoftBackendSRQ:
    """An engine `SharedReceiveQueue` in the device's protection domain (errors as `DocaError`)."""

    def __init__(self, owner: "SoftBackendDevice", max_wr: int, max_sge: int) -> None:
        try:
            self.engine_srq = SharedReceiveQueue(owner.soft.pd, max_wr=max_wr, max_sge=max_sge)
        except EngineError as e:
            raise error_from_engine(e) from e
        self.max_wr = max_wr
        self._owner = owner
        self._bell = bell_of(owner.soft)

    def post_recv(self, wr: RecvWR) -> None:
        try:
            with self._bell:
                self.engine_srq.post_recv(wr)
        except EngineError as e:
            raise error_from_engine(e) from e

    def close(self) -> None:
        if not self.engine_srq.closed:
            try:
                with self._bell:
                    self.engine_srq.close()
            except EngineError as e:
                raise error_from_engine(e) from e
            self._owner._srqs.pop(id(self), None)


class SoftBackendQP:
    """An engine QP with its own CQ, pumped by its device's driver."""

    def __init__(self, owner: "SoftBackendDevice", caps: QpCaps, srq: SoftBackendSRQ | None = None) -> None:
        self._owner = owner
        self._dev = owner.soft
        self._lock = bell_of(owner.soft)  # what may give the engine work rings the pump's bell
        depth = caps.max_send_wr + (caps.max_recv_wr if srq is None else srq.max_wr)
        self._cq = CompletionQueue(depth)
        self._ring = self._cq.entries  # tested for emptiness by `poll` without a call
        self.ready: Sized | None = self._ring  # and by the context's progress (`BackendQP.ready`)
        self._qp: QueuePair = self._dev.create_qp(
            send_cq=self._cq, recv_cq=self._cq, caps=caps, srq=None if srq is None else srq.engine_srq
        )
        self._psn = self._dev.rng.getrandbits(24) & PSN_MASK
        self._access = ConnectOptions().access
        self.connect_attrs = ConnectAttrs()
        self._closed = False

    @property
    def qpn(self) -> int:
        return self._qp.qpn

    @property
    def state(self) -> QpState:
        return self._qp.state

    @property
    def engine_qp(self) -> QueuePair:
        return self._qp

    def export(self) -> dict[str, object]:
        with self._lock.lock:
            ep = local_endpoint(self._dev, self._qp, self._psn)
        info: dict[str, object] = {
            "transport": ep.transport, "gid": ep.gid, "ip": ep.ip, "port": ep.port,
            "qpn": ep.qpn, "psn": ep.psn, "mtu": ep.mtu,
        }  # fmt: skip
        if ep.secret:
            info["secret"] = ep.secret  # a tcp QP's: whoever holds the descriptor may connect
        return info

    def init(self, access: Access | None = None) -> None:
        """RESET → INIT with the responder's `access` (None: as before, all of them at first), so
        receives can be posted before the peer is known."""
        if access is not None:
            self._access = int(access)
        with self._lock:
            if self._qp.state is QpState.RESET:
                init_qp(self._qp, self._access)

    def _options(self) -> ConnectOptions:
        """The transport's RTR/RTS attributes: `connect_attrs` (the TTL aside) and the access of `init`."""
        a = self.connect_attrs
        return ConnectOptions(
            access=self._access, max_rd_atomic=a.max_rd_atomic, max_dest_rd_atomic=a.max_dest_rd_atomic,
            min_rnr_timer=a.min_rnr_timer, timeout=a.timeout, retry_cnt=a.retry_cnt, rnr_retry=a.rnr_retry,
        )  # fmt: skip

    def connect(self, remote: Mapping[str, object]) -> None:
        transport = remote.get("transport")
        if transport not in _COMPATIBLE[self._dev.transport]:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"a {self._dev.transport} device cannot connect to a {transport} peer",
                Fault.CALLER,
            )
        try:
            peer = Endpoint(
                transport=self._dev.transport,
                gid=str(remote["gid"]),
                ip=str(remote["ip"]),
                port=int(remote.get("port", ROCE_UDP_PORT)),  # type: ignore[call-overload]
                qpn=int(remote["qpn"]),  # type: ignore[call-overload]
                psn=int(remote["psn"]),  # type: ignore[call-overload]
                mtu=int(remote["mtu"]),  # type: ignore[call-overload]
                secret=str(remote.get("secret", "")),
            )
            ip = ipaddress.ip_address(peer.ip)
            # ConnectionDescriptor checks this too; a caller of the backend may not have.
            problem = address_problem(ip)
            why = f"ip {ip} {problem}" if problem else gid_mismatch(IPv6Address(peer.gid), ip)
            if why is not None:
                raise DocaError(DocaErrorCode.INVALID_VALUE, f"bad connection info: {why}", Fault.PEER)
            with self._lock:
                connect_qp(self._dev, self._qp, self._psn, peer, self._options())
        except EngineError as e:
            raise error_from_engine(e) from e
        except (KeyError, TypeError, ValueError) as e:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"bad connection info: {e}", Fault.PEER) from e

    def post_send(self, wr: SendWR) -> None:
        bell = self._lock  # ``with bell:`` written out: the per-job path makes no further call
        bell.lock.acquire()
        try:
            bell.rung += 1
            self._qp.post_send(wr)
        except EngineError as e:
            raise error_from_engine(e) from e
        finally:
            bell.lock.release()

    def post_recv(self, wr: RecvWR) -> None:
        bell = self._lock
        bell.lock.acquire()
        try:
            bell.rung += 1
            self._qp.post_recv(wr)
        except EngineError as e:
            raise error_from_engine(e) from e
        finally:
            bell.lock.release()

    def poll(self, max_entries: int) -> Sequence[Completion]:
        ring = self._ring
        if not ring:  # the common idle poll takes no lock and makes nothing: a completion pushed
            return ()  # meanwhile waits for the next poll, as one pushed just after the lock was let go
        lock = self._lock.lock  # ``with`` written out: it would make its exit method each time
        lock.acquire()
        try:
            if len(ring) == 1 and max_entries:  # one operation in flight: its completion alone
                return (ring.popleft(),)
            return self._cq.poll(max_entries)
        finally:
            lock.release()

    def progress(self) -> bool:
        """Run the device's pump (for callers without a progress engine)."""
        return self._owner.pump.progress()

    def fileno(self) -> int:
        return self._owner.pump.fileno()

    def to_error(self) -> None:
        """To ERR (IBTA §10.3.1): outstanding and later work requests complete flushed."""
        with self._lock:
            if self._qp.state not in (QpState.RESET, QpState.ERR):
                self._qp.modify(QpState.ERR)

    def transport_fault(self) -> str | None:
        return self._dev.transport_fault(self._qp.qpn)

    def reset(self) -> None:
        """Back to RESET with a fresh PSN (the recovery flow re-exports)."""
        with self._lock:
            self._dev.reset_qp(self._qp)  # on TCP, the exported secret is void too
            self._cq.poll(1 << 30)
        self._psn = self._dev.rng.getrandbits(24) & PSN_MASK

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            if self._qp.state is not QpState.RESET:
                self._qp.modify(QpState.ERR)
            self._dev.destroy_qp(self._qp)


class SoftBackendDevice:
    """A `BackendDevice` over one (shared) `SoftDevice`."""

    def __init__(self, transport: TransportName, ip: str, port: int = ROCE_UDP_PORT) -> None:
        self.soft = _acquire(transport, ip, port)
        self.transport = transport
        self.name = f"{_PREFIX[transport]}:{self.soft.ip}"
        self.kind = _KIND[transport]
        self.gids: Sequence[IPv6Address] = (IPv6Address(self.soft.gid),)
        self.mtu = self.soft.max_mtu
        self.caps = SOFT_CAPS
        self.gid_index = 0
        driver = Driver()
        driver.add(self.soft)
        self.soft.post_with(driver.clock)  # a job's one WRITE or SEND leaves in its submit
        self.pump = SoftPump(driver, bell_of(self.soft))
        self._qps: list[SoftBackendQP] = []
        self._srqs: dict[int, SoftBackendSRQ] = {}
        self._closed = False
        if transport == "roce-udp":
            soft_cm(self.soft)  # QP1 answers from the start, as a NIC's CM does (REJ when nobody listens)

    @property
    def gid(self) -> IPv6Address:
        return self.gids[0]

    def gid_at(self, index: int) -> IPv6Address | None:
        return self.gids[index] if 0 <= index < len(self.gids) else None

    def local_view(self, lkey: int, addr: int, length: int, *, write: bool) -> memoryview | None:
        with self.soft.lock:
            return self.soft.pd.local_slice(SGE(addr, length, lkey), write)

    def register_memory(self, buffer: memoryview, addr: int, access: Access) -> MemoryRegion:
        try:
            with self.soft.lock:
                return self.soft.pd.register(buffer, addr, Access(access))
        except EngineError as e:
            raise error_from_engine(e) from e

    def deregister(self, registration: object) -> None:
        if isinstance(registration, MemoryRegion):
            with self.soft.lock:
                self.soft.pd.deregister(registration)

    def cm(self) -> BackendCm:
        """The device's connection manager: rdma_cm over its QP1 (RoCE-UDP only)."""
        return soft_cm(self.soft)

    def create_srq(self, max_wr: int, max_sge: int) -> SoftBackendSRQ:
        """An SRQ of the engine (``rdmakit.engine.srq``) in the device's protection domain."""
        if self._closed:
            raise DocaError(DocaErrorCode.BAD_STATE, f"{self.name} is closed", Fault.CALLER)
        srq = SoftBackendSRQ(self, max_wr, max_sge)
        self._srqs[id(srq)] = srq
        return srq

    def create_qp(
        self, caps: QpCaps, gid_index: int | None = None, srq: BackendSRQ | None = None
    ) -> SoftBackendQP:
        if self._closed:
            raise DocaError(DocaErrorCode.BAD_STATE, f"{self.name} is closed", Fault.CALLER)
        if gid_index not in (None, 0):
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{self.name} has one GID, no index {gid_index}")
        if self.transport == "tcp" and not caps.large_mtu:
            caps = QpCaps(
                max_send_wr=caps.max_send_wr, max_recv_wr=caps.max_recv_wr, max_send_sge=caps.max_send_sge,
                max_recv_sge=caps.max_recv_sge, large_mtu=True, max_unacked_psns=caps.max_unacked_psns,
                congestion_control=False,  # TCP's own
            )  # fmt: skip
        own = None if srq is None else self._srqs.get(id(srq))
        if srq is not None and own is not srq:  # IBTA §10.2.9: a QP and its SRQ share a PD
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{srq!r} is not an SRQ of {self.name}")
        with bell_of(self.soft):
            qp = SoftBackendQP(self, caps, own)
            self._qps.append(qp)
        return qp

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for qp in self._qps:
            qp.close()
        self._qps.clear()
        self.pump.close()
        _release(self.soft)


# -- discovery -------------------------------------------------------------------------


def _local_addresses() -> list[str]:
    """IPv4 and IPv6 addresses of this host's interfaces (Linux /proc)."""
    found: list[str] = []
    try:
        with open("/proc/net/fib_trie") as f:
            lines = f.read().splitlines()
        for prev, line in itertools.pairwise(lines):
            if "/32 host LOCAL" in line:
                ip = prev.split()[-1]
                if ip not in found:
                    found.append(ip)
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                hexaddr = line.split()[0]
                ip = str(IPv6Address(bytes.fromhex(hexaddr)))
                if not ip.startswith("fe80") and ip not in found:
                    found.append(ip)
    except OSError:
        pass
    return found or ["127.0.0.1"]


def soft_devinfo(transport: TransportName, ip: str, port: int = ROCE_UDP_PORT) -> DevInfo:
    addr = ipaddress.ip_address(ip)
    gid = IPv6Address(b"\0" * 10 + b"\xff\xff" + addr.packed) if addr.version == 4 else addr
    return DevInfo(
        name=f"{_PREFIX[transport]}:{addr}",
        kind=_KIND[transport],
        opener=lambda: SoftBackendDevice(transport, str(addr), port),
        ip_addrs=(addr,),
        gids=(IPv6Address(gid),),
        mtu=port_mtu(str(addr)) if transport == "roce-udp" else TCP_MTU,
        caps=SOFT_CAPS,
    )


def _provider() -> list[DevInfo]:
    out: list[DevInfo] = []
    for ip in _local_addresses():
        out.append(soft_devinfo("roce-udp", ip))
        out.append(soft_devinfo("tcp", ip))
    return out


def _resolve(spec: str) -> DevInfo | None:
    transport: TransportName = "roce-udp"
    rest = spec
    for prefix, t in (("udp:", "roce-udp"), ("tcp:", "tcp")):
        if spec.startswith(prefix):
            transport, rest = t, spec[len(prefix) :]  # type: ignore[assignment]
    port = ROCE_UDP_PORT
    host = rest
    if rest.count(":") == 1 or rest.startswith("["):  # ADDR:PORT or [V6]:PORT
        host, _, p = rest.rpartition(":")
        host = host.strip("[]")
        if not p.isdigit():
            return None
        port = int(p)
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    # Any address of 127.0.0.0/8 works without configuration; others must be ours.
    if not (addr.is_loopback or str(addr) in _local_addresses()):
        return None
    return soft_devinfo(transport, str(addr), port)


_installed = False


def install() -> None:
    """Make soft devices discoverable (idempotent; done on importing rdmakit.doca)."""
    global _installed
    if _installed:
        return
    _installed = True
    register_provider(_provider)
    register_resolver(_resolve)
