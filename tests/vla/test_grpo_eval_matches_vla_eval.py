"""Issue 64: a GRPO session's evaluation is `vla eval`'s on a sim task. Same checkpoint (the shipped base), task,
seeds, chunk execution and episode limit: `vla eval --task T --exec-steps 4` and the base-VLA evaluation of
`vla rl --method grpo --task T --exec-steps 4` give the same episodes (seed, success and ticks, each), both through
the sim bridge (issue 29 checked the same for `--env`)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = ROOT / "vla" / "checkpoints" / "base"
pytestmark = pytest.mark.e2e


def leased_site(path: pathlib.Path):
    from robot_io.ports import PortLease
    from robot_io.site import load_site, relocate_site, site_ports

    site = load_site("sim-franka-fast")
    lease = PortLease(len(site_ports(site)))
    return lease, relocate_site(site, lease.ports, str(path)).path


def test_the_grpo_sessions_base_evaluation_is_vla_evals(tmp_path):
    pytest.importorskip("lerobot")
    if not (BASE / "model.safetensors").is_file():
        pytest.skip("the shipped base checkpoint is not in this checkout")
    task, seeds, n = "pick_blue_cube", 200_000, 6
    lease, site = leased_site(tmp_path / "site.yaml")
    with lease:
        run = lambda *a: subprocess.run([sys.executable, "-m", "vla.cli", *a], cwd=ROOT, capture_output=True,  # noqa: E731
                                        text=True, timeout=400)
        ev = run("eval", "--checkpoint", str(BASE), "--task", task, "--episodes", str(n), "--seed-start", str(seeds),
                 "--exec-steps", "4", "--videos", "0", "--robot", site, "--serve", "always", "--threads", "1",
                 "--out", str(tmp_path / "eval"))
        assert ev.returncode == 0, ev.stdout[-2000:] + ev.stderr[-2000:]
        rl = run("rl", "--method", "grpo", "--checkpoint", str(BASE), "--task", task, "--exec-steps", "4",
                 "--eval-episodes", str(n), "--eval-seed-start", str(seeds), "--eval-every", "0", "--videos", "0",
                 "--total-episodes", "1", "--total-ticks", "4", "--group-size", "2", "--groups-per-update", "1",
                 "--warmup-steps", "0", "--robot", site, "--serve", "always", "--threads", "1",
                 "--out", str(tmp_path / "rl"))
        assert rl.returncode == 0, rl.stdout[-2000:] + rl.stderr[-2000:]
    from_eval = [(r["seed"], r["success"], r["ticks"])
                 for r in map(json.loads, (tmp_path / "eval" / "episodes.jsonl").open()) if r.get("task", task) == task]
    base = json.loads((tmp_path / "rl" / "base_eval.json").read_text())
    from_rl = [(r["seed"], r["success"], r["ticks"]) for r in base["per_episode"]]
    assert from_rl == from_eval
    assert len({t for _, _, t in from_eval}) > 1, "the check needs episodes of different lengths"
