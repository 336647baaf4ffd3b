"""`make base` at toy size: demos recorded BASE_JOBS at a time on bridges of their own, base0 trained, two DAgger
rounds (the newest model drives, the expert labels, a fine-tune from base0 on everything so far), the last model
copied out with repository-relative dataset paths. The full-size recipe is the README's; this is its quick variant."""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # `make base` at toy size: demos on bridges of their own, training, two DAgger rounds

ROOT = Path(__file__).resolve().parents[1]


def test_make_base_at_toy_size_runs_every_stage(tmp_path):
    runs = ROOT / "runs"
    before = set(runs.glob("base-*")) if runs.exists() else set()
    out = tmp_path / "base"
    r = subprocess.run(
        ["make", "-s", "base", "BASE_DAGGER_ROUNDS=2", f"BASE_DATA={tmp_path / 'data'}", f"BASE_OUT={out}", "BASE_EPISODES=2",
         "BASE_TASKS=pick_red_cube place_cube_in_bowl", "BASE_TRAIN_FLAGS=--steps 20 --batch-size 8",
         "BASE_DAGGER_EPISODES=1", "BASE_DAGGER_TASKS_1=pick_red_cube",
         # no handover: a 20-step model may close at its first tick, leaving no frame it drove
         "BASE_DAGGER_FLAGS=--dagger-temporal-ensemble --dagger-noise zero --dagger-gripper binary "
         "--dagger-labels correct",
         "BASE_FT_FLAGS=--steps 10 --batch-size 8 --dagger-rows coherent"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "MUJOCO_GL": "egl"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run,) = set(runs.glob("base-*")) - before
    try:
        for t in ("pick_red_cube", "place_cube_in_bowl"):
            assert (tmp_path / "data" / f"q1_{t}.complete").exists()
        # round 1 drove the pick only, round 2 both tasks, each from the model before it
        assert sorted(p.name for p in run.glob("dagger_r*_*") if p.is_dir()) == [
            "dagger_r1_pick_red_cube", "dagger_r2_pick_red_cube", "dagger_r2_place_cube_in_bowl"]
        for d, driver in (("dagger_r1_pick_red_cube", "base0"), ("dagger_r2_place_cube_in_bowl", "dagger_r1")):
            rows = [json.loads(x) for x in (run / d / "meta" / "vla_episodes.jsonl").read_text().splitlines()]
            assert rows and all(x["dagger"]["checkpoint"].endswith(f"{driver}/model") for x in rows)
            assert all(x["dagger"]["gripper"] == "binary" for x in rows)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["step"] == 10 and len(cfg["train"]["datasets"]) == 5
        assert not any(p.startswith("/") for p in cfg["train"]["datasets"])  # no machine paths in the shipped file
        assert cfg["execution"] == {"gripper": "binary"}  # what `--gripper auto` runs it with
        from vla.models import load_vla

        assert load_vla(str(out)).action_shape == (8, 7)
    finally:
        import shutil

        shutil.rmtree(run, ignore_errors=True)
