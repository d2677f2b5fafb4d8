"""The product's own import graph (read with ast, nothing imported): no cycle among the modules
or the packages of `bf16k/` and `verify/`, and no verification tier importing another tier (what
several tiers share lives in `verify/core/`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bf16k", "verify")
# The tiers of verify/: each may import verify.core (and its own modules), never another tier.
TIERS = ("parity", "recall", "forward", "live", "bench", "cost")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_main_guard(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The product modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    # A module's `if __name__ == "__main__":` entry runs only as a program: what it imports is
    # not a dependency of the module.
    tree.body = [n for n in tree.body if not _is_main_guard(n)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            # The nearest product module a dotted name falls in.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges between sibling packages: verify.bench -> verify.parity when a module of one imports
    a module of the other (a module's own package is its parent)."""

    def parent(name: str) -> str:
        return name.rpartition(".")[0] or name

    packages: dict[str, set[str]] = {}
    for name, targets in graph.items():
        for target in targets:
            a, b = parent(name), parent(target)
            # Compare at the depth where the two paths part (sibling packages).
            pa, pb = a.split("."), b.split(".")
            depth = next((i for i, (x, y) in enumerate(zip(pa, pb)) if x != y), None)
            if depth is None:
                continue
            packages.setdefault(".".join(pa[: depth + 1]), set()).add(".".join(pb[: depth + 1]))
    return packages


def test_the_import_graph_reads_every_module() -> None:
    graph = _graph()
    assert "bf16k.cli" in graph and "verify.figures" in graph
    assert any("verify.core" in name for name in graph)


def test_no_module_imports_itself_back() -> None:
    assert _cycles(_graph()) == []


def test_no_package_imports_itself_back() -> None:
    assert _cycles(_package_graph(_graph())) == []


def test_no_tier_imports_another_tier() -> None:
    crossings = []
    for name, targets in _graph().items():
        parts = name.split(".")
        if parts[0] != "verify" or len(parts) < 2 or parts[1] not in TIERS:
            continue
        for target in targets:
            other = target.split(".")
            if other[0] == "verify" and len(other) > 1 and other[1] in TIERS and other[1] != parts[1]:
                crossings.append(f"{name} -> {target}")
    assert crossings == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    # The checks above are only as good as the finder: it must see a two- and a three-cycle.
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert _cycles(graph) == [["a", "b"], ["c", "d", "e"]]


def test_the_package_graph_lifts_module_edges_to_sibling_packages() -> None:
    graph = {
        "verify.bench.read": {"verify.parity.cases"},
        "verify.parity.cases": {"verify.bench.twin"},
        "verify.core.a": {"verify.core.b"},
    }
    assert _cycles(_package_graph(graph)) == [["verify.bench", "verify.parity"]]
