"""``rdmakit conformance`` over IPv6 (RoCEv2 Annex A17.4), in a network namespace of its own.

The tester and the soft DUT each need an IPv6 address with UDP port 4791 of
its own, and the host has only ::1: the tests make a namespace whose loopback
carries two more (root; skipped, with the reason, where IPv6 is unavailable).
"""

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.agents import (
    against,
    agent,
    conformance,
    ipv6_namespace,
    results,
    spawned,
    write_secret,
)
from tests.conformance.mutations import MUTATIONS
from tests.conformance.test_conformance import MINIMAL_AGENT, caught

pytest.importorskip("scapy")

TESTER, DUT = "fd6c::1", "fd6c::2"
IP6_CASES = {"req.ip6.header", "resp.ip6.header", "resp.ip6.masked_fields", "resp.ip6.unmasked_icrc"}


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    if not os.path.exists("/proc/net/if_inet6"):
        pytest.skip("IPv6 is unavailable on this host (no /proc/net/if_inet6)")
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network namespace with two IPv6 addresses needs root and iproute2")
    with ipv6_namespace(TESTER, DUT) as name:
        yield name


def test_self_over_ipv6_passes_every_case(netns: str) -> None:
    """The whole suite over IPv6: every case PASSES (the Annex A17.4 ones too) or is SKIPPED with a reason."""
    p = conformance("--self", "--tester-ip", TESTER, "--dut-ip", DUT, "--json-out", "-", netns=netns)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert (doc["tester_ip"], doc["dut_ip"]) == (TESTER, DUT)
    assert doc["icrc_check"].startswith("IPv6 header"), doc["icrc_check"]
    got = results(doc)
    assert len(got) >= 160
    assert {c: got[c] for c in IP6_CASES} == dict.fromkeys(IP6_CASES, "PASS")
    assert {r["result"] for r in doc["results"]} <= {"PASS", "SKIPPED"}, {
        r["id"]: r["detail"] for r in doc["results"] if r["result"] not in ("PASS", "SKIPPED")
    }
    for r in doc["results"]:
        if r["result"] == "SKIPPED":
            assert r["detail"], r
            assert "IPv4" not in r["detail"], r
        else:  # every packet the DUT sent had its ICRC checked against its IPv6 header
            assert r["icrc_check"] in ("", "ipv6-header"), r


def test_ipv6_cases_on_the_pure_python_data_plane(netns: str) -> None:
    env_only = ("-k", "ip6", "-k", "resp.write.multi", "-k", "req.read.resp", "-k", "cm.req.rep_rtu")
    old = os.environ.get("RDMAKIT_PURE_PYTHON")
    os.environ["RDMAKIT_PURE_PYTHON"] = "1"
    try:
        p = conformance("--self", "--tester-ip", TESTER, "--dut-ip", DUT, *env_only, "--json-out", "-",
                        netns=netns)  # fmt: skip
    finally:
        if old is None:
            del os.environ["RDMAKIT_PURE_PYTHON"]
        else:
            os.environ["RDMAKIT_PURE_PYTHON"] = old
    assert p.returncode == 0, p.stderr[-3000:]
    got = results(json.loads(p.stdout))
    assert set(got.values()) == {"PASS"}, got
    assert set(got) >= IP6_CASES, got


def test_the_ipv6_cases_skip_on_ipv4() -> None:
    p = conformance("--self", "-k", "ip6", "--json-out", "-")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["results"]
    assert {r["id"] for r in rows} == IP6_CASES
    assert all(r["result"] == "SKIPPED" and "IPv4" in r["detail"] for r in rows), rows


V6_MUTANTS = sorted(n for n, m in MUTATIONS.items() if m.ipv6)


def test_some_mutants_only_ipv6_catches() -> None:
    assert V6_MUTANTS


@pytest.mark.parametrize("mutation", V6_MUTANTS)
def test_the_suite_over_ipv6_catches_a_broken_engine(mutation: str, netns: str, tmp_path: Path) -> None:
    caught(mutation, write_secret(tmp_path / "secret"), DUT, TESTER, netns)


@pytest.mark.parametrize("mutation", V6_MUTANTS)
def test_ipv4_does_not_catch_an_ipv6_mutant(mutation: str, tmp_path: Path, new_ip: "object") -> None:
    """The same agent over IPv4 passes what it fails over IPv6: the bug lives in the IPv6 path only."""
    secret = write_secret(tmp_path / "secret")
    only = ("-k", "resp.write.only", "-k", "req.send.ack", "-k", "resp.hdr.bad_icrc", "-k", "cm.req.rep_rtu")
    with agent(new_ip(), secret, mutation=mutation) as a:  # type: ignore[operator]
        p = against(a, new_ip(), *only, "--json-out", "-")  # type: ignore[operator]
    assert p.returncode == 0, p.stderr[-2000:]
    assert set(results(json.loads(p.stdout)).values()) == {"PASS"}


def test_the_minimal_agent_over_ipv6(netns: str, tmp_path: Path) -> None:
    """scripts/conformance-agent-minimal.py, written from the protocol document, serves an IPv6 DUT."""
    secret = write_secret(tmp_path / "secret")
    cmd = ["ip", "netns", "exec", netns, sys.executable, str(MINIMAL_AGENT), DUT, str(secret)]
    cases = ("resp.send.only", "resp.read.only", "req.send.ack", "resp.ip6.header", "req.ip6.header")
    with spawned(cmd, DUT, secret) as a:
        p = against(a, TESTER, *(arg for c in cases for arg in ("-k", c)), "--json-out", "-", netns=netns)
    assert results(json.loads(p.stdout)) == dict.fromkeys(cases, "PASS"), p.stdout
