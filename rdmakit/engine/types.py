"""Verbs value types: access flags, work requests, completions.

Enum values are the libibverbs ones (``infiniband/verbs.h``), so they can be
handed to and compared with pyverbs unchanged.
"""

from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import NamedTuple


class Access(IntFlag):
    """Memory and QP access rights (``ibv_access_flags``; IBTA Vol. 1 §10.6.3.1)."""

    NONE = 0
    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8


class WrOpcode(IntEnum):
    """Send work request operations (``ibv_wr_opcode``, rxe's ``IB_WR_*``; IBTA §10.8.2.1)."""

    RDMA_WRITE = 0  # IB_WR_RDMA_WRITE (IBTA §9.4.2)
    RDMA_WRITE_WITH_IMM = 1  # IB_WR_RDMA_WRITE_WITH_IMM
    SEND = 2  # IB_WR_SEND (§9.4.1)
    SEND_WITH_IMM = 3  # IB_WR_SEND_WITH_IMM
    RDMA_READ = 4  # IB_WR_RDMA_READ (§9.4.3)
    ATOMIC_CMP_AND_SWP = 5  # IB_WR_ATOMIC_CMP_AND_SWP (§9.4.5)
    ATOMIC_FETCH_AND_ADD = 6  # IB_WR_ATOMIC_FETCH_AND_ADD (§9.4.5)


class WcOpcode(IntEnum):
    """Work completion operations (``ibv_wc_opcode``, rxe's ``IB_WC_*``; IBTA §11.4.2.1)."""

    SEND = 0  # IB_WC_SEND
    RDMA_WRITE = 1  # IB_WC_RDMA_WRITE
    RDMA_READ = 2  # IB_WC_RDMA_READ
    COMP_SWAP = 3  # IB_WC_COMP_SWAP
    FETCH_ADD = 4  # IB_WC_FETCH_ADD
    RECV = 128  # IB_WC_RECV
    RECV_RDMA_WITH_IMM = 129  # IB_WC_RECV_RDMA_WITH_IMM


class WcStatus(IntEnum):
    """Work completion status (``ibv_wc_status``; IBTA §10.10.2, §11.6.2)."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21


class SGE(NamedTuple):
    """Scatter/gather element (``ibv_sge``): ``length`` bytes at ``addr`` in the MR of ``lkey``."""

    addr: int
    length: int
    lkey: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SendWR:
    """A send queue work request (``ibv_send_wr``).

    The message length is the sum of the ``sg_list`` lengths (for READ and the
    atomics, the local buffer the response lands in; atomics need exactly 8
    bytes). ``imm_data`` is the ImmDt u32 exactly as on the wire. For
    ATOMIC_CMP_AND_SWP ``compare_add`` is the compare value and ``swap`` the
    swap value; for ATOMIC_FETCH_AND_ADD ``compare_add`` is the addend.
    """

    wr_id: int
    opcode: WrOpcode
    sg_list: tuple[SGE, ...] = ()
    remote_addr: int = 0
    rkey: int = 0
    imm_data: int | None = None
    compare_add: int = 0
    swap: int = 0
    signaled: bool = True
    #: IBV_SEND_SOLICITED: SE on the message's last packet (SEND and WRITE with immediate).
    solicited: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RecvWR:
    """A receive queue work request (``ibv_recv_wr``)."""

    wr_id: int
    sg_list: tuple[SGE, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """A work completion (``ibv_wc``).

    On error ``opcode`` still names the operation of the work request (verbs
    leaves it undefined). ``imm_data`` is the ImmDt u32 exactly as on the wire.
    """

    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    byte_len: int = 0
    imm_data: int | None = None
    qp_num: int = 0
    src_qp: int = 0
    vendor_err: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class QpCaps:
    """Queue pair capacities (``ibv_qp_cap``) and engine limits.

    ``large_mtu`` allows any power-of-two path MTU from 256 bytes to 1 MiB (for
    the TCP transport, where no RoCE peer is involved). ``max_unacked_psns``
    is the requester's window: at most that many PSNs sent and not yet
    acknowledged (rxe ``RXE_MAX_UNACKED_PSNS``). ``fast_paths`` lets runs of
    MIDDLE packets skip the generic per-packet dispatch, in both directions and
    in bulk (``rx_run``, ``poll_transmit_trains``); off, every packet takes the
    generic path, with the same packets, completions and states.
    ``congestion_control`` keeps a congestion window and a DCQCN rate beside the
    window (:mod:`rdmakit.engine.congestion`); off for a transport that has its own
    (TCP), the requester sends as rxe does.
    """

    max_send_wr: int = 256
    max_recv_wr: int = 256
    max_send_sge: int = 16
    max_recv_sge: int = 16
    large_mtu: bool = False
    max_unacked_psns: int = 128
    fast_paths: bool = True
    congestion_control: bool = True
