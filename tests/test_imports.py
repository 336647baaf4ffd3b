"""Import hygiene: the project's import graph, read from the source with ``ast`` (nothing imported).

Every ``import`` / ``from ... import`` of a project module is an edge from the importing module
to the most specific project module it names (``from pkg import name`` -> ``pkg.name`` when that is
a module, else ``pkg``). Edges are *top-level* (run when the module is imported, including under
``try`` / ``if`` at module level) or *function-level* (inside a function or method body: run when
called). Imports under ``if TYPE_CHECKING:`` never run and are left out.

A cycle among top-level edges fails the test, listed module by module with file and line.
``python tests/test_imports.py`` prints both kinds of cycle.

The torch-free half (``robot_io``, ``deploy.runtime``, ``hardware``) is in ``tests/test_no_torch.py``.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hardware", "robot_io", "vla", "policies", "session", "rewards", "calibration", "deploy")


@dataclasses.dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    top_level: bool


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` of the project packages that exist."""
    out = {}
    for pkg in PACKAGES:
        if not (ROOT / pkg).is_dir():
            continue
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """(node, top_level) for every import statement that can run."""
    def walk(node: ast.AST, top: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, top
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.orelse:
                    yield from walk(ast.Module(body=[sub], type_ignores=[]), top)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, False)
            else:  # class bodies, try / if / with at module level run at import time
                yield from walk(child, top)
    yield from walk(tree, True)


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a project module."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in modules:
            return cand
    return None


def import_graph() -> list[Edge]:
    modules = project_modules()
    edges = []
    for mod, f in modules.items():
        is_pkg = f.name == "__init__.py"
        tree = ast.parse(f.read_text(), filename=str(f))
        for node, top in _imports(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from the package that holds this module
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                dst = _resolve(t, modules)
                if dst is not None and dst != mod:
                    edges.append(Edge(mod, dst, node.lineno, top))
    return edges


def find_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One example cycle (as its edges) per strongly connected component of more than one module."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        graph.setdefault(e.src, {}).setdefault(e.dst, e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = []
    for comp in sccs:  # shortest path back to the start inside the component (BFS)
        members, start = set(comp), comp[0]
        prev: dict[str, Edge] = {}
        queue, seen = [start], {start}
        found = None
        while queue and found is None:
            v = queue.pop(0)
            for w, e in sorted(graph.get(v, {}).items()):
                if w == start:
                    found = e
                    break
                if w in members and w not in seen:
                    seen.add(w)
                    prev[w] = e
                    queue.append(w)
        path = [found]
        while path[0].src != start:
            path.insert(0, prev[path[0].src])
        cycles.append(path)
    return cycles


def describe(cycle: list[Edge]) -> str:
    modules = project_modules()
    return "\n".join(f"  {e.src} ({modules[e.src].relative_to(ROOT)}:{e.line}) imports {e.dst}"
                     f"{'' if e.top_level else ' [inside a function]'}" for e in cycle)


def test_the_graph_sees_top_level_and_function_level_imports():
    edges = import_graph()
    assert any(e.src == "vla.models.compact" and e.dst == "vla.models.base" and e.top_level for e in edges)
    assert any(not e.top_level for e in edges)
    assert find_cycles([Edge("a", "b", 1, True), Edge("b", "c", 2, True), Edge("c", "a", 3, True)])
    assert not find_cycles([Edge("a", "b", 1, True), Edge("b", "c", 2, True)])


def test_no_cycle_among_top_level_imports():
    cycles = find_cycles([e for e in import_graph() if e.top_level])
    assert not cycles, "import cycles among top-level imports:\n" + "\n\n".join(describe(c) for c in cycles)


if __name__ == "__main__":
    all_edges = import_graph()
    for label, edges in (("top-level", [e for e in all_edges if e.top_level]), ("all (with function-level)", all_edges)):
        found = find_cycles(edges)
        print(f"{label}: {len(found)} cycle(s)")
        for c in found:
            print(describe(c) + "\n")
