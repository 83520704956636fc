"""``rdmakit conformance`` against the guest's kernel rxe, both roles.

The target agent runs in the guest on rxe0 through the verbs backend; the
tester runs on the host side of the lab network (10.77.0.1) with a raw
socket, so it checks every ICRC rxe sends against the IPv4 header it came
with. Then the same over IPv6 (RoCEv2 Annex A17.4): both ends get a global
IPv6 address, rxe adds a RoCE v2 GID for the guest's, and the agent uses
that GID (``--gid-index``). Each case must PASS, be SKIPPED with a reason, or
fail as a known rxe deviation listed, with its source, in
``rdmakit/conformance/deviations/rxe.json``. The results are kept in
``build/conformance/rxe.json`` and ``rxe-ipv6.json`` for
``scripts/conformance-matrix.py``, which writes ``docs/conformance.md``.

The guest is an emulated machine on a shared host: the control channel's
handshake and connection get 120 s (``--handshake-timeout``,
``--connect-timeout``) instead of 5 and 10, so a slow start is not taken for
a stranger. The cases' own waits are the suite's; a case that fails here
fails the test.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.lab.labvm import GUEST_ADDR, GUEST_SHARE, HOST_ADDR, REPO, LabGuest, booted, lab_marks

INSTANCE = "conformance-" + os.environ.get("PYTEST_XDIST_WORKER", "main")
GUEST_PYTHON = ("env", "-u", "PYTHONPYCACHEPREFIX", "python3")
DEVIATIONS = REPO / "rdmakit" / "conformance" / "deviations" / "rxe.json"
OUT = REPO / "build" / "conformance"
PORT = 18990
HOST_ADDR6, GUEST_ADDR6 = "fd77::1", "fd77::2"
SLOW = "120"  # seconds for the control channel's connection and handshake to an emulated guest

pytestmark = lab_marks(2400)


@pytest.fixture(scope="module")
def guest() -> Iterator[LabGuest]:
    with booted(INSTANCE, tap_queue=16384, rdma_cm=True) as g:
        yield g


def _run(guest: LabGuest, name: str, dut: str, tester: str, port: int, *agent_args: str) -> dict[str, Any]:
    """The whole suite against an agent on rxe0 (`agent_args`), as a tester at `tester`; its report,
    kept as ``build/conformance/NAME.json``."""
    secret = guest.share / "conformance.secret"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    job = guest.start(
        *GUEST_PYTHON, "-m", "rdmakit", "conformance-target", "-d", "rxe0", *agent_args,
        "--listen", f"tcp:{GUEST_ADDR}:{port}", "--secret-file", str(GUEST_SHARE / secret.name), "--once",
        "--handshake-timeout", SLOW, timeout=2000,
    )  # fmt: skip
    out = guest.share / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        p = subprocess.run(
            guest.host_command(
                sys.executable, "-m", "rdmakit", "conformance", "--target", f"tcp:{GUEST_ADDR}:{port}",
                "--dut-ip", dut, "--tester-ip", tester, "--secret-file", str(secret),
                "--connect-timeout", SLOW, "--deviations", str(DEVIATIONS), "--json-out", str(out),
            ),
            capture_output=True, text=True, timeout=2000, env=env, check=False,
        )  # fmt: skip
    finally:
        guest.kill(job)
    g = guest.wait(job, timeout=60)
    report = f"--- tester\n{p.stdout}\n{p.stderr[-4000:]}\n--- agent\n{g.stdout[-3000:]}\n{g.stderr[-3000:]}"
    assert out.is_file(), report
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["kernel"] = guest.ready().get("KERNEL", "?")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    failed = {r["id"]: r["detail"] for r in doc["results"] if r["result"] == "FAIL"}
    assert not failed, report
    assert p.returncode == 0, report
    assert len(doc["results"]) >= 160
    return doc


def test_the_suite_against_kernel_rxe(guest: LabGuest) -> None:
    doc = _run(guest, "rxe", GUEST_ADDR, HOST_ADDR, PORT)
    assert doc["icrc_check"].startswith("raw socket"), doc["icrc_check"]


def _ipv6_gid(guest: LabGuest) -> int:
    """Give both ends of the lab link a global IPv6 address; the index of rxe0's RoCE v2 GID for the
    guest's (rxe adds one per address of its netdev)."""
    host = guest.host_command("sh", "-c", "sysctl -qw net.ipv6.conf.lab0h.disable_ipv6=0 && "
                              f"ip addr add {HOST_ADDR6}/64 dev lab0h nodad")  # fmt: skip
    subprocess.run(host, check=True, capture_output=True, timeout=30)
    nic = guest.ready()["NIC"]
    ports = "/sys/class/infiniband/rxe0/ports/1"
    find = (
        f"sysctl -qw net.ipv6.conf.{nic}.disable_ipv6=0; "
        f"ip addr add {GUEST_ADDR6}/64 dev {nic} nodad || exit 1; "
        f"for _ in $(seq 100); do for g in {ports}/gids/*; do i=${{g##*/}}; "
        f'[ "$(cat $g 2>/dev/null)" = fd77:0000:0000:0000:0000:0000:0000:0002 ] && '
        f'[ "$(cat {ports}/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && {{ echo $i; exit 0; }}; '
        "done; sleep 0.1; done; exit 1"
    )
    r = guest.run("sh", "-c", find, timeout=120)
    assert r.returncode == 0, f"rxe0 has no RoCE v2 GID for {GUEST_ADDR6}: {r.stdout}{r.stderr}"
    return int(r.stdout.split()[-1])


def test_the_suite_against_kernel_rxe_over_ipv6(guest: LabGuest) -> None:
    index = _ipv6_gid(guest)
    doc = _run(guest, "rxe-ipv6", GUEST_ADDR6, HOST_ADDR6, PORT + 1, "--gid-index", str(index))
    assert doc["icrc_check"].startswith("IPv6 header"), doc["icrc_check"]
    ip6 = {r["id"]: r["result"] for r in doc["results"] if ".ip6." in r["id"]}
    assert ip6, doc["results"]
    assert set(ip6.values()) <= {"PASS", "KNOWN-DEVIATION"}, ip6
