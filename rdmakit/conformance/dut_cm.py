"""Connection-manager cases: the tester sends CM MADs to the DUT's QP1 (IBTA Vol. 1 ch. 12).

The tester plays the active side of ``rdma_cm`` (service IDs of the TCP port
space, ``cma.c``). The first cases need nothing of the DUT but its QP1; the
others ask the agent to listen on a port and accept whatever comes
(``cm_listen``), and are SKIPPED for an agent without a connection manager.
"""

import ipaddress
import time
from typing import Any

from . import cm_frames as C
from .cm_frames import DREP, DREQ, REJ, REP, REQ, RTU
from .control import TargetError
from .harness import CaseFail, Ctx, Skip, case, check

A = "cm"  # the DUT's role: the passive side of a connection, through its QP1
TCP_PS = 0x0106
REJ_NO_LISTENER, REJ_STALE = 8, 10


def _sid(port: int) -> int:
    return (TCP_PS << 16) | port


def _gid(ip: str) -> bytes:
    """The RoCEv2 GID of an address: IPv4-mapped for IPv4 (IBTA Annex A17.8), the address for IPv6."""
    a = ipaddress.ip_address(ip)
    return a.packed if a.version == 6 else bytes(10) + b"\xff\xff" + a.packed


def _req(ctx: Ctx, comm_id: int, port: int, *, qpn: int | None = None, tid: int | None = None) -> Any:
    """A REQ as rdma_cm sends it, with its cma_hdr (version 0, IP version 4 or 6, source port, addresses;
    an IPv4 address has 12 zero bytes before it: Linux ``cma.c`` ``cma_format_hdr()``)."""
    v6 = ipaddress.ip_address(ctx.link.ip).version == 6
    addr = (
        _gid(ip) if v6 else bytes(12) + ipaddress.ip_address(ip).packed for ip in (ctx.link.ip, ctx.dut_ip)
    )
    src, dst = addr
    hdr = bytes([0, 0x60 if v6 else 0x40]) + (40000).to_bytes(2, "big") + src + dst
    return C.mad(
        REQ, tid if tid is not None else ctx.rng.getrandbits(64),
        local_comm_id=comm_id, service_id=_sid(port), local_ca_guid=0x0200_00FF_FE00_0001,
        local_qpn=ctx.tqpn if qpn is None else qpn, responder_resources=1, initiator_depth=1,
        remote_cm_response_timeout=20, starting_psn=ctx.rng.randrange(0, 0xFFFFFF),
        local_cm_response_timeout=20, retry_count=7, pkey=0xFFFF, path_mtu=3, rnr_retry_count=7,
        max_cm_retries=15, primary_local_gid=_gid(ctx.link.ip), primary_remote_gid=_gid(ctx.dut_ip),
        primary_hop_limit=64, primary_local_ack_timeout=18, private_data=hdr.ljust(92, b"\0"),
    )  # fmt: skip


def _port(ctx: Ctx) -> int:
    return ctx.rng.randrange(20000, 60000)


def _listening(ctx: Ctx) -> int:
    """A port the DUT's agent now listens on and accepts on; Skip when it cannot."""
    port = _port(ctx)
    try:
        ctx.t.call("cm_listen", port=port)
    except TargetError as e:
        raise Skip(f"the agent cannot listen: {e}") from None
    return port


def _events(ctx: Ctx) -> list[str]:
    return [str(e.get("event")) for e in ctx.t.call("cm_events")["events"]]


def _await_event(ctx: Ctx, kind: str, limit: float = 3.0) -> None:
    seen: list[str] = []
    end = time.monotonic() + limit
    while time.monotonic() < end:
        seen += _events(ctx)
        if kind in seen:
            return
        time.sleep(0.05)
    raise CaseFail(f"the agent never reported {kind} (it reported {seen})")


@case(
    "cm.req.no_listener",
    A,
    "a REQ for a service ID nobody listens to is rejected",
    "IBTA Vol.1 §12.6.7, Table 109 reason 8; cm.c cm_match_req",
    "REJ reason 8 (invalid service ID), MessageREJected 0, remote comm ID and TID the REQ's",
)
def _no_listener(ctx: Ctx) -> None:
    cid, tid = ctx.rng.getrandbits(32) | 1, ctx.rng.getrandbits(64)
    ctx.send_mad(_req(ctx, cid, _port(ctx), tid=tid))
    rej = ctx.expect_mad(REJ, "REJ of the REQ")
    m = rej.message
    check(int(m.reason) == REJ_NO_LISTENER, f"REJ reason {int(m.reason)}, not 8")
    check(int(m.remote_comm_id) == cid, f"REJ names comm ID {int(m.remote_comm_id):#x}, not {cid:#x}")
    check(int(m.message_rejected) == 0, f"MessageREJected {int(m.message_rejected)}, not 0 (REQ)")
    check(rej.tid == tid, f"REJ TID {rej.tid:#x}, not the REQ's {tid:#x}")


@case(
    "cm.dreq.unknown",
    A,
    "a DREQ for a connection the DUT does not have still gets a DREP",
    "IBTA Vol.1 §12.9.8.7; cm.c cm_dreq_handler (cm_issue_drep)",
    "DREP with the comm IDs swapped and the DREQ's TID",
)
def _dreq_unknown(ctx: Ctx) -> None:
    local, remote, tid = ctx.rng.getrandbits(32) | 1, ctx.rng.getrandbits(32) | 1, ctx.rng.getrandbits(64)
    ctx.send_mad(C.mad(DREQ, tid, local_comm_id=local, remote_comm_id=remote, remote_qpn=0x123))
    drep = ctx.expect_mad(DREP, "DREP")
    m = drep.message
    check(
        int(m.remote_comm_id) == local,
        f"DREP names remote comm ID {int(m.remote_comm_id):#x}, not {local:#x}",
    )
    check(drep.tid == tid, f"DREP TID {drep.tid:#x}, not the DREQ's {tid:#x}")


@case(
    "cm.ud.bad_qkey",
    A,
    "a MAD to QP1 with a Q_Key other than 0x80010000 is dropped",
    "IBTA Vol.1 §10.2.5, C10-15; rxe_recv.c check_keys",
    "silence; the same REQ with the right Q_Key is then rejected (reason 8)",
)
def _bad_qkey(ctx: Ctx) -> None:
    port = _port(ctx)
    ctx.send_mad(_req(ctx, ctx.rng.getrandbits(32) | 1, port), qkey=0x12345678)
    ctx.no_mad(1.0)
    ctx.send_mad(_req(ctx, ctx.rng.getrandbits(32) | 1, port))
    ctx.expect_mad(REJ, "REJ of the good REQ")


@case(
    "cm.ud.bad_icrc",
    A,
    "a MAD with a bad ICRC is dropped",
    "IBTA Vol.1 Annex A17.3.3 (C17-8); rxe_icrc.c rxe_icrc_check",
    "silence; the same REQ with its ICRC is then rejected (reason 8)",
)
def _bad_icrc(ctx: Ctx) -> None:
    port = _port(ctx)
    ctx.send_mad(_req(ctx, ctx.rng.getrandbits(32) | 1, port), corrupt_icrc=True)
    ctx.no_mad(1.0)
    ctx.send_mad(_req(ctx, ctx.rng.getrandbits(32) | 1, port))
    ctx.expect_mad(REJ, "REJ of the good REQ")


def _connect(ctx: Ctx, port: int, cid: int, tid: int) -> Any:
    ctx.send_mad(_req(ctx, cid, port, tid=tid))
    rep = ctx.expect_mad(REP, "REP")
    m = rep.message
    check(int(m.remote_comm_id) == cid, f"REP names comm ID {int(m.remote_comm_id):#x}, not {cid:#x}")
    check(rep.tid == tid, f"REP TID {rep.tid:#x}, not the REQ's {tid:#x}")
    check(int(m.local_qpn) not in (0, 1), f"REP local QPN {int(m.local_qpn):#x}")
    check(int(m.local_comm_id) != 0, "REP local comm ID 0")
    return m


@case(
    "cm.req.rep_rtu",
    A,
    "REQ → REP → RTU establishes a connection",
    "IBTA Vol.1 §12.6.2, §12.9.5 (Figure 138); cma.c passive side",
    "REP with our comm ID, the REQ's TID and a QPN; the agent reports ESTABLISHED after the RTU",
)
def _rep_rtu(ctx: Ctx) -> None:
    port = _listening(ctx)
    cid, tid = ctx.rng.getrandbits(32) | 1, ctx.rng.getrandbits(64)
    rep = _connect(ctx, port, cid, tid)
    ctx.send_mad(C.mad(RTU, tid, local_comm_id=cid, remote_comm_id=int(rep.local_comm_id)))
    _await_event(ctx, "ESTABLISHED")


@case(
    "cm.req.duplicate",
    A,
    "a repeated REQ is answered with the REP again, not a second connection",
    "IBTA Vol.1 §12.6.6; cm.c cm_dup_req_handler",
    "the same REP (same local comm ID) for the repeated REQ; one CONNECT_REQUEST at the agent",
)
def _duplicate(ctx: Ctx) -> None:
    port = _listening(ctx)
    cid, tid = ctx.rng.getrandbits(32) | 1, ctx.rng.getrandbits(64)
    rep = _connect(ctx, port, cid, tid)
    ctx.send_mad(_req(ctx, cid, port, tid=tid))
    again = ctx.expect_mad(REP, "the REP again")
    check(int(again.message.local_comm_id) == int(rep.local_comm_id), "a second connection for one REQ")
    check(_events(ctx).count("CONNECT_REQUEST") == 1, "the agent saw two connection requests")
    ctx.send_mad(C.mad(RTU, tid, local_comm_id=cid, remote_comm_id=int(rep.local_comm_id)))


@case(
    "cm.req.stale",
    A,
    "a REQ from a QP that already has a connection is rejected as stale",
    "IBTA Vol.1 §12.9.8.3.1, Table 109 reason 10; cm.c cm_insert_remote_qpn",
    "REJ reason 10 (stale connection) for the second REQ",
)
def _stale(ctx: Ctx) -> None:
    port = _listening(ctx)
    cid, tid = ctx.rng.getrandbits(32) | 1, ctx.rng.getrandbits(64)
    rep = _connect(ctx, port, cid, tid)
    ctx.send_mad(C.mad(RTU, tid, local_comm_id=cid, remote_comm_id=int(rep.local_comm_id)))
    ctx.send_mad(_req(ctx, cid ^ 0x5A5A, port))  # same CA GUID and QPN, a new comm ID
    rej = ctx.expect_mad(REJ, "REJ of the stale REQ")
    check(int(rej.message.reason) == REJ_STALE, f"REJ reason {int(rej.message.reason)}, not 10")


@case(
    "cm.dreq.drep",
    A,
    "a DREQ on an established connection is answered with a DREP",
    "IBTA Vol.1 §12.6.9, §12.9.8.7",
    "DREP with the comm IDs swapped; the agent reports DISCONNECTED",
)
def _dreq(ctx: Ctx) -> None:
    port = _listening(ctx)
    cid, tid = ctx.rng.getrandbits(32) | 1, ctx.rng.getrandbits(64)
    rep = _connect(ctx, port, cid, tid)
    theirs = int(rep.local_comm_id)
    ctx.send_mad(C.mad(RTU, tid, local_comm_id=cid, remote_comm_id=theirs))
    dtid = ctx.rng.getrandbits(64)
    ctx.send_mad(C.mad(DREQ, dtid, local_comm_id=cid, remote_comm_id=theirs, remote_qpn=int(rep.local_qpn)))
    drep = ctx.expect_mad(DREP, "DREP")
    check(int(drep.message.remote_comm_id) == cid and int(drep.message.local_comm_id) == theirs,
          f"DREP {drep.describe()}")  # fmt: skip
    check(drep.tid == dtid, "DREP TID differs from the DREQ's")
    _await_event(ctx, "DISCONNECTED")
