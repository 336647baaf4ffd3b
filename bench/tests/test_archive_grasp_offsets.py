"""bench.archive.grasp_offsets: the grasp offsets of vla_confusion episodes, split by outcome, from generated records.
Moved from tests/test_bench_grasp_offsets.py (issue 62); e2e as it was."""

import json

import numpy as np
import pytest

from bench.archive import grasp_offsets

pytestmark = pytest.mark.e2e


def _episodes(rng, n, spread_ok, spread_bad):
    eps = []
    for i in range(n):
        ok = bool(i % 2)
        off = rng.normal(0.0, spread_ok if ok else spread_bad, 3)
        eps.append({"task": "pick_red_cube", "named": "red_cube", "close_nearest": "red_cube", "success": ok,
                    "close_offset_m": off.tolist()})
    eps.append({"task": "pick_red_cube", "named": "red_cube", "close_nearest": "blue_cube", "success": False,
                "close_offset_m": [0.5, 0.5, 0.5]})  # closed beside another cube: not counted
    eps.append({"task": "pick_red_cube", "named": "red_cube", "close_nearest": None, "success": False,
                "close_offset_m": None})  # never closed
    return eps


def test_failures_with_larger_offsets_are_counted_beyond_the_threshold(tmp_path):
    rng = np.random.default_rng(0)
    f = tmp_path / "conf.json"
    f.write_text(json.dumps({"execution": "x", "checkpoint": "c", "episodes": _episodes(rng, 200, 0.003, 0.03)}))
    assert grasp_offsets.main([str(f), "--out", str(tmp_path), "--name", "go"]) == 0
    out = json.loads((tmp_path / "go.json").read_text())
    p = out["pooled"]
    assert p["success"]["n"] == 100 and p["failure"]["n"] == 100  # the two uncounted episodes left out
    for ax in ("x", "y", "z"):
        k_ok, n_ok = p["success"]["beyond_threshold"][ax]
        k_bad, n_bad = p["failure"]["beyond_threshold"][ax]
        assert k_ok <= 2 and k_bad >= 40  # 1.5 cm is 5 sigma for the successes, 0.5 sigma for the failures
        assert p["failure"]["median_abs_cm"][ax] > 5 * p["success"]["median_abs_cm"][ax]
    assert (tmp_path / "go.png").stat().st_size > 0


def test_a_file_without_offsets_is_refused_by_name(tmp_path, capsys):
    f = tmp_path / "old.json"
    f.write_text(json.dumps({"episodes": [{"task": "pick_red_cube", "named": "red_cube", "success": True}]}))
    with pytest.raises(SystemExit):
        grasp_offsets.main([str(f), "--out", str(tmp_path)])
    assert "old.json" in capsys.readouterr().err
    g = tmp_path / "junk.json"
    g.write_text("{not json")
    with pytest.raises(SystemExit):
        grasp_offsets.main([str(g), "--out", str(tmp_path)])
    assert "junk.json" in capsys.readouterr().err
