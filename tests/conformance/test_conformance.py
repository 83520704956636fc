"""``rdmakit conformance`` against rdmakit's own soft engine, through the target agent in another process.

The suite builds its packets with scapy, not with ``rdmakit.wire``; these
tests check what it reports (table, JSON, JUnit, exit status), that it is
deterministic, that the agent's control channel refuses strangers, and
that it notices deliberate engine bugs (``tests.conformance.mutations``).
"""

import dataclasses
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.agents import against, agent, conformance, results, spawned, write_secret
from tests.conformance.mutations import MUTATIONS

pytest.importorskip("scapy")

ROLES = {"requester", "responder", "cm"}  # the DUT's role
OUTCOMES = {"PASS", "FAIL", "KNOWN-DEVIATION", "SKIPPED"}


@pytest.fixture(scope="module")
def self_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], ET.Element, str]:
    d = tmp_path_factory.mktemp("conformance")
    p = conformance("--self", "--junit", str(d / "junit.xml"), "--json-out", str(d / "out.json"))
    doc = json.loads((d / "out.json").read_text())
    return p.returncode, doc, ET.parse(d / "junit.xml").getroot(), p.stdout


def test_self_passes_every_case_in_both_roles(self_run: tuple[int, dict[str, Any], ET.Element, str]) -> None:
    status, doc, _junit, out = self_run
    assert status == 0, out
    rows = doc["results"]
    assert len(rows) >= 150
    assert {r["role"] for r in rows} == ROLES
    for r in rows:
        assert all(r[k] for k in ("id", "purpose", "follows", "expect")), r
        assert r["result"] in ("PASS", "SKIPPED"), (r["id"], r["result"], r["detail"])
        if r["result"] == "SKIPPED":
            assert r["detail"], r  # with the reason
    assert len({r["id"] for r in rows}) == len(rows)
    assert doc["icrc_check"]  # the report says how ICRCs were checked
    assert "PASS" in out.splitlines()[-1]  # the table's summary line


def test_junit_matches_the_json(self_run: tuple[int, dict[str, Any], ET.Element, str]) -> None:
    _status, doc, junit, _out = self_run
    cases = junit.findall(".//testcase")
    assert [c.get("name") for c in cases] == [r["id"] for r in doc["results"]]
    assert not junit.findall(".//failure")
    for c, r in zip(cases, doc["results"], strict=True):
        props = {e.get("name"): e.get("value") for e in c.iter("property")}
        assert props == {"conformance.result": r["result"], "conformance.dut_role": r["role"]}, props
    skipped = {c.get("name") for c in cases if c.find("skipped") is not None}
    assert skipped == {r["id"] for r in doc["results"] if r["result"] == "SKIPPED"}


def test_another_seed_gives_the_same_results(
    self_run: tuple[int, dict[str, Any], ET.Element, str], tmp_path: Path
) -> None:
    _status, doc, _junit, _out = self_run
    p = conformance("--self", "--seed", "987654321", "--json-out", "-")
    assert p.returncode == 0, p.stderr
    assert results(json.loads(p.stdout)) == results(doc)


def test_list_plain_and_as_json() -> None:
    p = conformance("--list", "--json-out", "-")
    assert p.returncode == 0
    listed = json.loads(p.stdout)
    assert len(listed) >= 150
    for c in listed:
        assert set(c) == {"id", "role", "purpose", "follows", "expect"}
        assert c["role"] in ROLES
    plain = conformance("--list")
    assert plain.returncode == 0
    assert [line.split()[0] for line in plain.stdout.splitlines()] == [c["id"] for c in listed]
    only = conformance("--list", "--json-out", "-", "-k", "resp.dup.", "-k", "req.rnr.*")
    ids = [c["id"] for c in json.loads(only.stdout)]
    assert ids
    assert all(i.startswith(("resp.dup.", "req.rnr.")) for i in ids)


def test_list_without_scapy() -> None:
    """Listing the cases imports no scapy; running them says what to install, in one line."""
    block = (
        "import sys; sys.modules['scapy'] = None; from rdmakit.cli.main import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    listed = subprocess.run([sys.executable, "-c", block, "conformance", "--list"], capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) >= 150
    run = subprocess.run([sys.executable, "-c", block, "conformance", "--self"], capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert run.returncode == 1
    assert "pip install 'rdmakit[conformance]'" in run.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "status", "words"),
    [
        ((), 2, "give --self, or --target"),
        (("--seed", "x"), 2, "invalid int value"),
        (("--self", "--tester-ip", "fd6c::1"), 2, "both --tester-ip and --dut-ip, or neither"),
        (("--self", "--tester-ip", "fd6c::1", "--dut-ip", "127.0.0.1"), 2, "two addresses of one IP version"),
        (("--self", "--tester-ip", "fd6c::1", "--dut-ip", "fd6c::1"), 2, "two addresses of one IP version"),
        (("--self", "--tester-ip", "fd6c::1", "--dut-ip", "nowhere"), 2, "does not appear to be an IPv4"),
        (("--self", "--deviations", "/nonexistent/dev.json"), 1, "deviations file"),
        (("--target", "tcp:127.0.0.1:1", "--dut-ip", "127.0.0.1", "--tester-ip", "127.0.0.1",
          "--connect-timeout", "2"), 1, "rdmakit conformance:"),
    ],
)  # fmt: skip
def test_bad_arguments_give_one_line(args: tuple[str, ...], status: int, words: str) -> None:
    p = conformance(*args)
    assert p.returncode == status, p.stderr
    assert "Traceback" not in p.stderr
    assert words in p.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe not json",
        b"[1, 2]",
        b'{"deviations": [{"case": "resp.send.only", "reason": "no source"}]}',
        b'{"deviations": ["resp.send.only"]}',
        b'{"deviations": 5}',
        b"[" * 100_000,
        b" " * (2 << 20),
    ],
    ids=["garbage", "list", "no-source", "not-objects", "not-a-list", "deep", "huge"],
)
def test_hostile_deviations_files_are_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "dev.json"
    path.write_bytes(content)
    p = conformance("--self", "-k", "resp.send.only", "--deviations", str(path))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("rdmakit conformance: deviations file")


def test_a_fifo_as_deviations_file_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    p = conformance("--self", "-k", "resp.send.only", "--deviations", str(tmp_path / "fifo"), timeout=60)
    assert p.returncode == 1
    assert "not a regular file" in p.stderr


# -- against agents started here: wrong secrets, known deviations, mutations ----------------


MINIMAL_AGENT = Path(__file__).resolve().parents[2] / "scripts" / "conformance-agent-minimal.py"


def test_the_protocol_document_is_enough_for_an_agent(tmp_path: Path, new_ip: Callable[[], str]) -> None:
    """scripts/conformance-agent-minimal.py speaks the control protocol from docs/conformance-agent.md
    with the standard library alone; the suite drives it in both roles."""
    secret = write_secret(tmp_path / "secret")
    dut = new_ip()
    with spawned([sys.executable, str(MINIMAL_AGENT), dut, str(secret)], dut, secret) as a:
        cases = ("resp.send.only", "resp.write.multi", "resp.read.only", "resp.dup.fadd", "req.send.ack",
                 "req.read.resp", "req.nak.remote_access")  # fmt: skip
        p = against(a, new_ip(), *(arg for c in cases for arg in ("-k", c)), "--json-out", "-")
    got = results(json.loads(p.stdout))
    assert got == dict.fromkeys(cases, "PASS"), got
    assert p.returncode == 0


@pytest.mark.parametrize(
    ("args", "words"),
    [(("--port", "2"), "port 1 and GID index 0"), (("--gid-index", "300"), "outside [0, 255]")],
)
def test_target_port_and_gid_index(args: tuple[str, ...], words: str, new_ip: Callable[[], str]) -> None:
    p = subprocess.run([sys.executable, "-m", "rdmakit", "conformance-target", "-d", f"soft-udp:{new_ip()}",
                        *args], capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert p.returncode in (1, 2), p.stderr
    assert words in p.stderr.strip().splitlines()[-1]


def test_the_agent_refuses_a_tester_without_its_secret(tmp_path: Path, new_ip: Callable[[], str]) -> None:
    right = write_secret(tmp_path / "right")
    wrong = write_secret(tmp_path / "wrong")
    with agent(new_ip(), right) as a:
        p = against(dataclasses.replace(a, secret_file=wrong), new_ip(), "-k", "resp.send.only")
        assert p.returncode == 1, p.stdout
        assert p.stderr.strip().splitlines()[-1].startswith("rdmakit conformance: control channel")
        # The agent survives and serves the tester that has the secret.
        good = against(a, new_ip(), "-k", "resp.send.only", "--json-out", "-")
        assert good.returncode == 0, good.stderr
        assert results(json.loads(good.stdout)) == {"resp.send.only": "PASS"}


#: What the catalogue must reach: each topic and mutants that plant a bug in it.
TOPICS = {
    "mid-range duplicate READ (C9-107)": ("dup-read-from-start", "dup-read-closes-message"),
    "the responder after an error (§10.3.1)": ("no-error-state", "err-flush-forgets-receives"),
    "exact retry accounting and timers (§9.9.3.1.2, C9-140)": ("retry-cnt-plus-one", "timeout-eight-times"),
    "go-back-N inside messages (§9.7.5.2.1)": ("gap-aborts-message", "retry-whole-message"),
    "initiator depth (§9.7.5.2.2)": ("max-rd-atomic-ignored", "rd-resources-never-freed"),
    "AckReq before the LAST (§9.7.5.1.1)": ("ackreq-ignored-before-last", "no-periodic-ackreq"),
    "the AETH's MSN and credits (§9.7.5.1, §9.7.7.2)": (
        "nak-msn-zero",
        "credits-count-the-used-wqe",
        "credits-ignored",
    ),
    "R_Key and VA bounds (§9.7.5.2.4)": ("range-end-off-by-one", "range-wraps-64"),
    "the format of requests (§9.2, §9.3.3)": (
        "reth-length-of-first-packet",
        "pad-bytes-not-zero",
        "se-never-set",
        "migreq-on-resend",
    ),
    "Annex A17 at the IP/UDP layer": ("sport-alternates", "icrc-not-checked", "icrc-v6-hop-limit-covered"),
}
AREAS = {"responder", "requester", "completer", "qp", "memory", "codec", "cm"}


def test_the_mutation_catalogue_spans_the_stack() -> None:
    assert len(MUTATIONS) >= 40
    assert {m.area for m in MUTATIONS.values()} == AREAS
    for topic, names in TOPICS.items():
        assert set(names) <= set(MUTATIONS), topic
    listed = {c["id"] for c in json.loads(conformance("--list", "--json-out", "-").stdout)}
    for name, m in MUTATIONS.items():
        assert m.catch, name
        assert set(m.catch) <= listed, name


def caught(mutation: str, secret: Path, dut_ip: str, tester_ip: str, netns: str | None = None) -> None:
    """The suite, run on the cases that should notice, FAILs against an agent with the bug planted."""
    m = MUTATIONS[mutation]
    only = [arg for c in m.catch for arg in ("-k", c)]
    with agent(dut_ip, secret, mutation=mutation, netns=netns) as a:
        p = against(a, tester_ip, *only, "--json-out", "-", netns=netns)
    assert p.stdout, f"{mutation}: no report: {p.stderr[-2000:]}"
    got = results(json.loads(p.stdout))
    assert p.returncode != 0, f"{mutation} survived: {got}"
    assert any(got[c] == "FAIL" for c in m.catch), (mutation, {k: v for k, v in got.items() if v != "PASS"})


@pytest.mark.parametrize("mutation", sorted(n for n, m in MUTATIONS.items() if not m.ipv6))
def test_the_suite_catches_a_broken_engine(mutation: str, tmp_path: Path, new_ip: Callable[[], str]) -> None:
    """Every mutant but those only IPv6 can catch (``test_ipv6.py`` runs those), over IPv4."""
    caught(mutation, write_secret(tmp_path / "secret"), new_ip(), new_ip())


def test_a_known_deviation_is_reported_as_such(tmp_path: Path, new_ip: Callable[[], str]) -> None:
    secret = write_secret(tmp_path / "secret")
    deviations = tmp_path / "dut.json"
    dut = "a DUT that NAKs sequence errors as invalid requests"
    deviations.write_text(json.dumps({"dut": dut, "deviations": [
        {"case": "resp.psn.gap_nak", "reason": "NAKs a PSN gap with code 1",
         "source": "IBTA Vol. 1 §9.7.5.2.1 (what it should do)"},
    ]}))  # fmt: skip
    junit = tmp_path / "junit.xml"
    with agent(new_ip(), secret, mutation="nak-61-for-sequence") as a:
        p = against(a, new_ip(), "-k", "resp.psn.gap_nak", "-k", "resp.send.only", "--deviations",
                    str(deviations), "--json-out", "-", "--junit", str(junit))  # fmt: skip
    doc = json.loads(p.stdout)
    # JUnit keeps it visible: a property and a line of output, beside the skip.
    (tc,) = (t for t in ET.parse(junit).getroot().iter("testcase") if t.get("name") == "resp.psn.gap_nak")
    props = {e.get("name"): e.get("value") for e in tc.iter("property")}
    assert props["conformance.result"] == "KNOWN-DEVIATION"
    assert props["conformance.dut_role"] == "responder"
    assert "NAKs a PSN gap with code 1" in str(props["conformance.deviation"])
    assert "KNOWN-DEVIATION: NAKs a PSN gap" in (tc.findtext("system-out") or "")
    assert results(doc) == {"resp.psn.gap_nak": "KNOWN-DEVIATION", "resp.send.only": "PASS"}
    assert p.returncode == 0
    (row,) = (r for r in doc["results"] if r["id"] == "resp.psn.gap_nak")
    assert "NAKs a PSN gap with code 1" in row["detail"]
    assert "IBTA" in row["detail"]
