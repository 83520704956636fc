"""Connection-manager peers for the QP1 and CM attack tests: real devices, and forged MADs.

``Side`` is `rdmakit.testing.cm_side.CmSide`: a soft device with its
``RdmaCm`` on a loopback address, pumped by hand. ``connect`` makes an RC
connection between two sides through their QP1s and ``exchange`` moves bytes over it and checks every one (the
legitimate run each test ends with). ``mad_datagram`` builds what a sender
at any address would put on the wire for one CM MAD to QP1, and
``forged_req`` a REQ such a sender makes up.
"""

import ipaddress
import random
import socket
import time
from pathlib import Path

from rdmakit.conformance import control
from rdmakit.conformance.control import TargetClient
from rdmakit.engine import SGE, Access, QueuePair, RecvWR, SendWR, WcStatus, WrOpcode
from rdmakit.testing.cm_side import CmSide, until
from rdmakit.transport.cma import CmaEventKind
from rdmakit.transport.comm import connect as connect_service
from rdmakit.transport.comm import parse_service
from rdmakit.transport.comm_auth import load_secret
from rdmakit.wire import icrc_ipv4, pack_icrc
from rdmakit.wire.cm import CmaHeader, CmAttr, CmMad, PortSpace, decode_cm, encode_cm, service_id
from rdmakit.wire.ud import GSI_QKEY, GSI_QPN, UdSend, decode_ud_send, encode_ud_send

PORT = 7174


#: A CM end with short timeouts (`CmSide`'s defaults); ``timeout_exponent=None`` gives rdma_cm's own.
Side = CmSide


def connect(a: Side, b: Side, port: int = PORT) -> tuple[QueuePair, QueuePair, int, int]:
    """`a` connects to `b` (which listens on `port`) and `b` accepts; both ESTABLISHED.

    Returns both QPs and both connection handles (each side's local communication ID)."""
    qa = a.qp()
    ha = a.cm.connect(b.dev.ip, port, qa, time.monotonic())
    until((a, b), lambda: any(e.kind is CmaEventKind.CONNECT_REQUEST for e in b.events))
    req = b.take(CmaEventKind.CONNECT_REQUEST)
    qb = b.qp()
    b.cm.accept(req.conn, qb, time.monotonic())
    until(
        (a, b),
        lambda: (
            any(e.kind is CmaEventKind.ESTABLISHED and e.conn == ha for e in a.events)
            and any(e.kind is CmaEventKind.ESTABLISHED and e.conn == req.conn for e in b.events)
        ),
    )
    return qa, qb, ha, req.conn


def exchange(
    a: CmSide, b: CmSide, qa: QueuePair, qb: QueuePair, size: int = 3000, base: int = 0x40_0000
) -> None:
    """A SEND of `size` random bytes from `qa` to `qb`; asserts both completed and every byte arrived."""
    msg = random.Random(size).randbytes(size)
    src, dst = bytearray(msg), bytearray(size)
    mra = a.dev.pd.register(src, base, Access.LOCAL_WRITE)
    mrb = b.dev.pd.register(dst, base + 0x10_0000, Access.LOCAL_WRITE)
    qb.post_recv(RecvWR(wr_id=7, sg_list=(SGE(base + 0x10_0000, size, mrb.lkey),)))
    qa.post_send(SendWR(wr_id=8, opcode=WrOpcode.SEND, sg_list=(SGE(base, size, mra.lkey),)))
    got: list[int] = []

    def done() -> bool:
        for wc in a.cq.poll(8) + b.cq.poll(8):
            assert wc.status is WcStatus.SUCCESS, wc
            got.append(wc.wr_id)
        return sorted(got) == [7, 8]

    until((a, b), done)
    assert bytes(dst) == msg


def mad_datagram(
    mad: CmMad | bytes, src: tuple[str, int], dst: tuple[str, int], *, ident: int = 0, spoil: bool = False
) -> bytes:
    """A UD SEND ONLY to QP1 carrying `mad`, as `src` sends it to `dst` with IPv4 ID `ident`: BTH .. ICRC."""
    payload = encode_cm(mad) if isinstance(mad, CmMad) else mad
    body = encode_ud_send(UdSend(dest_qp=GSI_QPN, src_qp=GSI_QPN, qkey=GSI_QKEY, payload=payload))
    (sip, sport), (dip, dport) = src, dst
    icrc = icrc_ipv4(socket.inet_aton(sip), socket.inet_aton(dip), sport, dport, body, ident=ident)
    return body + pack_icrc(icrc ^ spoil)


def forged_req(
    src_ip: str,
    dst_ip: str,
    comm_id: int,
    *,
    port: int = PORT,
    qpn: int = 0x77,
    guid: int = 0x5EED,
    timeout_exponent: int = 14,
    retries: int = 2,
    **fields: int,
) -> CmMad:
    """A REQ for `dst_ip`:`port` whose cma_hdr says it comes from `src_ip`; `fields` override any value."""
    hdr = CmaHeader(src=ipaddress.ip_address(src_ip), dst=ipaddress.ip_address(dst_ip), src_port=40000)
    values = {
        "local_comm_id": comm_id, "service_id": service_id(PortSpace.TCP, port), "local_ca_guid": guid,
        "local_qpn": qpn, "starting_psn": 1, "path_mtu": 3, "retry_count": 7, "rnr_retry_count": 7,
        "remote_cm_response_timeout": timeout_exponent, "local_cm_response_timeout": timeout_exponent,
        "max_cm_retries": retries, "responder_resources": 1, "initiator_depth": 1,
        **fields,
    }  # fmt: skip
    return CmMad(CmAttr.REQ, comm_id, values, hdr.encode())


class Stranger:
    """A UDP socket on an address where nothing answers: it only sends what it is given."""

    def __init__(self, ip: str, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ip, port))
        self.addr: tuple[str, int] = self.sock.getsockname()

    def send(self, datagrams: list[bytes], dst: tuple[str, int]) -> None:
        for d in datagrams:
            self.sock.sendto(d, dst)

    def recv_mad(self, timeout: float) -> CmMad | None:
        """The next CM MAD sent to this address's RoCE port (bind it there), or None."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return None
        return decode_cm(decode_ud_send(data[:-4]).payload)

    def close(self) -> None:
        self.sock.close()


def control_session(control_addr: str, secret_file: Path) -> TargetClient:
    """A control session with a conformance target agent, past its handshake."""
    sock = connect_service(parse_service(control_addr), max_msg_size=control.MAX_MSG, timeout=10)
    control.client_handshake(sock, load_secret(secret_file=secret_file))
    return TargetClient(sock)
