"""bench/extoken.py --quick runs token-free GRPO and ExToken (selector and random-token deployment) through `vla rl`
on the crowded pick and writes the report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_turns(task_name: str, seeds: list[int]) -> dict[int, str]:
    """Scene seed -> the grasp turn that does not land a finger on the neighbour (read off the layout)."""
    import numpy as np

    from hardware.sim_tasks import get_task
    from tests.hardware.expert_driver import blocked_mode

    task = get_task(task_name)
    return {s: "cw" if blocked_mode(task.layout(np.random.default_rng(s))) == "ccw" else "ccw" for s in seeds}


def test_bench_extoken_quick(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla
    from tests.net import free_port_block

    port = free_port_block(20)
    save_tiny_vla(str(tmp_path / "tok"), num_tokens=2)
    save_tiny_vla(str(tmp_path / "notok"))
    tokens = tmp_path / "tokens.json"  # token 1 was recorded in the ccw turn, token 2 in the cw turn
    tokens.write_text(json.dumps({"purity": {"field": "expert_mode", "table": {"1": {"ccw": 4, "cw": 1},
                                                                               "2": {"cw": 5}}}}))
    r = subprocess.run([sys.executable, "-m", "bench.extoken", "--quick", "--checkpoint",
                        str(tmp_path / "tok"), "--baseline-checkpoint", str(tmp_path / "notok"),
                        "--arms", "grpo", "extoken", "no-selector", "--jobs", "1", "--port0", str(port),
                        "--tokens", str(tokens), "--out", str(tmp_path / "res"), "--work", str(tmp_path / "work")],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "extoken.json").read_text())
    assert sorted(x["arm"] for x in res["runs"]) == ["extoken", "grpo", "no-selector"]
    cell = res["summary"]["pick_red_cube_crowded"]
    for arm in ("grpo", "extoken", "no-selector"):
        assert 0 <= cell[arm]["rate"] <= 1 and len(cell[arm]["ci95"]) == 2 and cell[arm]["rollouts"] == 2
        assert cell[arm]["ee_coverage"] is not None and cell[arm]["ee_coverage"] >= 1  # diversity logged by every arm
    runs = {x["arm"]: x for x in res["runs"]}
    for arm, run in runs.items():
        assert run["vla_weights_unchanged"] and run["agent"]["updates"] == 1 and run["episodes"] == 2
        cfg = json.loads((tmp_path / "work" / f"pick_red_cube_crowded-{arm}-s0" / "rl_config.json").read_text())
        assert cfg["method"] == ("grpo" if arm == "grpo" else "extoken")
        assert cfg["checkpoint"].endswith("notok" if arm == "grpo" else "tok")
    assert json.loads((tmp_path / "work" / "pick_red_cube_crowded-no-selector-s0" / "rl_config.json")
                      .read_text())["agent"]["deploy"] == "random"
    assert sorted(runs["extoken"]["token_counts"]) == ["1", "2"]  # the group of 2 tried both tokens (stratified)
    # the final evaluation's deployed tokens against each scene's free turn (PRIVILEGED, from the layout)
    for arm in ("extoken", "no-selector"):
        eps = runs[arm]["final_episodes"]
        assert [e["seed"] for e in eps] == [200000, 200001] and all(e["token"] in (1, 2) for e in eps)
        free = free_turns("pick_red_cube_crowded", [200000, 200001])
        want = sum(("ccw" if e["token"] == 1 else "cw") == free[e["seed"]] for e in eps)
        assert runs[arm]["deployed_turns"]["free_turn_token"] == want
        assert cell[arm]["deployed_turns"]["episodes"] == 2
    assert "final_episodes" in runs["grpo"] and "deployed_turns" not in cell["grpo"]  # no tokens: no turn to judge
    # the two checkpoints' base evaluations are never shared
    assert runs["extoken"]["base_from"] in (None, "pick_red_cube_crowded-no-selector-s0")
    assert res["goals"]["pick_red_cube_crowded"]["quarter_budget"]["met"] is False  # one seed cannot meet it
    assert (tmp_path / "res" / "extoken.png").stat().st_size > 10_000
    assert str(tmp_path) not in (tmp_path / "res" / "extoken.json").read_text()  # no machine paths
