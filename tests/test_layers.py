"""The folder layout is the architecture: imports point down only (docs/architecture.md)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "rdmakit"

#: layer -> the rdmakit layers it may import.
ALLOWED = {
    "wire": set(),
    "engine": {"wire"},
    "transport": {"wire", "engine"},
    "verbs": {"wire", "engine"},
    "doca": {"wire", "engine", "transport", "verbs"},
    "testing": {"wire", "engine", "transport", "verbs", "doca"},
    "cli": {"wire", "engine", "transport", "verbs", "doca", "conformance"},
    # The conformance suite: its tester builds packets with scapy, never with rdmakit.wire (the
    # code under test); its agent drives a device under test through transport or verbs.
    "conformance": {"engine", "transport", "verbs"},
}
#: Third-party modules that only some layers may use.
RESTRICTED = {
    "socket": {"transport"},
    "select": {"transport", "doca", "conformance"},
    "pyverbs": {"verbs"},
    "trio": {"transport", "doca", "cli"},
    # An optional dependency (the ``testing`` extra): rdmakit.testing.strategies only.
    "hypothesis": {"testing"},
    # GPL: used, never vendored; the optional conformance suite (its own extra) builds packets with it.
    "scapy": {"conformance"},
}
#: Modules the sans-IO layers may never import: no clock, no global random, no I/O.
SANS_IO_FORBIDDEN = {"time", "socket", "select", "selectors", "os", "threading", "asyncio", "trio"}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = path.relative_to(ROOT).parts[: -node.level]
                base = ".".join(("rdmakit", *pkg))
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
    return found


def _files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if len(p.relative_to(ROOT).parts) > 1)


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path: Path) -> None:
    layer = path.relative_to(ROOT).parts[0]
    assert layer in ALLOWED, f"{layer!r} is not a layer of docs/architecture.md"
    for line, mod in _imports(path):
        parts = mod.split(".")
        if parts[0] == "rdmakit" and len(parts) > 1 and parts[1] != layer:
            assert parts[1] in ALLOWED[layer], f"{path}:{line}: {layer} may not import {mod}"
        top = parts[0]
        if top in RESTRICTED:
            assert layer in RESTRICTED[top], f"{path}:{line}: only {RESTRICTED[top]} may import {top}"
        if layer in ("wire", "engine"):
            assert top not in SANS_IO_FORBIDDEN, f"{path}:{line}: sans-IO layer imports {top}"
            assert not (top == "random" and layer == "wire"), f"{path}:{line}: wire uses no randomness"
