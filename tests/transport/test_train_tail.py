"""A message's LAST leaves as the last segment of its train's last GSO batch.

Between a train of MIDDLE packets and its LAST, nothing differs but the
opcode: where the last batch has room, the LAST rides in it (``send_train``'s
``tail``), so a message costs one send and one read fewer. The datagrams must
be those the packets give one by one (``encode`` and the ICRC of the IPv4 ID
of their place in the batch), with either codec.
"""

import random
import socket
from collections.abc import Callable

import pytest

from rdmakit.engine import WrOpcode
from rdmakit.transport import fastpath
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.fastpath import PYTHON
from rdmakit.transport.port import PeerAddress
from rdmakit.wire import RETH, Opcode, Packet, Train, encode, icrc_ipv4, pack_icrc
from tests.transport.test_device_fastpath import _transfer

NATIVE = pytest.mark.skipif(fastpath.native is None, reason="no native data plane")
CODECS = ["python", pytest.param("native", marks=NATIVE)]
MTU = 1024
#: Segments per GSO batch at this MTU: 62 of 1,040 bytes fit in a UDP datagram's 65,507.
PER = min(64, 65507 // (MTU + 16))


def _sink(ip: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)  # 125 datagrams, one by one
    s.bind((ip, 0))
    s.settimeout(5)
    return s


def _message(npkts: int, last: Packet) -> tuple[list[Packet | Train], list[Packet]]:
    """FIRST, a train of ``npkts`` MIDDLEs, then ``last``: as sent, and packet by packet."""
    mem = memoryview(bytearray(random.Random(npkts).randbytes((npkts + 1) * MTU)))
    reth = RETH(1 << 20, 7, (npkts + 2) * MTU)
    first = Packet(Opcode.RDMA_WRITE_FIRST, 0x42, 100, reth=reth, payload=mem[:MTU])
    train = Train(Opcode.RDMA_WRITE_MIDDLE, 0x42, 101, npkts, mem[MTU:], MTU, 3, 66)
    return [first, train, last], [first, *train.packets(), last]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    ("npkts", "rides"),
    [(61, True), (1, True), (123, True), (62, False), (124, False)],  # a full last batch: no room
)
def test_the_last_rides_in_the_trains_last_batch(
    new_ip: Callable[[], str], codec: str, npkts: int, rides: bool
) -> None:
    ip_a, ip_b = new_ip(), new_ip()
    sink = _sink(ip_b)
    dev = SoftDevice(ip_a, port=0)
    try:
        port = dev.udp_port
        assert port is not None
        if codec == "python":
            port.codec = PYTHON
        peer = PeerAddress(ip_b, sink.getsockname()[1])
        last = Packet(Opcode.RDMA_WRITE_LAST, 0x42, 101 + npkts, ackreq=True, payload=bytes(range(256)) * 4)
        sent, pkts = _message(npkts, last)
        lc = port.link.counters
        sends = lc.sends
        port._send_udp(sent, peer)
        batches = -(-npkts // PER)
        assert lc.sends - sends == 1 + batches + (0 if rides else 1)
        assert lc.datagrams_out == len(pkts)
        # The receiver sees the datagrams one by one (no UDP_GRO): each as its packet gives it,
        # with the ICRC of its place in its batch (the FIRST alone, then batches of PER).
        places = [0] + [i % PER for i in range(npkts)] + [npkts % PER if rides else 0]
        src, dst = bytes(map(int, ip_a.split("."))), bytes(map(int, ip_b.split(".")))
        for pkt, k in zip(pkts, places, strict=True):
            body = encode(pkt)
            data = sink.recv(4096)
            assert data == body + pack_icrc(icrc_ipv4(src, dst, dev.port, peer.port, body, ident=k))
    finally:
        dev.close()
        sink.close()


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    "last",
    [
        Packet(Opcode.RDMA_WRITE_LAST, 0x42, 162, payload=bytes(MTU - 4)),  # short
        Packet(Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE, 0x42, 162, imm=5, payload=bytes(MTU)),  # ImmDt
        Packet(Opcode.RDMA_WRITE_ONLY, 0x42, 162, reth=RETH(0, 7, MTU), payload=bytes(MTU)),  # RETH
    ],
)
def test_a_last_of_another_size_goes_alone(new_ip: Callable[[], str], codec: str, last: Packet) -> None:
    ip_a, ip_b = new_ip(), new_ip()
    sink = _sink(ip_b)
    dev = SoftDevice(ip_a, port=0)
    try:
        port = dev.udp_port
        assert port is not None
        if codec == "python":
            port.codec = PYTHON
        sent, pkts = _message(61, last)
        lc = port.link.counters
        port._send_udp(sent, PeerAddress(ip_b, sink.getsockname()[1]))
        assert lc.sends == 3
        for pkt in pkts:
            assert sink.recv(4096)[:-4] == encode(pkt)
    finally:
        dev.close()
        sink.close()


def test_the_tail_must_fit_the_last_batch(new_ip: Callable[[], str]) -> None:
    mem = bytes(64 * MTU)
    for codec in [PYTHON] + ([fastpath.CODEC] if fastpath.native is not None else []):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((new_ip(), 0))
            addr = s.getsockname()
            states = bytes(4 * 64)
            seg = bytes(MTU + 16)
            for count, gso, tail in ((PER, True, seg), (3, False, seg), (3, True, b"x")):
                with pytest.raises(ValueError):
                    codec.send_train(s, addr, gso, 10, 1, 1, count, mem, MTU, -1, 1, states, tail)


@NATIVE
def test_a_write_with_its_last_in_the_train_lands_whole(new_ip: Callable[[], str]) -> None:
    """End to end, 63 packets, trains and the LAST behind one: the far side's memory is the
    requester's."""
    ma, mb, _sa, _sb = _transfer(new_ip(), new_ip(), WrOpcode.RDMA_WRITE, 63 * MTU, True)
    assert ma == mb
