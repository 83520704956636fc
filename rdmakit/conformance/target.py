"""The target agent: sets up each conformance case on the device under test, on the tester's orders.

It runs beside the DUT (``rdmakit conformance-target -d DEVICE``), listens on
a TCP control port and, once a tester has passed the handshake of
:mod:`.control`, executes its requests: create, modify, reset and destroy
QPs; register memory; post receives and sends; read and write memory; poll
completions; read counters. Between requests it pumps the device.

The control port is hostile until the handshake succeeds: the agent reads one
hello of the exact size within a few seconds, and only after that does it
parse anything. Every request is bounded: its size (``control.MAX_MSG``),
each integer's range, the number of QPs and memory regions and their sizes,
the bytes read or written per request. One tester at a time; the handshakes of
those waiting run side by side, each with its own deadline (`.target_gate`).
"""

import contextlib
import ipaddress
import select
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rdmakit.engine import (
    SGE,
    Access,
    Completion,
    CompletionQueue,
    EngineError,
    QpCaps,
    QpState,
    QueuePair,
    RecvWR,
    SendWR,
    WrOpcode,
)
from rdmakit.transport.cma import CmaEventKind, RdmaCm
from rdmakit.transport.comm import Listener, MessageSocket
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.port import PeerAddress

from . import control
from .control import ControlError
from .target_gate import Gate

MAX_QPS = 64
MAX_MRS = 64
MAX_MR_BYTES = 1 << 20
MAX_TOTAL_MR_BYTES = 16 << 20
#: Bytes one read_mem / write_mem moves (hex doubles them in the message).
MAX_IO_BYTES = 16 << 10
MAX_SGES = 4
MAX_POLL = 64
CQ_DEPTH = 256
_MR_BASE = 0x7F00_0000_0000
_MR_STRIDE = 1 << 24
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_U24 = (1 << 24) - 1
_STATES = {s.name: s for s in QpState}
_MODIFY = {
    "port": (1, 255), "pkey_index": (0, 63), "access": (0, 15), "path_mtu": (256, 4096),
    "dest_qpn": (1, _U24), "rq_psn": (0, _U24), "max_dest_rd_atomic": (0, 128), "min_rnr_timer": (0, 31),
    "timeout": (0, 31), "retry_cnt": (0, 7), "rnr_retry": (0, 7), "sq_psn": (0, _U24),
    "max_rd_atomic": (0, 128),
}  # fmt: skip
_SEND_OPS = {op.name: op for op in WrOpcode}
Remote = tuple[str, int] | None  # the tester's (ip, port) for a QP's address vector


class Refused(Exception):
    """A request the agent will not carry out (its reason goes back to the tester)."""


def _int(msg: dict[str, Any], key: str, lo: int, hi: int, default: int | None = None) -> int:
    v = msg.get(key, default)
    if type(v) is not int or not lo <= v <= hi:
        raise Refused(f"{key} must be an integer in [{lo}, {hi}]")
    return v


@dataclass(slots=True)
class _Qp:
    qp: Any  # the device's QP object
    send: deque[Completion] = field(default_factory=deque)
    recv: deque[Completion] = field(default_factory=deque)


@dataclass(slots=True)
class Region:
    """A registered memory region as the agent sees it: keys, address and its bytes."""

    addr: int
    length: int
    lkey: int
    rkey: int
    view: memoryview
    handle: Any  # the device's registration


def _wc(wc: Completion) -> dict[str, Any]:
    return {
        "wr_id": wc.wr_id, "status": wc.status.name, "opcode": wc.opcode.name,
        "byte_len": wc.byte_len, "imm": wc.imm_data,
    }  # fmt: skip


class Target:
    """The agent's requests, checked and bounded, over one device (`SoftTarget`, ``VerbsTarget``).

    A subclass supplies the device calls (the ``_dev_*`` methods) and the pump.
    """

    kind = "?"

    def __init__(self) -> None:
        self.qps: dict[int, _Qp] = {}
        self.mrs: dict[int, Region] = {}
        self.cm_ports: set[int] = set()  # what the session's cm_listen asked for
        self._next_mr = 1
        self._ops: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "info": self.info, "create_qp": self.create_qp, "destroy_qp": self.destroy_qp,
            "modify_qp": self.modify_qp, "query_qp": self.query_qp, "reg_mr": self.reg_mr,
            "dereg_mr": self.dereg_mr, "write_mem": self.write_mem, "read_mem": self.read_mem,
            "post_recv": self.post_recv, "post_send": self.post_send, "poll": self.poll,
            "cleanup": self.cleanup, "cm_listen": self.cm_listen, "cm_events": self.cm_events,
        }  # fmt: skip

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        fn = self._ops.get(op) if isinstance(op, str) else None
        if fn is None:
            return {"error": "unknown operation"}
        try:
            return fn(msg)
        except Refused as e:
            return {"error": str(e)}
        except self.device_errors as e:
            return {"error": f"{type(e).__name__}: {e}"}

    device_errors: tuple[type[Exception], ...] = (EngineError,)

    # -- what a device supplies --
    def _dev_info(self) -> dict[str, Any]:
        raise NotImplementedError

    def _dev_create_qp(self, caps: QpCaps) -> Any:
        raise NotImplementedError

    def _dev_destroy_qp(self, qp: Any) -> None:
        raise NotImplementedError

    def _dev_modify(self, qp: Any, state: QpState, kw: dict[str, int], remote: Remote) -> None:
        raise NotImplementedError

    def _dev_state(self, qp: Any) -> QpState:
        raise NotImplementedError

    def _dev_stats(self, qp: Any) -> dict[str, Any]:
        return {}

    def _dev_register(self, length: int, access: Access, mid: int) -> Region:
        raise NotImplementedError

    def _dev_deregister(self, region: Region) -> None:
        raise NotImplementedError

    def _dev_poll(self, q: _Qp, n: int) -> None:
        """Move up to `n` new completions of `q` into ``q.send`` and ``q.recv``."""
        raise NotImplementedError

    def progress(self) -> None:
        """Do the device's pending I/O and timers (a verbs device needs none)."""

    def fileno(self) -> int | None:
        return None

    def wait(self) -> float:
        """How long the agent may sleep before `progress` is due."""
        return 0.05

    # -- requests --
    def info(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"kind": self.kind, "memory_windows": False, **self._dev_info()}

    def _qp(self, msg: dict[str, Any]) -> _Qp:
        q = self.qps.get(_int(msg, "qpn", 0, _U24))
        if q is None:
            raise Refused("no such QP")
        return q

    def _mr(self, msg: dict[str, Any], key: str = "mr") -> Region:
        mr = self.mrs.get(_int(msg, key, 0, _U32))
        if mr is None:
            raise Refused("no such memory region")
        return mr

    def create_qp(self, msg: dict[str, Any]) -> dict[str, Any]:
        if len(self.qps) >= MAX_QPS:
            raise Refused(f"at most {MAX_QPS} QPs")
        _int(msg, "recv_cq_depth", 1, CQ_DEPTH, CQ_DEPTH)
        caps = QpCaps(max_send_wr=64, max_recv_wr=64, max_send_sge=MAX_SGES, max_recv_sge=MAX_SGES)
        qp = self._dev_create_qp(caps)
        self.qps[qp.qpn] = _Qp(qp)
        return {"qpn": qp.qpn}

    def destroy_qp(self, msg: dict[str, Any]) -> dict[str, Any]:
        q = self._qp(msg)
        self._dev_destroy_qp(q.qp)
        del self.qps[q.qp.qpn]
        return {}

    def modify_qp(self, msg: dict[str, Any]) -> dict[str, Any]:
        q = self._qp(msg)
        state = _STATES.get(msg.get("state"))  # type: ignore[arg-type]
        if state is None:
            raise Refused("state must be a QP state name")
        attrs = msg.get("attrs", {})
        if not isinstance(attrs, dict) or len(attrs) > len(_MODIFY) + 1:
            raise Refused("attrs must be an object of QP attributes")
        kw: dict[str, int] = {}
        remote: tuple[str, int] | None = None
        for name in attrs:
            if name == "remote":
                r = attrs["remote"]
                if not isinstance(r, dict) or not isinstance(r.get("ip"), str) or len(r["ip"]) > 64:
                    raise Refused("remote must be {ip, port}")
                try:
                    ip = ipaddress.ip_address(r["ip"])
                except ValueError:
                    raise Refused("remote ip must be an IPv4 or IPv6 address") from None
                remote = (str(ip), _int(r, "port", 1, 65535))
            elif name in _MODIFY:
                kw[name] = _int(attrs, name, *_MODIFY[name])
            else:
                raise Refused(f"unknown QP attribute {name[:40]!r}")
        self._dev_modify(q.qp, state, kw, remote)
        return {"state": self._dev_state(q.qp).name}

    def query_qp(self, msg: dict[str, Any]) -> dict[str, Any]:
        q = self._qp(msg)
        return {"state": self._dev_state(q.qp).name, **self._dev_stats(q.qp)}

    def reg_mr(self, msg: dict[str, Any]) -> dict[str, Any]:
        length = _int(msg, "length", 1, MAX_MR_BYTES)
        access = _int(msg, "access", 0, 15)
        if len(self.mrs) >= MAX_MRS or sum(m.length for m in self.mrs.values()) + length > MAX_TOTAL_MR_BYTES:
            raise Refused(f"at most {MAX_MRS} memory regions, {MAX_TOTAL_MR_BYTES} bytes in all")
        mid = self._next_mr
        self._next_mr += 1
        mr = self._dev_register(length, Access(access), mid)
        self.mrs[mid] = mr
        return {"mr": mid, "addr": mr.addr, "lkey": mr.lkey, "rkey": mr.rkey}

    def dereg_mr(self, msg: dict[str, Any]) -> dict[str, Any]:
        mr = self._mr(msg)
        self._dev_deregister(mr)
        self.mrs = {k: v for k, v in self.mrs.items() if v is not mr}
        return {}

    def _range(self, msg: dict[str, Any], length: int) -> tuple[Region, int]:
        mr = self._mr(msg)
        off = _int(msg, "offset", 0, mr.length)
        if length > MAX_IO_BYTES or off + length > mr.length:
            raise Refused("the range is outside the memory region or too long")
        return mr, off

    def write_mem(self, msg: dict[str, Any]) -> dict[str, Any]:
        data = msg.get("data")
        if not isinstance(data, str) or len(data) > 2 * MAX_IO_BYTES:
            raise Refused("data must be hex, at most {MAX_IO_BYTES} bytes")
        try:
            raw = bytes.fromhex(data)
        except ValueError:
            raise Refused("data must be hex") from None
        mr, off = self._range(msg, len(raw))
        mr.view[off : off + len(raw)] = raw
        return {}

    def read_mem(self, msg: dict[str, Any]) -> dict[str, Any]:
        length = _int(msg, "length", 0, MAX_IO_BYTES)
        mr, off = self._range(msg, length)
        return {"data": bytes(mr.view[off : off + length]).hex()}

    def _sges(self, msg: dict[str, Any]) -> tuple[SGE, ...]:
        sges = msg.get("sge", [])
        if not isinstance(sges, list) or len(sges) > MAX_SGES:
            raise Refused(f"sge must be a list of at most {MAX_SGES} [mr, offset, length]")
        out = []
        for s in sges:
            if not isinstance(s, list) or len(s) != 3:
                raise Refused("an sge is [mr, offset, length]")
            mr = self._mr({"mr": s[0]})
            sub = {"offset": s[1], "length": s[2]}
            off, length = _int(sub, "offset", 0, mr.length), _int(sub, "length", 0, mr.length)
            if off + length > mr.length:
                raise Refused("an sge is outside its memory region")
            out.append(SGE(mr.addr + off, length, mr.lkey))
        return tuple(out)

    def post_recv(self, msg: dict[str, Any]) -> dict[str, Any]:
        q = self._qp(msg)
        q.qp.post_recv(RecvWR(wr_id=_int(msg, "wr_id", 0, _U64), sg_list=self._sges(msg)))
        return {}

    def post_send(self, msg: dict[str, Any]) -> dict[str, Any]:
        q = self._qp(msg)
        opcode = _SEND_OPS.get(msg.get("opcode"))  # type: ignore[arg-type]
        if opcode is None:
            raise Refused("opcode must be a send work request opcode name")
        imm = msg.get("imm")
        wr = SendWR(
            wr_id=_int(msg, "wr_id", 0, _U64), opcode=opcode, sg_list=self._sges(msg),
            remote_addr=_int(msg, "remote_addr", 0, _U64, 0), rkey=_int(msg, "rkey", 0, _U32, 0),
            imm_data=None if imm is None else _int(msg, "imm", 0, _U32),
            compare_add=_int(msg, "compare_add", 0, _U64, 0), swap=_int(msg, "swap", 0, _U64, 0),
            signaled=msg.get("signaled", True) is not False, solicited=msg.get("solicited") is True,
        )  # fmt: skip
        q.qp.post_send(wr)
        return {}

    def poll(self, msg: dict[str, Any]) -> dict[str, Any]:
        q = self._qp(msg)
        n = _int(msg, "max", 1, MAX_POLL, MAX_POLL)
        self._dev_poll(q, n)
        send = [_wc(q.send.popleft()) for _ in range(min(n, len(q.send)))]
        recv = [_wc(q.recv.popleft()) for _ in range(min(n, len(q.recv)))]
        return {"send": send, "recv": recv}

    # -- the connection manager: listen on a port, accept every request, report what happened --
    def cm_listen(self, msg: dict[str, Any]) -> dict[str, Any]:
        port = _int(msg, "port", 1, 0xFFFF)
        self._dev_cm_listen(port)
        self.cm_ports.add(port)
        return {}

    def cm_events(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"events": self._dev_cm_events()}

    def _dev_cm_listen(self, port: int) -> None:
        raise Refused("this target has no connection manager")

    def _dev_cm_events(self) -> list[dict[str, Any]]:
        raise Refused("this target has no connection manager")

    def _dev_cm_unlisten(self, port: int) -> None:
        raise NotImplementedError

    def cleanup(self, msg: dict[str, Any]) -> dict[str, Any]:
        for q in list(self.qps.values()):
            self._dev_destroy_qp(q.qp)
        self.qps.clear()
        for mr in self.mrs.values():
            self._dev_deregister(mr)
        self.mrs.clear()
        for port in self.cm_ports:  # a session's listens end with it
            self._dev_cm_unlisten(port)
        self.cm_ports.clear()
        return {}


#: Connections the agent accepts at most, and events it keeps for the tester.
CM_QPS_MAX = 64
CM_LOG_MAX = 256


class SoftTarget(Target):
    """The agent's device: a ``SoftDevice`` driven through the engine's verbs-like calls."""

    kind = "soft"

    def __init__(self, dev: SoftDevice) -> None:
        super().__init__()
        self.dev = dev
        self._cqs: dict[int, tuple[CompletionQueue, CompletionQueue]] = {}
        # QP1 answers from the start, as a kernel's CM does: a REQ nobody listens for gets its REJ.
        self.cm: RdmaCm | None = (
            RdmaCm(dev, timeout_exponent=18, max_retries=4, timewait=1.0)  # 1 s: room for a busy tester
            if dev.udp_port is not None
            else None
        )
        self._cm_log: list[dict[str, Any]] = []
        self._cm_qps: list[QueuePair] = []

    def _dev_info(self) -> dict[str, Any]:
        return {
            "device": self.dev.name,
            "ip": self.dev.ip,
            "port": self.dev.port,
            "mtus": [256, 512, 1024, 2048, 4096],
            "cnp": True,  # the soft responder answers CE with a CNP (transport.cnp, Annex A17.9)
        }

    def _dev_create_qp(self, caps: QpCaps) -> QueuePair:
        scq, rcq = CompletionQueue(CQ_DEPTH), CompletionQueue(CQ_DEPTH)
        qp = self.dev.create_qp(send_cq=scq, recv_cq=rcq, caps=caps)
        self._cqs[qp.qpn] = (scq, rcq)
        return qp

    def _dev_destroy_qp(self, qp: QueuePair) -> None:
        self.dev.destroy_qp(qp)
        self._cqs.pop(qp.qpn, None)

    def _dev_modify(self, qp: QueuePair, state: QpState, kw: dict[str, int], remote: Remote) -> None:
        extra: dict[str, Any] = dict(kw)
        if remote is not None:
            if (":" in remote[0]) != (":" in self.dev.ip):
                raise Refused(f"the device is at {self.dev.ip}: the remote must be of its IP version")
            extra["remote"] = PeerAddress(*remote)
        qp.modify(state, **extra)

    def _dev_state(self, qp: QueuePair) -> QpState:
        return qp.state

    def _dev_stats(self, qp: QueuePair) -> dict[str, Any]:
        s = qp.stats
        return {
            "stats": {
                "retransmits": s.retransmits, "retries": s.retries, "timeouts": s.timeouts,
                "implied_naks": s.implied_naks, "duplicates": s.duplicates,
                "rnr_naks_sent": s.rnr_naks_sent, "rnr_naks_received": s.rnr_naks_received,
                "naks_sent": dict(s.naks_sent), "naks_received": dict(s.naks_received),
                "dropped": dict(s.dropped),
            },
            "device": self.dev.counters.as_dict(),
        }  # fmt: skip

    def _dev_register(self, length: int, access: Access, mid: int) -> Region:
        mr = self.dev.pd.register(bytearray(length), _MR_BASE + mid * _MR_STRIDE, access)
        return Region(mr.addr, mr.length, mr.lkey, mr.rkey, mr.view, mr)

    def _dev_deregister(self, region: Region) -> None:
        self.dev.pd.deregister(region.handle)

    def _dev_poll(self, q: _Qp, n: int) -> None:
        scq, rcq = self._cqs[q.qp.qpn]
        q.send.extend(scq.poll(n))
        q.recv.extend(rcq.poll(n))

    def _dev_cm_listen(self, port: int) -> None:
        if self.cm is None:
            raise Refused("a TCP device has no QP1 and no connection manager")
        self.cm.listen(port)

    def _dev_cm_events(self) -> list[dict[str, Any]]:
        if self.cm is None:
            raise Refused("a TCP device has no QP1 and no connection manager")
        self.progress()
        out, self._cm_log = self._cm_log, []
        return out

    def _dev_cm_unlisten(self, port: int) -> None:
        if self.cm is not None:
            self.cm.unlisten(port)

    def _cm_pump(self) -> None:
        """Accept every request with a fresh QP; note each event for `cm_events`.

        The requests come from anyone: what the engine refuses to do with one (a REQ's values
        it cannot connect a QP to) is noted for that event, and the agent goes on."""
        cm = self.cm
        assert cm is not None
        now = time.monotonic()
        while True:
            try:
                ev = cm.poll_event(now)
            except EngineError as e:
                self._note({"event": "ERROR", "detail": str(e)[:200]})
                continue
            if ev is None:
                return
            self._note({"event": ev.kind.name, "peer": ev.peer_ip, "reason": ev.reason})
            if ev.kind is CmaEventKind.CONNECT_REQUEST and len(self._cm_qps) < CM_QPS_MAX:
                scq = CompletionQueue(CQ_DEPTH)
                qp = None
                try:
                    qp = self.dev.create_qp(send_cq=scq, recv_cq=scq)
                    cm.accept(ev.conn, qp, now)
                except EngineError as e:
                    if qp is not None:
                        self.dev.destroy_qp(qp)
                    with contextlib.suppress(EngineError):
                        cm.reject(ev.conn, now)
                    self._note({"event": "ACCEPT_FAILED", "peer": ev.peer_ip, "detail": str(e)[:200]})
                    continue
                self._cm_qps.append(qp)

    def _note(self, entry: dict[str, Any]) -> None:
        self._cm_log.append(entry)
        del self._cm_log[:-CM_LOG_MAX]

    def progress(self) -> None:
        self.dev.progress(time.monotonic())
        if self.cm is not None:
            self._cm_pump()

    def fileno(self) -> int | None:
        return self.dev.fileno()

    def wait(self) -> float:
        d = self.dev.next_deadline()
        if d is None:
            return 0.05
        return min(max(d - time.monotonic(), 0.0), 0.05)


def serve(
    target: Target,
    listener: Listener,
    secret: bytes,
    *,
    once: bool = False,
    log: Callable[[str], None] | None = None,
    handshake_seconds: float = control.HANDSHAKE_SECONDS,
) -> None:
    """Serve testers one at a time, their handshakes side by side (`Gate`); pump the device all along."""
    say = log or (lambda _m: None)
    gate = Gate(listener, secret, say, handshake_seconds)
    try:
        while True:
            sock: MessageSocket | None = None
            while sock is None:
                now = time.monotonic()
                due = gate.wait(now)
                pause = target.wait() if due is None else min(target.wait(), due)
                r, _, _ = select.select(_fds(gate.fds(), target), [], [], pause)
                target.progress()
                sock = gate.step(set(r), time.monotonic())
            say(f"tester {sock.peer} authenticated")
            try:
                _session(target, sock)
            except (ControlError, OSError) as e:
                say(f"control connection from {sock.peer} ended: {e}")
            finally:
                sock.close()
                target.cleanup({})
            if once:
                return
    finally:
        gate.close()


def _fds(fds: list[int], target: Target) -> list[int]:
    dev = target.fileno()
    return fds if dev is None else [*fds, dev]


def _session(target: Target, sock: MessageSocket) -> None:
    while True:
        # A request may already wait in the channel's buffer (read with the handshake's last
        # bytes): answer what is there before sleeping on the socket.
        got = sock.recv(0)
        while got is not None:
            msg = control.decode(got[0])
            if msg.get("op") == "bye":
                sock.send(control.encode({}), timeout=5)
                return
            reply = target.handle(msg)
            target.progress()
            sock.send(control.encode(reply), timeout=5)
            got = sock.recv(0)
        select.select(_fds([sock.fileno()], target), [], [], target.wait())
        target.progress()


def open_soft_device(spec: str) -> SoftDevice:
    """``soft-udp:IP`` or ``IP``: a soft RoCEv2 device on UDP 4791 at that address."""
    ip = spec.removeprefix("soft-udp:")
    return SoftDevice(ip)
