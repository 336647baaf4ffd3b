"""bench/ is one experiment harness: a bench script imports the harness and the product packages, never another
script and never tests/; the harness imports only itself and the product; tests/ never import bench/; no module
edits the import path; and ``python -m bench.<name> --help`` works for every script, the archived probes' too."""

import ast
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
PRODUCT = {"hardware", "robot_io", "vla", "policies", "session", "rewards", "calibration", "deploy"}


def modules() -> list[pathlib.Path]:
    """Every module of bench/ but its own tests."""
    return sorted(p for p in BENCH.rglob("*.py") if "tests" not in p.relative_to(BENCH).parts)


def scripts() -> list[str]:
    """``bench.<name>`` and ``bench.archive.<name>`` of every script."""
    return [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in modules()
            if p.parent in (BENCH, BENCH / "archive") and p.name != "__init__.py"]


def imports(path: pathlib.Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, top level or inside a function; relative ones as ``.name``."""
    tree = ast.parse(text if text is not None else path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, "." * node.level + (node.module or "")))
    return out


def violations(path: pathlib.Path, text: str | None = None) -> list[str]:
    """The imports of a bench module that break the rule, as ``file:line: module``."""
    names = {p.stem for p in modules()} - PRODUCT - {"__init__"}  # a script's name imported bare (the old way, by path edits)
    bad = []
    for line, mod in imports(path, text):
        root = mod.split(".")[0]
        ok = not (mod.startswith(".") or root == "tests" or root in names
                  or (root == "bench" and not (mod == "bench.harness" or mod.startswith("bench.harness."))))
        if not ok:
            bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
    return bad


def test_bench_scripts_import_only_the_harness_and_the_product():
    bad = [v for p in modules() for v in violations(p)]
    assert bad == [], "\n".join(bad)


def test_the_rule_fails_on_a_script_that_imports_another_or_tests(tmp_path):
    """The negative twin: each way of leaning on another script or on tests/ is caught."""
    fake = BENCH / "fake_bench.py"
    for text in ("import bench.dsrl\n", "from bench import dsrl\n", "import dsrl as d\n",
                 "def f():\n    from vla_steerability import portable_path\n", "from tests.net import free_ports\n",
                 "from .harness import flags\n", "from bench.archive.sim_grip import hold\n"):
        assert violations(fake, text), text
    assert violations(fake, "from bench.harness.results import write_result\nimport numpy\nfrom vla.models import "
                            "load_vla\nfrom robot_io.bridge_process import running_bridge\n") == []


def test_no_bench_module_edits_the_import_path():
    """A grep of bench/ for the import path finds nothing (spelled in two parts here, so this file passes too)."""
    needle = "sys." + "path"
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in BENCH.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if needle in line]
    assert hits == [], hits


def test_bench_never_runs_a_tests_module():
    """Nor through a subprocess: no ``python -m tests.<module>`` in a bench script (a fake the bench needs is its own)."""
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in modules()
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"""["']-m["'],\s*["']tests\.""", line)]
    assert hits == [], hits
    assert re.search(r"""["']-m["'],\s*["']tests\.""", 'cmd = [sys.executable, "-m", "tests.deploy.fake_policy"]')


def test_tests_never_import_bench():
    bad = [f"{p.relative_to(ROOT)}:{line}: {mod}" for p in sorted((ROOT / "tests").rglob("*.py"))
           for line, mod in imports(p) if mod.split(".")[0] == "bench"]
    assert bad == [], "\n".join(bad)


def test_every_script_is_listed():
    names = scripts()
    assert "bench.dsrl" in names and "bench.archive.vla_steerability" in names and len(names) >= 35, names


def test_help_works_for_every_script():
    """``python -m bench.<name> --help`` for every script, run in one process (``runpy`` as ``-m`` runs it)."""
    code = ("import runpy, sys\nbad = []\nfor name in sys.argv[1:]:\n    sys.argv = [name, '--help']\n"
            "    try:\n        runpy.run_module(name, run_name='__main__', alter_sys=True)\n"
            "        bad.append(name + ': no exit')\n    except SystemExit as e:\n"
            "        if e.code not in (0, None): bad.append(f'{name}: exit {e.code}')\n"
            "    except Exception as e:\n        bad.append(f'{name}: {type(e).__name__}: {e}')\n"
            "print('BAD', bad)\nsys.exit(1 if bad else 0)\n")
    names = scripts()
    r = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("usage:") == len(names), r.stdout[-3000:]
