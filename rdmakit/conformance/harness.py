"""Cases, their registry, and the context a case runs in.

A case is a function of a `Ctx` registered with `case`: an id, the DUT's
role, what is being tested (``responder``: the tester sends requests and the
DUT responds; ``requester``: the DUT sends requests and the tester answers;
``cm``: the DUT is the passive side of a connection the tester makes through
its QP1), a one-line purpose, what it
follows (an IBTA Vol. 1 section or rule, Annex A17, else the Linux rxe
function or datenlord/roce-sim case) and the expected result. It fails by
raising `CaseFail` and skips with `Skip`.

Every packet the DUT sends in a case has its ICRC checked; one that does not
check fails the case, whatever else it expected.
"""

import ipaddress
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rdmakit.transport.probe import ProbeLink

from . import cm_frames as C
from . import frames as F
from .control import TargetClient

#: Bytes one read_mem call moves (the agent's limit, docs/conformance-agent.md).
MAX_IO = 16 << 10

Role = str  # "responder" | "requester" | "cm" (the passive side, MADs to QP1): the DUT's role


class CaseFail(Exception):
    """The DUT did not behave as the case expects (the message says how)."""


class Skip(Exception):
    """The case does not apply to this DUT (the message says why)."""


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    role: Role
    purpose: str
    follows: str
    expect: str
    fn: Callable[["Ctx"], None]


CASES: list[Case] = []


def case(id: str, role: Role, purpose: str, follows: str, expect: str) -> Callable[..., Any]:
    def register(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        assert not any(c.id == id for c in CASES), id
        CASES.append(Case(id, role, purpose, follows, expect, fn))
        return fn

    return register


def check(cond: object, message: str) -> None:
    if not cond:
        raise CaseFail(message)


@dataclass(frozen=True, slots=True)
class Mr:
    id: int
    addr: int
    rkey: int
    lkey: int
    length: int


@dataclass(slots=True)
class DutQp:
    qpn: int
    #: The PSN the DUT expects next from the tester (its rq_psn) and its own first PSN (sq_psn).
    rq_psn: int
    sq_psn: int
    mtu: int
    timeout: int
    wcs: list[dict[str, Any]] = field(default_factory=list)


class Ctx:
    """What a case works with: the target agent, the link, its own QPN and random source."""

    def __init__(
        self, client: TargetClient, link: ProbeLink, dut_ip: str, info: dict[str, Any], rng: random.Random
    ) -> None:
        self.t = client
        self.link = link
        self.info = info
        self.rng = rng
        dut_ip = str(ipaddress.ip_address(dut_ip))  # as the link's socket names its sources
        self.flow = F.Flow(link.ip, dut_ip, sport=link.port)
        self.dut_ip = dut_ip
        #: The QPN the tester answers to in this case (a fresh one per case).
        self.tqpn = rng.randrange(0x100, 0xFFFFFF)
        self.qp: DutQp | None = None
        self.log: list[str] = []
        self.icrc_methods: set[str] = set()
        self.received = 0

    # -- the DUT through its agent --
    def dut_qp(
        self,
        *,
        mtu: int = 1024,
        access: int = 0xF,
        rq_psn: int | None = None,
        sq_psn: int | None = None,
        max_dest_rd_atomic: int = 4,
        max_rd_atomic: int = 4,
        min_rnr_timer: int = 1,
        timeout: int = 16,
        retry_cnt: int = 3,
        rnr_retry: int = 3,
    ) -> DutQp:
        """A DUT QP in RTS, connected to the tester's QPN, with the attributes given."""
        qpn = int(self.t.call("create_qp")["qpn"])
        rq = self.rng.randrange(0, 0xFFF000) if rq_psn is None else rq_psn
        sq = self.rng.randrange(0, 0xFFF000) if sq_psn is None else sq_psn
        self.t.call("modify_qp", qpn=qpn, state="INIT", attrs={"port": 1, "pkey_index": 0, "access": access})
        rtr = {
            "path_mtu": mtu, "dest_qpn": self.tqpn, "rq_psn": rq, "max_dest_rd_atomic": max_dest_rd_atomic,
            "min_rnr_timer": min_rnr_timer, "remote": {"ip": self.link.ip, "port": self.link.port},
        }  # fmt: skip
        self.t.call("modify_qp", qpn=qpn, state="RTR", attrs=rtr)
        rts = {
            "timeout": timeout, "retry_cnt": retry_cnt, "rnr_retry": rnr_retry, "sq_psn": sq,
            "max_rd_atomic": max_rd_atomic,
        }  # fmt: skip
        self.t.call("modify_qp", qpn=qpn, state="RTS", attrs=rts)
        self.qp = DutQp(qpn, rq, sq, mtu, timeout)
        return self.qp

    def mr(self, length: int = 4096, access: int = 0xF, fill: bytes | None = None) -> Mr:
        r = self.t.call("reg_mr", length=length, access=access)
        mr = Mr(int(r["mr"]), int(r["addr"]), int(r["rkey"]), int(r["lkey"]), length)
        if fill is not None:
            self.write_mem(mr, 0, fill)
        return mr

    def write_mem(self, mr: Mr, offset: int, data: bytes) -> None:
        self.t.call("write_mem", mr=mr.id, offset=offset, data=data.hex())

    def read_mem(self, mr: Mr, offset: int, length: int) -> bytes:
        """``length`` bytes of ``mr`` from ``offset``, in pieces the agent moves in one call."""
        out = b""
        while len(out) < length:
            n = min(length - len(out), MAX_IO)
            r = self.t.call("read_mem", mr=mr.id, offset=offset + len(out), length=n)
            out += bytes.fromhex(r["data"])
        return out

    def post_recv(self, mr: Mr, offset: int = 0, length: int | None = None, wr_id: int = 1) -> None:
        assert self.qp is not None
        n = mr.length - offset if length is None else length
        self.t.call("post_recv", qpn=self.qp.qpn, wr_id=wr_id, sge=[[mr.id, offset, n]])

    def post_send(
        self, opcode: str, mr: Mr | None = None, length: int = 0, wr_id: int = 1, **kw: Any
    ) -> None:
        assert self.qp is not None
        sge = [[mr.id, 0, length]] if mr is not None and length else []
        self.t.call("post_send", qpn=self.qp.qpn, wr_id=wr_id, opcode=opcode, sge=sge, **kw)

    def state(self) -> str:
        assert self.qp is not None
        return str(self.t.call("query_qp", qpn=self.qp.qpn)["state"])

    def query(self) -> dict[str, Any]:
        assert self.qp is not None
        return self.t.call("query_qp", qpn=self.qp.qpn)

    def poll(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        assert self.qp is not None
        r = self.t.call("poll", qpn=self.qp.qpn)
        return list(r["send"]), list(r["recv"])

    def wait_wc(self, side: str = "send", n: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The next `n` completions of one queue ("send" or "recv"); fails if they do not come."""
        got: list[dict[str, Any]] = []
        pending = getattr(self, "_pending", {"send": [], "recv": []})
        self._pending = pending
        deadline = time.monotonic() + timeout
        while True:
            while pending[side] and len(got) < n:
                got.append(pending[side].pop(0))
            if len(got) >= n:
                return got
            s, r = self.poll()
            pending["send"] += s
            pending["recv"] += r
            if not s and not r:
                if time.monotonic() > deadline:
                    raise CaseFail(f"expected {n} {side} completion(s), got {len(got)}: {got}")
                time.sleep(0.005)

    def no_wc(self, side: str = "send", wait: float = 0.2) -> None:
        time.sleep(wait)
        s, r = self.poll()
        got = s if side == "send" else r
        other = r if side == "send" else s
        pending = getattr(self, "_pending", {"send": [], "recv": []})
        self._pending = pending
        pending["recv" if side == "send" else "send"] += other
        check(not got and not pending[side], f"expected no {side} completion, got {got or pending[side]}")

    # -- packets --
    @property
    def v6(self) -> bool:
        """Whether this run is over IPv6 (RoCEv2 Annex A17.4)."""
        return ":" in self.dut_ip

    def send(
        self, opcode: int, psn: int, *, tos: int = 0, hop_limit: int | None = None, flow_label: int = 0,
        **kw: Any,
    ) -> float:  # fmt: skip
        """Send one packet; return when it left (``time.time()``).

        ``tos`` is the IPv4 TOS byte or IPv6 traffic class, ``hop_limit`` the IPv4 TTL or IPv6
        hop limit, ``flow_label`` the IPv6 flow label (see `ProbeLink.send`)."""
        assert self.qp is not None
        kw.setdefault("dqpn", self.qp.qpn)
        dqpn = kw.pop("dqpn")
        pkt = F.build(self.flow, opcode, dqpn, psn, **kw)
        return self.link.send(pkt, (self.dut_ip, F.ROCE_PORT), tos, hop_limit, flow_label)

    def recv(self, timeout: float = 3.0) -> F.Rx | None:
        """The DUT's next packet to this case's QPN (ICRC checked), or None within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            d = self.link.recv(left)
            if d is None:
                return None
            if d.src_ip != self.dut_ip:
                continue
            rx = F.dissect(d.src_ip, d.sport, self.link.ip, self.link.port, d.payload, d.ip_header)
            if rx is None or rx.dqpn != self.tqpn:
                continue
            rx.stamp = d.stamp
            self.received += 1
            self.icrc_methods.add(rx.icrc_method)
            self.log.append(f"<- {rx.describe()} at {time.monotonic():.6f}")
            check(rx.icrc_ok, f"the DUT sent a bad ICRC ({rx.icrc_method}): {rx.describe()}")
            check(rx.version == 0, f"the DUT sent TVer {rx.version}")
            check(rx.pkey == 0xFFFF, f"the DUT sent P_Key {rx.pkey:#x}")
            return rx

    def expect(self, what: str, timeout: float = 3.0) -> F.Rx:
        rx = self.recv(timeout)
        if rx is None:
            raise CaseFail(f"expected {what}, got nothing")
        return rx

    def silence(self, wait: float = 0.4) -> None:
        rx = self.recv(wait)
        check(rx is None, f"expected no packet, got {rx.describe() if rx else ''}")

    def drain(self) -> None:
        while self.link.recv(0) is not None:
            pass

    def expect_ack(self, psn: int, msn: int | None = None, what: str = "ACK") -> F.Rx:
        rx = self.expect(f"{what} of PSN {psn:#x}")
        check(rx.is_ack(), f"expected {what} of PSN {psn:#x}, got {rx.describe()}")
        check(rx.psn == psn, f"expected {what} of PSN {psn:#x}, got {rx.describe()}")
        if msn is not None:
            check(rx.msn == msn, f"expected MSN {msn}, got {rx.describe()}")
        return rx

    def expect_nak(self, code: int, psn: int) -> F.Rx:
        names = {
            0: "PSN sequence error",
            1: "invalid request",
            2: "remote access error",
            3: "remote op error",
        }
        want = f"NAK {names.get(code, code)} at PSN {psn:#x}"
        rx = self.expect(want)
        check(rx.is_nak(code) and rx.psn == psn, f"expected {want}, got {rx.describe()}")
        return rx

    def expect_request(
        self, opcode: int, psn: int, timeout: float = 3.0, *, strict: bool = False, after: float | None = None
    ) -> F.Rx:
        """The DUT's next request, which must be ``opcode`` at ``psn``.

        Unless ``strict``, a request at a PSN before ``psn`` is passed over: the
        DUT going back after a packet the path lost (go-back-N, IBTA §9.9.3.1),
        which a case about something else must not take for its failure. A case
        about where the DUT goes back to asks for ``strict``, and gives as
        ``after`` when the response it answers left (``send``'s time): a request
        this host's kernel received before then was sent before the DUT could
        know of that response (its own timer going back, on a busy host), and is
        passed over too.
        """
        want = f"{F.OPCODE_NAMES[opcode]} at PSN {psn:#x}"
        deadline = time.monotonic() + timeout
        while True:
            rx = self.expect(want, max(deadline - time.monotonic(), 0.001))
            if after is not None and rx.opcode != F.ACKNOWLEDGE and 0 < rx.stamp < after:
                self.log.append(f"passed over {rx.describe()}, received before the response it waits on left")
                continue
            if strict or rx.opcode == F.ACKNOWLEDGE or not 0 < (psn - rx.psn) & F.PSN_MASK < 0x800000:
                break
            self.log.append(f"passed over a resent {rx.describe()} (a lost packet?) waiting for {want}")
        check(rx.opcode == opcode and rx.psn == psn, f"expected {want}, got {rx.describe()}")
        return rx

    # -- the tester's responses (the DUT is the requester) --
    def ack(self, psn: int, msn: int = 1, kind: int = F.ACK_KIND, value: int = F.CREDITS_UNLIMITED) -> float:
        return self.send(F.ACKNOWLEDGE, psn, dqpn=self.qpn, aeth=(F.syndrome(kind, value), msn))

    @property
    def qpn(self) -> int:
        assert self.qp is not None
        return self.qp.qpn

    # -- CM MADs to and from the DUT's QP1 (IBTA Vol. 1 ch. 12) --
    def send_mad(self, message: Any, **kw: Any) -> None:
        self.log.append(f"-> MAD {message.summary()} at {time.monotonic():.6f}")
        self.link.send(C.build_mad(self.flow, message, **kw), (self.dut_ip, F.ROCE_PORT))

    def recv_mad(self, timeout: float = 3.0) -> C.MadRx | None:
        """The DUT's next CM MAD (ICRC checked), or None within `timeout`; other packets are passed over."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            d = self.link.recv(left)
            if d is None:
                return None
            if d.src_ip != self.dut_ip:
                continue
            rx = C.dissect_mad(d.src_ip, d.sport, self.link.ip, self.link.port, d.payload, d.ip_header)
            if rx is None:
                continue
            self.received += 1
            self.icrc_methods.add(rx.icrc_method)
            self.log.append(f"<- {rx.describe()} at {time.monotonic():.6f}")
            check(rx.icrc_ok, f"the DUT sent a bad ICRC ({rx.icrc_method}): {rx.describe()}")
            check(rx.qkey == C.QP1_QKEY, f"the DUT's MAD carried Q_Key {rx.qkey:#x}, not 0x80010000")
            check(rx.srcqp == 1, f"the DUT's MAD came from QP {rx.srcqp}, not QP1")
            return rx
        return None

    def expect_mad(self, attr: int, what: str, timeout: float = 5.0) -> C.MadRx:
        rx = self.recv_mad(timeout)
        if rx is None:
            raise CaseFail(f"expected {what}, got nothing in {timeout:g} s")
        check(rx.attr == attr, f"expected {what}, got {rx.describe()}")
        return rx

    def no_mad(self, wait: float = 1.0) -> None:
        rx = self.recv_mad(wait)
        check(rx is None, f"expected no MAD, got {rx.describe() if rx else ''}")
