"""``rdmakit.testing`` ships like ``trio.testing``: optional dependencies stay optional."""

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_strategies_without_hypothesis_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # None in sys.modules: the import fails
    monkeypatch.delitem(sys.modules, "rdmakit.testing.strategies", raising=False)
    with pytest.raises(ImportError, match=r"needs hypothesis.*pip install 'rdmakit\[testing\]'"):
        importlib.import_module("rdmakit.testing.strategies")


def test_the_package_imports_none_of_its_modules() -> None:
    code = (
        "import sys, rdmakit.testing\n"
        "print(sorted(m for m in sys.modules if m.startswith('rdmakit.testing.') or m == 'hypothesis'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_hypothesis_is_in_the_testing_and_dev_extras() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("hypothesis") for req in extras["testing"])
    assert any("testing" in req for req in extras["dev"] if req.startswith("rdmakit["))
