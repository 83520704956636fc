"""RoCEv2 over IPv6 (IBTA Vol. 1 Annex A17.4): the DUT's IPv6 headers, and the ICRC's IPv6 masks.

These cases run when the tester and the DUT speak IPv6 (``--tester-ip`` and
``--dut-ip`` IPv6 addresses) and are SKIPPED on IPv4. Every other case runs
over IPv6 too: the ICRC of each packet the DUT sends is checked by scapy
against the IPv6 header it arrived with (:mod:`.frames`).

What the spec fixes, and what these cases check:

- Annex A17.3.3: the ICRC covers the IPv6 header with traffic class, flow
  label and hop limit set to ones, because routers change them. A DUT must
  accept a request whatever the three carry, and drop one whose ICRC covers
  them as sent.
- Annex A17.4: the IPv6 header carries the GRH's fields, with next header
  UDP (17) and port 4791. The hop limit a sender puts there is at least 1
  (RFC 8200 §3: a packet whose hop limit reaches 0 is discarded).
- RFC 3168 §5: a sender marks Not-ECT or ECT, never CE (only the network does).
- RFC 6437 §2: the packets of one flow carry one flow label, 0 or not. A QP
  is one flow here, as its UDP source port is (``req.udp.sport``).
"""

from . import frames as F
from .dut_ip import CNP
from .dut_requester import Q, wc_ok
from .dut_requester import setup as req_setup
from .dut_responder import R, alive
from .dut_responder import setup as resp_setup
from .frames import psn_add
from .harness import Ctx, Skip, case, check

#: Traffic classes the tester sends with (DSCP << 2 | ECN): EF with CE, AF11 with ECT(1).
TCLASS_EF_CE = (46 << 2) | 3
TCLASS_AF11_ECT1 = (10 << 2) | 1


def need_v6(ctx: Ctx) -> None:
    if not ctx.v6:
        raise Skip("the run is over IPv4: give IPv6 addresses (--tester-ip, --dut-ip) for Annex A17.4")


def headers(ctx: Ctx, seen: list[F.Rx]) -> None:
    """What every IPv6 header of ``seen`` (one QP's packets) must show: see the module."""
    for rx in seen:
        check(rx.icrc_method == "ipv6-header", f"{rx.describe()}: ICRC checked by {rx.icrc_method}")
        check(rx.hop_limit is not None and rx.hop_limit >= 1, f"{rx.describe()}: hop limit {rx.hop_limit}")
        check(rx.tos is not None and rx.tos & 3 != 3, f"{rx.describe()}: traffic class {rx.tos} is CE")
    labels = {rx.flow_label for rx in seen}
    check(
        len(labels) == 1,
        "flow labels differ: "
        + ", ".join(f"{rx.describe()} {rx.flow_label:#x}" for rx in seen if rx.flow_label is not None),
    )
    last = seen[-1]
    assert last.tos is not None
    ctx.log.append(
        f"hop limit {sorted({rx.hop_limit or 0 for rx in seen})}, DSCP {last.tos >> 2}, ECN {last.tos & 3}, "
        f"flow label {labels.pop():#x}"
    )


@case(
    "req.ip6.header",
    Q,
    "The DUT's requests over IPv6: hop limit >= 1, not CE, one flow label per QP, resends too",
    "IBTA Vol.1 Annex A17.4 (IPv6 header from the GRH), A17.3.3 (ICRC); RFC 8200 §3, RFC 3168 §5, "
    "RFC 6437 §2",
    "three SENDs and a resend with a good ICRC over the masked IPv6 header, one flow label",
)
def _req_header(ctx: Ctx) -> None:
    need_v6(ctx)
    qp, mr = req_setup(ctx, timeout=16, retry_cnt=7)
    for i in range(3):
        ctx.post_send("SEND", mr, 8, wr_id=i + 1)
    want = {psn_add(qp.sq_psn, i) for i in range(3)}
    seen: list[F.Rx] = []
    while not (want <= {rx.psn for rx in seen} and len(seen) > len({rx.psn for rx in seen})):
        rx = ctx.expect(f"the SENDs at {sorted(want)} and a resend; got {[r.psn for r in seen]}")
        check(rx.opcode == F.SEND_ONLY and rx.psn in want, f"unexpected {rx.describe()}")
        seen.append(rx)
    headers(ctx, seen)
    ctx.ack(psn_add(qp.sq_psn, 2), 3)
    wc_ok(ctx, 3)


@case(
    "resp.ip6.header",
    R,
    "The DUT's responses over IPv6: hop limit >= 1, not CE, one flow label per QP",
    "IBTA Vol.1 Annex A17.4 (IPv6 header from the GRH), A17.3.3 (ICRC); RFC 8200 §3, RFC 3168 §5, "
    "RFC 6437 §2",
    "an ACK and a 3-packet READ response with a good ICRC over the masked IPv6 header, one flow label",
)
def _resp_header(ctx: Ctx) -> None:
    need_v6(ctx)
    qp, mr = resp_setup(ctx, mtu=256)
    p = qp.rq_psn
    ctx.send(F.WRITE_ONLY, p, ackreq=True, reth=(mr.addr, mr.rkey, 8), payload=bytes(8))
    seen = [ctx.expect_ack(p, 1)]
    ctx.send(F.READ_REQUEST, psn_add(p, 1), ackreq=True, reth=(mr.addr, mr.rkey, 600))
    for i, op in enumerate((F.READ_RESP_FIRST, F.READ_RESP_MIDDLE, F.READ_RESP_LAST)):
        rx = ctx.expect(F.OPCODE_NAMES[op])
        check(rx.opcode == op and rx.psn == psn_add(p, 1 + i), f"packet {i}: {rx.describe()}")
        seen.append(rx)
    headers(ctx, seen)


@case(
    "resp.ip6.masked_fields",
    R,
    "Requests whose IPv6 traffic class, flow label and hop limit vary are executed: the ICRC masks them",
    "IBTA Vol.1 Annex A17.3.3 (ICRC: IPv6 traffic class, flow label, hop limit masked to ones), A17.4",
    "two WRITEs (EF+CE, flow label L1, hop limit 1; AF11+ECT(1), L2, hop limit 255) ACKed, MSN 1 and 2",
)
def _masked_fields(ctx: Ctx) -> None:
    need_v6(ctx)
    qp, mr = resp_setup(ctx)
    p = qp.rq_psn
    a, b = ctx.rng.randbytes(16), ctx.rng.randbytes(16)
    label = ctx.rng.randrange(1, 0xFFFFF)
    for i, (data, tclass, fl, hop) in enumerate(((a, TCLASS_EF_CE, label, 1),
                                                 (b, TCLASS_AF11_ECT1, label ^ 0xFFFFF, 255))):  # fmt: skip
        ctx.send(F.WRITE_ONLY, psn_add(p, i), tos=tclass, flow_label=fl, hop_limit=hop, ackreq=True,
                 reth=(mr.addr + 16 * i, mr.rkey, 16), payload=data)  # fmt: skip
        rx = ctx.expect(f"ACK of PSN {psn_add(p, i):#x}")
        if rx.opcode == CNP:  # a CNP for the CE mark first (resp.ip.cnp checks it)
            rx = ctx.expect(f"ACK of PSN {psn_add(p, i):#x}")
        check(rx.is_ack() and rx.psn == psn_add(p, i) and rx.msn == i + 1,
              f"expected ACK MSN {i + 1} of PSN {psn_add(p, i):#x}, got {rx.describe()}")  # fmt: skip
    check(ctx.read_mem(mr, 0, 32) == a + b, "the WRITEs did not land")


@case(
    "resp.ip6.unmasked_icrc",
    R,
    "A request whose ICRC covers the IPv6 traffic class, flow label and hop limit as sent is dropped",
    "IBTA Vol.1 Annex A17.3.3 (the ICRC masks them; a packet whose ICRC does not check is dropped "
    "silently, §9.6.1.1)",
    "no response, memory unchanged; the same PSN with the masked ICRC then executes once",
)
def _unmasked_icrc(ctx: Ctx) -> None:
    need_v6(ctx)
    qp, mr = resp_setup(ctx)
    p = qp.rq_psn
    data = ctx.rng.randbytes(16)
    tclass, label, hop = TCLASS_AF11_ECT1, ctx.rng.randrange(1, 0xFFFFF), 64
    good = F.build(ctx.flow, F.WRITE_ONLY, qp.qpn, p, ackreq=True, reth=(mr.addr, mr.rkey, 16), payload=data)
    bad = good[:-4] + F.unmasked_v6_icrc(ctx.flow, good, tclass, label, hop)
    dst = (ctx.dut_ip, F.ROCE_PORT)
    ctx.link.send(bad, dst, tclass, hop, label)
    ctx.silence()
    check(ctx.read_mem(mr, 0, 16) == bytes(16), "the WRITE with the unmasked ICRC was executed")
    ctx.link.send(good, dst, tclass, hop, label)
    ctx.expect_ack(p, 1)
    check(ctx.read_mem(mr, 0, 16) == data, "the WRITE with the masked ICRC did not land")
    alive(ctx, qp, psn_add(p, 1), mr, 2)
