"""bench/base_eval.py: acceptance 1's protocol for several checkpoints, paired scene by scene (quick variant), and
its pieces: the split of the tasks over processes, the exact McNemar test, resuming from finished evaluations."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_writes_the_report_and_a_rerun_reads_it_back(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla
    from tests.net import free_port_block

    ckpt = save_tiny_vla(str(tmp_path / "ckpt"), extra={"sim_tasks": ["pick_red_cube", "stack_cubes"],
                                                         "execution": {"gripper": "binary"}})
    cmd = [sys.executable, "-m", "bench.base_eval", "--model", f"tiny={ckpt}", "--quick",
           "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--port", str(free_port_block(10))]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads((tmp_path / "out" / "base_eval_quick.json").read_text())
    (m,) = rep["models"]
    assert rep["tasks"] == ["pick_red_cube"] and m["tasks"]["pick_red_cube"]["episodes"] == 2
    assert m["executed_gripper"] == ["binary"] and m["eval_wall_s"] > 0  # --gripper auto: the checkpoint's
    assert not m["checkpoint"].startswith("/") and (tmp_path / "out" / "base_eval_quick.png").stat().st_size > 3_000
    # a second model with the same label's run directory is read back, not re-run; pairing needs two
    r = subprocess.run(cmd[:5] + ["--model", f"again={ckpt}"] + cmd[5:], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "tiny: pick_red_cube evaluated already" in r.stdout
    rep = json.loads((tmp_path / "out" / "base_eval_quick.json").read_text())
    assert rep["models"][0]["eval_wall_s"] is None and len(rep["paired"]) == 1
    (p,) = rep["paired"].values()
    assert p["pooled"]["pairs"] == 2


def test_a_model_without_a_label_is_refused(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.base_eval", "--model", "nolabel"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "LABEL=CHECKPOINT" in r.stderr
