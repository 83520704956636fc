"""``UdpPort``'s sending of trains: runs of MIDDLE packets in one codec call, GSO batches.

Each segment ``k`` of a batch carries the ICRC for the IPv4 ID ``k`` the
kernel gives it (``inet_gso_segment``; RoCEv2 Annex A17.3.3).
"""

import errno
import os
import struct

from rdmakit.wire import BTH_LEN, ICRC_LEN, IcrcFlow, Packet, Payload, Train, crc32

from .codec import SegmentCodec
from .codec_py import headers
from .udp import GSO_MAX_BYTES, GSO_MAX_SEGMENTS, UdpLink

_ICRC = struct.Struct("<I")


class TrainSends:
    """``UdpPort``'s train sending (its base class)."""

    link: UdpLink
    _backlog: list[tuple[list[Payload], int, int, tuple[str, int]]]
    codec: SegmentCodec

    def _send_train(
        self, train: Train, flow: IcrcFlow, addr: tuple[str, int], after: Packet | Train | None
    ) -> tuple[list[Packet], bool]:
        """Send a run of MIDDLE packets in one codec call; what could not be sent is returned as
        packets, and whether ``after`` (the packet behind the train) left with it.

        ``after`` of the train's segment size (its message's LAST, without RETH or
        ImmDt) rides as the last batch's last segment where that batch has room:
        one send and one read fewer per message. Behind a backlog, or when the
        socket fills or refuses, the rest goes the per-packet way (which queues it
        in order, or counts the error), ``after`` with it.
        """
        link = self.link
        if self._backlog:
            return train.packets(), False
        size = BTH_LEN + train.mtu + ICRC_LEN
        gso = link.gso
        per = min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // size) if gso else 1
        total = train.npkts
        states = flow.seg_states(size, min(per, total))
        tail = self._train_tail(after, train.mtu, total % per, flow) if gso and total % per else None
        sent, err = self.codec.send_train(
            link.sock, addr, gso, train.opcode, train.dest_qp, train.psn, total,
            train.payload, train.mtu, train.ack_first, train.ack_every, states, tail,
        )  # fmt: skip
        lc = link.counters
        lc.datagrams_out += sent
        batches = (sent + per - 1) // per
        lc.sends += batches
        if gso:
            lc.gso_sends += batches
        if sent > total:
            return [], True
        if sent == total and tail is None:
            return [], False
        if err in (errno.EAGAIN, errno.EWOULDBLOCK):
            lc.send_would_block += 1
        elif gso and err in (errno.EIO, errno.EINVAL, errno.EOPNOTSUPP):
            link.gso = False  # as UdpLink.send_gso: no GSO on this path, for good
        elif err:
            link.record_error(OSError(err, os.strerror(err)))
            return [], False  # a dead route loses the packets; the engine retransmits them
        return train.tail(sent).packets(), False

    @staticmethod
    def _train_tail(pkt: Packet | Train | None, mtu: int, k: int, flow: IcrcFlow) -> bytes | None:
        """``pkt`` as segment ``k`` of a batch of MIDDLEs of ``mtu`` (ICRC included), or None
        where it is of another size (a RETH, an ImmDt, a short payload) or not a packet."""
        if type(pkt) is not Packet:
            return None
        pl = pkt[15]
        if len(pl) != mtu:
            return None
        hdr, masked = headers(pkt)
        if len(hdr) != BTH_LEN:
            return None
        size = BTH_LEN + mtu + ICRC_LEN
        st = flow.states.get(size | k << 16)
        if st is None:
            st = flow.state(size, k)
        return b"".join((hdr, pl, _ICRC.pack(crc32(pl, crc32(masked, st)))))
