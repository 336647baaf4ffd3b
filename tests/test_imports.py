"""Import hygiene: the project's import graph, read from the source with ``ast`` (nothing imported).

Every ``import`` / ``from ... import`` of a project module is an edge from the importing module
to the most specific project module it names (``from pkg import name`` -> ``pkg.name`` when that is
a module, else ``pkg``). Edges are *top-level* (run when the module is imported, including under
``try`` / ``if`` at module level) or *function-level* (inside a function or method body: run when
called). Imports under ``if TYPE_CHECKING:`` never run and are left out.

Three rules hold (DESIGN.md, "Packages ... and the direction of imports": "Arrows point down the
list above; a test holds that order (no upward import, no circle, not even inside a function)"):

- **Floors.** Every module sits on a floor (:data:`FLOORS`, ground floor first, the CLI on top);
  an import, top-level or inside a function, may name its own floor or one below, never one above.
  A failure names the file, the line and the arrow.
- **No circle**, among top-level imports nor with function-level ones: a function-level import
  that closes a circle is a circle that only hides until the function runs. Lazy imports (torch,
  lerobot, a heavy backbone) stay where they are for start-up speed; they just may not go up or
  close a circle.
- **Product code never imports tests/ or bench/.**

``python tests/test_imports.py`` prints the upward imports and both kinds of cycle.
The torch-free half (``robot_io``, ``deploy.runtime``, ``hardware``) is in ``tests/test_no_torch.py``.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hardware", "robot_io", "vla", "policies", "session", "rewards", "calibration", "deploy", "cli")
"""The product's top-level packages (``cli`` once the command line leaves ``vla/``; a missing one is skipped)."""

FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # DESIGN.md's list, ground floor first, with five places where the code and DESIGN.md's own text
    # put a package (or a part of one) lower than the list does. Each is marked below; DESIGN.md's
    # list should be brought in line with them.
    #
    # Below the list: calibration/ imports no other package, and the floors above it use it: the
    # bridge reads calibration files on the Pi (robot_io.site -> calibration.io; DESIGN.md: a site
    # file names "their endpoints, keys and calibration files"), the simulators draw its boards and
    # the screen camera uses its homography (hardware -> calibration.board / .screen).
    ("calibration", ("calibration",)),
    # Below the list: the wire format is the one schema every side shares (DESIGN.md, "The wire"),
    # and a device may read another device's stream (hardware.remote_screen decodes the host screen's
    # frames). The rest of robot_io stays above hardware, as listed.
    ("robot_io.wire", ("robot_io.wire",)),
    ("hardware", ("hardware",)),
    ("robot_io", ("robot_io",)),
    # Below vla: DESIGN.md's first house rule puts "the runtime half of deploy/" with robot_io (no
    # torch, no vla: it runs on a Pi); vla's ONNX backbone and vla.envs run exported policies with it.
    ("deploy.runtime", ("deploy.runtime",)),
    # Below vla: the simulated tasks' success reward reads the simulator's state (hardware only);
    # vla.envs.task_env, the one place that builds the sim task envs (DESIGN.md, "Env construction
    # lives in one place, shared by train, eval and rl"), hands it to RobotEnv as its reward hook.
    ("rewards.sim_success", ("rewards.sim_success",)),
    ("vla", ("vla",)),
    # Below policies (listed above session): success detectors and VLM judges are built on vla's
    # encoders and read by methods (SARL's success classifier, LfH's judge); rewards/ imports no
    # policy and no session.
    ("rewards", ("rewards",)),
    ("policies", ("policies",)),
    ("session", ("session",)),
    ("deploy", ("deploy",)),
    ("cli", ("vla.cli", "vla.commands", "cli")),  # "the top floor; nothing imports it"
)


@dataclasses.dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    top_level: bool


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` of the project packages that exist under ``root``."""
    out = {}
    for pkg in PACKAGES:
        if not (root / pkg).is_dir():
            continue
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
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


def imported_names(mod: str, f: Path, modules: dict[str, Path]):
    """(absolute dotted name, line, top_level) for every name an import statement of ``f`` brings in."""
    is_pkg = f.name == "__init__.py"
    tree = ast.parse(f.read_text(), filename=str(f))
    for node, top in _imports(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno, top
            continue
        base = node.module or ""
        if node.level:  # relative: from the package that holds this module
            pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        for a in node.names:
            yield (f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base), node.lineno, top


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a project module."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in modules:
            return cand
    return None


def import_graph(root: Path = ROOT) -> list[Edge]:
    modules = project_modules(root)
    edges = []
    for mod, f in modules.items():
        for name, line, top in imported_names(mod, f, modules):
            dst = _resolve(name, modules)
            if dst is not None and dst != mod:
                edges.append(Edge(mod, dst, line, top))
    return edges


def floor_of(module: str) -> int | None:
    """Index in :data:`FLOORS` of the floor whose prefix matches ``module`` most specifically."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def _where(e: Edge, modules: dict[str, Path], root: Path) -> str:
    return f"{modules[e.src].relative_to(root)}:{e.line}"


def upward_imports(edges: list[Edge], root: Path = ROOT) -> list[str]:
    """One line per import that names a higher floor than its module's: file:line, the arrow, the floors."""
    modules = project_modules(root)
    out = []
    for e in edges:
        lo, hi = floor_of(e.src), floor_of(e.dst)
        if lo is not None and hi is not None and hi > lo:
            out.append(f"{_where(e, modules, root)}: {e.src} -> {e.dst}"
                       f"{'' if e.top_level else ' [inside a function]'} goes up from floor "
                       f"'{FLOORS[lo][0]}' to floor '{FLOORS[hi][0]}'")
    return sorted(set(out))


def forbidden_imports(root: Path = ROOT) -> list[str]:
    """Product modules importing ``tests`` (mocks) or ``bench`` (STYLE.md: "production code importing
    test mocks" is what to avoid). That tests/ never import bench/ is the bench's rule to keep."""
    modules = project_modules(root)
    out = set()
    for mod, f in modules.items():
        for name, line, top in imported_names(mod, f, modules):
            if name.split(".")[0] in ("tests", "bench"):
                out.add(f"{f.relative_to(root)}:{line}: product module {mod} imports {name}")
    return sorted(out)


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


def describe(cycle: list[Edge], root: Path = ROOT) -> str:
    modules = project_modules(root)
    return "\n".join(f"  {e.src} ({_where(e, modules, root)}) imports {e.dst}"
                     f"{'' if e.top_level else ' [inside a function]'}" for e in cycle)


def test_the_graph_sees_top_level_and_function_level_imports():
    edges = import_graph()
    assert any(e.src == "vla.models.compact" and e.dst == "vla.models.base" and e.top_level for e in edges)
    assert any(not e.top_level for e in edges)
    assert find_cycles([Edge("a", "b", 1, True), Edge("b", "c", 2, True), Edge("c", "a", 3, True)])
    assert not find_cycles([Edge("a", "b", 1, True), Edge("b", "c", 2, True)])


def test_every_module_sits_on_a_floor():
    assert [m for m in project_modules() if floor_of(m) is None] == []
    assert floor_of("vla.commands.rl") == len(FLOORS) - 1 and floor_of("vla.cli") == len(FLOORS) - 1
    assert floor_of("vla.models") < floor_of("policies.dsrl") < floor_of("session.runner") < floor_of("deploy.export")


def test_no_import_goes_up_a_floor():
    up = upward_imports(import_graph())
    assert not up, ("imports that go up a floor (DESIGN.md: arrows point down the list; floors in "
                    "tests/test_imports.py FLOORS):\n  " + "\n  ".join(up))


def test_no_cycle_among_top_level_imports():
    cycles = find_cycles([e for e in import_graph() if e.top_level])
    assert not cycles, "import cycles among top-level imports:\n" + "\n\n".join(describe(c) for c in cycles)


def test_no_cycle_even_inside_functions():
    cycles = find_cycles(import_graph())
    assert not cycles, ("import cycles closed by an import inside a function (move the shared piece down "
                        "instead):\n" + "\n\n".join(describe(c) for c in cycles))


def test_product_code_never_imports_tests_or_bench():
    bad = forbidden_imports()
    assert not bad, "\n".join(bad)


def test_the_checks_fail_on_a_synthetic_upward_import_and_a_hidden_circle(tmp_path):
    """The checks above run on a small tree written here, so that they cannot pass by seeing nothing."""
    files = {
        "robot_io/__init__.py": "",
        "robot_io/wire.py": "import numpy\n",
        "robot_io/client.py": "from robot_io.wire import decode\n\n\ndef f():\n    from vla.commands.rl import run\n",
        "vla/__init__.py": "",
        "vla/commands/__init__.py": "",
        "vla/commands/rl.py": "from robot_io import client\n",
        "vla/models/__init__.py": "from vla.models import base\n",
        "vla/models/base.py": "def set_mode():\n    from . import modes\n",
        "vla/models/modes.py": "from vla.models.base import MODES\n",
        "policies/__init__.py": "import tests.mocks\n\n\ndef f():\n    from bench.harness import flags\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    edges = import_graph(tmp_path)
    assert upward_imports(edges, tmp_path) == [
        "robot_io/client.py:5: robot_io.client -> vla.commands.rl [inside a function] goes up from floor "
        "'robot_io' to floor 'cli'"]
    assert not find_cycles([e for e in edges if e.top_level])
    cycles = find_cycles(edges)
    assert len(cycles) == 2, cycles  # robot_io.client <-> vla.commands.rl, vla.models.base <-> modes
    assert "vla.models.base (vla/models/base.py:2) imports vla.models.modes [inside a function]" in \
        "\n".join(describe(c, tmp_path) for c in cycles)
    assert forbidden_imports(tmp_path) == ["policies/__init__.py:1: product module policies imports tests.mocks",
                                           "policies/__init__.py:5: product module policies imports bench.harness"]


if __name__ == "__main__":
    all_edges = import_graph()
    up = upward_imports(all_edges)
    print(f"upward: {len(up)} import(s)")
    for line in up:
        print("  " + line)
    for label, edges in (("top-level", [e for e in all_edges if e.top_level]), ("all (with function-level)", all_edges)):
        found = find_cycles(edges)
        print(f"{label}: {len(found)} cycle(s)")
        for c in found:
            print(describe(c) + "\n")
    for line in forbidden_imports():
        print(line)
