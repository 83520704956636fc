"""The byte-checked RC exchange (``rdmakit.testing.rcpeer``) and the netem matrix's verdicts, on loopback."""

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from rdmakit.testing.netem import RUNS, Row, failed, line, markdown
from rdmakit.testing.rcpeer import verify

SIZES = "0,1,1025,65537"
Phases = dict[str, dict[str, Any]]


def _phases(out: str) -> Phases:
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return {e["phase"]: e for e in events if e["event"] == "phase"}


@pytest.fixture(scope="module")
def exchange(tmp_path_factory: pytest.TempPathFactory, ip_source: Callable[[], str]) -> tuple[Phases, Phases]:
    shared = tmp_path_factory.mktemp("rcpeer")
    peer = [sys.executable, "-m", "rdmakit.testing.rcpeer", "--dir", str(shared), "--sizes", SIZES]
    guest = subprocess.Popen(
        [*peer, "--side", "guest", "--backend", "soft", "--ip", ip_source()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    host = subprocess.run(
        [*peer, "--side", "host", "--ip", ip_source()],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    g_out, g_err = guest.communicate(timeout=240)
    assert host.returncode == 0, host.stdout[-2000:] + host.stderr[-2000:]
    assert guest.returncode == 0, g_out[-2000:] + g_err[-2000:]
    return _phases(host.stdout), _phases(g_out)


def test_two_soft_engines_check_every_byte_both_ways(exchange: tuple[Phases, Phases]) -> None:
    host, guest = exchange
    assert verify(host["host-requests"], guest["host-requests"]) == []
    assert verify(guest["guest-requests"], host["guest-requests"]) == []
    ops = {op["op"] for op in host["host-requests"]["ops"]}
    assert ops == {"SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "RDMA_READ",
                   "ATOMIC_FETCH_AND_ADD", "ATOMIC_CMP_AND_SWP"}  # fmt: skip
    assert {op["length"] for op in host["host-requests"]["ops"]} >= {0, 1, 1025, 65537}


def test_verify_names_a_changed_byte_a_lost_receive_and_a_failed_completion(
    exchange: tuple[Phases, Phases],
) -> None:
    host, guest = exchange
    req, resp = host["host-requests"], guest["host-requests"]
    changed = {**resp, "target_sha256": "0" * 64}
    assert verify(req, changed) == ["the target memory differs from what was written"]
    assert verify(req, {**resp, "recvs": resp["recvs"][:-1]}) == ["the receives differ from what was sent"]
    ops = [dict(req["ops"][0], status="RETRY_EXC_ERR"), *req["ops"][1:]]
    assert verify({**req, "ops": ops}, resp)[0].startswith("completion {")
    assert verify({**req, "checks": {"read 1: data": False}}, resp) == ["check failed: read 1: data"]


def test_bad_sizes_are_refused_with_one_line(tmp_path: Path) -> None:
    for sizes in ("1,x", str(8 << 20), ""):
        done = subprocess.run(
            [sys.executable, "-m", "rdmakit.testing.rcpeer", "--side", "host", "--dir", str(tmp_path),
             "--sizes", sizes],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "--sizes" in done.stderr.splitlines()[-1]


def _row(**kw: Any) -> Row:
    base: dict[str, Any] = {
        "path": "loss1", "what": "1 % loss", "netem": "delay 10ms loss 1%",
        "mbs": dict.fromkeys(RUNS, 2.0) | {"iperf3": 4.0}, "notes": dict.fromkeys(RUNS, ""),
        "checks": {"rk-rk": "", "rk-rxe": ""}, "check_seconds": {"rk-rk": 1.0, "rk-rxe": 2.0}, "load": 1.0,
    }  # fmt: skip
    return Row(**(base | kw))


def test_the_matrix_fails_on_a_failed_run_of_rdmakit_a_bad_byte_or_a_hang() -> None:
    assert not failed([_row()])
    assert not failed([_row(mbs=dict.fromkeys(RUNS, 1.0) | {"rxe-rxe": None})])  # rxe's own baseline
    assert failed([_row(mbs=dict.fromkeys(RUNS, 1.0) | {"rk>rxe": None})])
    assert failed([_row(checks={"rk-rk": "", "rk-rxe": "the target memory differs"})])
    assert failed([_row(hung=["rk-rk"])])
    assert "0.50x" in line(_row())
    assert "| 2.00 (0.50×) |" in markdown([_row()])


def test_the_docs_blocks_are_rewritten_from_the_json_and_nothing_else(tmp_path: Path) -> None:
    rows = [
        _row(),
        _row(path="clean", mbs={"iperf3": 10.0, "rk-rk": 5.0, "rk-rk read": 2.5}),
        _row(
            path="red-ecn", mbs={"iperf3": 2.0, "rk-rk": 1.0},
            counters={"rk-rk": {"marked": 7, "cnps": 3, "dropped": 0, "early": 0, "pdrop": 5}},
        ),
    ]  # fmt: skip
    report = tmp_path / "m.json"
    report.write_text(json.dumps([asdict(r) for r in rows]))
    doc = tmp_path / "doc.md"
    doc.write_text(
        "before\n<!-- netem-matrix -->\nold\n<!-- /netem-matrix -->\nmiddle\n"
        "<!-- netem-summary -->\nold\n<!-- /netem-summary -->\nafter\n"
    )
    cmd = [sys.executable, "-m", "rdmakit.testing.netem", "--markdown", str(report), "--update", str(doc)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert "old" not in text
    assert text.startswith("before\n")
    assert text.endswith("after\n")
    matrix = text.split("<!-- netem-matrix -->")[1].split("<!-- /netem-matrix -->")[0]
    summary = text.split("<!-- netem-summary -->")[1].split("<!-- /netem-summary -->")[0]
    assert "| clean |" in matrix
    assert "| red-ecn |" in matrix
    assert "| loss1 |" in matrix
    assert "`ib_read_bw`" in matrix
    assert "| 2.50 (0.25×) |" in matrix
    assert "| red-ecn | rk-rk | 1.00 | 7 | 0 | 5 | 0 | 3 |" in matrix  # the ECN counters
    # The summary keeps SUMMARY's order (loss1 first) and leaves the ECN paths to the docs.
    assert summary.index("| loss1 |") < summary.index("| clean |")
    assert "red-ecn" not in summary
    bare = tmp_path / "bare.md"
    bare.write_text("no blocks here\n")
    cmd[-1] = str(bare)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "no <!-- netem-matrix -->" in done.stderr.splitlines()[-1]
    assert bare.read_text() == "no blocks here\n"


def test_runs_of_one_path_make_one_row_with_medians_and_the_range_of_ratios() -> None:
    runs = [
        _row(mbs={"iperf3": 4.0, "rk-rk": 1.0}, samples={"iperf3": [3.0, 4.0, 9.0]}),
        _row(mbs={"iperf3": 8.0, "rk-rk": 6.0}, samples={"iperf3": [8.0, 7.0, 8.5]}),
        _row(mbs={"iperf3": 6.0, "rk-rk": None}, notes={"rk-rk": "RETRY_EXC_ERR"}),
    ]
    assert "failed in 2 of 2: HUNG / RETRY_EXC_ERR |" in markdown(
        [_row(mbs={"iperf3": 1.0, "rk-rk": None}, notes={"rk-rk": n}) for n in ("HUNG", "RETRY_EXC_ERR")]
    )
    table = markdown(runs)
    (loss1,) = [t for t in table.splitlines() if t.startswith("| loss1 |")][:1]
    cells = [c.strip() for c in loss1.strip("|").split("|")]
    assert cells[2] == "3"  # three runs, one row
    assert cells[3] == "6.00 (3.00–9.00)"  # iperf3: the median of the runs' medians, every sample's range
    # rdmakit: the median of what moved (1.0, 6.0) and of each run's own ratio (0.25, 0.75), and the failure.
    assert cells[4] == "3.50 (0.50×; 0.25–0.75×); failed in 1 of 3: RETRY_EXC_ERR"
    assert cells[5] == "–"
