"""bench/archive/vla_probe.py (an archived probe, run as ``python -m bench.archive.vla_probe``): the per-episode grasp diagnostics, one episode of a tiny VLA on the fast sim."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.net import free_port_block

ROOT = Path(__file__).resolve().parents[1]


def test_probe_writes_the_episode_diagnostics_and_the_plot(tmp_path):
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    port = free_port_block(20)
    r = subprocess.run([sys.executable, "-m", "bench.archive.vla_probe", "--checkpoint", str(tmp_path / "ckpt"),
                        "--episodes", "1", "--port", str(port), "--threads", "1", "--out", str(tmp_path / "res")],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads((tmp_path / "res" / "vla_probe.json").read_text())
    (ep,) = out["episodes"]
    assert out["task"] == "pick_red_cube" and out["execution"].startswith("temporal ensembling")
    assert ep["seed"] == 100_000 and 1 <= ep["ticks"] <= 100 and ep["closes"] >= 0
    assert ep["first_close_dxy_m"] is None or 0 <= ep["first_close_dxy_m"] < 1.0
    assert out["summary"]["episodes"] == 1 and not out["checkpoint"].startswith("/")
    assert (tmp_path / "res" / "vla_probe.png").stat().st_size > 5_000


def test_probe_refuses_a_task_without_a_pick(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.archive.vla_probe", "--checkpoint", str(tmp_path),
                        "--task", "push_block_to_marker"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "pick or lift task" in r.stderr
