"""From the directory that holds a clone named ``rdmakit``, every program still starts.

There the current directory, first on ``sys.path``, holds a folder
``rdmakit`` (the clone, no ``__init__.py``): an empty namespace package that
shadows a package installed in editable mode (found by a finder placed after
the path finder, as setuptools' editable installs do). The test builds that
layout: a symlink named ``rdmakit`` to this source tree, and a
``sitecustomize`` that installs such a finder for it.
"""

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import rdmakit

SOURCE = Path(rdmakit.__file__).resolve().parent.parent

FINDER = textwrap.dedent(
    """
    import sys
    from importlib.machinery import PathFinder
    from importlib.util import spec_from_file_location

    PACKAGE = {package!r}

    class EditableFinder:
        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            if fullname == "rdmakit":
                return spec_from_file_location(fullname, PACKAGE + "/__init__.py")
            parent, _, _ = fullname.rpartition(".")
            if parent == "rdmakit":
                return PathFinder.find_spec(fullname, path=[PACKAGE])
            return None

    sys.meta_path.insert(sys.meta_path.index(PathFinder) + 1, EditableFinder)
    """
)


@pytest.fixture
def clone_parent(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A directory holding ``rdmakit`` (this source tree) and the environment of an editable install."""
    (tmp_path / "rdmakit").symlink_to(SOURCE)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FINDER.format(package=str(SOURCE / "rdmakit")))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "rdmakit"  # what pip writes for the console script
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom rdmakit.cli.main import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHONPATH": str(site), "PYTHON": sys.executable}
    return tmp_path, env


def start(cmd: list[str], where: tuple[Path, dict[str, str]]) -> subprocess.CompletedProcess[str]:
    cwd, env = where
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_python_m_rdmakit(clone_parent: tuple[Path, dict[str, str]]) -> None:
    p = start([sys.executable, "-m", "rdmakit", "--help"], clone_parent)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: rdmakit")


def test_a_tools_wrapper(clone_parent: tuple[Path, dict[str, str]]) -> None:
    p = start(["rdmakit/tools/rdma_write_requester", "--help"], clone_parent)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: rdmakit rdma-write-requester")


def test_bench_and_its_far_side(clone_parent: tuple[Path, dict[str, str]], new_ip: Callable[[], str]) -> None:
    cmd = [str(clone_parent[0] / "bin" / "rdmakit"), "bench", "--runs", "1", "--total", "8", "--pings", "50"]
    p = start([*cmd, "--ip-a", new_ip(), "--ip-b", new_ip()], clone_parent)
    assert p.returncode == 0, p.stderr
    assert "RDMA WRITE 1 MiB, TCP transport" in p.stdout
    assert "ATOMIC CMP_SWP 8 B round trip, polling" in p.stdout
