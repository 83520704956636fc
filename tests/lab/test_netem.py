"""rdmakit on netem paths in the lab guest, and CNPs sent to kernel rxe (slow: a guest boots).

The whole matrix is ``scripts/lab/netem-matrix.sh`` (``rdmakit.testing.netem``);
CI runs one path of it here, the one with a goodput target (1 % loss, 10 ms
each way): rdmakit between two namespaces, rdmakit's client and server against
kernel rxe's perftest, rxe against rxe and iperf3, all on the same netem path in
the same run, plus every RC operation with its bytes checked between two
rdmakit engines and between rdmakit and rxe. No run may stall, every byte
must check, and a run of rxe's perftest that fails must say why. The goodput
figures are printed, not asserted: a shared TCG guest's CPU share decides
them (docs/networks.md has the measured matrix).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from rdmakit.testing.rcpeer import verify
from tests.lab.labvm import GUEST_SHARE, LabGuest, booted, lab_marks

INSTANCE = "netem-" + os.environ.get("PYTEST_XDIST_WORKER", "main")
#: rdmakit compiled once per boot (scripts/lab/guest-python): the matrix starts two processes
#: per run, and each would otherwise compile the package from the read-only checkout again.
GUEST_PYTHON = ("bash", "scripts/lab/guest-python")

pytestmark = [*lab_marks(1500), pytest.mark.slow]


@pytest.fixture(scope="module")
def guest() -> Iterator[LabGuest]:
    with booted(INSTANCE) as g:
        yield g


def test_one_percent_loss_ten_ms_every_run_ends_and_every_byte_checks(guest: LabGuest) -> None:
    res = guest.run(
        *GUEST_PYTHON, "-m", "rdmakit.testing.netem", "--paths", "loss1", "--seconds", "3",
        "--runs", "iperf3,rk-rk,rk>rxe,rxe>rk,rxe-rxe",  # WRITE: the full matrix adds READ
        "--json-out", str(GUEST_SHARE / "out" / "netem.json"), timeout=1200,
    )  # fmt: skip
    print(res.stdout, res.stderr)
    assert res.returncode in (0, 1), res.stdout[-4000:] + res.stderr[-4000:]  # 1: a run failed
    (row,) = json.loads((guest.share / "out" / "netem.json").read_text())
    assert row["path"] == "loss1"
    assert "loss 1%" in row["netem"]
    # No run stalled, every byte of both exchanges checked, TCP and rdmakit <-> rdmakit moved data.
    assert row["hung"] == [], row
    assert row["checks"] == {"rk-rk": "", "rk-rxe": ""}, row["checks"]
    for run in ("iperf3", "rk-rk"):
        assert row["mbs"][run] is not None, (run, row["notes"][run])
        assert row["mbs"][run] > 0, (run, row)
    # A run with kernel rxe's perftest either moved data or failed with its own clear line (its
    # default 67 ms ACK timeout against a peer in the same emulated guest), never in silence.
    for run in ("rk>rxe", "rxe>rk", "rxe-rxe"):
        if row["mbs"][run] is None:
            assert row["notes"][run].strip(), (run, row)
    assert res.returncode == (1 if row["mbs"]["rk>rxe"] is None or row["mbs"]["rxe>rk"] is None else 0)


def test_red_marks_ce_rdmakit_answers_with_cnps_and_without_ecn_red_drops(guest: LabGuest) -> None:
    """Annex A17.9 on a real qdisc: RED on each link's egress (20 Mbit/s after 10 ms of netem)
    marks CE on rdmakit's ECT(0) datagrams, and the responder answers with CNPs; the same RED
    without ``ecn`` drops them instead, and no CNP is sent. Goodput and the counters of both
    paths are printed (docs/networks.md has the matrix's)."""
    res = guest.run(
        *GUEST_PYTHON, "-m", "rdmakit.testing.netem", "--paths", "red-ecn,red-drop", "--runs", "iperf3,rk-rk",
        "--checks", "", "--seconds", "3", "--json-out", str(GUEST_SHARE / "out" / "red.json"), timeout=1200,
    )  # fmt: skip
    print(res.stdout, res.stderr)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    rows = {r["path"]: r for r in json.loads((guest.share / "out" / "red.json").read_text())}
    assert rows.keys() == {"red-ecn", "red-drop"}
    for row in rows.values():
        assert row["hung"] == [], row
        assert (row["mbs"]["rk-rk"] or 0) > 0, row
    ecn, drop = rows["red-ecn"]["counters"]["rk-rk"], rows["red-drop"]["counters"]["rk-rk"]
    assert ecn["marked"] > 0, ecn  # RED marked what rdmakit sent as ECT(0) ...
    assert ecn["cnps"] > 0, ecn  # ... and the responder answered the CE marks with CNPs
    # An ECN-capable packet is marked, not dropped early; RED still drops the few packets that
    # are not ECT (the side channel's TCP, neighbour discovery): sch_red counts those as early.
    assert ecn["early"] * 20 < ecn["marked"], ecn
    assert (drop["marked"], drop["cnps"]) == (0, 0), drop  # no marks, no CNPs
    assert drop["early"] > 0, drop  # the same RED dropped instead


@pytest.fixture(scope="module")
def cnp_run(guest: LabGuest) -> dict[str, Any]:
    res = guest.run(*GUEST_PYTHON, "tests/lab/cnp_guest.py", "run", timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    run: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    assert not run["hung"], run
    for side in ("host", "guest", "inject"):
        assert run[side]["rc"] == 0, (side, run[side])
    return run


def _phases(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["phase"]: e for e in events if e["event"] == "phase"}


def test_cnps_to_rxe_qps_leave_every_operation_intact(cnp_run: dict[str, Any]) -> None:
    """rxe as requester and as responder completes every operation, bytes checked, under CNPs."""
    sent = cnp_run["inject"]["sent"]
    # Both of rxe's QPs got CNPs during their exchange (the injector starts at its descriptor).
    assert set(sent) == {"host-requests", "guest-requests"}, sent
    assert all(n >= 20 for n in sent.values()), sent
    host, guest = _phases(cnp_run["host"]["events"]), _phases(cnp_run["guest"]["events"])
    assert verify(host["host-requests"], guest["host-requests"]) == []
    assert verify(guest["guest-requests"], host["guest-requests"]) == []


def test_rxe_drops_cnps_before_counting_and_counts_no_error(cnp_run: dict[str, Any]) -> None:
    """rxe_recv.c: a CNP's transport (opcode bits 7:5 = 100) is not RC's, so ``check_type_state``
    drops it before ``rxe_rcv`` counts a received packet; no error counter moves."""
    rxe = cnp_run["rxe"]  # from before the exchange to after the last CNP
    host_done = next(e for e in cnp_run["host"]["events"] if e["event"] == "done")
    host = {k: host_done["counters_after"][k] - host_done["counters_before"].get(k, 0)
            for k in host_done["counters_after"]}  # fmt: skip
    # Every packet rdmakit sent passed rxe's checks, and rxe counted nothing else: not one of the
    # thousands of CNPs (k0's own rx_packets cannot tell them apart: it counts rdmakit's UDP GSO
    # batches as one packet each, since veth passes them whole).
    assert sum(cnp_run["inject"]["sent"].values()) > 100, cnp_run["inject"]
    assert rxe["rcvd_pkts"] == host["packets_out"], (rxe, host)
    for name in ("retry_exceeded_err", "retry_rnr_exceeded_err", "send_err", "rcvd_rnr_err", "send_rnr_err"):
        assert rxe[name] == 0, (name, rxe)
    # Sequence NAKs and duplicates only as the two ends account for them (rxe_resp.c counts
    # out_of_seq_request once per NAK it sends; a slow TCG peer may make a timer fire).
    phases = _phases(cnp_run["host"]["events"])
    soft_req, soft_resp = phases["host-requests"]["qp_stats"], phases["guest-requests"]["qp_stats"]
    naked = soft_req["naks_received"].get("PSN_SEQUENCE_ERROR", 0)
    assert rxe["out_of_seq_request"] == naked, (rxe, soft_req)
    assert rxe["rcvd_seq_err"] == soft_resp["naks_sent"].get("PSN_SEQUENCE_ERROR", 0), (rxe, soft_resp)
    assert rxe["duplicate_request"] <= soft_req["retransmits"] + soft_req["probes"], (rxe, soft_req)
    guest_done = next(e for e in cnp_run["guest"]["events"] if e["event"] == "done")
    assert not guest_done["bad_icrc_lines"], guest_done["bad_icrc_lines"]
