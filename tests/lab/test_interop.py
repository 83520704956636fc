"""rdmakit's soft engine interoperates with the kernel's rxe driven by rdmakit's verbs backend.

The soft engine runs on the host side of the lab network (``SoftBackendDevice``
on 10.77.0.1, in the ``rdmakit-host-*`` namespace); the verbs backend runs in
the guest on rxe0 (10.77.0.2). ``interop_peer.py`` is both sides: every RC
operation for sizes from 0 bytes to 4 MiB, with the host as requester and then
the guest as requester, descriptors exchanged through the guest's writable
share. One guest boots for the module, and both directions run in one pair of
processes; the tests below check what that run recorded.

Besides the data, the counters of both ends must add up: rxe accepted every
packet the host sent (its ``rcvd_pkts`` counts packets that passed its ICRC and
header checks), the host verified every packet rxe sent (solving the IP ID rxe
put in the ICRC), and every duplicate or NAK is explained by a retransmission
of the other side.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rdmakit.testing.rcpeer import WC_OPCODE
from tests.lab.labvm import GUEST_SHARE, HOST_ADDR, LabGuest, booted, lab_marks

PEER = Path(__file__).with_name("interop_peer.py")
INSTANCE = "interop-" + os.environ.get("PYTEST_XDIST_WORKER", "main")
PHASES = ("host-requests", "guest-requests")
#: The guest's Python with the bytecode compiled into the image (stdlib, the lab's wheels)
#: rather than lab-run.sh's PYTHONPYCACHEPREFIX=/tmp, which recompiles every import at
#: every boot: under TCG that is most of a Python program's start-up.
GUEST_PYTHON = ("env", "-u", "PYTHONPYCACHEPREFIX", "python3")
#: Longer than any burst the host sends (a 4 MiB READ is 4096 response packets).
TAP_QUEUE = 16384

pytestmark = lab_marks(900)


@pytest.fixture(scope="module")
def guest() -> Iterator[LabGuest]:
    with booted(INSTANCE) as g:
        yield g


@dataclass(frozen=True, slots=True)
class Side:
    """What one side's interop_peer.py printed."""

    phases: dict[str, dict[str, Any]]
    done: dict[str, Any]

    @property
    def delta(self) -> dict[str, int]:
        before, after = self.done["counters_before"], self.done["counters_after"]
        return {k: after[k] - before.get(k, 0) for k in after}


@dataclass(frozen=True, slots=True)
class Interop:
    host: Side
    guest: Side
    tap: dict[str, int]
    seconds: float


def _side(out: str) -> Side:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    phases = {x["phase"]: x for x in lines if x["event"] == "phase"}
    done = next(x for x in lines if x["event"] == "done")
    return Side(phases, done)


def run_interop(guest: LabGuest, name: str) -> Interop:
    """Both sides of interop_peer.py, descriptors through share/out/NAME; both must exit 0."""
    shared = guest.share / "out" / name
    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir(parents=True)
    tap_before = guest.tap_stats()
    t0 = time.monotonic()
    job = guest.start(
        *GUEST_PYTHON, str(PEER.relative_to(PEER.parents[2])), "--side", "guest",
        "--dir", str(GUEST_SHARE / "out" / name), timeout=400,
    )  # fmt: skip
    try:
        host = subprocess.run(
            guest.host_command(
                sys.executable, str(PEER), "--side", "host", "--dir", str(shared), "--ip", HOST_ADDR
            ),
            capture_output=True,
            text=True,
            timeout=400,
            check=False,
        )
    except BaseException:
        guest.kill(job)
        raise
    if host.returncode != 0:
        guest.kill(job)
    g = guest.wait(job, timeout=400)
    seconds = time.monotonic() - t0
    tap_after = guest.tap_stats()
    report = (
        f"--- host\n{host.stdout[-3000:]}\n{host.stderr[-3000:]}\n"
        f"--- guest\n{g.stdout[-3000:]}\n{g.stderr[-3000:]}"
    )
    assert host.returncode == 0, report
    assert g.returncode == 0, report
    return Interop(
        host=_side(host.stdout),
        guest=_side(g.stdout),
        tap={k: tap_after[k] - tap_before[k] for k in tap_after},
        seconds=seconds,
    )


@pytest.fixture(scope="module")
def interop(guest: LabGuest) -> Interop:
    guest.set_tap_queue(TAP_QUEUE)
    return run_interop(guest, "interop")


def _check_direction(requester: dict[str, Any], responder: dict[str, Any]) -> None:
    assert requester["role"] == "requester"
    assert responder["role"] == "responder"
    failed = [name for name, ok in requester["checks"].items() if not ok]
    assert not failed, failed
    for op in requester["ops"]:
        assert op["status"] == "SUCCESS", op
        assert op["wr_id_ok"], op
        assert op["opcode"] == WC_OPCODE[op["op"]], op
    got = [[r["opcode"], r["byte_len"], r["imm"], r["sha256"]] for r in responder["recvs"]]
    assert got == requester["expected_recvs"]
    assert all(r["status"] == "SUCCESS" for r in responder["recvs"])
    assert responder["target_sha256"] == requester["expected_target_sha256"]
    assert requester["state"] == responder["state"] == "RTS"


def test_host_soft_requester_to_guest_rxe_responder(interop: Interop) -> None:
    _check_direction(interop.host.phases["host-requests"], interop.guest.phases["host-requests"])


def test_guest_rxe_requester_to_host_soft_responder(interop: Interop) -> None:
    _check_direction(interop.guest.phases["guest-requests"], interop.host.phases["guest-requests"])


def test_every_packet_accounted_for(interop: Interop) -> None:
    """No loss on the lab link, rxe accepted every host packet, the host every rxe packet."""
    host, guest = interop.host.delta, interop.guest.delta
    assert interop.tap["tx_dropped"] == 0, f"the lab network dropped packets: {interop.tap}"
    assert host["packets_out"] > 20_000  # 4 MiB messages at MTU 1024 both ways
    # rxe counts rcvd_pkts after its header and ICRC checks (rxe_recv.c rxe_rcv()).
    assert guest["rcvd_pkts"] == host["packets_out"], (guest, host)
    assert guest["sent_pkts"] == host["packets_in"], (guest, host)
    assert not interop.guest.done["bad_icrc_lines"], interop.guest.done["bad_icrc_lines"]
    for name in ("bad_icrc", "malformed", "unknown_qp", "wrong_source", "dropped_state"):
        assert host[name] == 0, (name, host)
    # Every packet from rxe passed the ICRC check: most only after the host solved the IP ID
    # rxe chose (``__ip_select_ident``, covered by the ICRC); a packet whose ID happens to be
    # what the host tries first (its index in a GRO batch, or 0) checks directly. With at
    # most 64 segments per batch, that is at most 65 IDs in each 65536.
    assert host["icrc_ok"] + host["icrc_solved"] == host["packets_in"], host
    assert host["icrc_ok"] <= 65 * (1 + host["packets_in"] // 65536), host


def test_no_rnr_and_no_unexplained_retries(interop: Interop) -> None:
    """Sequence errors and duplicates only where the other side retransmitted."""
    guest = interop.guest.delta
    soft_req = interop.host.phases["host-requests"]["qp_stats"]
    soft_resp = interop.host.phases["guest-requests"]["qp_stats"]
    # Every receive is posted before the requester starts.
    assert guest["send_rnr_err"] == guest["rcvd_rnr_err"] == 0, guest
    assert soft_req["rnr_naks_received"] == soft_resp["rnr_naks_sent"] == 0
    # Nothing is lost on the way (test above), so no side ever sees a PSN gap.
    assert guest["out_of_seq_request"] == guest["rcvd_seq_err"] == 0, guest
    assert soft_req["naks_received"] == {}
    assert soft_resp["naks_sent"] == {}
    assert guest["retry_exceeded_err"] == guest["retry_rnr_exceeded_err"] == guest["send_err"] == 0, guest
    # A slow peer may still make a retransmit timer fire (rxe's 4.096 us x 2^14 = 67 ms,
    # under TCG, the soft engine's 268 ms) or, a guest stall past two smoothed round trips, the
    # soft requester's tail-loss probe (engine/probe.py): a duplicate needs a packet sent again
    # by the other side.
    assert guest["duplicate_request"] <= soft_req["retransmits"] + soft_req["probes"], (guest, soft_req)
    if soft_resp["duplicates"]:
        assert guest["completer_retry_err"] > 0, (guest, soft_resp)
    assert soft_resp["dropped"] == {}, soft_resp


def test_both_requesters_send_the_same_packets(interop: Interop) -> None:
    """The soft requester and rxe segment the same program into the same request packets."""
    soft_req = interop.host.phases["host-requests"]["qp_stats"]
    soft_resp = interop.host.phases["guest-requests"]["qp_stats"]
    sent_by_soft = soft_req["packets_out"] - soft_req["retransmits"] - soft_req["probes"]
    sent_by_rxe = soft_resp["packets_in"] - soft_resp["duplicates"]
    assert sent_by_soft == sent_by_rxe, (soft_req, soft_resp)


def test_verbs_backend_on_rxe(guest: LabGuest) -> None:
    """The verbs backend's device and DOCA backend tests (tests/lab/test_verbs_*.py), run in the guest."""
    # The guest has no pytest-timeout (pyproject's ``timeout``) and needs neither trio nor
    # hypothesis here: their plugins would cost ~40 s of imports over 9p under TCG.
    res = guest.run(
        *GUEST_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
        "-p", "no:trio", "-W", "ignore::pytest.PytestConfigWarning", "tests/lab/test_verbs_device.py",
        "tests/lab/test_verbs_backend.py", timeout=400,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    summary = res.stdout.strip().splitlines()[-1]
    assert " passed" in summary, res.stdout[-2000:]
    assert "skipped" not in summary, res.stdout[-2000:]


def test_doca_fidelity_on_rxe(guest: LabGuest) -> None:
    """The DOCA fidelity tests (tests/doca/fidelity) on the verbs backend, rxe0 in the guest: each
    header's documented behaviour holds on a kernel verbs device as on the soft engine."""
    res = guest.run(
        *GUEST_PYTHON, "-m", "pytest", "-q", "-m", "lab", "-p", "no:cacheprovider",
        "-p", "no:hypothesispytest", "-p", "no:trio", "-W", "ignore::pytest.PytestConfigWarning",
        "-rs", "tests/doca/fidelity", timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    summary = res.stdout.strip().splitlines()[-1]
    assert " passed" in summary, res.stdout[-2000:]
    assert "skipped" not in summary, res.stdout[-2000:]


@pytest.mark.slow
def test_recovery_over_the_lossy_default_tap(guest: LabGuest) -> None:
    """With the tap's default 1000-packet queue, a 4 MiB READ's 4096 responses overflow it.

    Both implementations must recover from what the lab network drops (rxe
    retries the READ from the first missing response; lost ACKs time out): the
    data is still right, and every host packet was either accepted by rxe or
    dropped at the tap.
    """
    guest.set_tap_queue(1000)
    try:
        run = run_interop(guest, "interop-lossy")
    finally:
        guest.set_tap_queue(TAP_QUEUE)
    if run.tap["tx_dropped"] == 0:
        pytest.skip("the lab network dropped nothing this time: no recovery to check")
    _check_direction(run.host.phases["host-requests"], run.guest.phases["host-requests"])
    _check_direction(run.guest.phases["guest-requests"], run.host.phases["guest-requests"])
    host, guest_c = run.host.delta, run.guest.delta
    assert guest_c["rcvd_pkts"] + run.tap["tx_dropped"] == host["packets_out"], (guest_c, host, run.tap)
    assert guest_c["sent_pkts"] == host["packets_in"], (guest_c, host)
    assert host["bad_icrc"] == host["malformed"] == 0, host
    assert not run.guest.done["bad_icrc_lines"]
    soft_req = run.host.phases["host-requests"]["qp_stats"]
    assert guest_c["completer_retry_err"] + soft_req["retries"] > 0, (guest_c, soft_req)
    assert guest_c["retry_exceeded_err"] == 0, guest_c
