"""The responder's fast paths: in-order MIDDLE packets placed without the generic dispatch.

Each function does exactly what ``Responder.on_request`` does for the packets
it takes (rxe ``rxe_resp.c``: ``check_psn``, ``check_op_seq``,
``check_op_valid``, ``check_length``, ``check_rkey``, then the copy and the
ACK if asked), and nothing for any other packet: the caller then takes the
generic path, which sorts out errors and edge cases. The bulk forms
(``write_run``, ``send_run``) serve ``QueuePair.rx_run``.
"""

from rdmakit.wire import OPCODE_INFO, PSN_MASK, Kind, Opcode, Packet, Payload, Position

from .memory import scatter
from .responder import Responder
from .timers import MAX_MSG_SIZE
from .types import Access

_MASK = PSN_MASK
_FIRST, _MIDDLE, _LAST, _ONLY = Position.FIRST, Position.MIDDLE, Position.LAST, Position.ONLY
_SEND, _WRITE = Kind.SEND, Kind.WRITE
_WRITE_MIDDLE = Opcode.RDMA_WRITE_MIDDLE
_REMOTE_WRITE = int(Access.REMOTE_WRITE)


def fast_middle(resp: Responder, op: int, psn: int, ackreq: bool, payload: Payload) -> bool:
    """Place an in-order WRITE or SEND MIDDLE packet of the message being received.

    Does exactly what ``on_request`` does for such a packet (PSN, opcode
    sequence, access, MTU length and bounds checks, then the copy and the
    ACK if asked), without the generic dispatch. Returns False, having
    done nothing, for any packet that needs more than that: the caller
    then takes the generic path, which sorts out errors and edge cases.
    """
    plen = len(payload)
    if psn != resp.psn or plen != resp.mtu:
        return False
    if op == _WRITE_MIDDLE:
        run = write_run(resp)
        if run is None:
            return False
        view, off = run[1], run[2]
        view[off : off + plen] = payload
        write_run_done(resp, 1, 0 if ackreq else -1)
    else:
        r = resp.cur_recv
        if resp.in_msg is not _SEND or r is None or r.segs is None:
            return False
        off = resp.recv_off
        if off + plen > r.length:
            return False
        segs = r.segs
        if len(segs) == 1:
            segs[0][off : off + plen] = payload
        else:
            scatter(segs, off, payload)
        send_run_done(resp, 1, 0 if ackreq else -1)
    return True


def write_target(resp: Responder, pkt: Packet, plen: int) -> memoryview | None:
    """Where ``plen`` payload bytes of the WRITE request ``pkt`` (headers only) will land.

    For transports that receive a large payload straight into the target
    memory (the TCP stream reader): the packet must be the next in-order
    one, a WRITE without immediate, and pass every check ``_send_write``
    makes (opcode sequence, access, length, R_Key and bounds); None
    otherwise. Handing ``receive`` the packet with the returned buffer as
    its payload then skips the copy; it is checked as usual.
    """
    qp = resp.qp
    info = OPCODE_INFO.get(pkt.opcode)
    if info is None or info.kind is not _WRITE or info.imm or pkt.psn != resp.psn or not plen:
        return None
    if not qp.access_bits & _REMOTE_WRITE:
        return None
    pos = info.position
    mtu = resp.mtu
    if ((pos is _FIRST or pos is _MIDDLE) and plen != mtu) or plen > mtu:
        return None
    reth = pkt.reth
    if pos is _FIRST or pos is _ONLY:
        if resp.in_msg is not None or reth is None or not 0 < reth.dma_len <= MAX_MSG_SIZE:
            return None
        if (plen != reth.dma_len) if pos is _ONLY else (plen >= reth.dma_len):
            return None
        view = qp.pd.remote_slice(reth.rkey, reth.va, reth.dma_len, _REMOTE_WRITE)
        key = (reth.rkey, reth.va, 0, plen)
        off = 0
    else:
        if resp.in_msg is not _WRITE or resp.w_gen != qp.pd.generation:
            return None
        if (plen != resp.w_resid) if pos is _LAST else (plen >= resp.w_resid):
            return None
        view = resp.w_view
        off = resp.w_off
        key = (resp.w_rkey, resp.w_va, off, plen)
    if view is None:
        return None
    target = view[off : off + plen]
    resp.placed = (target, key)
    return target


def write_run(resp: Responder) -> tuple[int, memoryview, int, int, int] | None:
    """Where a run of in-order WRITE MIDDLE packets would go (see ``QueuePair.rx_run``).

    The conditions are ``fast_middle``'s, for every packet of the run: the
    WRITE under way has room for more than one MTU after each of them.
    """
    view = resp.w_view
    if resp.in_msg is not _WRITE or view is None or resp.w_gen != resp.qp.pd.generation:
        return None
    if not resp.qp.access_bits & _REMOTE_WRITE:
        return None
    mtu = resp.mtu
    most = (resp.w_resid - 1) // mtu
    if most <= 0:
        return None
    return resp.psn, view, resp.w_off, most, mtu


def send_run(resp: Responder) -> tuple[int, memoryview, int, int, int] | None:
    """Where a run of in-order SEND MIDDLE packets would go (see ``QueuePair.rx_run``).

    ``fast_middle``'s conditions for every packet of the run: a SEND under
    way into a receive WQE of one buffer with room for each.
    """
    r = resp.cur_recv
    if resp.in_msg is not _SEND or r is None or r.segs is None or len(r.segs) != 1:
        return None
    mtu = resp.mtu
    off = resp.recv_off
    most = (r.length - off) // mtu
    if most <= 0:
        return None
    return resp.psn, r.segs[0], off, most, mtu


def send_run_done(resp: Responder, count: int, last_ackreq: int) -> None:
    """``count`` packets of the run placed (as ``count`` calls of ``fast_middle``)."""
    resp.recv_off += count * resp.mtu
    _run_done(resp, count, last_ackreq)


def write_run_done(resp: Responder, count: int, last_ackreq: int) -> None:
    """``count`` packets of the run placed; the last one asking for an ACK was number ``last_ackreq``."""
    size = count * resp.mtu
    resp.w_off += size
    resp.w_resid -= size
    _run_done(resp, count, last_ackreq)


def _run_done(resp: Responder, count: int, last_ackreq: int) -> None:
    resp.sent_psn_nak = False
    psn = resp.psn
    resp.psn = resp.ack_psn = (psn + count) & _MASK
    if last_ackreq >= 0:
        resp.queue_ack((psn + last_ackreq) & _MASK)
