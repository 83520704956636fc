#!/usr/bin/env python3
"""A minimal conformance agent: the control protocol of docs/conformance-agent.md in one file.

    conformance-agent-minimal.py DUT_IP SECRET_FILE [LISTEN_PORT]

The protocol half (framing, the mutual HMAC handshake, message tags, JSON
requests) uses the standard library only, as another stack's agent would;
the device half drives rdmakit's soft RoCEv2 engine at DUT_IP, where that
stack would call its own. It serves one tester, then exits; it prints
``{"control": "tcp:HOST:PORT"}`` when it listens. No connection manager.
"""

import hashlib
import hmac
import json
import secrets
import select
import socket
import struct
import sys
import time
from typing import Any

from rdmakit.engine import SGE, Access, CompletionQueue, QpCaps, QpState, RecvWR, SendWR, WrOpcode
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.port import PeerAddress

LABEL = b"rdmakit-comch/1 "
MAGIC_C, MAGIC_S = b"rdmakit-conformance/1 c", b"rdmakit-conformance/1 s"
NONCE, TAG, MAX_BODY = 32, 16, 1 << 16
LEN = struct.Struct(">I")


class Channel:
    """Frames over TCP; after the handshake, a tag on each body (HMAC-SHA256 of seq || body)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.keys: tuple[bytes, bytes] | None = None  # (send, receive)
        self.seq = [0, 0]

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the tester closed the connection")
            buf += chunk
        return buf

    def _tag(self, i: int, body: bytes) -> bytes:
        assert self.keys is not None
        tag = hmac.new(self.keys[i], self.seq[i].to_bytes(8, "big") + body, hashlib.sha256).digest()[:TAG]
        self.seq[i] += 1
        return tag

    def send(self, body: bytes) -> None:
        tag = self._tag(0, body) if self.keys else b""
        self.sock.sendall(LEN.pack(len(body) + len(tag)) + body + tag)

    def recv(self) -> bytes:
        (n,) = LEN.unpack(self._exact(4))
        t = TAG if self.keys else 0
        if not t < n <= MAX_BODY + t:
            raise ConnectionError(f"a frame of {n} bytes")
        frame = self._exact(n)
        body = frame[: n - t]
        if self.keys and not hmac.compare_digest(self._tag(1, body), frame[n - t :]):
            raise ConnectionError("a message failed its tag")
        return body

    def handshake(self, secret: bytes) -> None:
        """The agent's side: check the tester's hello, prove first, check the tester's proof."""
        self.sock.settimeout(5)
        hello_c = self.recv()
        if len(hello_c) != len(MAGIC_C) + NONCE or not hello_c.startswith(MAGIC_C):
            raise ConnectionError("not a conformance tester hello")
        hello_s = MAGIC_S + secrets.token_bytes(NONCE)
        peer, local = self.sock.getpeername(), self.sock.getsockname()
        transcript = hello_c + hello_s + f"{peer[0]} {peer[1]} {local[0]} {local[1]}".encode()

        def mac(label: bytes) -> bytes:
            return hmac.digest(secret, LABEL + label + transcript, hashlib.sha256)

        self.send(hello_s + mac(b"server "))
        if not hmac.compare_digest(self.recv(), mac(b"client ")):
            raise ConnectionError("the tester does not know the secret")
        self.keys = (mac(b"key s2c "), mac(b"key c2s "))
        self.sock.settimeout(None)


class Agent:
    """The requests of the protocol over a soft device (no connection manager)."""

    def __init__(self, ip: str) -> None:
        self.dev = SoftDevice(ip)
        self.qps: dict[int, tuple[Any, CompletionQueue, CompletionQueue]] = {}
        self.mrs: dict[int, Any] = {}

    def info(self, m: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "minimal", "device": self.dev.name, "ip": self.dev.ip, "port": 4791,
                "mtus": [256, 512, 1024, 2048, 4096], "memory_windows": False}  # fmt: skip

    def create_qp(self, m: dict[str, Any]) -> dict[str, Any]:
        scq, rcq = CompletionQueue(256), CompletionQueue(256)
        caps = QpCaps(max_send_wr=64, max_recv_wr=64, max_send_sge=4, max_recv_sge=4)
        qp = self.dev.create_qp(send_cq=scq, recv_cq=rcq, caps=caps)
        self.qps[qp.qpn] = (qp, scq, rcq)
        return {"qpn": qp.qpn}

    def modify_qp(self, m: dict[str, Any]) -> dict[str, Any]:
        qp = self.qps[m["qpn"]][0]
        attrs = dict(m.get("attrs", {}))
        if "remote" in attrs:
            attrs["remote"] = PeerAddress(attrs["remote"]["ip"], attrs["remote"]["port"])
        qp.modify(QpState[m["state"]], **attrs)
        return {"state": qp.state.name}

    def query_qp(self, m: dict[str, Any]) -> dict[str, Any]:
        return {"state": self.qps[m["qpn"]][0].state.name}

    def reg_mr(self, m: dict[str, Any]) -> dict[str, Any]:
        mid = len(self.mrs) + 1
        mr = self.dev.pd.register(bytearray(m["length"]), 0x7F00_0000_0000 + (mid << 24), Access(m["access"]))
        self.mrs[mid] = mr
        return {"mr": mid, "addr": mr.addr, "lkey": mr.lkey, "rkey": mr.rkey}

    def write_mem(self, m: dict[str, Any]) -> dict[str, Any]:
        data = bytes.fromhex(m["data"])
        self.mrs[m["mr"]].view[m["offset"] : m["offset"] + len(data)] = data
        return {}

    def read_mem(self, m: dict[str, Any]) -> dict[str, Any]:
        return {"data": bytes(self.mrs[m["mr"]].view[m["offset"] : m["offset"] + m["length"]]).hex()}

    def _sges(self, m: dict[str, Any]) -> tuple[SGE, ...]:
        return tuple(SGE(self.mrs[mr].addr + off, n, self.mrs[mr].lkey) for mr, off, n in m.get("sge", []))

    def post_recv(self, m: dict[str, Any]) -> dict[str, Any]:
        self.qps[m["qpn"]][0].post_recv(RecvWR(wr_id=m["wr_id"], sg_list=self._sges(m)))
        return {}

    def post_send(self, m: dict[str, Any]) -> dict[str, Any]:
        wr = SendWR(
            wr_id=m["wr_id"], opcode=WrOpcode[m["opcode"]], sg_list=self._sges(m),
            remote_addr=m.get("remote_addr", 0), rkey=m.get("rkey", 0), imm_data=m.get("imm"),
            compare_add=m.get("compare_add", 0), swap=m.get("swap", 0), solicited=m.get("solicited") is True,
        )  # fmt: skip
        self.qps[m["qpn"]][0].post_send(wr)
        return {}

    def poll(self, m: dict[str, Any]) -> dict[str, Any]:
        _qp, scq, rcq = self.qps[m["qpn"]]

        def wc(w: Any) -> dict[str, Any]:
            return {"wr_id": w.wr_id, "status": w.status.name, "opcode": w.opcode.name,
                    "byte_len": w.byte_len, "imm": w.imm_data}  # fmt: skip

        self.dev.progress(time.monotonic())
        return {"send": [wc(w) for w in scq.poll(64)], "recv": [wc(w) for w in rcq.poll(64)]}

    def cleanup(self, m: dict[str, Any]) -> dict[str, Any]:
        for qp, _s, _r in self.qps.values():
            self.dev.destroy_qp(qp)
        for mr in self.mrs.values():
            self.dev.pd.deregister(mr)
        self.qps.clear()
        self.mrs.clear()
        return {}


def serve(agent: Agent, ch: Channel) -> None:
    while True:
        ready, _, _ = select.select([ch.sock, agent.dev.fileno()], [], [], 0.005)
        agent.dev.progress(time.monotonic())
        if ch.sock not in ready:
            continue
        msg = json.loads(ch.recv())
        op = msg.get("op")
        if op == "bye":
            ch.send(b"{}")
            return
        fn = getattr(agent, op, None) if op in _OPS else None
        try:
            reply = fn(msg) if fn is not None else {"error": "unknown operation"}
        except Exception as e:  # a refused or failed step: one line back, the session goes on
            reply = {"error": f"{type(e).__name__}: {e}"[:200]}
        agent.dev.progress(time.monotonic())
        ch.send(json.dumps(reply).encode())


_OPS = {"info", "create_qp", "modify_qp", "query_qp", "reg_mr", "write_mem", "read_mem", "post_recv",
        "post_send", "poll", "cleanup"}  # fmt: skip


def main() -> None:
    dut_ip, secret_file = sys.argv[1], sys.argv[2]
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    with open(secret_file) as f:
        secret = bytes.fromhex(f.read().strip())
    agent = Agent(dut_ip)
    lsock = socket.create_server(("127.0.0.1", port))
    host, lport = lsock.getsockname()[:2]
    print(json.dumps({"control": f"tcp:{host}:{lport}"}), flush=True)
    conn, _ = lsock.accept()
    lsock.close()
    ch = Channel(conn)
    try:
        ch.handshake(secret)
        serve(agent, ch)
    except (ConnectionError, OSError) as e:
        sys.exit(f"conformance-agent-minimal: {e}")
    finally:
        conn.close()
        agent.cleanup({})
        agent.dev.close()


if __name__ == "__main__":
    main()
