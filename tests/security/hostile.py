"""Two connected soft devices and crafted RoCEv2 datagrams, for the receive-path attack tests.

``Pair`` is a requester ``a`` and a responder ``b`` on loopback with an RC
connection between ``qa`` and ``qb``; ``transfer`` moves data over it and
checks every byte (a legitimate flow, before and after an attack).
``datagram`` builds the UDP payload a given sender would put on the wire for a
packet: its ICRC covers the sender's address and port and an IPv4 ID.
"""

import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rdmakit.engine import SGE, Access, Completion, CompletionQueue, QueuePair, SendWR, WcStatus, WrOpcode
from rdmakit.testing.engine import until_completions
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.wire import RETH, Opcode, Packet, encode, icrc_ipv4, pack_icrc, unpack_icrc

#: The PSNs the two sides start from.
PSN_A, PSN_B = 10, 20


@dataclass
class Pair:
    a: SoftDevice
    b: SoftDevice
    qa: QueuePair
    qb: QueuePair
    cqa: CompletionQueue
    drv: Driver
    wr_id: int = 0
    _keep: list[bytearray] = field(default_factory=list)

    def transfer(self, size: int, seed: int = 1, timeout: float = 30.0) -> None:
        """RDMA WRITE ``size`` bytes from a to b; asserts it completed and every byte landed."""
        src = bytearray(random.Random(seed).randbytes(size))
        dst = bytearray(size)
        self._keep += (src, dst)
        mra = self.a.pd.register(src, 0x1_0000 * (len(self._keep) + 1), Access.LOCAL_WRITE)
        mrb = self.b.pd.register(
            dst, 0x9_0000 * (len(self._keep) + 1), Access.LOCAL_WRITE | Access.REMOTE_WRITE
        )
        self.wr_id += 1
        sge = SGE(mra.addr, size, mra.lkey)
        wr = SendWR(
            wr_id=self.wr_id, opcode=WrOpcode.RDMA_WRITE, sg_list=(sge,), remote_addr=mrb.addr, rkey=mrb.rkey
        )
        self.qa.post_send(wr)
        got: list[Completion] = []
        assert self.drv.run_until(until_completions(self.cqa, got), timeout)
        assert got[0].status is WcStatus.SUCCESS
        assert got[0].wr_id == self.wr_id
        assert dst == src

    def close(self) -> None:
        self.a.close()
        self.b.close()
        self.drv.close()


def connected_pair(new_ip: Callable[[], str], native: bool) -> Pair:
    """Two devices on fresh loopback addresses, ``bulk=native``, without GSO (one datagram per packet)."""
    a, b = SoftDevice(new_ip(), gso=False, bulk=native), SoftDevice(new_ip(), gso=False, bulk=native)
    cqa, cqb = CompletionQueue(64), CompletionQueue(64)
    qa, qb = a.create_qp(send_cq=cqa, recv_cq=cqa), b.create_qp(send_cq=cqb, recv_cq=cqb)
    connect_qp(a, qa, PSN_A, local_endpoint(b, qb, PSN_B))
    connect_qp(b, qb, PSN_B, local_endpoint(a, qa, PSN_A))
    drv = Driver()
    drv.add(a)
    drv.add(b)
    return Pair(a, b, qa, qb, cqa, drv)


def datagram(pkt: Packet, src: tuple[str, int], dst: tuple[str, int], ident: int = 0) -> bytes:
    """``pkt`` as ``src`` sends it to ``dst`` over IPv4 with IPv4 ID ``ident``: BTH .. ICRC."""
    body = encode(pkt)
    ic = icrc_ipv4(socket.inet_aton(src[0]), socket.inet_aton(dst[0]), src[1], dst[1], body, ident=ident)
    return body + pack_icrc(ic)


def spoil(data: bytes) -> bytes:
    """``data`` with one ICRC bit flipped: no IPv4 ID explains it (a CRC-32 never confuses one bit)."""
    return data[:-4] + pack_icrc(unpack_icrc(data) ^ 1)


def stale_write(qpn: int, payload: bytes = b"") -> Packet:
    """A WRITE the responder has seen before (its PSN is behind): harmless if it gets through."""
    return Packet(Opcode.RDMA_WRITE_ONLY, qpn, PSN_A - 5, reth=RETH(0, 0, len(payload)), payload=payload)


class SolverCalls:
    """Counts the IPv4-ID solver's runs (each needs the basis of ``rdmakit.wire.ident`` for a length)."""

    def __init__(self, monkeypatch: Any) -> None:
        from rdmakit.wire import ident

        self.count = 0
        real = ident._solver

        def counted(*args: Any) -> Any:
            self.count += 1
            return real(*args)

        monkeypatch.setattr(ident, "_solver", counted)
