"""Tools for attacking a soft ``tcp:`` device: raw streams, forged prefaces, a legitimate
pair whose transfers are checked byte for byte, and the process's resident memory."""

import contextlib
import os
import random
import socket
import struct
import time
from collections.abc import Callable

from rdmakit.engine import SGE, Access, CompletionQueue, QueuePair, RecvWR, SendWR, WcStatus, WrOpcode
from rdmakit.transport import tcp_limits
from rdmakit.transport.connect import Endpoint, connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice, gid_of
from rdmakit.transport.driver import Driver
from rdmakit.wire import FRAME_HEADER, RETH, Opcode, Packet, encode

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
MEM = 1 << 20
A_PSN, B_PSN = 10, 20


def ip16(ip: str) -> bytes:
    return b"\0" * 10 + b"\xff\xff" + socket.inet_aton(ip)


def preface(claim_ip: str, claim_port: int, qpn: int, secret: bytes) -> bytes:
    """A preface claiming to come from the device listening on ``(claim_ip, claim_port)``."""
    return tcp_limits.PREFACE_MAGIC + ip16(claim_ip) + struct.pack(">HI", claim_port, qpn) + secret


def write_frame(qpn: int, psn: int, va: int, rkey: int, payload: bytes) -> bytes:
    reth = RETH(va, rkey, len(payload))
    body = encode(Packet(Opcode.RDMA_WRITE_ONLY, qpn, psn, ackreq=True, reth=reth, payload=payload))
    return FRAME_HEADER.pack(len(body)) + body


def dial(src_ip: str, dst: tuple[str, int]) -> socket.socket:
    """A non-blocking stream from ``src_ip`` to ``dst`` (connection under way)."""
    s = socket.socket()
    s.bind((src_ip, 0))
    s.setblocking(False)
    s.connect_ex(dst)
    return s


def is_closed(s: socket.socket) -> bool:
    """The far end closed the stream (FIN or RST arrived)."""
    try:
        return s.recv(1, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def rss() -> int:
    """This process's resident set, in bytes (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Pair:
    """Two ``tcp:`` soft devices with one connected QP each, pumped by one driver."""

    def __init__(self, new_ip: Callable[[], str], clock: Callable[[], float] = time.monotonic) -> None:
        self.a = SoftDevice(new_ip(), transport="tcp", port=0)
        self.b = SoftDevice(new_ip(), transport="tcp", port=0)
        self.drv = Driver(clock)
        self.drv.add(self.a)
        self.drv.add(self.b)
        self.cqa, self.cqb = CompletionQueue(256), CompletionQueue(256)
        self.qa = self.a.create_qp(send_cq=self.cqa, recv_cq=self.cqa)
        self.qb = self.b.create_qp(send_cq=self.cqb, recv_cq=self.cqb)
        self.ea = local_endpoint(self.a, self.qa, A_PSN)
        self.eb = local_endpoint(self.b, self.qb, B_PSN)
        connect_qp(self.a, self.qa, A_PSN, self.eb)
        connect_qp(self.b, self.qb, B_PSN, self.ea)
        self.amem, self.bmem = bytearray(MEM), bytearray(MEM)
        self.mra = self.a.pd.register(self.amem, 0x10_0000, Access.LOCAL_WRITE)
        self.mrb = self.b.pd.register(self.bmem, 0x900_0000, ALL)

    @property
    def b_secret(self) -> bytes:
        return bytes.fromhex(self.eb.secret)

    def pump(self, rounds: int = 20) -> None:
        for _ in range(rounds):
            self.drv.progress()

    def _complete(self, cq: CompletionQueue, timeout: float = 20.0) -> WcStatus:
        got: list[WcStatus] = []

        def done() -> bool:
            got.extend(wc.status for wc in cq.poll(1))
            return bool(got)

        assert self.drv.run_until(done, timeout), "no completion"
        return got[0]

    def _post(self, qp: QueuePair, op: WrOpcode, length: int, remote: int = 0) -> None:
        qp.post_send(
            SendWR(
                wr_id=1, opcode=op, sg_list=(SGE(self.mra.addr, length, self.mra.lkey),),
                remote_addr=self.mrb.addr + remote, rkey=self.mrb.rkey,
            )
        )  # fmt: skip

    def transfer(self, seed: int) -> None:
        """WRITE, READ and SEND, each checked byte for byte."""
        rng = random.Random(seed)
        n = 256 << 10
        data = rng.randbytes(n)
        self.amem[:n] = data
        self._post(self.qa, WrOpcode.RDMA_WRITE, n)
        assert self._complete(self.cqa) is WcStatus.SUCCESS
        assert self.bmem[:n] == data
        back = rng.randbytes(64 << 10)
        self.bmem[n : n + len(back)] = back
        self._post(self.qa, WrOpcode.RDMA_READ, len(back), remote=n)
        assert self._complete(self.cqa) is WcStatus.SUCCESS
        assert self.amem[: len(back)] == back
        msg = rng.randbytes(1000)
        self.qb.post_recv(RecvWR(wr_id=7, sg_list=(SGE(self.mrb.addr, len(msg), self.mrb.lkey),)))
        self.amem[: len(msg)] = msg
        self._post(self.qa, WrOpcode.SEND, len(msg))
        assert self._complete(self.cqa) is WcStatus.SUCCESS
        assert self._complete(self.cqb) is WcStatus.SUCCESS
        assert self.bmem[: len(msg)] == msg

    def close(self) -> None:
        self.a.close()
        self.b.close()
        self.drv.close()


def fake_endpoint(ip: str, port: int) -> Endpoint:
    """The endpoint of a ``tcp:`` peer that is only a listening socket."""
    return Endpoint(
        transport="tcp", gid=gid_of(ip), ip=ip, port=port, qpn=0x123, psn=B_PSN, mtu=1 << 20,
        secret=os.urandom(tcp_limits.SECRET_LEN).hex(),
    )  # fmt: skip


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.close()
