"""``rdmakit conformance`` against the guest's kernel rxe, both roles.

The target agent runs in the guest on rxe0 through the verbs backend; the
tester runs on the host side of the lab network (10.77.0.1) with a raw
socket, so it checks every ICRC rxe sends against the IPv4 header it came
with. Each case must PASS, be SKIPPED with a reason, or fail as a known rxe
deviation listed, with its source, in ``rdmakit/conformance/deviations/rxe.json``.
The results are kept in ``build/conformance/rxe.json`` for
``scripts/conformance-matrix.py``, which writes ``docs/conformance.md``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.lab.labvm import GUEST_ADDR, GUEST_SHARE, HOST_ADDR, REPO, LabGuest, booted, lab_marks

INSTANCE = "conformance-" + os.environ.get("PYTEST_XDIST_WORKER", "main")
GUEST_PYTHON = ("env", "-u", "PYTHONPYCACHEPREFIX", "python3")
DEVIATIONS = REPO / "rdmakit" / "conformance" / "deviations" / "rxe.json"
OUT = REPO / "build" / "conformance"
PORT = 18990

pytestmark = lab_marks(2400)


@pytest.fixture(scope="module")
def guest() -> Iterator[LabGuest]:
    with booted(INSTANCE, tap_queue=16384, rdma_cm=True) as g:
        yield g


def test_the_suite_against_kernel_rxe(guest: LabGuest) -> None:
    secret = guest.share / "conformance.secret"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    job = guest.start(
        *GUEST_PYTHON, "-m", "rdmakit", "conformance-target", "-d", "rxe0",
        "--listen", f"tcp:{GUEST_ADDR}:{PORT}", "--secret-file", str(GUEST_SHARE / secret.name), "--once",
        timeout=2000,
    )  # fmt: skip
    out = guest.share / "rxe.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        p = subprocess.run(
            guest.host_command(
                sys.executable, "-m", "rdmakit", "conformance", "--target", f"tcp:{GUEST_ADDR}:{PORT}",
                "--dut-ip", GUEST_ADDR, "--tester-ip", HOST_ADDR, "--secret-file", str(secret),
                "--connect-timeout", "120", "--deviations", str(DEVIATIONS), "--json-out", str(out),
            ),
            capture_output=True, text=True, timeout=2000, env=env, check=False,
        )  # fmt: skip
    finally:
        guest.kill(job)
    g = guest.wait(job, timeout=60)
    report = f"--- tester\n{p.stdout}\n{p.stderr[-4000:]}\n--- agent\n{g.stdout[-3000:]}\n{g.stderr[-3000:]}"
    assert out.is_file(), report
    doc = json.loads(out.read_text())
    doc["kernel"] = guest.ready().get("KERNEL", "?")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "rxe.json").write_text(json.dumps(doc, indent=1) + "\n")
    failed = {r["id"]: r["detail"] for r in doc["results"] if r["result"] == "FAIL"}
    assert not failed, report
    assert p.returncode == 0, report
    assert doc["icrc_check"].startswith("raw socket"), doc["icrc_check"]
    assert len(doc["results"]) >= 60
