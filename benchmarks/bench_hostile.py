"""What each kind of hostile datagram costs a soft RoCE responder (a script, not a test).

    python benchmarks/bench_hostile.py [--count N] [--rounds N]

A responder (a UDP soft device with a QP connected to a peer, on loopback)
is flooded with one kind of datagram at a time: the datagrams are queued in
its socket first, then the CPU time its ``progress`` takes to drain them is
measured (``time.thread_time``: the receiving side only). Each kind is
printed per datagram and as a ratio to a valid packet (a 64-byte RDMA WRITE
that the responder places and ACKs) measured in the same round; the median of
the rounds. ``RDMAKIT_PURE_PYTHON=1`` measures the pure-Python path.
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import time
from collections.abc import Callable

from rdmakit.engine import Access, CompletionQueue
from rdmakit.transport import fastpath
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.wire import RETH, Opcode, Packet, encode, icrc_ipv4, pack_icrc, unpack_icrc

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
        for s in (self.kernel_port, self.stranger, *self.ports):
            s.close()
        self.a.close()
        self.b.close()


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=3000, help="datagrams per kind per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    rng = random.Random(1)
    rig = Rig()
    try:
        table = kinds(rig, args.count, rng)
        per: dict[str, list[float]] = {k: [] for k in table}
        ratio: dict[str, list[float]] = {k: [] for k in table}
        for _ in range(args.rounds):
            cost: dict[str, float] = {}
            for name, make in table.items():
                flood = make()
                for sock, data in flood:
                    sock.sendto(data, rig.dst)
                cost[name] = rig.drain(len(flood)) / len(flood)
            for name, c in cost.items():
                per[name].append(c)
                ratio[name].append(c / cost["valid 64-byte WRITE (placed, ACKed)"])
        print(f"bench_hostile: {args.count} datagrams per kind, median of {args.rounds} rounds; "
              f"UDP data plane: {fastpath.describe()}")  # fmt: skip
        print(f"{'datagram kind':42} {'CPU/datagram':>13} {'vs valid':>9}")
        worst = 0.0
        for name in table:
            r = statistics.median(ratio[name])
            worst = max(worst, r) if not name.startswith("valid 64") else worst
            print(f"{name:42} {statistics.median(per[name]) * 1e6:10.2f} µs {r:8.2f}x")
        n = rig.b.counters
        print(f"worst hostile kind: {worst:.2f}x a valid packet (aim: at most 3x); responder counters: "
              f"solver runs {n.solver_runs}, limited {n.solver_limited}, bad ICRC {n.bad_icrc}, "
              f"solved {n.icrc_solved}")  # fmt: skip
    finally:
        rig.close()


if __name__ == "__main__":
    main()
