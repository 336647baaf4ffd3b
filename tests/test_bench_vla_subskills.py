"""python -m bench.vla_subskills: each sub-skill instruction prompted from the state where it starts; its sim
bridges on leased ports (no --port0). The sub-skill list (subskills) is tested in bench/tests/test_vla_subskills.py."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_subskill_bench_hands_over_where_each_sub_skill_starts(tmp_path):
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.vla_subskills", "--checkpoint", str(tmp_path / "ckpt"),
                        "--task", "place_cube_in_bowl", "--episodes", "1", "--budget", "8", "--jobs", "1",
                        "--exec-steps", "8", "--handover", "expert", "--no-task-prompt", "--out", str(tmp_path / "res")],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads((tmp_path / "res" / "vla_subskills.json").read_text())
    pick, place = out["episodes"]
    assert (pick["k"], pick["handover_tick"], place["k"]) == (0, 0, 1)
    # the oracle carried the red cube up before the VLA took over with "put it in the bowl"
    assert place["reached"] and 10 < place["handover_tick"] < 150 and place["instruction"] == "put it in the bowl"
    assert all(e["seed"] == 100_000 and e["ticks"] == 8 or e["success"] for e in out["episodes"])
    assert [row["instruction"] for row in out["subskills"]] == ["pick up the red cube", "put it in the bowl"]
    assert {row["handover"] for row in out["subskills"]} == {"expert"} and out["noise"] == "zero"
    assert not out["checkpoint"].startswith("/") and out["provenance"]["bench"] == "vla_subskills"
    assert (tmp_path / "res" / "vla_subskills.png").stat().st_size > 5_000


def test_chain_gives_the_sub_skill_prompts_in_order_from_the_start(tmp_path):
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.vla_subskills", "--checkpoint", str(tmp_path / "ckpt"),
                        "--chain", "--task", "stack_cubes", "--episodes", "1", "--budget", "4", "--jobs", "1",
                        "--exec-steps", "4", "--out", str(tmp_path / "res")],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads((tmp_path / "res" / "vla_subskills.json").read_text())
    pick, place, chain, task = out["subskills"]
    assert [(x["k"], x["handover"]) for x in (pick, place, chain, task)] == [(0, "own"), (1, "own"), (-1, "none"),
                                                                             (-2, "none")]
    assert chain["instruction"] == "pick up the green cube -> put it on the red cube"
    assert task["instruction"] == "stack the green cube on the red cube"
    # an untrained VLA does not pick the green cube up in 4 ticks: the sequence stops at its first prompt, so the
    # place is never reached from the VLA's own hand-over
    assert (pick["reached"], pick["successes"], place["reached"]) == (1, 0, 0)
    ep = next(e for e in out["episodes"] if e["k"] == -1)
    assert ep["ticks"] == 4 and ep["skills_done"] == 0 and ep["ticks_per_skill"] == [None] and not ep["success"]
    # the task prompt runs for the task's tick limit
    assert next(e for e in out["episodes"] if e["k"] == -2)["ticks"] == 150
