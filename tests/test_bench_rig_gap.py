"""python -m bench.rig_gap --quick: a tiny BC + DAgger agent in emulation, scored in emulation, through the
rig on a simulated clock and with a failure source off, one fix; human-normalised with Nature's
constants; a second call reuses every agent and score in --work. The filmed emulation (make_env) is
tested in bench/tests/test_rig_gap.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, work):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "bench.rig_gap", "--quick", "--games", "breakout",
                           "--conditions", "emulation", "emulation-single-frame", "emulation-filmed", "rig",
                           "rig-no-latency", "rig-timing", "--fixes", "dagger-rig", "dagger-rig-history",
                           "dagger-rig-cotrain", "single-frame", "dagger-rig-ahead",
                           "--work", str(work), "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)


def test_bench_rig_gap_quick(tmp_path):
    work = tmp_path / "work"
    r = _run(tmp_path, work)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    res = json.load(open(tmp_path / "rig_gap.json"))
    assert res["mode"] == "quick" and res["provenance"]["quick"] is True and res["provenance"]["bench"] == "rig_gap"
    assert res["constants"]["breakout"] == {"random": 1.7, "human": 31.8}
    assert "PRIVILEGED" in res["teacher"]
    g = res["games"]["breakout"]
    t = g["table"]
    assert set(t) == {"emulation@emulation", "emulation@rig", "emulation@rig-no-latency", "dagger-rig@rig",
                      "dagger-rig@emulation", "dagger-rig-history@rig", "dagger-rig-history@emulation",
                      "dagger-rig-cotrain@rig", "dagger-rig-cotrain@emulation", "emulation@emulation-single-frame",
                      "emulation@emulation-filmed", "single-frame@rig", "single-frame@emulation",
                      "emulation@rig-timing", "dagger-rig-ahead@rig", "dagger-rig-ahead@emulation"}
    for row in t.values():
        assert row["games"] == 1
        assert abs(row["human_normalised"] - 100 * (row["mean_score"] - 1.7) / 30.1) < 1e-9
    assert abs(g["gap_points"] - (t["emulation@emulation"]["human_normalised"]
                                  - t["emulation@rig"]["human_normalised"])) < 1e-9
    assert set(g["recovered_by_switching_off"]) == {"rig-no-latency"}
    assert abs(g["recovered_by_skipping_the_camera"] - (t["emulation@rig-timing"]["human_normalised"]
                                                        - t["emulation@rig"]["human_normalised"])) < 1e-9
    single_cost = (t["emulation@emulation"]["human_normalised"]
                   - t["emulation@emulation-single-frame"]["human_normalised"])
    assert abs(g["single_frame_cost_in_emulation"] - single_cost) < 1e-9
    assert {"dagger-rig", "dagger-rig-history", "dagger-rig-cotrain", "single-frame", "dagger-rig-ahead"} <= set(
        g["fixes"])
    assert [x["how"] for x in res["training"]] == ["emulation", "dagger-rig", "dagger-rig-history",
                                                   "dagger-rig-cotrain", "single-frame", "dagger-rig-ahead"]
    # the PRIVILEGED teacher's own games: one each in quick mode, human-normalised as the agent's
    tg = res["teacher_games"]["breakout"]
    assert set(tg) == {"emulation, present RAM", "rig, present RAM", "rig, at-key RAM"}
    for v in tg.values():
        assert len(v["scores"]) == 1 and abs(v["human_normalised"] - 100 * (v["mean"] - 1.7) / 30.1) < 1e-9
    assert res["training"][1]["rounds"][0]["player"] == "student"  # the fix starts from the emulation agent
    from policies.dqn.dqn import DQN  # the delay-aware fix reads its last --fix-history actions, the others none

    (hist_run,) = work.glob("breakout/seed0/dagger-rig-history-*")
    (plain_run,) = [p for p in work.glob("breakout/seed0/dagger-rig-*") if len(p.name) == len("dagger-rig-") + 8]
    assert DQN.from_checkpoint(str(hist_run)).cfg.action_history == res["fix_history"] == 2
    assert DQN.from_checkpoint(str(plain_run)).cfg.action_history == 0
    (co_run,) = work.glob("breakout/seed0/dagger-rig-cotrain-*")
    co = [json.loads(x) for x in open(co_run / "rounds.jsonl")]
    assert [r["cotrain_samples"] for r in co] == [res["fix_cotrain"]] == [100]  # quick: 100 emulation decisions
    assert DQN.from_checkpoint(str(co_run)).cfg.action_history == 2
    (ahead_run,) = work.glob("breakout/seed0/dagger-rig-ahead-*")  # labels the state its key meets
    assert json.load(open(ahead_run / "bc_config.json"))["label_at_key"] is True
    assert json.load(open(hist_run / "bc_config.json"))["label_at_key"] is False
    assert DQN.from_checkpoint(str(ahead_run)).cfg.action_history == 2
    assert res["rig_noise"]["latency_ms"] == 50.0
    assert (tmp_path / "rig_gap.png").stat().st_size > 5_000
    # a second call finds every agent and score in --work
    before = {p: p.stat().st_mtime_ns for p in work.rglob("*.json")}
    r = _run(tmp_path, work)
    assert r.returncode == 0, r.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in work.rglob("*.json")} == before


def test_bench_rig_gap_scores_each_kept_round(tmp_path):
    """--score-rounds: the fixes keep every round's student and the rounds named are scored as the last one
    is; the curve lands beside the table, not in it; a fix without its rounds kept stops the run by name."""
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "bench.rig_gap", "--quick", "--games", "breakout", "--conditions",
           "emulation", "rig", "--fixes", "dagger-rig-ahead", "--fix-conditions", "rig", "--teacher-games", "0",
           "--score-rounds", "1", "--work", str(work), "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    res = json.load(open(tmp_path / "rig_gap.json"))
    assert res["score_rounds"] == [1]
    g = res["games"]["breakout"]
    assert set(g["table"]) == {"emulation@emulation", "emulation@rig", "dagger-rig-ahead@rig"}
    (run,) = work.glob("breakout/seed0/dagger-rig-ahead-*")
    assert sorted(p.name for p in (run / "rounds").iterdir()) == ["01", "02"]  # quick: 2 fix rounds with it
    (kept,) = [s for s in res["scores"] if s.get("round") == 1]
    assert (kept["agent"], kept["condition"]) == ("dagger-rig-ahead", "rig")
    assert os.path.isfile(run / "rounds" / "01" / "scores" / "rig-g1-m60-e0.05.json")
    curve = g["fix_round_curve"]["dagger-rig-ahead"]["rig"]
    assert [c["round"] for c in curve] == [1, 2]
    assert curve[0]["human_normalised"] == kept["human_normalised"]
    assert curve[1]["human_normalised"] == g["table"]["dagger-rig-ahead@rig"]["human_normalised"]
    # a round named that this fix did not keep: the run stops before scoring and names the directory
    import shutil

    shutil.rmtree(run / "rounds" / "01")
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode != 0
    assert str(run / "rounds" / "01") in r.stderr and "Traceback" not in r.stderr
