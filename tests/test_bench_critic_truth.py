"""bench/critic_truth.py --quick: decision states and Monte-Carlo truth from a base's rollouts, then a residual
session's critic scored at its snapshots and final checkpoint against it (issue 61). An end-to-end run (a sim
bridge, a `vla rl` session and the bench as subprocesses, about 3 minutes on 2 cores)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def test_bench_critic_truth_quick(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    from robot_io.ports import PortLease
    from robot_io.site import load_site, relocate_site, site_ports

    ckpt = save_tiny_vla(str(tmp_path / "ckpt"))
    run = tmp_path / "run"
    base = load_site("sim-franka-fast")
    with PortLease(len(site_ports(base))) as lease:  # a bridge of the session's own (the suite may run others)
        site = relocate_site(base, lease.ports, str(tmp_path / "site.yaml")).path
    r = subprocess.run([sys.executable, "-m", "vla.cli", "rl", "--method", "residual", "--checkpoint", ckpt,
                        "--task", "pick_red_cube", "--out", str(run), "--robot", site, "--total-ticks", "96", "--snapshot-every", "48",
                        "--warmup-steps", "4", "--exec-steps", "4", "--batch-size", "16", "--eval-every", "0",
                        "--eval-episodes", "1", "--max-episode-ticks", "24", "--videos", "0", "--serve", "always"],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert len(list((run / "snapshots").glob("agent_*.pt"))) >= 1
    out = tmp_path / "res"
    r = subprocess.run([sys.executable, "-m", "bench.critic_truth", "--quick", "--checkpoint", ckpt, "--task",
                        "pick_red_cube", "--max-ticks", "24", "--random-states", "1", "--jobs", "1",
                        "--run", f"legacy={run}", "--fit", f"off={run}", "--fit-steps", "20", "--fit-targets",
                        "mc", "legacy", "--out", str(out), "--name", "ct"],
                       cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "ct.json").read_text())
    assert res["bench"] == "critic_truth" and len(res["commit"]) == 40 and res["quick"] is True
    states = res["truth_states"]
    assert states and all(s["replay_state_error"] < 1e-6 for s in states)  # the replayed prefix is the same state
    assert all(len(s["p"]) == 2 + 1 + 1 for s in states)  # 2 noises, 1 residual and zero
    truth = json.loads((out / "ct_truth.json").read_text())
    st = truth["states"][0]
    assert np.asarray(st["success"]).shape == (4, 2) and np.asarray(st["chunks"]).shape[1:] == (4, 7)
    scored, *fitted = res["runs"]
    assert [f["name"] for f in fitted] == ["off:mc", "off:legacy"]  # one offline fit per value target
    for f in fitted:
        assert f["method"] == "residual offline fit" and len(f["checkpoints"]) == 1
        fit = f["checkpoints"][0]["fit"]
        assert fit["transitions"] > 0 and fit["held_out_episodes"] >= 1 and fit["steps"] == 20
        assert len(f["checkpoints"][0]["states"]) == len(states)
    assert fitted[1]["target"]["time_limit"] == "bootstrap" and fitted[0]["target"]["n_step"] is None
    assert scored["method"] == "residual" and scored["target"]["time_limit"] == "terminal"
    ticks = [c["ticks"] for c in scored["checkpoints"]]
    assert len(ticks) >= 2 and ticks == sorted(ticks)  # snapshots then the final checkpoint
    s = res["summary"]["pick_red_cube"]["residual"]["legacy"]
    assert set(s) >= {"median_spearman", "calibration_error", "by_checkpoint"}
    assert s["calibration_error"] >= 0 and len(s["by_checkpoint"]) == len(ticks)
    assert (out / "ct.png").stat().st_size > 10_000
    assert str(tmp_path) not in (out / "ct.json").read_text()  # no machine paths
    # --fit-truth: one scene left out at a time (a second scene made from the first: the fit's path, not its figure)
    two = dict(truth)
    two["states"] = truth["states"] + [{**st, "scene": st["scene"] + 1} for st in truth["states"]]
    (out / "two_truth.json").write_text(json.dumps(two))
    r = subprocess.run([sys.executable, "-m", "bench.critic_truth", "--truth", str(out / "two_truth.json"),
                        "--fit-truth", "--fit-steps", "5", "--out", str(out), "--name", "loso"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (loso,) = json.loads((out / "loso.json").read_text())["runs"]
    assert loso["method"] == "truth offline fit" and loso["checkpoints"][0]["fit"]["scenes"] == 2
    assert len(loso["checkpoints"][0]["states"]) == 2 * len(states)
    r = subprocess.run([sys.executable, "-m", "bench.critic_truth", "--truth", str(out / "ct_truth.json"),
                        "--fit-truth", "--out", str(out), "--name", "loso1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1 and "it needs 2" in r.stderr and "Traceback" not in r.stderr
    # the same rollouts pooled twice would double-count them: refused, naming the state
    r = subprocess.run([sys.executable, "-m", "bench.critic_truth", "--truth", str(out / "ct_truth.json"),
                        str(out / "ct_truth.json"), "--out", str(out), "--name", "dup"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "continuation streams" in r.stderr and "Traceback" not in r.stderr


def test_bench_critic_truth_refuses_a_bad_run_argument(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.critic_truth", "--run", "no-equals-sign"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "NAME=RUN_DIR" in r.stderr and "Traceback" not in r.stderr


def test_bench_critic_truth_killed_leaves_no_worker_or_bridge(tmp_path):
    """SIGKILL the bench at a random moment while its two workers measure: every process it started (the pool's
    workers and their sim bridges) is gone soon after, so nothing keeps simulating for a run that is gone."""
    pytest.importorskip("lerobot")
    import random
    import signal
    import time

    import psutil

    from tests.conftest import save_tiny_vla

    ckpt = save_tiny_vla(str(tmp_path / "ckpt"))
    p = subprocess.Popen([sys.executable, "-m", "bench.critic_truth", "--quick", "--checkpoint", ckpt, "--task",
                          "pick_red_cube", "--max-ticks", "24", "--scenes", "2", "--jobs", "2", "--out",
                          str(tmp_path / "res"), "--name", "ct"], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    me = psutil.Process(p.pid)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until both workers have their bridges up
        kids = me.children(recursive=True)
        if sum("bridge" in " ".join(k.cmdline()) for k in kids if k.is_running()) >= 2:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the bench never started two bridges")
    time.sleep(random.uniform(0.0, 8.0))
    kids = me.children(recursive=True)
    p.send_signal(signal.SIGKILL)
    p.wait(10)

    def alive():  # a zombie has ended (who reaps an orphan depends on the machine's init)
        out = []
        for k in kids:
            try:
                if k.status() != psutil.STATUS_ZOMBIE:
                    out.append(k)
            except psutil.NoSuchProcess:
                pass
        return out

    deadline = time.monotonic() + 30
    while alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = alive()
    names = [" ".join(k.cmdline()[:5]) for k in left]
    for k in left:
        k.kill()
    assert not left, names
