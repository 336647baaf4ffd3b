"""bench/vla_sft.py --quick records, trains and evaluates one ablation row end to end and writes the report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_vla_sft_quick(tmp_path):
    pytest.importorskip("efficientnet_lite_pytorch")
    cmd = [sys.executable, "-m", "bench.vla_sft", "--quick", "--out", str(tmp_path / "out"),
           "--data-dir", str(tmp_path / "data"), "--runs-dir", str(tmp_path / "runs"), "--port", "6680"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rep = json.loads((tmp_path / "out" / "vla_sft.json").read_text())
    (row,) = rep["rows"]
    assert row["row"] == "dart_crop" and row["settings"]["record"] == ["--dart", "0.01"]
    t = row["tasks"]["pick_red_cube"]
    assert t["episodes"] == 2 and 0 <= t["successes"] <= 2 and t["ci95"][0] <= t["rate"] <= t["ci95"][1]
    assert row["wall_s"]["record"] > 0 and row["wall_s"]["train"] > 0 and row["wall_s"]["eval"] > 0
    # the recipe reached the artefacts: DART in the episode log, the crop in the checkpoint
    log = [json.loads(line) for line in open(tmp_path / "data" / "q1_dart_0p01_pick_red_cube" / "meta" / "vla_episodes.jsonl")]
    assert len(log) == 2 and all(e["dart_sigma"] == 0.01 for e in log)
    cfg = json.loads((tmp_path / "runs" / row["run_dir"] / "model" / "config.json").read_text())["config"]
    assert cfg["crops"] == [["front", 0.2, 0.35, 0.8, 0.85]]
    assert (tmp_path / "out" / "vla_sft.png").stat().st_size > 5_000
    # a second run reads the finished row back instead of re-running it
    r2 = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r2.returncode == 0 and "reusing" in r2.stdout, r2.stdout[-2000:] + r2.stderr[-2000:]


def test_bench_vla_sft_quick_dagger_row(tmp_path):
    """The DAgger row: the first model drives, the expert labels, the fine-tuned model is evaluated."""
    pytest.importorskip("efficientnet_lite_pytorch")
    row_name = "crop_fine3_noshift_dagger1_exec4"
    cmd = [sys.executable, "-m", "bench.vla_sft", "--quick", "--row", row_name, "--out",
           str(tmp_path / "out"), "--data-dir", str(tmp_path / "data"), "--runs-dir", str(tmp_path / "runs"),
           "--port", "6690"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (row,) = json.loads((tmp_path / "out" / "vla_sft.json").read_text())["rows"]
    assert row["row"] == row_name and row["settings"]["dagger_rounds"] == 1
    assert row["run_dir"].endswith("_dagger1") and row["tasks"]["pick_red_cube"]["episodes"] == 2
    run = tmp_path / "runs" / row["run_dir"]
    first = tmp_path / "runs" / row["run_dir"].removesuffix("_dagger1")
    cfg = json.loads((run / "train_config.json").read_text())
    assert cfg["init"] == str(first) and cfg["steps"] == 10 and cfg["shift_pad"] == 0
    assert any(d.endswith("_dagger1_pick_red_cube") for d in cfg["datasets"]) and len(cfg["datasets"]) == 2
    dagger_data = tmp_path / "data" / f"{row['run_dir']}_pick_red_cube"
    log = [json.loads(line) for line in open(dagger_data / "meta" / "vla_episodes.jsonl")]
    assert len(log) == 2 and all(e["dagger"]["checkpoint"] == str(first) and e["seed"] >= 1000 for e in log)
