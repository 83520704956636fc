"""The segment codec in Python: the reference the native one (``_fastpath.c``) must equal.

Every rule of the interface (:mod:`rdmakit.transport.codec`) is written here
once for Python: the BTH of a MIDDLE packet (IBTA §9.2), the ICRC over the
masked header (RoCEv2 Annex A17.3.3), and the checks that accept a run of
MIDDLE segments.
"""

from __future__ import annotations

import errno
import socket
import struct
from typing import TYPE_CHECKING

from rdmakit.wire import (
    BTH_LEN,
    ICRC_LEN,
    MIDDLE_OPCODES,
    IcrcFlow,
    Packet,
    WireError,
    crc32,
    decode,
    encode_headers,
)

from .codec import (
    Arm,
    ArmReq,
    PollArmed,
    PostSend,
    PostSmall,
    RecvRaw,
    RecvRuns,
    SendAcks,
    SmallRequest,
    SmallResponse,
    WaitLoop,
)
from .udp import GSO_MAX_BYTES, GSO_MAX_SEGMENTS, SOL_UDP, UDP_SEGMENT

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from 3.12

_BTH = struct.Struct(">BBHII")
_ICRC = struct.Struct("<I")
_U16 = struct.Struct("=H")
_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")
_U24 = 0xFFFFFF
#: PadCnt (BTH byte 1 bits 5:4) for a payload length mod 4.
_PADCNT_BITS = (0x00, 0x30, 0x20, 0x10)
#: Packet fields se .. ieth of a MIDDLE packet as the engine makes them.
_PLAIN_MIDDLE = (False, False, 0xFFFF, False, False, None, None, None, None, None, None)
#: BTH word 1 with FECN, BECN and resv6 set: the ICRC counts them as ones.
_MASK_BYTE4 = 0xFF000000
_WOULD_BLOCK = (errno.EAGAIN, errno.EWOULDBLOCK)


def headers(pkt: Packet) -> tuple[bytes, bytes]:
    """``pkt``'s headers (``encode_headers``) and the same with BTH byte 4 masked for the ICRC."""
    op, plen = pkt[0], len(pkt[15])
    if op in MIDDLE_OPCODES and pkt[4:15] == _PLAIN_MIDDLE and pkt[1] <= _U24 and pkt[2] <= _U24:
        # The bulk of a message: the BTH alone (IBTA §9.2).
        w2 = pkt[2] | 0x80000000 if pkt[3] else pkt[2]
        b1 = _PADCNT_BITS[plen & 3]
        return _BTH.pack(op, b1, 0xFFFF, pkt[1], w2), _BTH.pack(op, b1, 0xFFFF, pkt[1] | _MASK_BYTE4, w2)
    hdr = encode_headers(pkt)
    m = bytearray(hdr)
    m[4] = 0xFF  # FECN, BECN, resv6 (Annex A17.3.3)
    return hdr, bytes(m)


def _state(states: dict[int, int], flow: IcrcFlow, n: int, idx: int) -> int:
    st = states.get(n | idx << 16)
    return flow.state(n, idx) if st is None else st


class PythonCodec:
    """The segment codec in pure Python."""

    name = "python"
    recv_runs: RecvRuns | None = None
    recv_raw: RecvRaw | None = None
    small_request: SmallRequest | None = None
    small_response: SmallResponse | None = None
    arm: Arm | None = None
    poll_armed: PollArmed | None = None
    send_acks: SendAcks | None = None
    arm_req: ArmReq | None = None
    post_small: PostSmall | None = None
    wait_loop: WaitLoop | None = None
    post_send: PostSend | None = None

    def send_packet(
        self, sock: socket.socket, addr: tuple[str, int], pkt: Packet, states: dict[int, int], flow: IcrcFlow
    ) -> int:
        try:
            hdr, masked = headers(pkt)
            pl = pkt[15]
            pad = _PADS[-len(pl) & 3]
            size = len(hdr) + len(pl) + len(pad) + ICRC_LEN
            ic = crc32(pad, crc32(pl, crc32(masked, _state(states, flow, size, 0))))
        except (WireError, IndexError, TypeError):
            return -1  # not an encodable packet: encode_headers says why
        try:
            sock.sendmsg((hdr, pl, pad + _ICRC.pack(ic)), (), 0, addr)
        except InterruptedError:
            return errno.EINTR
        except OSError as e:
            return e.errno or errno.EIO
        return 0

    def check_decode(self, seg: Buffer, idx: int, states: dict[int, int], flow: IcrcFlow) -> Packet | int:
        view = memoryview(seg).cast("B")
        n = len(view)
        if n < BTH_LEN + ICRC_LEN:
            return 1
        end = n - ICRC_LEN
        try:
            pkt = decode(view[:end])  # the header checks first, as rxe's hdr_check()
        except WireError:
            return 1
        b4 = bytes(view[:BTH_LEN])
        masked = b4[:4] + b"\xff" + b4[5:]
        ic = crc32(view[BTH_LEN:end], crc32(masked, _state(states, flow, n, idx)))
        diff = ic ^ _ICRC.unpack_from(view, end)[0]
        return pkt if not diff or flow.id_shift(n, diff) is not None else 0

    def send_train(
        self,
        sock: socket.socket,
        addr: tuple[str, int],
        gso: bool,
        op: int,
        dqpn: int,
        psn: int,
        count: int,
        payload: Buffer,
        mtu: int,
        ack_first: int,
        ack_every: int,
        states: Buffer,
        tail: Buffer | None = None,
    ) -> tuple[int, int]:
        size = BTH_LEN + mtu + ICRC_LEN
        per = max(1, min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // size)) if gso else 1
        if tail is not None and (not gso or len(memoryview(tail).cast("B")) != size or count % per == 0):
            raise ValueError("send_train: the tail does not fit the last batch")
        src = memoryview(payload).cast("B")
        st = memoryview(states).cast("B").cast("I")
        pack_bth, pack_ic = _BTH.pack, _ICRC.pack
        sent = 0
        while sent < count:
            n = min(count - sent, per)
            parts: list[Buffer] = []
            for k in range(n):
                i = sent + k
                p = (psn + i) & _U24
                ackreq = ack_first >= 0 and i >= ack_first and (i - ack_first) % ack_every == 0
                w2 = p | 0x80000000 if ackreq else p
                body = src[i * mtu : (i + 1) * mtu]
                ic = crc32(body, crc32(pack_bth(op, 0, 0xFFFF, dqpn | _MASK_BYTE4, w2), st[k]))
                parts += (pack_bth(op, 0, 0xFFFF, dqpn, w2), body, pack_ic(ic))
            took = n
            if tail is not None and sent + n == count:
                parts.append(tail)
                took += 1
            anc = [(SOL_UDP, UDP_SEGMENT, _U16.pack(size))] if gso and took > 1 else []
            try:
                sock.sendmsg(parts, anc, 0, addr)
            except InterruptedError:
                continue
            except OSError as e:
                return sent, e.errno or errno.EIO
            sent += took
        return sent, 0

    def place_run(
        self,
        buf: Buffer,
        nbytes: int,
        seg: int,
        k0: int,
        states: Buffer,
        op: int,
        qpn: int,
        psn: int,
        mtu: int,
        dst: Buffer,
        dst_off: int,
        max_count: int,
        shifts: Buffer = b"",
    ) -> tuple[int, int]:
        base = memoryview(buf).cast("B")
        st = memoryview(states).cast("B").cast("I")
        other_ids = frozenset(memoryview(shifts).cast("B").cast("I")[1:])
        out = memoryview(dst).cast("B")
        size = BTH_LEN + mtu + ICRC_LEN
        unpack_bth, unpack_ic = _BTH.unpack_from, _ICRC.unpack_from
        count, last_ack, k = 0, -1, k0
        while count < max_count and nbytes > 0 and k * seg < nbytes and k < len(st):
            off = k * seg
            if min(nbytes - off, seg) != size:
                break
            b0, b1, pkey, w1, w2 = unpack_bth(base, off)
            # A MIDDLE of this run: TVer 0, no pad, a valid P_Key, the QP, the next PSN.
            if b0 != op or b1 & 0x3F or pkey & 0x7FFF != 0x7FFF or w1 & _U24 != qpn:
                break
            if w2 & _U24 != (psn + count) & _U24:
                break
            at = dst_off + count * mtu
            if at + mtu > len(out):
                break
            end = off + BTH_LEN + mtu
            masked = _BTH.pack(b0, b1, pkey, w1 | _MASK_BYTE4, w2)
            diff = crc32(base[off + BTH_LEN : end], crc32(masked, st[k])) ^ unpack_ic(base, end)[0]
            if diff and diff not in other_ids:  # another IPv4 ID below SEGMENT_IDS (IcrcFlow.id_shift)
                break
            out[at : at + mtu] = base[off + BTH_LEN : end]
            if w2 & 0x80000000:
                last_ack = count
            count += 1
            k += 1
        return count, last_ack
