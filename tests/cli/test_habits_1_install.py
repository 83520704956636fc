"""README's two commands work where ``pip install`` outside a virtual environment is refused.

Debian and Ubuntu mark their Python externally managed (PEP 668), so both
commands must make and enter a virtual environment first; CI extracts the
test command from README.md (``.ci/run``) and runs the install-and-demo one
from a bare python3 (``scripts/fresh-install-check.sh``).
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The pattern .ci/run and scripts/fresh-install-check.sh find the test command by.
CI_TEST_CMD = re.compile(r"^python3 -m venv .*pip install .*pytest.*$", re.M)
DEMO_CMD = re.compile(r"^python3 -m venv .*pip install .*rdmakit demo$", re.M)


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line for b in blocks for line in b.splitlines() if "pip install" in line]


def test_both_commands_make_and_enter_a_virtual_environment() -> None:
    cmds = _commands()
    install = [c for c in cmds if c.endswith("rdmakit demo")]
    tests = [c for c in cmds if "pytest" in c]
    assert install, cmds
    assert tests, cmds
    for c in (install[0], tests[0]):
        assert c.startswith("python3 -m venv .venv && . .venv/bin/activate && python3 -m pip install -e "), c


def test_ci_finds_and_runs_the_readme_commands() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    text = (ROOT / "README.md").read_text()
    grep = re.search(r"grep -m1 -E '([^']+)' README.md", ci)
    assert grep is not None
    found = subprocess.run(
        ["grep", "-m1", "-E", grep.group(1), "README.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    assert found == CI_TEST_CMD.search(text).group(0)  # type: ignore[union-attr]
    assert "bash scripts/fresh-install-check.sh" in ci
    script = (ROOT / "scripts" / "fresh-install-check.sh").read_text()
    assert DEMO_CMD.search(text) is not None
    assert "-u PYTHONPATH" in script
    assert "PYTHONNOUSERSITE=1" in script
