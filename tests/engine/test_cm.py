"""The IB CM state machine (IBTA Vol. 1 ch. 12) in a seeded hostile simulated network.

Two `CmEndpoint` s exchange encoded MADs (through ``rdmakit.wire.cm``) over a
simulated datagram network that loses, duplicates and reorders them. The
applications on top accept every REQ, send the RTU on every REP and, once
connected, disconnect from a random side. Whatever the network does, each
side ends with one connection that was established and then disconnected,
or one clean failure, and both endpoints end with no connection left.
"""

import heapq
import random
from collections.abc import Hashable
from dataclasses import dataclass, field

import pytest

from rdmakit.engine.cm import CmConnParams, CmEndpoint, CmEventKind, CmState
from rdmakit.wire.cm import CmAttr, CmMad, PortSpace, RejReason, decode_cm, encode_cm, service_id
from tests.engine.seeds import SeedSample

SERVICE = service_id(PortSpace.TCP, 7174)
T_EXP = 12  # 16.8 ms response timeout: fast simulated time


@dataclass
class Net:
    rng: random.Random
    loss: float = 0.0
    dup: float = 0.0
    jitter: float = 0.0
    delay: float = 0.0005
    queue: list[tuple[float, int, str, str, bytes]] = field(default_factory=list)
    seq: int = 0
    sent: int = 0

    def send(self, now: float, src: str, dst: str, data: bytes) -> None:
        self.sent += 1
        copies = 1 + (self.rng.random() < self.dup)
        for _ in range(copies):
            if self.rng.random() < self.loss:
                continue
            self.seq += 1
            at = now + self.delay + self.rng.random() * self.jitter
            heapq.heappush(self.queue, (at, self.seq, src, dst, data))


@dataclass
class App:
    name: str
    cm: CmEndpoint
    log: list[CmEventKind] = field(default_factory=list)
    established: set[int] = field(default_factory=set)
    ids: set[int] = field(default_factory=set)


def _params(rng: random.Random) -> CmConnParams:
    return CmConnParams(qpn=rng.getrandbits(24) or 1, starting_psn=rng.getrandbits(24))


def _run(
    seed: int,
    *,
    loss: float,
    dup: float,
    jitter: float,
    hang_up_by: str | None = None,
    think: float = 0.0,
    reject: float = 0.0,
) -> tuple[App, App]:
    """One connection attempt; B answers a REQ within `think` seconds, rejecting with odds `reject`."""
    rng = random.Random(seed)
    net = Net(random.Random(seed ^ 0x5EED), loss, dup, jitter)
    a = App("A", CmEndpoint(rng=random.Random(seed + 1), ca_guid=0xA, timeout_exponent=T_EXP, timewait=0.05))
    b = App("B", CmEndpoint(rng=random.Random(seed + 2), ca_guid=0xB, timeout_exponent=T_EXP, timewait=0.05))
    apps = {"A": a, "B": b}
    b.cm.listen(SERVICE)
    now = 0.0
    a.ids.add(a.cm.connect("B", SERVICE, _params(rng), now))
    hang_up = hang_up_by or rng.choice("AB")
    hang_up_at: float | None = None
    hung_up = False
    answers: list[tuple[float, int, bool]] = []  # B's decisions: (when, comm ID, accept)

    def flush(app: App) -> None:
        nonlocal hang_up_at
        for peer, mad in app.cm.poll_transmit():
            net.send(now, app.name, str(peer), encode_cm(mad))
        while (ev := app.cm.next_event()) is not None:
            app.log.append(ev.kind)
            if ev.kind is CmEventKind.REQ_RECEIVED:
                app.ids.add(ev.comm_id)
                answers.append((now + rng.random() * think, ev.comm_id, rng.random() >= reject))
            elif ev.kind is CmEventKind.REP_RECEIVED:
                app.cm.send_rtu(ev.comm_id, now)
            elif ev.kind is CmEventKind.ESTABLISHED:
                app.established.add(ev.comm_id)
                if hang_up_at is None and not hung_up:
                    hang_up_at = now + rng.random() * 0.02
        for peer, mad in app.cm.poll_transmit():
            net.send(now, app.name, str(peer), encode_cm(mad))

    for _ in range(200_000):
        for app in apps.values():
            flush(app)
        timers = [t for app in apps.values() if (t := app.cm.get_timer()) is not None]
        if hang_up_at is not None:
            timers.append(hang_up_at)
        timers += [t for t, _, _ in answers]
        if net.queue:
            timers.append(net.queue[0][0])
        if not timers:
            # Quiet, yet a side still thinks it is connected: its peer is gone (its messages lost).
            # An application learns that from its QP's errors and hangs up, as here.
            left = [
                (app, cid)
                for app in apps.values()
                for cid in app.ids
                if app.cm.state(cid) is CmState.ESTABLISHED
            ]
            if not left:
                break
            for app, cid in left:
                app.cm.disconnect(cid, now)
            continue
        now = max(now, min(timers))
        for answer in [x for x in answers if x[0] <= now]:
            answers.remove(answer)
            _, cid, accept = answer
            if b.cm.state(cid) in (CmState.REQ_RCVD, CmState.MRA_REQ_SENT):  # not expired meanwhile
                if accept:
                    b.cm.accept(cid, _params(rng), now)
                else:
                    b.cm.reject(cid, now, private_data=b"no thanks")
                    b.log.append(CmEventKind.REJECTED)  # B's own ending: it refused
        if hang_up_at is not None and now >= hang_up_at:
            app = apps[hang_up[0]]
            states = {cid: app.cm.state(cid) for cid in app.ids}
            if hang_up == "AB" and all(
                apps[n].cm.state(c) is CmState.ESTABLISHED for n in "AB" for c in apps[n].ids
            ):  # both at the same instant: the DREQs cross
                for n in "AB":
                    for cid in apps[n].ids:
                        apps[n].cm.disconnect(cid, now)
                hang_up_at, hung_up = None, True
            elif CmState.ESTABLISHED in states.values():
                for cid, state in states.items():
                    if state is CmState.ESTABLISHED:
                        app.cm.disconnect(cid, now)
                hang_up_at, hung_up = None, True
            elif set(states.values()) <= {CmState.CLOSED, CmState.TIMEWAIT}:
                # This side failed (its REJ may be lost): the other hangs up, as an application does
                # once its QP finds the peer gone; a DREQ for nothing is still answered.
                other = "A" if hang_up[0] == "B" else "B"
                if hang_up_by is None and any(
                    apps[other].cm.state(c) is CmState.ESTABLISHED for c in apps[other].ids
                ):
                    hang_up, hang_up_at = other, now
                else:
                    hang_up_at, hung_up = None, True
            else:
                hang_up_at = now + 0.005  # this side is not connected yet: try again
        while net.queue and net.queue[0][0] <= now:
            _, _, src, dst, data = heapq.heappop(net.queue)
            apps[dst].cm.receive(src, decode_cm(data), now)
        for app in apps.values():
            app.cm.handle_timer(now)
    else:
        pytest.fail("the simulation never settled")
    return a, b


_TERMINAL = {CmEventKind.DISCONNECTED, CmEventKind.REJECTED, CmEventKind.TIMEOUT}


def _check(a: App, b: App) -> None:
    for app in (a, b):
        assert app.cm.get_timer() is None, (app.name, app.cm)
        assert repr(app.cm).startswith("<CmEndpoint {}"), (app.name, app.cm)  # nothing left, timewait over
    if not b.log:  # no REQ ever reached B: A failed, alone
        assert a.log[-1] in (CmEventKind.TIMEOUT, CmEventKind.REJECTED), a.log
        return
    for app in (a, b):
        log = [k for k in app.log if k is not CmEventKind.REQ_RECEIVED and k is not CmEventKind.REP_RECEIVED]
        # one connection: at most one ESTABLISHED, then exactly one terminal event
        assert log.count(CmEventKind.ESTABLISHED) <= 1, (app.name, app.log)
        assert len([k for k in log if k in _TERMINAL]) == 1, (app.name, app.log)
        assert log[-1] in _TERMINAL, (app.name, app.log)
    assert b.log.count(CmEventKind.REQ_RECEIVED) == 1, b.log  # duplicates never make a second connection
    assert a.log.count(CmEventKind.REP_RECEIVED) <= 1, a.log
    if CmEventKind.ESTABLISHED in b.log:  # the RTU (or DREQ) comes only after A's REP_RECEIVED
        assert CmEventKind.REP_RECEIVED in a.log


def test_clean_network_connects_and_disconnects() -> None:
    """REQ → REP → RTU, then DREQ → DREP (IBTA §12.9.5, §12.9.8.7), both sides."""
    for side in ("A", "B", "AB"):  # AB: both at once, DREQs crossing (IBTA §12.9.8.6)
        a, b = _run(1, loss=0, dup=0, jitter=0, hang_up_by=side)
        _check(a, b)
        assert a.log == [CmEventKind.REP_RECEIVED, CmEventKind.ESTABLISHED, CmEventKind.DISCONNECTED]
        assert b.log == [CmEventKind.REQ_RECEIVED, CmEventKind.ESTABLISHED, CmEventKind.DISCONNECTED]
        if side != "AB":
            assert a.cm.stats == {}
            assert b.cm.stats == {}


@pytest.mark.parametrize("seed", range(40))
def test_hostile_network_still_connects(seed: int) -> None:
    """Loss, duplication and reordering at 20 %: 15 retries make failure vanishingly rare."""
    a, b = _run(seed, loss=0.2, dup=0.2, jitter=0.01)
    _check(a, b)
    for app in (a, b):
        assert CmEventKind.ESTABLISHED in app.log, (app.name, app.log, app.cm.stats)
        assert app.log[-1] is CmEventKind.DISCONNECTED


@pytest.mark.slow
def test_cm_sweep(seed_sample: SeedSample) -> None:
    """Seeded sweep: loss up to 80 %, duplication, reordering, slow and refused answers: all end cleanly."""
    seeds = seed_sample.seeds(range(10_000))
    for seed in seeds:
        rng = random.Random(seed)
        a, b = _run(
            seed,
            loss=rng.choice((0, 0.1, 0.3, 0.6, 0.8)),
            dup=rng.random() * 0.5,
            jitter=rng.random() * 0.05,
            think=rng.choice((0, 0.01, 0.2)),  # slow answers: duplicate REQs get MRAs
            reject=rng.choice((0, 0.2)),
        )
        _check(a, b)
    seed_sample.passed(len(seeds))


# -- single messages ---------------------------------------------------------------------------


def _req(comm_id: int, *, qpn: int = 5, guid: int = 0xA, service: int = SERVICE, tid: int = 9) -> CmMad:
    values = {
        "local_comm_id": comm_id, "service_id": service, "local_ca_guid": guid, "local_qpn": qpn,
        "remote_cm_response_timeout": T_EXP, "max_cm_retries": 3,
    }  # fmt: skip
    return CmMad(CmAttr.REQ, tid, values)


def _sent(cm: CmEndpoint) -> list[tuple[Hashable, CmMad]]:
    return cm.poll_transmit()


def test_no_listener_is_rej_invalid_service_id() -> None:
    """A REQ for a service nobody listens to: REJ reason 8 (rdma_cm's "no listener"), no state kept."""
    cm = CmEndpoint(rng=random.Random(1), ca_guid=0xB)
    cm.receive("peer", _req(77, service=service_id(PortSpace.TCP, 9)), 0.0)
    ((peer, rej),) = _sent(cm)
    assert peer == "peer"
    assert (rej.attr, rej["reason"], rej["remote_comm_id"], rej["message_rejected"], rej.tid) == (
        CmAttr.REJ, RejReason.INVALID_SERVICE_ID, 77, 0, 9,
    )  # fmt: skip
    assert cm.next_event() is None
    assert cm.get_timer() is None


def test_duplicate_req_gets_mra_then_the_rep_again() -> None:
    """IBTA §12.6.6: a repeated REQ is answered with an MRA while undecided, with the REP once sent."""
    cm = CmEndpoint(rng=random.Random(1), ca_guid=0xB, timeout_exponent=T_EXP)
    cm.listen(SERVICE)
    cm.receive("p", _req(77), 0.0)
    ev = cm.next_event()
    assert ev is not None
    assert ev.kind is CmEventKind.REQ_RECEIVED
    cm.receive("p", _req(77), 0.001)
    ((_, mra),) = _sent(cm)
    assert (mra.attr, mra["message_mraed"], mra["remote_comm_id"]) == (CmAttr.MRA, 0, 77)
    cm.accept(ev.comm_id, CmConnParams(qpn=9, starting_psn=100), 0.002)
    ((_, rep),) = _sent(cm)
    cm.receive("p", _req(77), 0.003)
    ((_, again),) = _sent(cm)
    assert again == rep
    assert cm.next_event() is None  # no second connection


def test_stale_and_spoofed_messages() -> None:
    """A second REQ from a live QP is REJ stale (10); a MAD from another address is dropped."""
    cm = CmEndpoint(rng=random.Random(1), ca_guid=0xB, timeout_exponent=T_EXP)
    cm.listen(SERVICE)
    cm.receive("p", _req(77), 0.0)
    ev = cm.next_event()
    assert ev is not None
    cm.receive("p", _req(78), 0.0)  # same (GUID, QPN), new communication ID
    ((_, rej),) = _sent(cm)
    assert (rej["reason"], rej["remote_comm_id"]) == (RejReason.STALE_CONN, 78)
    cm.accept(ev.comm_id, CmConnParams(qpn=9, starting_psn=1), 0.0)
    _sent(cm)
    rtu = CmMad(CmAttr.RTU, 9, {"local_comm_id": 77, "remote_comm_id": ev.comm_id})
    cm.receive("mallory", rtu, 0.0)
    assert cm.state(ev.comm_id) is CmState.REP_SENT
    assert cm.stats["wrong_peer"] == 1
    cm.receive("p", CmMad(CmAttr.RTU, 9, {"local_comm_id": 76, "remote_comm_id": ev.comm_id}), 0.0)
    assert cm.state(ev.comm_id) is CmState.REP_SENT
    assert cm.stats["wrong_remote_comm_id"] == 1
    cm.receive("p", rtu, 0.0)
    assert cm.state(ev.comm_id) is CmState.ESTABLISHED


def test_pending_requests_are_bounded_and_expire() -> None:
    """A flood of REQs fills at most max_pending; the rest get REJ no resources; unanswered ones expire."""
    cm = CmEndpoint(rng=random.Random(1), ca_guid=0xB, timeout_exponent=T_EXP, max_pending=4)
    cm.listen(SERVICE)
    for i in range(10):
        cm.receive("p", _req(100 + i, qpn=100 + i), 0.0)
    reasons = [m["reason"] for _, m in _sent(cm)]
    assert reasons == [RejReason.NO_RESOURCES] * 6
    deadline = cm.get_timer()
    assert deadline is not None
    cm.handle_timer(deadline)
    assert [m["reason"] for _, m in _sent(cm)] == [RejReason.TIMEOUT] * 4
    assert cm.get_timer() is None


def test_unanswered_req_times_out_after_its_retries() -> None:
    cm = CmEndpoint(rng=random.Random(1), ca_guid=0xA, timeout_exponent=T_EXP, max_retries=3)
    cid = cm.connect("nobody", SERVICE, CmConnParams(qpn=1, starting_psn=1), 0.0)
    now, sent = 0.0, len(_sent(cm))
    while (t := cm.get_timer()) is not None:
        now = t
        cm.handle_timer(now)
        sent += len(_sent(cm))
    assert sent == 1 + 3 + 1  # the REQ, three retries, the REJ "timeout"
    ev = cm.next_event()
    assert ev is not None
    assert (ev.kind, ev.comm_id, ev.reason) == (
        CmEventKind.TIMEOUT,
        cid,
        RejReason.TIMEOUT,
    )


def test_a_refusal_is_repeated_and_comm_est_connects() -> None:
    """A repeated REQ after our REJ gets the same REJ; data before the RTU (COMM_EST) connects."""
    cm = CmEndpoint(rng=random.Random(1), ca_guid=0xB, timeout_exponent=T_EXP)
    cm.listen(SERVICE)
    cm.receive("p", _req(77), 0.0)
    ev = cm.next_event()
    assert ev is not None
    cm.reject(ev.comm_id, 0.0, private_data=b"busy")
    ((_, rej),) = _sent(cm)
    assert (rej["reason"], rej.private_data[:4]) == (RejReason.CONSUMER_DEFINED, b"busy")
    cm.receive("p", _req(77), 0.1)
    assert _sent(cm) == [("p", rej)]
    assert cm.next_event() is None
    cm.receive("p", _req(80, qpn=6), 0.1)  # another QP of the same peer is welcome
    ev = cm.next_event()
    assert ev is not None
    assert ev.kind is CmEventKind.REQ_RECEIVED
    cm.accept(ev.comm_id, CmConnParams(qpn=9, starting_psn=1), 0.1)
    cm.establish(ev.comm_id)
    done = cm.next_event()
    assert done is not None
    assert done.kind is CmEventKind.ESTABLISHED


def test_communication_ids_come_from_the_rng() -> None:
    ids = {
        CmEndpoint(rng=random.Random(s), ca_guid=1).connect("p", SERVICE, CmConnParams(1, 1), 0)
        for s in range(50)
    }
    assert len(ids) == 50
    assert 0 not in ids
