"""bench.archive.vla_failure_map: rebuilds each evaluated scene from its seed and splits failures by where the target
object lay (border band vs core of equal area). Moved from tests/test_bench_vla_failure_map.py (issue 62); e2e as it
was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.archive import vla_failure_map as fm
from hardware.sim_tasks import OBJECT_REGION, get_task

pytestmark = pytest.mark.e2e


def write_eval(path: Path, episodes: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return path


def test_core_is_half_the_region():
    rng = np.random.default_rng(0)
    (x0, x1), (y0, y1) = OBJECT_REGION
    pts = rng.uniform((x0, y0), (x1, y1), size=(20_000, 2))
    assert abs(np.mean([fm.in_core(x, y) for x, y in pts]) - 0.5) < 0.015


def test_scenes_are_the_sims_and_a_border_effect_is_found(tmp_path):
    task = "pick_blue_cube"
    seeds = range(100_000, 100_060)
    core = {s: fm.in_core(*get_task(task).layout(np.random.default_rng(s))["blue_cube"][:2]) for s in seeds}
    # a model that fails exactly on the border band; and one whose failures ignore the placement
    border = write_eval(tmp_path / "runs" / "border" / "ev",
                        [{"task": task, "seed": s, "success": core[s], "ticks": 40} for s in seeds])
    even = write_eval(tmp_path / "runs" / "even" / "ev",
                      [{"task": task, "seed": s, "success": s % 2 == 0, "ticks": 40} for s in seeds])
    res = fm.main(["--eval", str(border), "--eval", str(even), "--out", str(tmp_path / "out")])
    b, e = res["runs"][0]["all_tasks"], res["runs"][1]["all_tasks"]
    assert b["band"]["failure_rate"] == 1.0 and b["core"]["failures"] == 0 and b["fisher_p"] < 1e-6
    assert e["fisher_p"] > 0.05
    assert b["band"]["episodes"] + b["core"]["episodes"] == 60
    ep = res["runs"][0]["episodes"][0]
    assert (ep["x"], ep["y"]) == tuple(get_task(task).layout(np.random.default_rng(ep["seed"]))["blue_cube"][:2])
    saved = json.loads((tmp_path / "out" / "failure_map.json").read_text())
    assert saved["runs"][0]["name"].endswith("runs/border") and not saved["runs"][0]["name"].startswith("/")
    assert (tmp_path / "out" / "failure_map.png").stat().st_size > 10_000


def test_a_malformed_log_line_is_named(tmp_path):
    d = write_eval(tmp_path / "ev", [{"task": "pick_red_cube", "seed": 1, "success": True}])
    with open(d / "episodes.jsonl", "a") as f:
        f.write('{"task": "pick_red_cube"}\n')
    with pytest.raises(SystemExit, match="line 2"):
        fm.main(["--eval", str(d), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="no episodes.jsonl"):
        fm.main(["--eval", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
