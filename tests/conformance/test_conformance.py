"""``rdmakit conformance`` against rdmakit's own soft engine, through the target agent in another process.

The suite builds its packets with scapy, not with ``rdmakit.wire``; these
tests check what it reports (table, JSON, JUnit, exit status), that it is
deterministic, that the agent's control channel refuses strangers, and
that it notices deliberate engine bugs (``tests.conformance.mutations``).
"""

import dataclasses
import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.agents import against, agent, conformance, results, write_secret
from tests.conformance.mutations import MUTATIONS

pytest.importorskip("scapy")

ROLES = {"requester", "responder", "cm"}  # the tester's role
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
    assert len(rows) >= 60
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
    assert len(listed) >= 60
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


@pytest.mark.parametrize(
    ("args", "status", "words"),
    [
        ((), 2, "give --self, or --target"),
        (("--seed", "x"), 2, "invalid int value"),
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


#: Each deliberate engine bug, and a case that must catch it.
CAUGHT_BY = {
    "no-atomic-replay": "resp.dup.fadd",
    "nak-61-for-sequence": "resp.psn.gap_nak",
    "no-rnr-nak": "resp.rnr.nak",
    "ignore-rnr-retry": "req.rnr.retry_exceeded",
    "no-implied-nak": "req.implied_nak.read",
    "accept-bad-middle": "resp.len.middle_short",
}


def test_every_mutation_has_a_catcher() -> None:
    assert set(CAUGHT_BY) == set(MUTATIONS)
    assert len(MUTATIONS) >= 6


@pytest.mark.parametrize("mutation", sorted(CAUGHT_BY))
def test_the_suite_catches_a_broken_engine(mutation: str, tmp_path: Path, new_ip: Callable[[], str]) -> None:
    secret = write_secret(tmp_path / "secret")
    with agent(new_ip(), secret, mutation=mutation) as a:
        p = against(a, new_ip(), "--json-out", "-")
    assert p.returncode != 0, f"{mutation}: every case passed"
    got = results(json.loads(p.stdout))
    assert got[CAUGHT_BY[mutation]] == "FAIL", (mutation, {k: v for k, v in got.items() if v != "PASS"})


def test_a_known_deviation_is_reported_as_such(tmp_path: Path, new_ip: Callable[[], str]) -> None:
    secret = write_secret(tmp_path / "secret")
    deviations = tmp_path / "dut.json"
    dut = "a DUT that NAKs sequence errors as invalid requests"
    deviations.write_text(json.dumps({"dut": dut, "deviations": [
        {"case": "resp.psn.gap_nak", "reason": "NAKs a PSN gap with code 1",
         "source": "IBTA Vol. 1 §9.7.5.2.1 (what it should do)"},
    ]}))  # fmt: skip
    with agent(new_ip(), secret, mutation="nak-61-for-sequence") as a:
        p = against(a, new_ip(), "-k", "resp.psn.gap_nak", "-k", "resp.send.only", "--deviations",
                    str(deviations), "--json-out", "-")  # fmt: skip
    doc = json.loads(p.stdout)
    assert results(doc) == {"resp.psn.gap_nak": "KNOWN-DEVIATION", "resp.send.only": "PASS"}
    assert p.returncode == 0
    (row,) = (r for r in doc["results"] if r["id"] == "resp.psn.gap_nak")
    assert "NAKs a PSN gap with code 1" in row["detail"]
    assert "IBTA" in row["detail"]
