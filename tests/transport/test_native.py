"""The native data plane (``rdmakit.transport._fastpath``) against the pure-Python codec.

Every byte it sends must be what ``encode`` and ``icrc_ipv4`` make of the same
packets, and it must place exactly the segments the per-packet path would take
as in-order MIDDLE packets, writing nothing for the first one it refuses.
"""

import os
import random
import socket
import subprocess
import sys
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from rdmakit.transport import fastpath
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.port import PeerAddress
from rdmakit.transport.udp import CE, ECT0, GSO_MAX_BYTES, GSO_MAX_SEGMENTS, UdpLink
from rdmakit.wire import IcrcFlow, Opcode, Packet, Train, encode, icrc_ipv4, pack_icrc
from tests.transport.sockets import udp_sink

pytestmark = pytest.mark.skipif(fastpath.native is None, reason=f"native data plane: {fastpath.describe()}")

WM = int(Opcode.RDMA_WRITE_MIDDLE)


def test_crc32_is_zlibs() -> None:
    rng = random.Random(1)
    data = rng.randbytes(70000)
    crc32 = fastpath.native.crc32  # type: ignore[union-attr]
    for n in [*range(300), 4096, 4108, 4112, 65536, 70000 - 7]:
        for off in (0, 1, 5, 15):
            for seed in (0, 1, 0xDEADBEEF, 0xFFFFFFFF):
                chunk = data[off : off + n]
                assert crc32(chunk, seed) == zlib.crc32(chunk, seed), (n, off, seed)
    assert crc32(memoryview(bytearray(b"abc"))) == zlib.crc32(b"abc")
    with pytest.raises(TypeError):
        crc32("text")  # not a buffer


#: The native CRC-32 implementations by ``CLMUL`` level, and the variable that caps the level below.
_CRC_LEVELS = {2: "VPCLMULQDQ", 1: "PCLMULQDQ", 0: "table"}
_CRC_CAPS = {2: {}, 1: {"RDMAKIT_NO_VPCLMUL": "1"}, 0: {"RDMAKIT_NO_CLMUL": "1"}}
_CRC_CHECK = (
    "import random, zlib\n"
    "from rdmakit.transport import _fastpath as f\n"
    "d = random.Random(9).randbytes(9000)\n"
    "for n in [*range(600), 4096, 4108, 8191]:\n"
    "    for off in (0, 7):\n"
    "        for v in (0, 0xFFFFFFFF, 0x1234567):\n"
    "            assert f.crc32(d[off:off + n], v) == zlib.crc32(d[off:off + n], v), (n, off, v)\n"
    "print(f.CLMUL)\n"
)


def _crc_in_child(env: dict[str, str]) -> int:
    """Checks the native crc32 against zlib's in a new process with `env`; returns its ``CLMUL``."""
    clean = {k: v for k, v in os.environ.items() if k not in ("RDMAKIT_NO_VPCLMUL", "RDMAKIT_NO_CLMUL")}
    out = subprocess.run(
        [sys.executable, "-c", _CRC_CHECK], env=clean | env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.parametrize("level", sorted(_CRC_LEVELS, reverse=True), ids=_CRC_LEVELS.get)
def test_crc32_is_zlibs_with_each_instruction_set(level: int) -> None:
    """Each CRC-32 implementation of the native module (the import picks one; an environment
    variable caps it), in a process of its own, against zlib: lengths below and above each
    folding path's minimum (64 and 256 bytes), unaligned starts and running values."""
    best = _crc_in_child({})
    if level > best:
        pytest.skip(f"this CPU has no {_CRC_LEVELS[level]}")
    assert _crc_in_child(_CRC_CAPS[level]) == level


@pytest.mark.parametrize("gso", [True, False])
@pytest.mark.parametrize("mtu", [256, 1024, 4096])
def test_send_train_is_byte_identical_to_the_generic_encoder(
    new_ip: Callable[[], str], gso: bool, mtu: int
) -> None:
    sink = udp_sink(new_ip())
    dev = SoftDevice(new_ip(), port=0, gso=gso)
    assert dev.udp_port is not None
    assert dev.udp_port.codec is fastpath.NATIVE
    peer = PeerAddress(sink.getsockname()[0], sink.getsockname()[1])
    rng = random.Random(mtu)
    n = 150  # several GSO batches and a short tail; PSN wraps; AckReq every 66th from the 5th
    mem = memoryview(bytearray(rng.randbytes(n * mtu)))
    train = Train(Opcode.RDMA_WRITE_MIDDLE, 0xABCDEF, 0xFFFFFF - 70, n, mem, mtu, 5, 66)
    trains: list[Packet | Train] = [train]
    dev.udp_port._send_udp(trains, peer)
    size = 12 + mtu + 4
    per = min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // size) if dev.udp and dev.udp.gso else 1
    src, dst = dev.udp_port._local, bytes(map(int, peer.ip.split(".")))
    for j, pkt in enumerate(train.packets()):
        data = sink.recv(65536)
        body = encode(pkt)
        assert pkt.ackreq == (j >= 5 and (j - 5) % 66 == 0)
        want = body + pack_icrc(icrc_ipv4(src, dst, dev.port, peer.port, body, ident=j % per))
        assert data == want, j
    assert dev.udp is not None
    assert dev.udp.counters.datagrams_out == n
    dev.close()
    sink.close()


def test_train_tail_is_the_rest_of_its_packets() -> None:
    mem = memoryview(bytes(range(256)) * 40)
    t = Train(Opcode.SEND_MIDDLE, 7, 0xFFFFF0, 40, mem, 256, 3, 7)
    full = t.packets()
    for j in range(41):
        assert t.tail(j).packets() == full[j:], j
    short = Train(Opcode.SEND_MIDDLE, 7, 0, 3, mem, 256)
    assert short.tail(1).packets() == short.packets()[1:]
    assert [p.ackreq for p in t.packets()[:12]] == [False] * 3 + [True] + [False] * 6 + [True, False]


def _segments(pkts: list[Packet], flow: IcrcFlow) -> list[bytearray]:
    out = []
    for k, pkt in enumerate(pkts):
        body = encode(pkt)
        out.append(bytearray(body + pack_icrc(flow.icrc_seg(k, body))))
    return out


class _Batch:
    """A GRO batch of WRITE MIDDLE segments to QP 0x10 from PSN 100, and where they go."""

    def __init__(self, count: int = 12, mtu: int = 1024) -> None:
        self.mtu = mtu
        self.flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 4791, 4791)
        rng = random.Random(count)
        self.pkts = [
            Packet(Opcode.RDMA_WRITE_MIDDLE, 0x10, 100 + i, ackreq=i in (2, 7), payload=rng.randbytes(mtu))
            for i in range(count)
        ]
        self.segs = _segments(self.pkts, self.flow)
        self.dst = bytearray(b"\xee" * (count + 2) * mtu)

    def run(
        self,
        k0: int = 0,
        psn: int = 100,
        max_count: int = 1 << 30,
        *,
        nbytes: int | None = None,
        seg: int | None = None,
        states: object = None,
        mtu: int | None = None,
        dst: object = None,
    ) -> tuple[int, int]:
        buf = b"".join(self.segs)
        size = len(self.segs[0])
        got: tuple[int, int] = fastpath.native.place_run(  # type: ignore[union-attr]
            buf,
            len(buf) if nbytes is None else nbytes,
            size if seg is None else seg,
            k0,
            self.flow.seg_states(size, 64) if states is None else states,
            WM,
            0x10,
            psn,
            self.mtu if mtu is None else mtu,
            self.dst if dst is None else dst,
            self.mtu,
            max_count,
        )
        return got

    def placed(self, first: int, count: int) -> bool:
        m = self.mtu
        for i in range(count):
            if self.dst[m + i * m : m + (i + 1) * m] != self.pkts[first + i].payload:
                return False
        rest = self.dst[m + count * m :]
        return self.dst[:m] == b"\xee" * m and rest == b"\xee" * len(rest)


def test_place_run_places_a_clean_batch() -> None:
    b = _Batch()
    assert b.run() == (12, 7)  # all; the last AckReq was packet 7
    assert b.placed(0, 12)


def test_place_run_stops_at_the_first_segment_it_must_not_take() -> None:
    def corrupt_icrc(b: _Batch) -> None:
        b.segs[5][-1] ^= 1

    def corrupt_payload(b: _Batch) -> None:
        b.segs[5][40] ^= 0x80

    def psn_gap(b: _Batch) -> None:
        b.pkts[5] = b.pkts[5]._replace(psn=200)
        b.segs[5:6] = _segments(b.pkts[:6], b.flow)[5:6]

    def other_qp(b: _Batch) -> None:
        b.pkts[5] = b.pkts[5]._replace(dest_qp=0x11)
        b.segs[5:6] = _segments(b.pkts[:6], b.flow)[5:6]

    def other_opcode(b: _Batch) -> None:
        b.pkts[5] = b.pkts[5]._replace(opcode=Opcode.SEND_MIDDLE)
        b.segs[5:6] = _segments(b.pkts[:6], b.flow)[5:6]

    def bad_pkey(b: _Batch) -> None:
        b.pkts[5] = b.pkts[5]._replace(pkey=0x8001)
        b.segs[5:6] = _segments(b.pkts[:6], b.flow)[5:6]

    def tver(b: _Batch) -> None:
        b.segs[5][1] |= 0x01  # TVer 1 (and the ICRC then no longer matches either)

    for spoil in (corrupt_icrc, corrupt_payload, psn_gap, other_qp, other_opcode, bad_pkey, tver):
        b = _Batch()
        spoil(b)
        assert b.run() == (5, 2), spoil.__name__
        assert b.placed(0, 5), spoil.__name__


def test_place_run_limits() -> None:
    b = _Batch()
    assert b.run(max_count=4) == (4, 2)
    assert b.placed(0, 4)
    b = _Batch()
    assert b.run(k0=3, psn=103) == (9, 4)  # starts inside the batch; ID k from the batch index
    b.dst[: b.mtu] = b"\xee" * b.mtu
    b = _Batch()
    assert b.run(psn=101) == (0, -1)  # the first is not the expected PSN
    assert b.placed(0, 0)
    b = _Batch()
    assert b.run(mtu=512) == (0, -1)  # segments of another size than one MTU
    b = _Batch()
    assert b.run(dst=bytearray(4 * 1024)) == (3, 2)  # no room past the target's end
    b = _Batch()
    assert b.run(states=b.flow.seg_states(len(b.segs[0]), 64)[:6]) == (6, 2)  # no state, no check
    b = _Batch()
    b.segs[-1] = b.segs[-1][:-8]  # a shorter last datagram is never a MIDDLE of this run
    assert b.run() == (11, 7)


def test_place_run_rejects_bad_arguments() -> None:
    b = _Batch()
    with pytest.raises(ValueError):
        b.run(nbytes=10**9)
    with pytest.raises(ValueError):
        b.run(seg=0)
    with pytest.raises(TypeError):
        b.run(dst=b"read-only")
    with pytest.raises(ValueError):
        fastpath.native.send_train(  # type: ignore[union-attr]
            -1, ("127.0.0.1", 1), False, True, WM, 1, 0, 10, b"x" * 100, 1024, -1, 1, b"\0" * 64
        )
    with pytest.raises(ValueError):
        fastpath.native.send_train(  # type: ignore[union-attr]
            -1, ("no-address", 1), False, True, WM, 1, 0, 1, b"x" * 1024, 1024, -1, 1, b"\0" * 64
        )


#: What the native ``recv_runs`` returns: placed, last AckReq PSN, reads, datagrams, GRO batches,
#: errno, the datagram it stopped at, (bytes, segment size, segments, (address, port)), or None,
#: and the reads marked CE.
RecvRuns = tuple[int, int, int, int, int, int, tuple[int, int, int, tuple[str, int]] | None, int]


class _Stream:
    """WRITE MIDDLE datagrams from a real sender (IPv4 ID 0) to a receiving socket without GRO."""

    def __init__(self, new_ip: Callable[[], str], mtu: int = 1024) -> None:
        self.mtu = mtu
        self.rx = UdpLink(new_ip(), 0, gro=False)
        self.tx = UdpLink(new_ip(), 0, gso=False)
        self.other = UdpLink(self.tx.ip, 0, gso=False)  # same address, another port
        self.dst = bytearray(64 * mtu)
        self.rng = random.Random(mtu)

    def flow(self, link: UdpLink) -> IcrcFlow:
        ip = bytes(map(int, link.ip.split(".")))
        return IcrcFlow.ipv4(ip, bytes(map(int, self.rx.ip.split("."))), link.port, self.rx.port)

    def send(self, psn: int, *, link: UdpLink | None = None, op: Opcode = Opcode.RDMA_WRITE_MIDDLE) -> bytes:
        link = link or self.tx
        payload = self.rng.randbytes(self.mtu)
        body = encode(Packet(op, 0x10, psn, payload=payload))
        assert link.send([body, pack_icrc(self.flow(link).icrc(body))], (self.rx.ip, self.rx.port))
        return payload

    def recv_runs(self, psn: int, max_count: int = 64, max_reads: int = 64) -> RecvRuns:
        states = self.flow(self.tx).seg_states(12 + self.mtu + 4, 64)
        got: RecvRuns = fastpath.native.recv_runs(  # type: ignore[union-attr]
            self.rx.fileno(), self.rx.view, False, (self.tx.ip, self.tx.port), states, WM, 0x10, psn,
            self.mtu, self.dst, 0, max_count, max_reads,
        )  # fmt: skip
        return got

    def close(self) -> None:
        for link in (self.rx, self.tx, self.other):
            link.close()


def _settle(s: _Stream) -> None:
    """Wait until datagrams are queued (loopback delivers at once, but be sure)."""
    for _ in range(1000):
        if s.rx.ready():
            return
    raise AssertionError("nothing arrived")


def test_recv_runs_reads_while_the_run_goes_on(new_ip: Callable[[], str]) -> None:
    s = _Stream(new_ip)
    sent = [s.send(100 + i) for i in range(10)]
    _settle(s)
    assert s.recv_runs(100) == (10, -1, 10, 10, 0, 0, None, 0)
    assert bytes(s.dst[: 10 * s.mtu]) == b"".join(sent)
    assert s.recv_runs(110) == (0, -1, 0, 0, 0, 0, None, 0)  # nothing more: EAGAIN, no read
    s.close()


def test_recv_runs_hands_back_what_does_not_continue_the_run(new_ip: Callable[[], str]) -> None:
    s = _Stream(new_ip)
    sent = [s.send(7 + i) for i in range(5)]
    s.send(12, link=s.other)  # another source port: not this run's flow
    s.send(12)
    _settle(s)
    placed, last, reads, datagrams, gro, err, pending, _ce = s.recv_runs(7)
    assert (placed, last, reads, datagrams, gro, err) == (5, -1, 6, 6, 0, 0)
    assert pending == (12 + s.mtu + 4, 12 + s.mtu + 4, 0, (s.other.ip, s.other.port))
    assert bytes(s.dst[: 5 * s.mtu]) == b"".join(sent)
    assert bytes(s.dst[5 * s.mtu :]) == bytes(len(s.dst) - 5 * s.mtu)
    s.send(13, op=Opcode.RDMA_WRITE_LAST)  # the run's flow, but not a MIDDLE
    placed, _, reads, _, _, _, pending, _ce = s.recv_runs(12)
    assert (placed, reads) == (1, 2)  # the MIDDLE with PSN 12, then the LAST comes back
    assert pending is not None
    assert pending[2:] == (0, (s.tx.ip, s.tx.port))
    s.close()


def test_recv_runs_counts_the_reads_marked_ce(new_ip: Callable[[], str]) -> None:
    """The IP header's ECN field of each read (IP_RECVTOS): a run marked CE says how many reads were."""
    s = _Stream(new_ip)
    s.tx.sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, CE)
    for i in range(3):
        s.send(i)
    _settle(s)
    got = s.recv_runs(0)
    assert got[:4] == (3, -1, 3, 3)
    assert got[7] == 3
    s.tx.sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ECT0)
    s.send(3)
    _settle(s)
    assert s.recv_runs(3)[7] == 0
    s.close()


def test_recv_runs_stops_at_max_count_and_max_reads(new_ip: Callable[[], str]) -> None:
    s = _Stream(new_ip)
    for i in range(6):
        s.send(i)
    _settle(s)
    assert s.recv_runs(0, max_count=2)[:4] == (2, -1, 2, 2)
    assert s.recv_runs(2, max_reads=3)[:4] == (3, -1, 3, 3)
    assert s.recv_runs(5)[:4] == (1, -1, 1, 1)
    with pytest.raises(ValueError):
        fastpath.native.recv_runs(  # type: ignore[union-attr]
            s.rx.fileno(), s.rx.view, False, ("not-an-ip", 1), b"", WM, 0x10, 0, 1024, s.dst, 0, 1, 1
        )
    with pytest.raises(ValueError):
        fastpath.native.recv_runs(  # type: ignore[union-attr]
            s.rx.fileno(), s.rx.view, False, (s.tx.ip, s.tx.port), b"", WM, 0x10, 0, 0, s.dst, 0, 1, 1
        )
    s.close()


def test_sizes_that_would_overflow_are_refused_by_every_function(new_ip: Callable[[], str]) -> None:
    """Counts, offsets and lengths are checked without forming products or sums that could overflow."""
    native: Any = fastpath.native
    big, huge = 1 << 53, 1 << 62
    b = _Batch()
    # place_run: an index or segment size far past the data is nothing to place, not a wild read.
    assert b.run(k0=huge) == (0, -1)
    assert b.run(k0=3, seg=huge) == (0, -1)
    assert b.run(max_count=huge) == (12, 7)
    for kw in ({"mtu": huge}, {"mtu": 65508}, {"nbytes": -1}, {"k0": -1}):
        with pytest.raises(ValueError):
            b.run(**kw)
    buf, states, size = b"".join(b.segs), b.flow.seg_states(len(b.segs[0]), 64), len(b.segs[0])
    for dst_off in (len(b.dst) + 1, huge):
        with pytest.raises(ValueError):
            native.place_run(buf, len(buf), size, 0, states, WM, 0x10, 100, b.mtu, b.dst, dst_off, 10)
    for qpn, psn, op in ((1 << 24, 0, WM), (-1, 0, WM), (0x10, 1 << 24, WM), (0x10, 0, 256), (0x10, 0, -1)):
        with pytest.raises(ValueError):
            native.place_run(buf, len(buf), size, 0, states, op, qpn, psn, b.mtu, b.dst, 0, 10)
    with pytest.raises(OverflowError):
        native.place_run(buf, len(buf), size, 0, states, WM, 0x10, 1 << 64, b.mtu, b.dst, 0, 10)
    # send_train: count * mtu would wrap to 0 and pass a plain "payload too short" test.
    for count, mtu in ((big, 2048), (huge, 1024), (1, huge), (1, 65508)):
        with pytest.raises(ValueError):
            native.send_train(
                -1, ("127.0.0.1", 1), False, True, WM, 1, 0, count, b"x" * 4096, mtu, -1, 1, states
            )
    for dqpn, psn, op in ((1 << 24, 0, WM), (-1, 0, WM), (1, 1 << 24, WM), (1, 0, 256)):
        with pytest.raises(ValueError):
            native.send_train(
                -1, ("127.0.0.1", 1), False, True, op, dqpn, psn, 1, b"x" * 1024, 1024, -1, 1, states
            )
    with pytest.raises(ValueError, match="port"):
        native.send_train(
            -1, ("127.0.0.1", 1 << 16), False, True, WM, 1, 0, 1, b"x" * 1024, 1024, -1, 1, states
        )
    # recv_runs: the same argument checks before any read.
    rx = UdpLink(new_ip(), 0, gro=False)
    try:
        for dst_off, qpn in ((len(b.dst) + 1, 0x10), (huge, 0x10), (0, 1 << 24)):
            with pytest.raises(ValueError):
                native.recv_runs(
                    rx.fileno(),
                    rx.view,
                    False,
                    ("127.0.0.1", 1),
                    states,
                    WM,
                    qpn,
                    0,
                    1024,
                    b.dst,
                    dst_off,
                    1,
                    1,
                )
    finally:
        rx.close()
    # check_decode: a segment longer than any datagram; send_packet: a port out of range, a payload too long.
    flow = b.flow
    with pytest.raises(ValueError, match="UDP datagram"):
        native.check_decode(memoryview(bytearray(70_000)), 0, flow.states, flow)
    pkt = Packet(Opcode.SEND_ONLY, 1, 0, payload=b"abcd")
    with pytest.raises(ValueError, match="port"):
        native.send_packet(-1, ("127.0.0.1", -1), False, pkt, flow.states, flow)
    assert (
        native.send_packet(-1, ("127.0.0.1", 1), False, pkt._replace(payload=bytes(70_000)), {}, flow) == -1
    )
    with pytest.raises(TypeError):
        native.send_packet(-1, "127.0.0.1:1", False, pkt, flow.states, flow)
    # init_codec: an entry that is not a tuple.
    from rdmakit.wire import AETH, CODEC_LAYOUTS, RETH, AtomicETH

    with pytest.raises(TypeError):
        native.init_codec(Packet, RETH, AETH, AtomicETH, {4: [Opcode.SEND_ONLY, 0, 12]})
    native.init_codec(Packet, RETH, AETH, AtomicETH, CODEC_LAYOUTS)
