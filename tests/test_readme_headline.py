"""The README a newcomer reads (issue 62): at most 300 lines, its headline table is the one
`python -m bench.harness.headline` computes from bench/results now, and CI runs the test tiers it names.

The harness runs as a subprocess (tests/ never import bench/). Each check has a negative twin -- a tampered README,
a tampered result file -- so that a check which passes for any input would fail here.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- headline:start -->", "<!-- headline:end -->"


def headline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.harness.headline", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def block_rows(text: str) -> list[str]:
    block = text[text.index(START):text.index(END)]
    return [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]


def test_readme_is_at_most_300_lines():
    n = len(README.read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines; issue 62 keeps it at 300 or fewer (the write-ups go to " \
                     "bench/results/README.md, the reference to docs/guide.md)"


def test_readme_headline_table_is_current():
    r = headline("--check", str(README))
    assert r.returncode == 0, (f"{r.stderr}\nregenerate it: .venv/bin/python -m bench.harness.headline "
                               "--write README.md")
    assert len(block_rows(README.read_text())) >= 10, "the headline table lost its rows"


def test_a_tampered_readme_table_is_stale(tmp_path):
    text = README.read_text()
    row = block_rows(text)[0]
    cells = row.split(" | ")
    cells[1] = cells[1] + " (edited by hand)"
    tampered = tmp_path / "README.md"
    tampered.write_text(text.replace(row, " | ".join(cells), 1))
    r = headline("--check", str(tampered))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "stale" in r.stderr and "(edited by hand)" in r.stderr, r.stderr


def test_the_table_is_computed_from_the_result_files(tmp_path):
    """One success fewer in the shipped base's first task of base_eval.json changes the table (the figure is read,
    not written down), and --write puts the new figure in the block."""
    results = tmp_path / "results"
    results.mkdir()
    for f in (ROOT / "bench" / "results").glob("*.json"):
        shutil.copy(f, results / f.name)
    res = json.loads((results / "base_eval.json").read_text())
    shipped = next(m for m in res["models"] if m["checkpoint"] == "vla/checkpoints/base")
    task, t = next(iter(shipped["tasks"].items()))
    t["successes"] -= 1
    (results / "base_eval.json").write_text(json.dumps(res))

    r = headline("--check", str(README), "--results", str(results))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{t['successes']}/{t['episodes']}" in r.stderr and task in r.stderr, r.stderr

    copy = tmp_path / "README.md"
    shutil.copy(README, copy)
    assert headline("--write", str(copy), "--results", str(results)).returncode == 0
    assert headline("--check", str(copy), "--results", str(results)).returncode == 0
    assert f"**{t['successes']}/{t['episodes']}" in copy.read_text()


def test_readme_without_markers_is_refused(tmp_path):
    bare = tmp_path / "README.md"
    bare.write_text("# no table here\n")
    r = headline("--check", str(bare))
    assert r.returncode == 2 and START in r.stderr, r.stderr


def test_ci_runs_the_test_tiers_the_readme_names():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    named = set(re.findall(r"`(make test(?:-e2e)?)`", README.read_text()))
    assert named == {"make test", "make test-e2e"}, named
    assert [line for line in ci if line in named] == ["make test", "make test-e2e"], ci
