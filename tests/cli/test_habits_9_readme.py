"""README.md says what is true today: its quoted commands parse (the cheap ones run), its demo table
has the shape the demo prints, its counts are the suite's, and its sweep figures are generated."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rdmakit.cli.main import _parser_of, build_parser
from rdmakit.cli.perftest_params import build_parser as perftest_parser
from tests.cli.cli_util import run_once

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PROMPT = re.compile(r"^(?:[a-z]*[$#]) (rdmakit .*)$")
#: Cheap quoted commands run for real (the others need a peer, a NIC or minutes).
RUN = ("rdmakit conformance --list -k resp.rnr",)


def quoted_commands() -> list[str]:
    """Every ``rdmakit …`` command typed at a prompt in README's console blocks (continuations joined)."""
    cmds = []
    for block in re.findall(r"```console\n(.*?)```", README, re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            m = PROMPT.match(line.strip())
            if m:
                cmds.append(m.group(1).split("  #")[0].strip())
    return cmds


def test_readme_quotes_commands() -> None:
    assert len(quoted_commands()) >= 10


@pytest.mark.parametrize("command", quoted_commands())
def test_a_quoted_command_parses(command: str) -> None:
    argv = shlex.split(command)[1:]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    assert extra == [], f"{command}: {extra} unknown to {_parser_of(parser, args.command).prog}"
    if args.command == "perftest":
        perftest_parser(args.test).parse_args(args.args)


@pytest.mark.parametrize("command", RUN)
def test_a_cheap_quoted_command_runs(command: str) -> None:
    assert command in quoted_commands()
    rc, out, err = run_once(*shlex.split(command)[1:], timeout=120)
    assert rc == 0, err
    assert out


def test_the_conformance_counts_are_the_suites() -> None:
    rc, out, _ = run_once("conformance", "--list", timeout=120)
    assert rc == 0
    n = len(out.splitlines())
    assert f"{n} cases" in README
    assert "every case passes" not in README


def test_the_demo_table_has_the_demos_shape() -> None:
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme-figures.py"), "--check"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_sweep_figures_are_generated_or_marked_stale() -> None:
    """The sweep's sentence is the script's, or says the plot is stale; never the old quoted figures."""
    m = re.search(r"<!-- sweep-figures -->\n(.*?)\n<!-- /sweep-figures -->", README, re.S)
    assert m is not None
    text = " ".join(m.group(1).split())
    assert text.startswith(("In that sweep the WRITE round trip is ", "The plot above predates"))
    assert "75–100" not in README


def test_readme_says_why_127_0_0_2_works() -> None:
    assert (
        "every address in it\nis this machine's" in README
        or "every address in it is this machine's" in README
    )
    assert "Linux routes all of 127.0.0.0/8 to lo" in " ".join(README.split())
