"""The responder against the retransmissions kernel rxe's requester sends, packet by packet.

rxe (``rxe_req.c`` ``req_retry()``) goes back to ``comp.psn``, the PSN after
the last one acknowledged: for a multi-packet WRITE that is often a MIDDLE or
LAST, resent without the FIRST and its RETH. After a timeout it also resends
what the responder already has, FIRST packets included, while the responder
is in the middle of a later message or past it. IBTA Vol. 1 §9.7.5.1 (C9-*
rules on duplicate and out-of-sequence requests): a request before the
expected PSN is a duplicate, acknowledged again and not executed; one after
it is NAKed once with PSN sequence error and then dropped; only the expected
PSN is executed, and there a FIRST or ONLY inside a message, or a MIDDLE or
LAST outside one, is an invalid request.

Each scenario is a scripted packet sequence fed to one responder QP along
every receive path (the generic one, the engine's MIDDLE fast path, the bulk
run placement the simulated network uses, and the soft device's UDP receiver
with its native run placement): each must answer with the same responses and
leave the same memory as the rules say.

The last scenario is the one the perftest lab recorded (``ib_write_bw -q 2``
from rxe under TCG): after a spurious timeout, an ACK of a WRITE's last PSN
that arrived while rxe was resending that WRITE moved rxe's ``comp.psn`` past
it without completing it; a second timeout then made ``req_retry()`` resend the
WRITE as a zero-length WRITE ONLY at ``comp.psn`` and number every later
packet one higher. Such packets are no longer the ones the responder executed
under those PSNs; the responder's answer (duplicates acknowledged, then NAK
invalid request where the shifted opcodes stop fitting) is what IBTA requires.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from rdmakit.engine import CompletionQueue, ProtectionDomain, QpCaps, QpState, QueuePair
from rdmakit.testing.engine import ALL_ACCESS, BASE_ADDR
from rdmakit.transport import fastpath
from rdmakit.wire import (
    MIDDLE_OPCODES,
    RETH,
    NakCode,
    Opcode,
    Packet,
    encode,
    icrc_ipv4,
    nak_syndrome,
    pack_icrc,
    parse_syndrome,
)

MTU = 256
PKTS = 4  #: packets per WRITE
MSG = MTU * PKTS
MSGS = 6
RKEY_SEED = 11
PEER_QPN = 0x11

W_FIRST, W_MIDDLE, W_LAST, W_ONLY = (
    Opcode.RDMA_WRITE_FIRST,
    Opcode.RDMA_WRITE_MIDDLE,
    Opcode.RDMA_WRITE_LAST,
    Opcode.RDMA_WRITE_ONLY,
)


def _writes(psn0: int, qpn: int, rkey: int, va: int, data: bytes, n: int = MSGS) -> list[Packet]:
    """``n`` WRITEs of ``MSG`` bytes from ``data`` to ``va`` onwards, numbered from ``psn0``."""
    out = []
    for m in range(n):
        for i in range(PKTS):
            op = W_FIRST if i == 0 else W_LAST if i == PKTS - 1 else W_MIDDLE
            off = m * MSG + i * MTU
            reth = RETH(va + m * MSG, rkey, MSG) if i == 0 else None
            psn = (psn0 + m * PKTS + i) & 0xFFFFFF
            out.append(Packet(op, qpn, psn, ackreq=i == PKTS - 1, reth=reth, payload=data[off : off + MTU]))
    return out


def _changed(pkt: Packet) -> Packet:
    """The same request with other payload bytes: a duplicate that must not be executed again."""
    return pkt._replace(payload=bytes(b ^ 0xFF for b in pkt.payload))


# -- receive paths --------------------------------------------------------------


@dataclass
class Responder:
    qp: QueuePair
    mem: bytearray
    va: int
    rkey: int


def _responder(psn0: int, fast: bool) -> Responder:
    rng = random.Random(RKEY_SEED)
    pd = ProtectionDomain(rng)
    mem = bytearray(MSG * MSGS)
    mr = pd.register(mem, BASE_ADDR, ALL_ACCESS)
    cq = CompletionQueue(64)
    qp = QueuePair(pd, qpn=0x4242, send_cq=cq, recv_cq=cq, caps=QpCaps(fast_paths=fast), rng=rng)
    qp.modify(QpState.INIT, port=1, pkey_index=0, access=ALL_ACCESS)
    qp.modify(
        QpState.RTR,
        path_mtu=MTU,
        dest_qpn=PEER_QPN,
        rq_psn=psn0,
        max_dest_rd_atomic=4,
        min_rnr_timer=1,
        remote="peer",
    )
    qp.modify(QpState.RTS, timeout=14, retry_cnt=7, rnr_retry=7, sq_psn=0, max_rd_atomic=4)
    return Responder(qp, mem, mr.addr, mr.rkey)


Response = tuple[str, int, str]


def _answers(r: Responder, out: list[Response]) -> None:
    for p in r.qp.poll_transmit(0.0):
        assert p.aeth is not None
        kind, code = parse_syndrome(p.aeth.syndrome)
        out.append((p.opcode.name, p.psn, f"{kind.name}:{code}"))


def _generic(r: Responder, pkts: Sequence[Packet], out: list[Response]) -> None:
    for p in pkts:
        r.qp.receive(p, 0.0)
        _answers(r, out)


def _bulk(r: Responder, pkts: Sequence[Packet], out: list[Response]) -> None:
    """Like ``SimNet(bulk=True)``: in-order MIDDLE packets placed through ``rx_run``."""
    qp = r.qp
    for p in pkts:
        run = qp.rx_run(p.opcode) if p.opcode in MIDDLE_OPCODES else None
        if run is not None and p.psn == run[0] and len(p.payload) == run[4] and not p.reth:
            _, mem, off, _, mtu = run
            mem[off : off + mtu] = p.payload
            qp.rx_run_done(p.opcode, 1, 0 if p.ackreq else -1, 0.0)
        else:
            qp.receive(p, 0.0)
        _answers(r, out)


def _device(new_ip: Callable[[], str]) -> Callable[[Responder, Sequence[Packet], list[Response]], None]:
    """Through the soft device's UDP receiver: runs of equal-sized packets as GRO batches
    (segment k checked with IPv4 ID k, as an rdmakit sender with GSO numbers them), so runs
    of MIDDLE packets take the native ``place_run``."""

    def run(r: Responder, pkts: Sequence[Packet], out: list[Response]) -> None:
        from rdmakit.transport.device import SoftDevice
        from rdmakit.transport.port import PeerAddress

        dev = SoftDevice(new_ip(), port=0, bulk=True)
        try:
            peer = PeerAddress(new_ip(), 4791)
            # Adopt the scripted QP: the device delivers to QPs it knows by number.
            dev._qps[r.qp.qpn] = r.qp
            r.qp.remote = peer
            src = bytes(map(int, peer.ip.split(".")))
            dst = bytes(map(int, dev.ip.split(".")))
            i = 0
            while i < len(pkts):
                body = encode(pkts[i])
                batch = [body]
                j = i + 1
                while j < len(pkts) and len(batch) < 64:
                    nxt = encode(pkts[j])
                    if len(nxt) != len(body):
                        break
                    batch.append(nxt)
                    j += 1
                data = b"".join(
                    b + pack_icrc(icrc_ipv4(src, dst, peer.port, dev.port, b, ident=k))
                    for k, b in enumerate(batch)
                )
                dev.receive_datagram(data, (peer.ip, peer.port), 0.0, segsize=len(body) + 4)
                _answers(r, out)
                i = j
        finally:
            dev._qps.pop(r.qp.qpn, None)
            dev.close()

    return run


PATHS = ["generic", "fast", "bulk", "device"]


def _deliver(
    path: str, psn0: int, script: Callable[[Responder], list[Packet]], new_ip: Callable[[], str]
) -> tuple[list[Response], bytes, QpState]:
    if path == "device" and fastpath.native is None:
        pytest.skip(f"native data plane: {fastpath.describe()}")
    r = _responder(psn0, fast=path != "generic")
    out: list[Response] = []
    feed = {"generic": _generic, "fast": _generic, "bulk": _bulk}.get(path) or _device(new_ip)
    feed(r, script(r), out)
    return out, bytes(r.mem), r.qp.state


def _data() -> bytes:
    return random.Random(5).randbytes(MSG * MSGS)


#: An ACK of a responder with no receive WQE posted: credit code 0 (IBTA §9.7.7.2).
ACK = "ACK:0"


def _ack(psn: int) -> Response:
    return ("ACKNOWLEDGE", psn & 0xFFFFFF, ACK)


def _nak(psn: int, code: NakCode) -> Response:
    kind, c = parse_syndrome(nak_syndrome(code))
    return ("ACKNOWLEDGE", psn & 0xFFFFFF, f"{kind.name}:{c}")


PSN0S = [0x1000, 0xFFFFFF - 9]  # the second wraps inside the third WRITE


def _check(
    path: str, psn0: int, script: Callable[[Responder], list[Packet]], new_ip: Callable[[], str]
) -> tuple[list[Response], bytes, QpState]:
    got = _deliver(path, psn0, script, new_ip)
    want = _deliver("generic", psn0, script, new_ip)
    if path == "device":
        # A GRO batch is taken whole before anything is sent: equal ACKs queued for its
        # packets are one (plain ACKs are cumulative, IBTA §9.7.5.1.1).
        assert (_coalesced(got[0]), got[1:]) == (_coalesced(want[0]), want[1:]), "receive paths disagree"
        return want
    assert got == want, "receive paths disagree"
    return got


def _coalesced(out: list[Response]) -> list[Response]:
    return [r for i, r in enumerate(out) if i == 0 or r != out[i - 1] or r[2] != ACK]


# -- scenarios --------------------------------------------------------------------


@pytest.mark.parametrize("psn0", PSN0S)
@pytest.mark.parametrize("path", PATHS)
def test_go_back_to_a_middle_the_responder_has(path: str, psn0: int, new_ip: Callable[[], str]) -> None:
    """A timeout: rxe restarts inside WRITE 1 (a MIDDLE, no RETH) while the responder is
    inside WRITE 2; the resent packets it has are duplicates (ACKed, data untouched), the
    rest continue WRITE 2 where it was."""
    data = _data()

    def script(r: Responder) -> list[Packet]:
        w = _writes(psn0, r.qp.qpn, r.rkey, r.va, data)
        return w[: 2 * PKTS + 2] + [_changed(p) for p in w[PKTS + 1 : 2 * PKTS + 2]] + w[2 * PKTS + 2 :]

    out, mem, state = _check(path, psn0, script, new_ip)
    dups = [_ack(psn0 + 2 * PKTS + 1)] * (PKTS + 1)
    lasts = [_ack(psn0 + m * PKTS + PKTS - 1) for m in range(MSGS)]
    assert out == lasts[:2] + dups + lasts[2:]
    assert mem == data
    assert state is QpState.RTS


@pytest.mark.parametrize("psn0", PSN0S)
@pytest.mark.parametrize("path", PATHS)
def test_go_back_to_the_expected_middle_after_a_nak(path: str, psn0: int, new_ip: Callable[[], str]) -> None:
    """A MIDDLE of WRITE 1 is lost: one NAK sequence error, the later packets dropped
    silently, then rxe resends from the lost MIDDLE (not from the FIRST)."""
    data = _data()
    lost = PKTS + 2

    def script(r: Responder) -> list[Packet]:
        w = _writes(psn0, r.qp.qpn, r.rkey, r.va, data)
        return w[:lost] + w[lost + 1 : lost + 4] + w[lost:]

    out, mem, state = _check(path, psn0, script, new_ip)
    lasts = [_ack(psn0 + m * PKTS + PKTS - 1) for m in range(MSGS)]
    assert out == [lasts[0], _nak(psn0 + lost, NakCode.PSN_SEQUENCE_ERROR), *lasts[1:]]
    assert mem == data
    assert state is QpState.RTS


@pytest.mark.parametrize("psn0", PSN0S)
@pytest.mark.parametrize("path", PATHS)
def test_duplicate_first_inside_and_after_its_write(path: str, psn0: int, new_ip: Callable[[], str]) -> None:
    """Duplicate FIRST packets (with their RETH) while the responder is in the middle of
    that WRITE, and after it, between and inside later WRITEs: never executed again, and
    they do not restart the WRITE under way."""
    data = _data()

    def script(r: Responder) -> list[Packet]:
        w = _writes(psn0, r.qp.qpn, r.rkey, r.va, data)
        first1, first0 = _changed(w[PKTS]), _changed(w[0])
        return [
            *w[: PKTS + 2],
            first1,  # inside WRITE 1, its own FIRST
            *w[PKTS + 2 : 2 * PKTS],
            first1,  # between WRITE 1 and 2
            first0,
            *w[2 * PKTS : 2 * PKTS + 1],
            first1,  # inside WRITE 2
            *w[2 * PKTS + 1 :],
        ]

    out, mem, state = _check(path, psn0, script, new_ip)
    lasts = [_ack(psn0 + m * PKTS + PKTS - 1) for m in range(MSGS)]
    expect = [
        lasts[0],
        _ack(psn0 + PKTS + 1),
        lasts[1],
        lasts[1],
        lasts[1],
        _ack(psn0 + 2 * PKTS),
        *lasts[2:],
    ]
    assert out == expect
    assert mem == data
    assert state is QpState.RTS


@pytest.mark.parametrize("psn0", PSN0S)
@pytest.mark.parametrize("path", PATHS)
def test_two_qps_interleaved_with_their_own_retries(path: str, psn0: int, new_ip: Callable[[], str]) -> None:
    """Two responders fed alternately (as two QPs of one device are): each one's
    retransmissions touch only its own state."""
    if path == "device":
        pytest.skip("one QP per scripted device")
    data = _data()
    a, b = _responder(psn0, path != "generic"), _responder((psn0 + 77) & 0xFFFFFF, path != "generic")
    wa = _writes(psn0, a.qp.qpn, a.rkey, a.va, data)
    wb = _writes((psn0 + 77) & 0xFFFFFF, b.qp.qpn, b.rkey, b.va, data[::-1])
    sa = wa[: PKTS + 2] + wa[1 : PKTS + 2] + wa[PKTS + 2 :]
    sb = wb[: 2 * PKTS + 1] + wb[PKTS + 3 :]
    feed = _bulk if path == "bulk" else _generic
    oa: list[Response] = []
    ob: list[Response] = []
    for i in range(max(len(sa), len(sb))):
        if i < len(sa):
            feed(a, sa[i : i + 1], oa)
        if i < len(sb):
            feed(b, sb[i : i + 1], ob)
    assert bytes(a.mem) == data
    assert bytes(b.mem) == data[::-1]
    assert not [r for r in oa + ob if r[2] != ACK]


@pytest.mark.parametrize("psn0", PSN0S)
@pytest.mark.parametrize("path", PATHS)
def test_rxe_renumbered_retry_gets_nak_invalid_request(
    path: str, psn0: int, new_ip: Callable[[], str]
) -> None:
    """The perftest lab's trace: the responder has WRITEs 0-2 and half of 3 when rxe,
    whose ``comp.psn`` is past WRITE 1 without having completed it, resends WRITE 1 as a
    zero-length WRITE ONLY at that PSN (WRITE 2's FIRST PSN), WRITE 2 from one PSN later,
    and so on. The packets before the expected PSN are duplicates; the shifted MIDDLE after
    it still fits WRITE 3 (nothing in IBTA lets a responder tell); where WRITE 3's LAST is
    due a MIDDLE arrives: NAK invalid request there (the lab's NAK), and the QP goes to
    the error state."""
    data = _data()
    have = 3 * PKTS + 2  # WRITEs 0, 1, 2 and two packets of 3

    def script(r: Responder) -> list[Packet]:
        w = _writes(psn0, r.qp.qpn, r.rkey, r.va, data)
        at = psn0 + 2 * PKTS  # WRITE 1's comp.psn: past its last PSN
        only = Packet(W_ONLY, r.qp.qpn, at & 0xFFFFFF, ackreq=True, reth=RETH(r.va + MSG, r.rkey, 0))
        shifted = [p._replace(psn=(p.psn + 1) & 0xFFFFFF) for p in w[2 * PKTS :]]
        return [*w[:have], only, *shifted]

    out, mem, state = _check(path, psn0, script, new_ip)
    lasts = [_ack(psn0 + m * PKTS + PKTS - 1) for m in range(3)]
    dups = [_ack(psn0 + have - 1)] * (have - 2 * PKTS)  # the ONLY, WRITE 2 and WRITE 3's FIRST
    # The expected PSN brings WRITE 3's second packet (placed as its third), the next one
    # its third where the LAST must come.
    assert out == lasts + dups + [_nak(psn0 + have + 1, NakCode.INVALID_REQUEST)]
    end = 3 * MSG + 2 * MTU
    assert mem[:end] == data[:end]
    assert mem[end : end + MTU] == data[end - MTU : end]
    assert state is QpState.ERR
