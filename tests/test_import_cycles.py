"""The import graph of ``rdmakit`` has no cycle (a module is one thing, built on what is below it).

Every import statement counts, wherever it sits: at module level, under
``TYPE_CHECKING``, or inside a function (a deferred import still says the two
modules need each other). The graph is read from the AST of each module.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "rdmakit"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the rdmakit modules it imports (runtime, TYPE_CHECKING and deferred imports)."""
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in paths)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in paths:
                        edges.add(sub)  # ``from package import module``
                    elif target in paths:
                        edges.add(target)
        edges.discard(mod)
        graph[mod] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph[start])))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in done:
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
                path.append(nxt)
                on_path.add(nxt)
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert "rdmakit.engine.context" in graph["rdmakit.engine.requester"]  # runtime, relative
    assert "rdmakit.verbs.device" in graph["rdmakit.verbs.discovery"]  # deferred (inside a function)
    assert "rdmakit.verbs.device" in graph["rdmakit.doca.verbs_glue"]  # TYPE_CHECKING
    assert "rdmakit.wire" in graph["rdmakit.engine.qp"]  # absolute, a package


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
