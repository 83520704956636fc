"""The backend boundary: what the DOCA layer needs from a device.

A backend is a device driver below the DOCA object model: the soft-RoCE driver
(``rdmakit.doca.soft`` over ``rdmakit.transport``), the pyverbs backend
(``rdmakit.doca.verbs_glue`` over ``rdmakit.verbs``) and the in-tree
`rdmakit.doca.local.LocalBackendDevice`. The surface is a set of
`typing.Protocol` s, so a backend satisfies it structurally; this module is a
leaf of ``rdmakit.doca`` (it imports the engine's value types and nothing of
``rdmakit.doca``), so a backend never depends on the DOCA layer. What crosses
the boundary is the engine's verbs value types (``rdmakit.engine.types``:
`Access`, `SGE`, `SendWR`, `RecvWR`, `Completion`, `QpCaps`;
``rdmakit.engine.states.QpState``), whose values are libibverbs' own, plus
``memoryview``, ``ipaddress`` and plain JSON-able dicts.

Every capability the DOCA layer uses is a member here: nothing above this
line asks an object what it can do with ``getattr``. Failures are raised as
``rdmakit.doca.DocaError`` by the implementations; members that report "no"
as a value (`BackendDevice.gid_at`, `BackendDevice.local_view`) return None.

`rdmakit.testing.backend.check_backend_pair` is the conformance suite every
backend runs.
"""

from collections.abc import Mapping, Sequence, Set, Sized
from dataclasses import dataclass
from enum import StrEnum
from ipaddress import IPv4Address, IPv6Address
from typing import Protocol, runtime_checkable

from rdmakit.engine.cm_events import CmEvent, CmEventKind
from rdmakit.engine.states import QpState
from rdmakit.engine.types import Access, Completion, QpCaps, RecvWR, SendWR

__all__ = [
    "BackendCaps",
    "BackendCm",
    "BackendDevice",
    "BackendQP",
    "BackendSRQ",
    "CmEvent",
    "CmEventKind",
    "ConnectAttrs",
    "DeviceCaps",
    "JobType",
    "MemoryRegistration",
    "Pump",
]


class JobType(StrEnum):
    """Names a device lists in ``caps.job_types`` for the jobs it can run.

    Plain strings, so a backend fills its capabilities without importing this
    module. Mirrors DOCA's per-library ``*_job_get_supported()`` queries.
    """

    DMA_MEMCPY = "dma.memcpy"
    RDMA_SEND = "rdma.send"
    RDMA_SEND_IMM = "rdma.send_imm"
    RDMA_RECV = "rdma.recv"
    RDMA_READ = "rdma.read"
    RDMA_WRITE = "rdma.write"
    RDMA_WRITE_IMM = "rdma.write_imm"
    RDMA_ATOMIC_CMP_SWP = "rdma.atomic_cmp_swp"
    RDMA_ATOMIC_FETCH_ADD = "rdma.atomic_fetch_add"


class BackendCaps(Protocol):
    """Device capabilities, as the DOCA capability queries report them."""

    @property
    def max_buf_size(self) -> int:
        """Largest single buffer (bytes) a job may reference."""

    @property
    def max_buf_list_len(self) -> int:
        """Longest buffer chain (``doca_buf`` list) a job may reference."""

    @property
    def max_qp_wr(self) -> int:
        """Largest send/receive queue depth of a QP."""

    @property
    def max_sge(self) -> int:
        """Most scatter/gather entries in one work request."""

    @property
    def job_types(self) -> Set[str]:
        """`JobType` values the device can execute."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceCaps:
    """A concrete `BackendCaps`."""

    max_buf_size: int = 1 << 31
    max_buf_list_len: int = 16
    max_qp_wr: int = 4096
    max_sge: int = 16
    job_types: frozenset[str] = frozenset()


class MemoryRegistration(Protocol):
    """A registered memory region (``ibv_mr``); the engine's `MemoryRegion` is one."""

    @property
    def addr(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def lkey(self) -> int: ...
    @property
    def rkey(self) -> int: ...


class Pump(Protocol):
    """What does a device's I/O and timers: the soft driver, a verbs completion channel.

    A `rdmakit.doca.ProgressEngine` holds the pumps of the devices opened
    under it and runs each once per ``progress``; their descriptors are in its
    notification handle.
    """

    def progress(self) -> bool:
        """Do pending I/O and timers without blocking; True if anything happened."""

    def fileno(self) -> int | None:
        """A descriptor readable whenever `progress` has work; None: polling only."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectAttrs:
    """The RC attributes `BackendQP.connect` sets on the way to RTS (IBTA §11.2.5.3, ``ibv_modify_qp``).

    The defaults are the ones both backends connect with unless told
    otherwise: ``retry_cnt`` 6, not 7, because rxe never exhausts 7 and a
    vanished peer must end in RETRY_EXC_ERR, not a hang; ``rnr_retry`` 7
    waits for receives as long as it takes (IBTA §9.7.5.2.8), as perftest
    does. `timeout` None is the backend's own: 14 on a verbs device (its
    kernel or firmware runs the timer), more on the soft engine, whose timer
    runs in a Python pump. `hop_limit` is the IP TTL (the GRH hop limit) of a
    verbs QP's packets; the soft engine's packets leave through its device's
    socket, with the system's TTL.
    """

    max_rd_atomic: int = 16  # RDMA READ / atomic requests in flight as requester (RTS)
    max_dest_rd_atomic: int = 16  # ... accepted as responder (RTR)
    min_rnr_timer: int = 12  # the RNR NAK timer code a responder sends (RTR)
    timeout: int | None = None  # local ACK timeout, 4.096 µs * 2**timeout (RTS)
    retry_cnt: int = 6  # transport retries (RTS)
    rnr_retry: int = 7  # RNR retries; 7 is infinite (RTS)
    hop_limit: int = 64  # GRH hop limit, the IP TTL (RTR)


@runtime_checkable
class BackendQP(Protocol):
    """An RC queue pair with its own completion queue (``ibv_qp`` + ``ibv_cq``).

    Lifecycle (IBTA Vol. 1 §10.3.1): created in RESET; `init` moves it to INIT
    with the responder's access flags, so receives can be posted before the
    peer is known; `connect` moves it to RTS (INIT -> RTR -> RTS) with the
    peer's `export` output; `to_error` moves it to ERR, flushing what is
    outstanding; `reset` takes it back to RESET from anywhere. Work requests
    are posted without blocking; the device's `Pump` does the I/O;
    completions are collected with `poll`.
    """

    #: The attributes `connect` uses; set before `connect` to change them.
    connect_attrs: ConnectAttrs
    #: What `poll` would take, where the backend can show it without a call (a soft device's
    #: completion ring: empty means `poll` would return nothing); None: only `poll` knows.
    ready: Sized | None

    @property
    def qpn(self) -> int: ...
    @property
    def state(self) -> QpState: ...

    def export(self) -> dict[str, object]:
        """Connection info a peer needs (QPN, PSN, GID, MTU, ...), JSON-serialisable."""

    def init(self, access: Access) -> None:
        """RESET -> INIT, granting the peer `access` (REMOTE_* bits; IBTA §10.6.3.1).

        A no-op in any other state.
        """

    def connect(self, remote: Mapping[str, object]) -> None:
        """Bring the QP to RTS towards the peer described by its `export` output."""

    def post_send(self, wr: SendWR) -> None:
        """Post one send-queue work request (``ibv_post_send``)."""

    def post_recv(self, wr: RecvWR) -> None:
        """Post one receive-queue work request (``ibv_post_recv``)."""

    def poll(self, max_entries: int) -> Sequence[Completion]:
        """Up to `max_entries` completions, oldest first; never blocks (``ibv_poll_cq``)."""

    def to_error(self) -> None:
        """Move to ERR (``ibv_modify_qp`` IBV_QPS_ERR); a no-op in RESET or ERR.

        Every outstanding work request then completes with WR_FLUSH_ERR
        (IBTA §10.3.1, §11.6.2), as do those posted later.
        """

    def reset(self) -> None:
        """Back to RESET with a fresh PSN; outstanding work is dropped without completions."""

    def transport_fault(self) -> str | None:
        """Why the transport under the QP gave up on its peer, in words, when it knows more
        than the completion status says (a refused TCP connection); None otherwise."""

    def close(self) -> None:
        """Destroy the QP; idempotent. Outstanding work requests are dropped."""


class BackendSRQ(Protocol):
    """A shared receive queue (``ibv_srq``, IBTA Vol. 1 §10.2.9) the device's QPs can take receives from.

    Receives posted here are consumed by whichever attached QP a message
    arrives on first; the completion is on that QP (`BackendQP.poll`), with
    that QP's number. A QP of the SRQ that fails flushes only the receive it
    was filling; the others stay for the other QPs.
    """

    @property
    def max_wr(self) -> int: ...

    def post_recv(self, wr: RecvWR) -> None:
        """Post one receive (``ibv_post_srq_recv``); FULL past ``max_wr``."""

    def close(self) -> None:
        """Destroy the SRQ once no QP uses it (``ibv_destroy_srq``); idempotent."""


@runtime_checkable
class BackendCm(Protocol):
    """A device's connection manager: RDMA CM over the port's GSI QP (IBTA Vol. 1 ch. 12).

    The same surface whether the device speaks CM itself (the soft engine) or
    through librdmacm (verbs). QPs are the caller's: `connect` takes a QP in
    INIT and the CM moves it to RTR and RTS from the peer's REP; `accept` does
    the same with the REQ. Events are only ever returned by `poll_events`,
    which the DOCA layer calls inside progress; the CM's timers run in the
    device's `Pump`.
    """

    def listen(self, port: int) -> None:
        """Accept REQs for `port` (``rdma_listen``); DocaError IN_USE if taken."""

    def stop_listen(self, port: int) -> None:
        """Stop accepting REQs for `port`; idempotent."""

    def connect(
        self,
        qp: BackendQP,
        addr: IPv4Address | IPv6Address,
        port: int,
        private_data: bytes,
        timeout: float,
    ) -> int:
        """Send a REQ for `qp` to `addr`:`port`; returns the connection handle."""

    def accept(self, conn: int, qp: BackendQP, private_data: bytes) -> None:
        """Answer a CONNECT_REQUEST with a REP for `qp` (``rdma_accept``)."""

    def reject(self, conn: int, private_data: bytes) -> None:
        """Answer a CONNECT_REQUEST with a REJ, reason consumer reject (28)."""

    def disconnect(self, conn: int) -> None:
        """Send a DREQ (or answer one); the QP goes to ERR. Idempotent."""

    def poll_events(self) -> Sequence[CmEvent]:
        """Events since the last call, oldest first; never blocks."""

    def close(self) -> None:
        """Stop listening and drop every connection; idempotent."""


@runtime_checkable
class BackendDevice(Protocol):
    """An open device: identity, GIDs, memory registration, QP creation and its pump."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str:
        """``"local"``, ``"soft-udp"``, ``"soft-tcp"``, ``"verbs"``."""

    @property
    def gids(self) -> Sequence[IPv6Address]:
        """The port's populated GIDs (RoCEv2: IPv4-mapped or IPv6 addresses), index order."""

    @property
    def gid_index(self) -> int:
        """The GID table index QPs use unless told otherwise."""

    @property
    def gid(self) -> IPv6Address:
        """The GID at `gid_index`: a RoCE v2 GID of the device's own address, never link-local."""

    def gid_at(self, index: int) -> IPv6Address | None:
        """The RoCE v2 GID at GID table index `index` (``ibv_query_gid``), None if there is none."""

    @property
    def mtu(self) -> int:
        """Active path MTU in bytes (256, 512, 1024, 2048 or 4096)."""

    @property
    def caps(self) -> BackendCaps: ...

    @property
    def pump(self) -> Pump:
        """What runs this device's I/O; the same object for the device's lifetime."""

    def register_memory(self, buffer: memoryview, addr: int, access: Access) -> MemoryRegistration:
        """Register `buffer` (1-D bytes) at virtual address `addr` (``ibv_reg_mr``).

        A read-only `buffer` is only ever passed without write access. Keys
        must be unpredictable.
        """

    def deregister(self, registration: MemoryRegistration) -> None:
        """Invalidate the keys of `registration` (``ibv_dereg_mr``); idempotent."""

    def local_view(self, lkey: int, addr: int, length: int, *, write: bool) -> memoryview | None:
        """The registered bytes ``[addr, addr+length)`` under `lkey`, as the device reaches them.

        None on a local protection error (IBTA §10.6.3.2): an unknown key, a
        range outside the region, or `write` without LOCAL_WRITE.
        """

    def create_qp(
        self, caps: QpCaps, gid_index: int | None = None, srq: BackendSRQ | None = None
    ) -> BackendQP:
        """Create an RC QP in RESET whose address vector uses `gid_index` (None: `gid_index`).

        With `srq` (one of this device's), the QP has no receive queue of its
        own: `BackendQP.post_recv` is INVALID_VALUE and receives go to `srq`.
        """

    def create_srq(self, max_wr: int, max_sge: int) -> BackendSRQ:
        """A shared receive queue (``ibv_create_srq``); NOT_SUPPORTED where the device has none."""

    def cm(self) -> BackendCm:
        """The device's connection manager, created on first use.

        DocaError NOT_SUPPORTED where the device has none (local, soft TCP).
        """

    def close(self) -> None:
        """Release the device; idempotent. Registrations and QPs become invalid."""
