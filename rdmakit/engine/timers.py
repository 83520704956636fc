"""RC timer and limit constants (IBTA Vol. 1 §9.7.6, §9.7.5.2.8; rxe_param.h, rxe_comp.c)."""

#: RNR NAK timer field -> microseconds (IBTA §9.7.5.2.8 table 46; rxe
#: ``rnrnak_usec``). Code 0 is the longest wait, 655.36 ms. rxe's table has
#: 61410 for code 25 where IBTA says 61.44 ms; we keep IBTA's value.
RNR_TIMER_USEC: tuple[int, ...] = (
    655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
    2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
    163840, 245760, 327680, 491520,
)  # fmt: skip

#: ``retry_cnt`` / ``rnr_retry`` value that never runs out: rxe never
#: decrements 7 (``rxe_comp.c`` COMPST_ERROR_RETRY / COMPST_RNR_RETRY);
#: IBTA §9.7.5.2.8 gives 7 this meaning for rnr_retry.
INFINITE_RETRY = 7

#: Set AckReq when more than this many packets went without one (rxe
#: ``RXE_MAX_PKT_PER_ACK``; ``init_req_packet()``: ``noack_pkts++ > 64``).
MAX_PKT_PER_ACK = 64

#: Requester window: PSNs sent and not acknowledged (rxe ``RXE_MAX_UNACKED_PSNS``).
MAX_UNACKED_PSNS = 128

#: Upper bound of max_rd_atomic and max_dest_rd_atomic (rxe ``RXE_MAX_QP_RD_ATOM``
#: and ``RXE_MAX_RES_RD_ATOM``).
MAX_RD_ATOMIC = 128

#: Largest message (rxe ``RXE_MAX_MSG_SIZE``; IBTA §9.4.3 RETH DMA length).
MAX_MSG_SIZE = 1 << 31

#: IB path MTUs (IBTA §7.7.9); with ``QpCaps.large_mtu`` any power of two up to
#: ``MAX_LARGE_MTU`` is accepted.
IB_MTUS = (256, 512, 1024, 2048, 4096)
MAX_LARGE_MTU = 1 << 20


def rnr_delay(code: int) -> float:
    """Seconds to wait after an RNR NAK carrying timer ``code`` (5 bits)."""
    return RNR_TIMER_USEC[code & 0x1F] * 1e-6


def transport_timeout(timeout: int) -> float | None:
    """Local ACK timeout in seconds: 4.096 µs × 2^timeout; 0 disables it (IBTA §9.7.6.1.3; rxe_qp.c)."""
    if timeout == 0:
        return None
    return 4.096e-6 * (1 << timeout)


def round_rd_atomic(n: int) -> int:
    """rxe rounds max_rd_atomic and max_dest_rd_atomic up to a power of two (``rxe_qp_from_attr()``)."""
    return 0 if n == 0 else 1 << (n - 1).bit_length()
