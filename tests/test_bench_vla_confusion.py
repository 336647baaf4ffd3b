"""bench/vla_confusion.py: which cube a multi-task VLA acts on for each instruction, and each failure's kind."""

import json
import subprocess
import sys
from pathlib import Path

from tests.net import free_port_block

ROOT = Path(__file__).resolve().parents[1]


def test_confusion_bench_writes_matrices_outcomes_and_the_plot(tmp_path):
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    port = free_port_block(20)
    r = subprocess.run([sys.executable, "-m", "bench.vla_confusion", "--checkpoint", str(tmp_path / "ckpt"),
                        "--task", "pick_red_cube", "--episodes", "1", "--jobs", "1", "--exec-steps", "8", "--wording", "paraphrases",
                        "--gripper", "binary", "--port0", str(port), "--out", str(tmp_path / "res")],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads((tmp_path / "res" / "vla_confusion.json").read_text())
    (ep,) = out["episodes"]
    assert ep["seed"] == 100_000 and 1 <= ep["ticks"] <= 100 and ep["named"] == "red_cube"
    assert set(ep["xy_start"]) == set(ep["xy_end"]) >= {"red_cube", "green_cube", "blue_cube", "target"}
    assert ep["instruction"] == "grab the red block"  # the first paraphrase, a wording the model never saw
    t = out["tasks"]["pick_red_cube"]
    assert t["episodes"] == 1 and sum(t["outcomes"].values()) == 1 and sum(t["grasped_first"].values()) == 1
    assert not out["checkpoint"].startswith("/")
    assert out["gripper"] == "binary" and out["execution"].endswith("gripper binary")
    assert (tmp_path / "res" / "vla_confusion.png").stat().st_size > 5_000


def test_a_site_without_a_camera_the_checkpoint_reads_is_refused_by_name(tmp_path):
    from tests.conftest import save_tiny_vla

    ck = tmp_path / "ckpt"
    save_tiny_vla(str(ck))
    cfg = json.loads((ck / "config.json").read_text())
    cfg["config"]["cameras"] = ["front", "wrist", "side"]
    (ck / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "bench.vla_confusion", "--checkpoint", str(ck), "--task", "pick_red_cube",
                        "--out", str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "--robot sim-franka-fast has no camera side" in r.stderr and "sim-franka-fast-3cam" in r.stderr
    assert not (tmp_path / "res").exists()  # refused before any bridge started or file was written
