"""rdmakit runs on its declared dependencies: typing-only modules stay under ``TYPE_CHECKING``.

``typing_extensions`` comes with mypy, not with rdmakit; a module that needs it at
run time breaks on a machine (or the lab guest) that has only what rdmakit declares.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Modules a fresh install need not have: imported only for type checking.
TYPING_ONLY = ("typing_extensions",)

PROBE = """
import importlib, pkgutil, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is for type checking only")
        return None
sys.meta_path.insert(0, Refuse())
import rdmakit
for m in pkgutil.walk_packages(rdmakit.__path__, "rdmakit."):
    if m.name == "rdmakit.__main__" or m.name.startswith(
        (
            "rdmakit.testing.strategies", "rdmakit.verbs.device", "rdmakit.verbs.qp_modify",
            "rdmakit.verbs.cm", "rdmakit.verbs.pvcall", "rdmakit.verbs.srq", "rdmakit.conformance",
        )
    ):
        continue  # optional extras: hypothesis, pyverbs, scapy
    importlib.import_module(m.name)
print("ok")
"""


@pytest.mark.parametrize("blocked", [TYPING_ONLY])
def test_every_module_imports_without_typing_only_packages(blocked: tuple[str, ...]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(blocked=set(blocked))],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
