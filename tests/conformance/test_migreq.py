"""MigReq against the path migration state an agent reports (IBTA Vol. 1 §17.2.8).

rdmakit's engine has no APM state machine: its agent reports no state and the
``*.migreq_state`` cases are SKIPPED (``test_conformance.py``). Here the soft
agent is made to report one, as a verbs agent does from ``ibv_query_qp``: the
engine keeps sending MigReq 0, which is right for Rearm and Armed and wrong
for Migrated.
"""

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conformance.agents import against, results, spawned, write_secret

pytest.importorskip("scapy")

CASES = ("req.hdr.migreq_state", "resp.hdr.migreq_state")
AGENT = (
    "import sys; from rdmakit.conformance import target as t; o = t.SoftTarget._dev_stats; "
    "t.SoftTarget._dev_stats = lambda self, qp: {{**o(self, qp), 'path_mig_state': {state!r}}}; "
    "from rdmakit.cli.main import main; sys.exit(main(['conformance-target', *sys.argv[1:]]))"
)


@pytest.mark.parametrize(("state", "want"), [("MIGRATED", "FAIL"), ("REARM", "PASS"), ("ARMED", "PASS"),
                                             ("SIDEWAYS", "FAIL")])  # fmt: skip
def test_migreq_follows_the_reported_state(
    state: str, want: str, tmp_path: Path, new_ip: Callable[[], str]
) -> None:
    secret = write_secret(tmp_path / "secret")
    dut = new_ip()
    cmd = [sys.executable, "-c", AGENT.format(state=state), "-d", f"soft-udp:{dut}", "--listen",
           "tcp:127.0.0.1:0", "--secret-file", str(secret), "--once"]  # fmt: skip
    with spawned(cmd, dut, secret) as a:
        p = against(a, new_ip(), *(arg for c in CASES for arg in ("-k", c)), "--json-out", "-")
    assert results(json.loads(p.stdout)) == dict.fromkeys(CASES, want), p.stdout
    assert p.returncode == (1 if want == "FAIL" else 0)
