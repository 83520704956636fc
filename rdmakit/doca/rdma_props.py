"""The configuration and capability queries of DOCA RDMA (``doca_rdma.h``): the properties half of `Rdma`.

Every setter may be called in IDLE only (BAD_STATE otherwise: "Can only be
called before calling doca_ctx_start()"). The capability queries take a
`DevInfo` and report what the backend really has: the soft engine's limits
(``rdmakit.doca.soft.SOFT_CAPS``, the engine's ``MAX_MSG_SIZE``) or, on a
verbs device, ``ibv_query_device``'s (``rdmakit.verbs.info.caps_of``). A
property the backend cannot honour is NOT_SUPPORTED:

================================================  ==========================================================
DOCA                                              here, and how it is honoured
================================================  ==========================================================
``doca_rdma_cap_get_max_send_queue_size``         `cap_get_max_send_queue_size`: the device's ``max_qp_wr``
``doca_rdma_cap_get_max_recv_queue_size``         `cap_get_max_recv_queue_size`: the device's ``max_qp_wr``
``doca_rdma_cap_get_max_message_size``            `cap_get_max_message_size`: ``max_buf_size`` (2^31 at most)
``doca_rdma_cap_get_max_send_buf_list_len``       `cap_get_max_send_buf_list_len`: ``max_sge``
``doca_rdma_cap_task_receive_get_max_dst_buf_...  `cap_task_receive_get_max_dst_buf_list_len`: ``max_sge``
``doca_rdma_cap_get_gid_table_size``, ``_gid``    `cap_get_gid_table_size`, `cap_get_gid`: the port's GIDs
``doca_rdma_cap_transport_type_is_supported``     `cap_transport_type_is_supported`: RC only
``doca_rdma_cap_task_<x>_is_supported``           `cap_task_is_supported` and one per task type
``doca_rdma_set_mtu``                             `set_mtu`: the path MTU both descriptors carry
``doca_rdma_set_grh_enabled``                     `set_grh_enabled`: RoCE needs the GRH; False NOT_SUPPORTED
``doca_rdma_set_sl``                              `set_sl`: 0 only (NOT_SUPPORTED otherwise: no VLAN PCP)
``doca_rdma_set_rnr_retry_count``                 `set_rnr_retry_count`: the QP's RNR retry count (RTS)
``doca_rdma_set_max_send_buf_list_len``           `set_max_send_buf_list_len`: the QP's ``max_send_sge``
``doca_rdma_set_connection_request_timeout``      `set_connection_request_timeout`: milliseconds, for CM
================================================  ==========================================================
"""

from enum import IntEnum
from ipaddress import IPv6Address

from rdmakit.doca.backend import JobType
from rdmakit.doca.device import Dev, DevInfo
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.mmap import AccessFlag
from rdmakit.doca.rdma_cm import RdmaCmApi
from rdmakit.doca.rdma_jobs import U32, check_uint
from rdmakit.engine.types import Access, QpCaps

__all__ = ["MTU_SIZES"]  # RdmaPropsApi: a base of Rdma; RDMA_PERMISSIONS, RdmaTransportType: via rdma

#: ``enum doca_mtu_size``: the IB path MTUs (IBTA §7.7.9).
MTU_SIZES = (256, 512, 1024, 2048, 4096)

#: The task types and the job type each needs of the device (``doca_rdma_cap_task_<x>_is_supported``).
_TASK_JOBS = {
    "receive": JobType.RDMA_RECV,
    "send": JobType.RDMA_SEND,
    "send_imm": JobType.RDMA_SEND_IMM,
    "read": JobType.RDMA_READ,
    "write": JobType.RDMA_WRITE,
    "write_imm": JobType.RDMA_WRITE_IMM,
    "atomic_cmp_swp": JobType.RDMA_ATOMIC_CMP_SWP,
    "atomic_fetch_add": JobType.RDMA_ATOMIC_FETCH_ADD,
    "remote_net_sync_event_get": JobType.RDMA_READ,
    "remote_net_sync_event_notify_set": JobType.RDMA_WRITE,
    "remote_net_sync_event_notify_add": JobType.RDMA_ATOMIC_FETCH_ADD,
}


class RdmaTransportType(IntEnum):
    """``enum doca_rdma_transport_type``."""

    RC = 0  # reliable connection
    DC = 1  # dynamically connected: not supported (as in DOCA without a DC-capable NIC)


#: The permissions an Rdma context may grant (``doca_rdma_set_permissions``).
RDMA_PERMISSIONS = (
    AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC
)


class RdmaPropsApi(RdmaCmApi):
    """The configuration of `Rdma` (IDLE only) and its capability queries."""

    def __init__(self) -> None:
        super().__init__()
        self._permissions = AccessFlag.LOCAL_READ_WRITE  # DOCA's default: no remote access
        self._gid_index: int | None = None  # None: the device's own
        self._send_queue_size = 64
        self._recv_queue_size = 64
        self._recv_buf_chain_len = 1
        self._transport_type = RdmaTransportType.RC
        self._mtu: int | None = None  # None: the device's
        self._rnr_retry = 7
        self._max_send_buf_list_len: int | None = None  # None: the device's max_sge

    # -- capabilities (doca_rdma_cap_*) ------------------------------------------------------------

    @staticmethod
    def _rdma_caps(devinfo: DevInfo) -> None:
        if not devinfo.is_job_supported(JobType.RDMA_SEND):
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{devinfo.name} does not run RDMA", Fault.SYSTEM)

    @classmethod
    def cap_get_max_send_queue_size(cls, devinfo: DevInfo) -> int:
        """``doca_rdma_cap_get_max_send_queue_size``: the device's ``max_qp_wr``."""
        cls._rdma_caps(devinfo)
        return devinfo.caps.max_qp_wr

    @classmethod
    def cap_get_max_recv_queue_size(cls, devinfo: DevInfo) -> int:
        """``doca_rdma_cap_get_max_recv_queue_size``: the device's ``max_qp_wr``."""
        cls._rdma_caps(devinfo)
        return devinfo.caps.max_qp_wr

    @classmethod
    def cap_get_max_message_size(cls, devinfo: DevInfo) -> int:
        """``doca_rdma_cap_get_max_message_size``: the longest message (IBTA §9.4.3: 2^31 at most)."""
        cls._rdma_caps(devinfo)
        return devinfo.caps.max_buf_size

    @classmethod
    def cap_get_max_send_buf_list_len(cls, devinfo: DevInfo) -> int:
        """``doca_rdma_cap_get_max_send_buf_list_len``: scatter/gather entries of a send (``max_sge``)."""
        cls._rdma_caps(devinfo)
        return devinfo.caps.max_sge

    @classmethod
    def cap_task_receive_get_max_dst_buf_list_len(cls, devinfo: DevInfo) -> int:
        """``doca_rdma_cap_task_receive_get_max_dst_buf_list_len``: the device's ``max_sge``."""
        cls._rdma_caps(devinfo)
        return devinfo.caps.max_sge

    @classmethod
    def cap_get_gid_table_size(cls, devinfo: DevInfo) -> int:
        """``doca_rdma_cap_get_gid_table_size``: the entries of the port's GID table."""
        cls._rdma_caps(devinfo)
        return len(devinfo.gids)

    @classmethod
    def cap_get_gid(cls, devinfo: DevInfo, start_index: int, num_entries: int) -> list[IPv6Address]:
        """``doca_rdma_cap_get_gid``: `num_entries` GIDs from `start_index`; INVALID_VALUE past the table."""
        cls._rdma_caps(devinfo)
        gids = devinfo.gids
        check_uint("start_index", start_index, U32)
        check_uint("num_entries", num_entries, U32)
        if num_entries == 0 or start_index + num_entries > len(gids):
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"GIDs {start_index}..{start_index + num_entries - 1} are outside the table of {len(gids)}",
            )
        return list(gids[start_index : start_index + num_entries])

    @classmethod
    def cap_transport_type_is_supported(cls, devinfo: DevInfo, transport_type: int) -> None:
        """``doca_rdma_cap_transport_type_is_supported``: RC; DC is NOT_SUPPORTED (no DC target here)."""
        cls._rdma_caps(devinfo)
        try:
            t = RdmaTransportType(transport_type)
        except ValueError:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"unknown transport type {transport_type!r}"
            ) from None
        if t is not RdmaTransportType.RC:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, f"{devinfo.name} does not support {t.name}", Fault.SYSTEM
            )

    @staticmethod
    def cap_task_is_supported(devinfo: DevInfo, task: str) -> None:
        """``doca_rdma_cap_task_<task>_is_supported``: NOT_SUPPORTED unless the device runs `task`."""
        job_type = _TASK_JOBS.get(task)
        if job_type is None:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"no RDMA task type {task!r}")
        if not devinfo.is_job_supported(job_type):
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, f"{devinfo.name} does not run {task} tasks", Fault.SYSTEM
            )

    @classmethod
    def cap_task_receive_is_supported(cls, devinfo: DevInfo) -> None:
        cls.cap_task_is_supported(devinfo, "receive")

    @classmethod
    def cap_task_send_is_supported(cls, devinfo: DevInfo) -> None:
        cls.cap_task_is_supported(devinfo, "send")

    @classmethod
    def cap_task_send_imm_is_supported(cls, devinfo: DevInfo) -> None:
        cls.cap_task_is_supported(devinfo, "send_imm")

    @classmethod
    def cap_task_read_is_supported(cls, devinfo: DevInfo) -> None:
        cls.cap_task_is_supported(devinfo, "read")

    @classmethod
    def cap_task_write_is_supported(cls, devinfo: DevInfo) -> None:
        cls.cap_task_is_supported(devinfo, "write")

    @classmethod
    def cap_task_write_imm_is_supported(cls, devinfo: DevInfo) -> None:
        cls.cap_task_is_supported(devinfo, "write_imm")

    @classmethod
    def cap_task_atomic_cmp_swp_is_supported(cls, devinfo: DevInfo) -> None:
        cls.cap_task_is_supported(devinfo, "atomic_cmp_swp")

    @classmethod
    def cap_task_atomic_fetch_add_is_supported(cls, devinfo: DevInfo) -> None:
        cls.cap_task_is_supported(devinfo, "atomic_fetch_add")

    # -- the DOCA 2.0/2.5 properties ----------------------------------------------------------

    @staticmethod
    def job_get_supported(devinfo: DevInfo, job_type: JobType) -> None:
        """NOT_SUPPORTED unless the device runs `job_type` (``doca_rdma_job_get_supported``)."""
        if not devinfo.is_job_supported(job_type):
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"{devinfo.name} does not support {job_type.value} jobs",
                Fault.SYSTEM,
            )

    # -- configuration (IDLE only) -------------------------------------------------------------

    @property
    def dev(self) -> Dev | None:
        return self._devs[0] if self._devs else None

    @property
    def permissions(self) -> AccessFlag:
        """What the peer may do through this connection (the responder QP's access flags)."""
        return self._permissions

    def set_permissions(self, permissions: int) -> None:
        """Grant RDMA access flags (``doca_rdma_set_permissions``); non-RDMA flags are INVALID_VALUE."""
        self._require_idle("set_permissions")
        if type(permissions) is not int and not isinstance(permissions, AccessFlag):
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"permissions must be AccessFlag, got {permissions!r}"
            )
        if permissions < 0 or permissions & ~RDMA_PERMISSIONS:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"permissions {permissions:#x} include flags other than LOCAL_READ_WRITE, RDMA_READ, "
                "RDMA_WRITE, RDMA_ATOMIC",
            )
        self._permissions = AccessFlag(permissions)

    @property
    def gid_index(self) -> int:
        """The GID index set with `set_gid_index`, else the device's (0 without a device)."""
        if self._gid_index is None:
            dev = self.dev
            return 0 if dev is None or dev.closed else dev.backend.gid_index
        return self._gid_index

    def set_gid_index(self, gid_index: int) -> None:
        """Select the port GID the connection uses (``doca_rdma_set_gid_index``).

        The queue pair's address vector (source GID index) and the exported
        connection descriptor use the GID at this index of the device's table;
        INVALID_VALUE unless it holds a RoCE v2 GID. The default is the
        device's own (`BackendDevice.gid_index`).
        """
        self._require_idle("set_gid_index")
        check_uint("gid_index", gid_index, U32)
        dev = self.dev
        if dev is not None:
            self._check_gid(dev, gid_index)
        self._gid_index = gid_index

    def _qp_caps(self, dev: Dev) -> tuple[QpCaps, int]:
        """The start queue pair's capabilities and GID index, checked against `dev` (at start)."""
        backend = dev.backend
        caps = backend.caps
        for name, size in (("send", self._send_queue_size), ("receive", self._recv_queue_size)):
            if size > caps.max_qp_wr:
                raise DocaError(
                    DocaErrorCode.NOT_SUPPORTED,
                    f"{name} queue size {size} exceeds {dev.name}'s {caps.max_qp_wr}",
                    Fault.CALLER,
                )
        send_sge = caps.max_sge if self._max_send_buf_list_len is None else self._max_send_buf_list_len
        if send_sge > caps.max_sge:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"max_send_buf_list_len {send_sge} exceeds {dev.name}'s {caps.max_sge}",
                Fault.CALLER,
            )
        if self._recv_buf_chain_len > caps.max_sge:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"recv_buf_chain_len {self._recv_buf_chain_len} exceeds {dev.name}'s {caps.max_sge}",
                Fault.CALLER,
            )
        gid_index = backend.gid_index if self._gid_index is None else self._gid_index
        self._check_gid(dev, gid_index)
        qp_caps = QpCaps(
            max_send_wr=self._send_queue_size,
            max_recv_wr=self._recv_queue_size,
            max_send_sge=send_sge,
            max_recv_sge=self._recv_buf_chain_len,
        )
        return qp_caps, gid_index

    def _qp_access(self) -> Access:
        """The queue pair's access flags: the context's permissions (IBTA §10.6.3.1)."""
        access = Access.NONE
        if AccessFlag.RDMA_READ in self._permissions:
            access |= Access.REMOTE_READ
        if AccessFlag.RDMA_WRITE in self._permissions:
            access |= Access.REMOTE_WRITE
        if AccessFlag.RDMA_ATOMIC in self._permissions:
            access |= Access.REMOTE_ATOMIC
        return access

    @staticmethod
    def _check_gid(dev: Dev, gid_index: int) -> None:
        if dev.backend.gid_at(gid_index) is None:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"{dev.name} has no RoCE v2 GID at index {gid_index} "
                f"(it has {len(dev.backend.gids)}, at index 0 to {len(dev.backend.gids) - 1})",
            )

    @property
    def send_queue_size(self) -> int:
        return self._send_queue_size

    @property
    def recv_queue_size(self) -> int:
        return self._recv_queue_size

    @staticmethod
    def _queue_size(name: str, size: int) -> int:
        if type(size) is not int or not 1 <= size <= U32:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{name} must be a positive integer, got {size!r}")
        return 1 << (size - 1).bit_length()  # DOCA rounds up to a power of two

    def set_send_queue_size(self, size: int) -> None:
        """Send queue depth, rounded up to a power of two (``doca_rdma_set_send_queue_size``)."""
        self._require_idle("set_send_queue_size")
        self._send_queue_size = self._queue_size("send queue size", size)

    def set_recv_queue_size(self, size: int) -> None:
        """Receive queue depth, rounded up to a power of two (``doca_rdma_set_recv_queue_size``)."""
        self._require_idle("set_recv_queue_size")
        self._recv_queue_size = self._queue_size("receive queue size", size)

    @property
    def recv_buf_chain_len(self) -> int:
        return self._recv_buf_chain_len

    def set_recv_buf_chain_len(self, length: int) -> None:
        """Longest buffer chain a receive job may use (``doca_rdma_set_recv_buf_chain_len``)."""
        self._require_idle("set_recv_buf_chain_len")
        if type(length) is not int or length < 1:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"recv_buf_chain_len must be positive, got {length!r}"
            )
        self._recv_buf_chain_len = length

    @property
    def transport_type(self) -> RdmaTransportType:
        return self._transport_type

    def set_transport_type(self, transport_type: int) -> None:
        """RC only; DC is NOT_SUPPORTED (``doca_rdma_set_transport_type``)."""
        self._require_idle("set_transport_type")
        try:
            t = RdmaTransportType(transport_type)
        except ValueError:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE, f"unknown transport type {transport_type!r}"
            ) from None
        if t is not RdmaTransportType.RC:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, f"{t.name} transport is not supported; use RC", Fault.SYSTEM
            )
        self._transport_type = t

    def _check_dev(self, dev: Dev) -> None:
        if self._devs:
            raise DocaError(DocaErrorCode.NOT_SUPPORTED, "an RDMA context uses exactly one device")
        caps = dev.backend.caps
        if JobType.RDMA_SEND not in caps.job_types:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"{dev.name} ({dev.info.kind}) cannot run RDMA jobs",
                Fault.CALLER,
            )

    # -- properties of the newer doca_rdma.h -------------------------------------------------------

    @property
    def mtu(self) -> int | None:
        """`set_mtu`'s value; None: the device's (``doca_rdma_get_mtu``)."""
        return self._mtu

    def set_mtu(self, mtu: int) -> None:
        """``doca_rdma_set_mtu``: one of `MTU_SIZES` (INVALID_VALUE); above the device's, NOT_SUPPORTED.

        The path MTU this side exports and connects with: the connection uses
        the smaller of the two sides' (IBTA §9.6.2 path MTU).
        """
        self._require_idle("set_mtu")
        if mtu not in MTU_SIZES or type(mtu) is not int:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"mtu {mtu!r} is not one of {MTU_SIZES}")
        dev = self.dev
        if dev is not None and mtu > dev.info.mtu:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, f"mtu {mtu} exceeds {dev.name}'s {dev.info.mtu}", Fault.CALLER
            )
        self._mtu = mtu

    @property
    def grh_enabled(self) -> bool:
        return True

    def set_grh_enabled(self, grh_enabled: bool) -> None:
        """``doca_rdma_set_grh_enabled``: "If using ETH device, GRH must be enabled."

        Every backend is RoCE (Ethernet): False is NOT_SUPPORTED.
        """
        self._require_idle("set_grh_enabled")
        if type(grh_enabled) is not bool:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"grh_enabled must be a bool, got {grh_enabled!r}")
        if not grh_enabled:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, "RoCE devices need the GRH (it carries the IP addresses)"
            )

    @property
    def sl(self) -> int:
        return 0

    def set_sl(self, sl: int) -> None:
        """``doca_rdma_set_sl``: 0..15 (INVALID_VALUE); other than 0 NOT_SUPPORTED.

        On RoCE the SL becomes a VLAN priority (PCP); neither backend tags frames.
        """
        self._require_idle("set_sl")
        check_uint("sl", sl, 15)
        if sl != 0:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, f"service level {sl}: the backend sends untagged frames (SL 0)"
            )

    @property
    def rnr_retry_count(self) -> int:
        return self._rnr_retry

    def set_rnr_retry_count(self, count: int) -> None:
        """``doca_rdma_set_rnr_retry_count``: 0..7, 7 is infinite (IBTA §9.7.5.2.8); the QP's at RTS."""
        self._require_idle("set_rnr_retry_count")
        check_uint("rnr_retry_count", count, 7)
        self._rnr_retry = count

    @property
    def max_send_buf_list_len(self) -> int | None:
        """`set_max_send_buf_list_len`'s value; None: the device's ``max_sge``."""
        return self._max_send_buf_list_len

    def set_max_send_buf_list_len(self, length: int) -> None:
        """``doca_rdma_set_max_send_buf_list_len``: the QP's ``max_send_sge``.

        Beyond the device's ``max_sge``: NOT_SUPPORTED.
        """
        self._require_idle("set_max_send_buf_list_len")
        if type(length) is not int or not 1 <= length <= U32:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"max_send_buf_list_len {length!r} is not positive")
        dev = self.dev
        if dev is not None and length > dev.backend.caps.max_sge:
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED,
                f"max_send_buf_list_len {length} exceeds {dev.name}'s {dev.backend.caps.max_sge}",
                Fault.CALLER,
            )
        self._max_send_buf_list_len = length

    @property
    def connection_request_timeout(self) -> int:
        """Milliseconds `connect_to_addr` waits (``doca_rdma_get_connection_request_timeout``)."""
        return round(self._cm_timeout * 1000)

    def set_connection_request_timeout(self, timeout_ms: int) -> None:
        """``doca_rdma_set_connection_request_timeout``: a uint16 of milliseconds, for connect_to_addr."""
        self._require_idle("set_connection_request_timeout")
        check_uint("timeout", timeout_ms, 0xFFFF)
        if timeout_ms == 0:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "the connection request timeout must be positive")
        self._cm_timeout = timeout_ms / 1000
