"""bench/autosafe.py --quick runs and writes what the full benchmark writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("body,stem", [("cartpole", "autosafe"), ("arm", "autosafe_arm")])
def test_bench_autosafe_quick(tmp_path, body, stem):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    r = subprocess.run([sys.executable, "-m", "bench.autosafe", "--env", body, "--quick", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / f"{stem}.json"))
    assert res["mode"] == "quick" and res["config"]["threads"] == 1 and res["env"] == body
    assert set(res["summary"]) == {"sac", "autosafe", "sac+simplex"}
    # the safety layers hold from the first step, even untrained (AutoSafe's blend; Simplex's exact model)
    assert res["summary"]["autosafe"]["violation_steps"] == 0
    assert res["summary"]["sac+simplex"]["violation_steps"] == 0
    assert res["goals"]["autosafe_zero_violations"]["met"] is True
    for name in ("autosafe_return_vs_sac", "inference_hz"):
        assert res["goals"][name]["measured"] > 0 and isinstance(res["goals"][name]["met"], bool)
    auto = next(run for run in res["runs"] if run["arm"] == "autosafe")
    assert auto["inference"]["hz_median"] > 0
    assert 0 < auto["sharpness_final"]["mean"] <= res["config"]["autosafe"]["sharpness_max"]
    assert (tmp_path / f"{stem}.png").stat().st_size > 10_000
    if body == "arm":  # the arm's measured error about the displacement model the layers certify on
        err = auto["model_error"]
        assert err["steps"] == 150 and 0 < err["mean_m"] <= err["max_m"]
        assert res["config"]["safe_set"]["certified_sharpness"] >= res["config"]["autosafe"]["sharpness_max"]


def test_bench_autosafe_append_adds_seeds_and_refuses_other_settings(tmp_path):
    """--append --seed-start 1 adds seed 1 to an existing results file; other settings are refused, naming the
    field, and the file is left as it was."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "bench.autosafe", "--env", "cartpole", "--quick", "--out", str(tmp_path)]
    run = lambda *extra: subprocess.run(base + list(extra), cwd=ROOT, capture_output=True, text=True,  # noqa: E731
                                        timeout=180, env=env)
    r = run("--append")
    assert r.returncode != 0 and "does not exist" in r.stderr
    assert run().returncode == 0
    r = run("--append", "--seed-start", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "autosafe.json"))
    assert res["config"]["seeds"] == [0, 1]
    assert sorted((x["seed"], x["arm"]) for x in res["runs"]) == sorted(
        (s, a) for s in (0, 1) for a in ("sac", "autosafe", "sac+simplex"))
    before = (tmp_path / "autosafe.json").read_text()
    r = run("--append", "--seed-start", "2", "--max-steps", "50")
    assert r.returncode != 0 and "'max_steps'" in r.stderr
    assert (tmp_path / "autosafe.json").read_text() == before
