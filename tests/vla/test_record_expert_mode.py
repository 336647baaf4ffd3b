"""`vla record --expert-mode`: the scripted expert's grasp mode per episode, in the episode log."""

import json

import numpy as np
import pytest

from vla.cli import main


def test_expert_mode_needs_the_scripted_expert(tmp_path, capsys):
    assert main(["record", "--task", "pick_red_cube_yaw45", "--teleop", "keyboard", "--expert-mode", "ccw",
                 "--root", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--expert-mode" in err and "--teleop scripted" in err
    with pytest.raises(SystemExit):
        main(["record", "--teleop", "scripted", "--expert-mode", "left", "--root", str(tmp_path / "y")])


def test_list_tasks_marks_the_scene_variants(capsys):
    assert main(["record", "--list-tasks"]) == 0
    out = capsys.readouterr().out
    assert "pick_red_cube_crowded" in out and "a scene variant of pick_red_cube" in out


@pytest.mark.slow  # ~20 s: the bridge and two episodes
def test_random_expert_mode_is_logged_per_episode_and_turns_that_way(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path / "modes"
    assert main(["record", "--robot", "sim-franka-fast", "--task", "pick_red_cube_yaw45", "--teleop", "scripted",
                 "--expert-mode", "random", "--episodes", "2", "--no-video", "--root", str(root)]) == 0
    side = [json.loads(line) for line in open(root / "meta" / "vla_episodes.jsonl")]
    assert sorted(s["expert_mode"] for s in side) == ["ccw", "cw"] and all(s["success"] for s in side)
    ds = LeRobotDataset("local/modes", root=root).hf_dataset.with_format("numpy")
    actions, episode = np.asarray(ds["action"]), np.asarray(ds["episode_index"]).ravel()
    for i, s in enumerate(side):
        turn = float(actions[episode == i, 5].sum())  # drot about world z, rad
        assert (turn > 0.5) if s["expert_mode"] == "ccw" else (turn < -0.5), (s["expert_mode"], turn)
