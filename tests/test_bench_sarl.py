"""bench/sarl.py --quick runs the fixed prompt policies and SARL through `vla rl` and writes the report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_sarl_quick(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.sarl", "--quick", "--checkpoint",
                        str(tmp_path / "ckpt"), "--task", "place_cube_in_bowl", "--terminator", "subgoal",
                        "--arms", "subskills", "sarl", "--port0", "6740", "--out", str(tmp_path / "res"), "--work", str(tmp_path / "work")],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "sarl.json").read_text())
    assert sorted(x["arm"] for x in res["runs"]) == ["sarl", "subskills"]
    cell = res["summary"]["place_cube_in_bowl"]["subgoal"]
    assert set(cell) == {"task prompt", "subskills", "sarl"}
    for arm in ("subskills", "sarl"):
        assert 0 <= cell[arm]["rate"] <= 1 and len(cell[arm]["ci95"]) == 2
    sarl = [x for x in res["runs"] if x["arm"] == "sarl"][0]
    assert sarl["ticks"] >= 300 and sarl["vla_weights_unchanged"] and sarl["grounding"]  # 2 x 150-tick episodes
    # the hand-written arm gives the sub-skill instructions in order; SARL's grounding counts each prompt it chose
    eps = [json.loads(x) for x in open(tmp_path / "work" / "place_cube_in_bowl-subgoal-sarl-s0" / "episodes.jsonl")]
    assert sum(len(e["sarl_steps"]) for e in eps) == sum(g["chosen"] for g in sarl["grounding"].values())
    cfg = json.loads((tmp_path / "work" / "place_cube_in_bowl-subgoal-subskills-s0" / "rl_config.json").read_text())
    assert cfg["agent"]["prompt_policy"] == "subskills" and cfg["total_ticks"] == 0
    assert res["goals"]["place_cube_in_bowl/subgoal"]["met"] is False  # one seed and 2 episodes cannot meet it
    assert (tmp_path / "res" / "sarl.png").stat().st_size > 10_000
    assert str(tmp_path) not in (tmp_path / "res" / "sarl.json").read_text()  # no machine paths
