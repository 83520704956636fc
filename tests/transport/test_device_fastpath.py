"""The soft device's UDP fast paths produce and accept exactly what the generic codec does.

Sending: MIDDLE packets get their BTH packed directly and every packet its
ICRC from a per-flow cached header state (GSO segment k: IPv4 ID k); the
datagrams must be byte-identical to ``encode`` + ``icrc_ipv4(ident=k)``.
Receiving: runs of in-order MIDDLE packets are placed by the segment codec
(``place_run``, either implementation) without a ``Packet``; the transfer must
end the same as packet by packet.
"""

import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from rdmakit.engine import SGE, Access, CompletionQueue, QpCaps, RecvWR, SendWR, WcStatus, WrOpcode
from rdmakit.engine import qp as qp_mod
from rdmakit.transport import fastpath
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.transport.port import PeerAddress
from rdmakit.wire import AETH, RETH, Opcode, Packet, encode, icrc_ipv4, pack_icrc

needs_native = pytest.mark.skipif(fastpath.native is None, reason=f"native data plane: {fastpath.describe()}")
ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


def test_udp_send_is_byte_identical_to_the_generic_encoder(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = SoftDevice(new_ip(), port=0)
    peer = PeerAddress(new_ip(), 4791)
    sent: list[tuple[bytes, int, int]] = []

    def send_gso(parts: list[Any], seg: int, count: int, addr: object) -> bool:
        sent.append((b"".join(parts), seg, count))
        return True

    def send(parts: list[Any], addr: object) -> bool:
        data = b"".join(parts)
        sent.append((data, len(data), 1))
        return True

    monkeypatch.setattr(dev.udp, "send_gso", send_gso)
    monkeypatch.setattr(dev.udp, "send", send)
    rng = random.Random(7)
    mem = memoryview(bytearray(rng.randbytes(1 << 16)))
    pkts = [
        Packet(Opcode.RDMA_WRITE_FIRST, 0x123456, 0xFFFFFE, reth=RETH(1 << 40, 77, 9000), payload=mem[:1024])
    ]
    for i in range(1, 80):  # psn wraps; AckReq on some; GSO batches of 64 and a shorter tail
        op = (Opcode.RDMA_WRITE_MIDDLE, Opcode.SEND_MIDDLE, Opcode.RDMA_READ_RESPONSE_MIDDLE)[i % 3]
        pkts.append(
            Packet(op, 0xABCDEF, (0xFFFFFE + i) & 0xFFFFFF, ackreq=i % 5 == 0, payload=mem[i : i + 1024])
        )
    pkts.append(Packet(Opcode.RDMA_WRITE_MIDDLE, 5, 1, se=True, payload=mem[:1024]))  # not the engine's shape
    pkts.append(Packet(Opcode.RDMA_WRITE_LAST, 5, 2, payload=mem[:1021]))  # pad
    pkts.append(Packet(Opcode.ACKNOWLEDGE, 5, 3, aeth=AETH(0x1F, 9)))
    port = dev.udp_port
    assert port is not None
    port._send_udp(pkts, peer)
    got: list[tuple[bytes, int]] = []
    for data, seg, count in sent:
        datagrams = [data[i : i + seg] for i in range(0, len(data), seg)]
        assert len(datagrams) == count
        got += [(d, k) for k, d in enumerate(datagrams)]
    assert len(got) == len(pkts)
    src, dst = port._local, bytes(map(int, peer.ip.split(".")))
    for pkt, (data, k) in zip(pkts, got, strict=True):
        body = encode(pkt)
        assert data == body + pack_icrc(icrc_ipv4(src, dst, dev.port, peer.port, body, ident=k))
    dev.close()


def _transfer(
    ip_a: str, ip_b: str, op: WrOpcode, size: int, native: bool, fast: bool = True
) -> tuple[bytes, bytes, Any, Any]:
    with (
        SoftDevice(ip_a, port=0, bulk=native) as a,
        SoftDevice(ip_b, port=0, bulk=native) as b,
        Driver() as drv,
    ):
        drv.add(a)
        drv.add(b)
        cqa, cqb = CompletionQueue(64), CompletionQueue(64)
        qa = a.create_qp(send_cq=cqa, recv_cq=cqa, caps=QpCaps(fast_paths=fast))
        qb = b.create_qp(send_cq=cqb, recv_cq=cqb, caps=QpCaps(fast_paths=fast))
        rng = random.Random(size)
        ma, mb = bytearray(rng.randbytes(size)), bytearray(rng.randbytes(size))
        mra = a.pd.register(ma, 0x1000, ALL)
        mrb = b.pd.register(mb, 0x9000, ALL)
        connect_qp(a, qa, 10, local_endpoint(b, qb, 20))
        connect_qp(b, qb, 20, local_endpoint(a, qa, 10))
        if op is WrOpcode.SEND:
            qb.post_recv(RecvWR(wr_id=9, sg_list=(SGE(mrb.addr, size, mrb.lkey),)))
        qa.post_send(
            SendWR(
                wr_id=1,
                opcode=op,
                sg_list=(SGE(mra.addr, size, mra.lkey),),
                remote_addr=mrb.addr,
                rkey=mrb.rkey,
            )
        )
        assert drv.run_until(lambda: len(cqa) > 0, 10.0)
        (wc,) = cqa.poll()
        assert wc.status is WcStatus.SUCCESS
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:  # let the last ACKs land
            drv.progress()
        return bytes(ma), bytes(mb), qa.stats, qb.stats


class _Counting:
    """A segment codec, counting calls of its functions."""

    def __init__(self, native: Any, calls: dict[str, int]) -> None:
        self.native, self.calls = native, calls

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.native, name)
        if fn is None:
            return None  # (the Python codec has no recv_runs)

        def counted(*a: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*a)

        return counted


MODES = ["generic", "python", pytest.param("native", marks=needs_native)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [WrOpcode.RDMA_WRITE, WrOpcode.RDMA_READ, WrOpcode.SEND])
def test_udp_receive_fast_paths_end_like_the_generic_path(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch, op: WrOpcode, mode: str
) -> None:
    taken = {"run": 0}
    real_run = qp_mod.QueuePair.rx_run_done

    def counting_run(self: qp_mod.QueuePair, opcode: int, count: int, *a: Any) -> None:
        taken["run"] += count
        real_run(self, opcode, count, *a)

    monkeypatch.setattr(qp_mod.QueuePair, "rx_run_done", counting_run)
    calls: dict[str, int] = {}
    codec = fastpath.NATIVE if mode == "native" else fastpath.PYTHON
    monkeypatch.setattr(fastpath, "CODEC", _Counting(codec, calls))
    size = 300 * 1024 + 3  # 76 packets at MTU 4096: AckReq inside, a padded last packet
    got = _transfer(new_ip(), new_ip(), op, size, native=mode != "generic", fast=mode != "generic")
    if mode == "generic":
        assert taken == {"run": 0}
    elif mode == "python":
        assert taken["run"] > 0
        assert set(calls) == {"send_train", "place_run", "send_packet", "check_decode"}
    else:
        assert taken["run"] > 0
        # every native entry point ran (the requests and ACKs: send_packet, check_decode; every
        # read: recv_raw; a READ request: the armed responder, arm, which declines one of more
        # than eight responses, then small_request; the ACK that completes a WRITE or SEND: the
        # requester's native completer, arm_req, then the device poll, poll_armed); a WRITE's
        # FIRST and LAST packets meet the armed responder (arm, then poll_armed's reads), which
        # sends its ACKs itself
        small = {"arm", "small_request"} if op is WrOpcode.RDMA_READ else {"arm_req"}
        every = {"send_train", "place_run", "recv_runs", "recv_raw", "send_packet", "check_decode"}
        if op is WrOpcode.RDMA_WRITE:
            every = every - {"send_packet", "check_decode"} | {"arm", "poll_armed"}
        assert every | small <= set(calls) <= every | small | {"poll_armed", "small_response"}
    ref = got if mode == "generic" else _transfer(new_ip(), new_ip(), op, size, native=False, fast=False)
    assert got[0] == got[1]
    assert got[:2] == ref[:2]
    # A loaded host may stall a side past a timeout or the tail-loss probe's 2 SRTT: the resends
    # (and the duplicates they draw at the far end) are then not the fast path's doing.
    stalled = any(q.timeouts or q.probes for q in (*got[2:], *ref[2:]))
    for f, s in zip(got[2:], ref[2:], strict=True):
        assert not f.dropped
        assert not s.dropped
        if not stalled:
            assert f == s


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_native)], ids=["python", "native"])
@pytest.mark.parametrize("op", [WrOpcode.RDMA_WRITE, WrOpcode.RDMA_READ, WrOpcode.SEND])
def test_ipv6_bulk_transfers(op: WrOpcode, native: bool) -> None:
    """Two devices on ::1 (their own ports): the IPv6 ICRC, GSO and GRO paths, both ways."""
    a, b, sa, sb = _transfer("::1", "::1", op, (1 << 20) + 333, native=native)
    assert a == b
    assert not sa.dropped
    assert not sb.dropped
