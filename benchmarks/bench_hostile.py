"""What each kind of hostile datagram costs a soft RoCE responder (a script, not a test).

    python benchmarks/bench_hostile.py [--count N] [--rounds N]

A responder (a UDP soft device with a QP connected to a peer, on loopback)
is flooded with one kind of datagram at a time: the datagrams are queued in
its socket first, then the CPU time its ``progress`` takes to drain them is
measured (``time.thread_time``: the receiving side only). Each kind is
printed per datagram and as a ratio to a valid packet (a 64-byte RDMA WRITE
that the responder places and ACKs) measured in the same round; the median of
the rounds. ``RDMAKIT_PURE_PYTHON=1`` measures the pure-Python path.

QP1 (the connection manager's GSI) is measured the same way, against a valid
MAD: a REQ for a port nobody listens to, which the CM answers with a REJ.
Its hostile kinds come from strangers (addresses no QP is connected to).
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import time
from collections.abc import Callable, Mapping

from rdmakit.engine import Access, CompletionQueue
from rdmakit.transport import fastpath
from rdmakit.transport.cma import RdmaCm
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.wire import RETH, Opcode, Packet, encode, icrc_ipv4, pack_icrc, unpack_icrc
from rdmakit.wire.cm import CmAttr, CmMad, PortSpace, encode_cm, service_id
from rdmakit.wire.ud import GSI_QKEY, GSI_QPN, UdSend, encode_ud_send

BASE = f"127.{random.Random().randrange(150, 250)}.{random.Random().randrange(256)}"
PSN_A, PSN_B = 1000, 2000


class Rig:
    """A responder ``b``, the peer address ``a`` it is connected to, and sockets to attack from."""

    def __init__(self) -> None:
        self.a = SoftDevice(f"{BASE}.1", port=0, gso=False)
        self.b = SoftDevice(f"{BASE}.2", port=0, gso=False)
        cqa, cqb = CompletionQueue(1 << 16), CompletionQueue(1 << 16)
        self.qa = self.a.create_qp(send_cq=cqa, recv_cq=cqa)
        self.qb = self.b.create_qp(send_cq=cqb, recv_cq=cqb)
        connect_qp(self.a, self.qa, PSN_A, local_endpoint(self.b, self.qb, PSN_B))
        connect_qp(self.b, self.qb, PSN_B, local_endpoint(self.a, self.qa, PSN_A))
        self.mem = bytearray(1 << 20)
        self.mr = self.b.pd.register(self.mem, 0x10_0000, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        self.dst = (self.b.ip, self.b.port)
        self.peer = self.a.udp.sock if self.a.udp else None  # the peer's own (address, port)
        self.kernel_port = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.kernel_port.bind((self.a.ip, 0))  # the peer's address, another port (a kernel QP's)
        self.ports = []
        for _ in range(64):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((self.a.ip, 0))
            self.ports.append(s)
        self.stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.stranger.bind((f"{BASE}.3", 0))
        self.cm = RdmaCm(self.b)  # QP1 answers; nobody listens on the port the REQs name
        self.strangers = []  # QP1's senders: one address each
        for i in range(64):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((f"{BASE}.{10 + i}", 0))
            self.strangers.append(s)
        self.psn = PSN_A
        self.last_valid: list[bytes] = []

    def wire(self, pkt: Packet, sock: socket.socket, ident: int = 0) -> bytes:
        body = encode(pkt)
        (sip, sport), (dip, dport) = sock.getsockname(), self.dst
        ic = icrc_ipv4(socket.inet_aton(sip), socket.inet_aton(dip), sport, dport, body, ident=ident)
        return body + pack_icrc(ic)

    def write(self, psn: int, payload: bytes) -> Packet:
        reth = RETH(self.mr.addr + (psn % 1000) * 64, self.mr.rkey, len(payload))
        return Packet(
            Opcode.RDMA_WRITE_ONLY, self.qb.qpn, psn & 0xFFFFFF, ackreq=True, reth=reth, payload=payload
        )

    def drain(self, sent: int) -> float:
        """CPU seconds the responder takes to read and handle ``sent`` queued datagrams."""
        link = self.b.udp
        assert link is not None
        target = link.counters.datagrams_in + sent
        t0 = time.thread_time()
        for _ in range(sent * 4 + 1000):
            self.b.progress(time.monotonic())
            if link.counters.datagrams_in >= target and not link.ready():
                break
        return time.thread_time() - t0

    def close(self) -> None:
        for s in (self.kernel_port, self.stranger, *self.ports, *self.strangers):
            s.close()
        self.a.close()
        self.b.close()

    def mad_wire(self, payload: bytes, sock: socket.socket, ident: int = 0, qkey: int = GSI_QKEY) -> bytes:
        """A UD SEND ONLY to QP1 carrying ``payload``, as ``sock`` sends it with IPv4 ID ``ident``."""
        body = encode_ud_send(UdSend(dest_qp=GSI_QPN, src_qp=GSI_QPN, qkey=qkey, payload=payload))
        (sip, sport), (dip, dport) = sock.getsockname(), self.dst
        ic = icrc_ipv4(socket.inet_aton(sip), socket.inet_aton(dip), sport, dport, body, ident=ident)
        return body + pack_icrc(ic)


def _req(comm_id: int) -> bytes:
    """A REQ for port 9 (nobody listens there): the CM answers REJ "invalid service ID"."""
    values = {
        "local_comm_id": comm_id, "service_id": service_id(PortSpace.TCP, 9), "local_ca_guid": 0x1234,
        "local_qpn": 0x100 + comm_id % 1000, "remote_cm_response_timeout": 16, "max_cm_retries": 3,
    }  # fmt: skip
    return encode_cm(CmMad(CmAttr.REQ, comm_id, values))


def _spoil(data: bytes) -> bytes:
    return data[:-4] + pack_icrc(unpack_icrc(data) ^ 1)


Flood = list[tuple[socket.socket, bytes]]


def kinds(rig: Rig, n: int, rng: random.Random) -> dict[str, Callable[[], Flood]]:
    peer = rig.peer
    assert peer is not None
    payload = bytes(64)

    def valid() -> Flood:
        out = []
        rig.last_valid = []
        for _ in range(n):
            data = rig.wire(rig.write(rig.psn, payload), peer)
            rig.psn += 1
            rig.last_valid.append(data)
            out.append((peer, data))
        return out

    def duplicate() -> Flood:
        return [(peer, d) for d in rig.last_valid]

    def bad_icrc_same_length() -> Flood:
        return [(peer, _spoil(rig.wire(rig.write(rig.psn + i, payload), peer))) for i in range(n)]

    def bad_icrc_cycling_lengths() -> Flood:
        k = rig.kernel_port
        return [(k, _spoil(rig.wire(rig.write(rig.psn + i, bytes(4 * (i % 300))), k))) for i in range(n)]

    def bad_icrc_many_ports() -> Flood:
        out = []
        for i in range(n):
            s = rig.ports[i % len(rig.ports)]
            out.append((s, _spoil(rig.wire(rig.write(rig.psn + i, payload), s))))
        return out

    def solvable_icrc_kernel_id() -> Flood:
        # ICRCs that some IPv4 ID explains, IDs all over the place: the solver's worst case.
        k = rig.kernel_port
        return [
            (k, rig.wire(rig.write(rig.psn + i, bytes(4 * (i % 300))), k, rng.getrandbits(16)))
            for i in range(n)
        ]

    def unknown_qpn() -> Flood:
        return [
            (peer, rig.wire(Packet(Opcode.SEND_ONLY, 0x7777, i, payload=payload), peer)) for i in range(n)
        ]

    def wrong_source() -> Flood:
        s = rig.stranger
        return [(s, rig.wire(rig.write(rig.psn + i, payload), s)) for i in range(n)]

    def bad_tver() -> Flood:
        out = []
        for i in range(n):
            b = bytearray(rig.wire(rig.write(rig.psn + i, payload), peer))
            b[1] |= 1
            out.append((peer, bytes(b)))
        return out

    def short_or_truncated() -> Flood:
        whole = rig.wire(rig.write(rig.psn, payload), peer)
        return [(peer, whole[: (5, 15, 20, 40)[i % 4]]) for i in range(n)]

    def random_bytes() -> Flood:
        return [(peer, rng.randbytes(rng.randrange(1, 200))) for _ in range(n)]

    def random_bytes_to_qp() -> Flood:
        head = rig.wire(rig.write(0, b""), peer)[:12]
        return [(peer, head + rng.randbytes(rng.randrange(4, 200))) for _ in range(n)]

    return {
        "valid 64-byte WRITE (placed, ACKed)": valid,
        "valid but duplicate": duplicate,
        "bad ICRC, same length": bad_icrc_same_length,
        "bad ICRC, cycling lengths (new port)": bad_icrc_cycling_lengths,
        "bad ICRC, 64 ports of the peer": bad_icrc_many_ports,
        "ICRC of a random IPv4 ID": solvable_icrc_kernel_id,
        "unknown QPN": unknown_qpn,
        "wrong source address": wrong_source,
        "bad TVer": bad_tver,
        "short / truncated": short_or_truncated,
        "random bytes": random_bytes,
        "random bytes after a good BTH": random_bytes_to_qp,
    }


VALID_MAD = "valid MAD (a REQ, answered by a REJ)"


def qp1_kinds(rig: Rig, n: int, rng: random.Random) -> dict[str, Callable[[], Flood]]:
    one = rig.strangers[0]
    many = rig.strangers

    def valid() -> Flood:
        return [(one, rig.mad_wire(_req(1 + i), one)) for i in range(n)]

    def bad_icrc() -> Flood:
        return [(one, _spoil(rig.mad_wire(_req(1 + i), one))) for i in range(n)]

    def bad_icrc_cycling_lengths() -> Flood:
        return [(one, _spoil(rig.mad_wire(bytes(4 * (1 + i % 300)), one))) for i in range(n)]

    def bad_icrc_many_sources() -> Flood:
        return [
            (many[i % len(many)], _spoil(rig.mad_wire(_req(1 + i), many[i % len(many)]))) for i in range(n)
        ]

    def random_ident() -> Flood:
        # ICRCs that some IPv4 ID explains, IDs all over the place: the solver's worst case.
        socks = [many[i % len(many)] for i in range(n)]
        return [(s, rig.mad_wire(_req(1 + i), s, rng.getrandbits(16) or 1)) for i, s in enumerate(socks)]

    def wrong_qkey() -> Flood:
        return [(one, rig.mad_wire(_req(1 + i), one, qkey=0x1234)) for i in range(n)]

    def not_cm() -> Flood:
        return [(one, _spoil(rig.mad_wire(bytes([1, 0x81]) + rng.randbytes(254), one))) for _ in range(n)]

    def random_bytes() -> Flood:
        head = rig.mad_wire(b"", one)[:20]
        return [(one, head + rng.randbytes(rng.randrange(4, 300))) for _ in range(n)]

    return {
        VALID_MAD: valid,
        "QP1 bad ICRC, one stranger": bad_icrc,
        "QP1 bad ICRC, cycling lengths": bad_icrc_cycling_lengths,
        "QP1 bad ICRC, 64 strangers": bad_icrc_many_sources,
        "QP1 ICRC of a random IPv4 ID, 64 strangers": random_ident,
        "QP1 wrong Q_Key": wrong_qkey,
        "QP1 not a CM MAD (bad ICRC)": not_cm,
        "QP1 random bytes after the headers": random_bytes,
    }


def _measure(
    rig: Rig, table: dict[str, Callable[[], Flood]], baseline: str, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    per: dict[str, list[float]] = {k: [] for k in table}
    ratio: dict[str, list[float]] = {k: [] for k in table}
    for _ in range(rounds):
        cost: dict[str, float] = {}
        for name, make in table.items():
            flood = make()
            for sock, data in flood:
                sock.sendto(data, rig.dst)
            cost[name] = rig.drain(len(flood)) / len(flood)
        for name, c in cost.items():
            per[name].append(c)
            ratio[name].append(c / cost[baseline])
    return per, ratio


def _print(
    table: Mapping[str, object], per: dict[str, list[float]], ratio: dict[str, list[float]], base: str
) -> float:
    print(f"{'datagram kind':44} {'CPU/datagram':>13} {'vs valid':>9}")
    worst = 0.0
    for name in table:
        r = statistics.median(ratio[name])
        worst = max(worst, r) if name != base else worst
        print(f"{name:44} {statistics.median(per[name]) * 1e6:10.2f} µs {r:8.2f}x")
    return worst


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=3000, help="datagrams per kind per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    rng = random.Random(1)
    rig = Rig()
    try:
        valid = "valid 64-byte WRITE (placed, ACKed)"
        table = kinds(rig, args.count, rng)
        per, ratio = _measure(rig, table, valid, args.rounds)
        print(f"bench_hostile: {args.count} datagrams per kind, median of {args.rounds} rounds; "
              f"UDP data plane: {fastpath.describe()}")  # fmt: skip
        worst = _print(table, per, ratio, valid)
        packet = statistics.median(per[valid])
        n = rig.b.counters
        print(f"worst hostile kind: {worst:.2f}x a valid packet (aim: at most 3x); responder counters: "
              f"solver runs {n.solver_runs}, limited {n.solver_limited}, bad ICRC {n.bad_icrc}, "
              f"solved {n.icrc_solved}")  # fmt: skip
        print()
        qp1 = qp1_kinds(rig, args.count, rng)
        per, ratio = _measure(rig, qp1, VALID_MAD, args.rounds)
        worst = _print(qp1, per, ratio, VALID_MAD)
        dearest = max(statistics.median(per[k]) for k in qp1 if k != VALID_MAD)
        gsi = rig.b.gsi
        g = gsi.counters.as_dict() if gsi is not None else {}
        print(f"worst QP1 kind: {worst:.2f}x a valid MAD (aim: at most 3x), {dearest * 1e6:.2f} µs, "
              f"{dearest / packet:.2f}x a valid data packet; QP1 counters: {g}")  # fmt: skip
    finally:
        rig.close()


if __name__ == "__main__":
    main()
