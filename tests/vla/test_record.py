"""`vla record` end to end on the fast simulated Franka: scripted demos into a LeRobot v3 dataset."""

import json

import numpy as np
import pytest

from vla.cli import main


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "pick"
    rc = main(["record", "--robot", "sim-franka-fast", "--task", "pick_red_cube", "--teleop", "scripted",
               "--episodes", "2", "--root", str(root)])
    assert rc == 0
    return root


def test_lerobot_loads_what_vla_record_wrote(recorded):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/pick", root=recorded)
    assert ds.num_episodes == 2 and ds.fps == 10
    side = [json.loads(line) for line in open(recorded / "meta" / "vla_episodes.jsonl")]
    assert [s["frames"] for s in side] == [int(ds.meta.episodes[i]["length"]) for i in range(2)]
    assert ds.num_frames == sum(s["frames"] for s in side) and all(s["success"] for s in side)
    assert all(s["roi"] == {"front": [0.2, 0.35, 0.8, 0.85]} for s in side)  # the site's region of interest
    for key in ("observation.images.front", "observation.images.wrist", "observation.state", "action",
                "intervention", "observation.capture_time"):
        assert key in ds.features
    assert ds.features["observation.images.front"]["dtype"] == "video"
    first, last = ds[0], ds[ds.num_frames - 1]
    assert first["task"] == "pick up the red cube"
    img = first["observation.images.front"]
    assert tuple(img.shape) == (3, 224, 224) and float(img.std()) > 0.05  # a decoded, non-blank frame
    assert bool(first["intervention"].item())
    # capture times are real and increasing within an episode
    ep0 = ds.hf_dataset.with_format("numpy")["observation.capture_time"][: side[0]["frames"]]
    assert np.all(np.diff(np.asarray(ep0).ravel()) > 0)
    assert last["action"].shape == (7,)


@pytest.mark.e2e  # `vla replay` on the sim bridge
def test_dataset_check_and_replay_reproduce_the_demo(recorded, capsys):
    assert main(["dataset", "check", "--root", str(recorded)]) == 0
    rc = main(["replay", "--robot", "sim-franka-fast", "--root", str(recorded), "--episode", "1"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "task success on replay: True" in captured.out, captured.out


def test_record_refuses_unknown_task_with_suggestion(tmp_path, capsys):
    assert main(["record", "--task", "pick_red_cub", "--teleop", "scripted", "--root", str(tmp_path / "x")]) == 2
    assert "did you mean 'pick_red_cube'" in capsys.readouterr().err


def test_list_tasks_needs_no_root(capsys):
    """`vla record --list-tasks` as the README shows it (issue 12); without --list-tasks, a
    missing --root is one clear line."""
    assert main(["record", "--list-tasks"]) == 0
    assert "pick_red_cube" in capsys.readouterr().out
    assert main(["record", "--task", "pick_red_cube", "--teleop", "scripted"]) == 2
    assert "--root is required" in capsys.readouterr().err


@pytest.mark.e2e  # `vla record` on the sim bridge
def test_mistake_rate_records_the_experts_wrong_goal_as_kept_failures(tmp_path):
    """--mistake-rate 1 with a full-quality expert: every episode goes for a wrong cube, so every kept
    episode is a failure, and the side log says which rate made it (a multimodal base for RL)."""
    root = tmp_path / "mm"
    assert main(["record", "--robot", "sim-franka-fast", "--task", "pick_red_cube", "--teleop", "scripted",
                 "--mistake-rate", "1", "--expert-seed", "7", "--keep-failures", "--episodes", "2",
                 "--root", str(root)]) == 0
    side = [json.loads(line) for line in open(root / "meta" / "vla_episodes.jsonl")]
    assert len(side) == 2 and not any(s["success"] for s in side)
    assert all(s["mistake_rate"] == 1.0 and s["expert_quality"] == 1.0 and s["expert_seed"] == 7 for s in side)
    assert [s["seed"] for s in side] == [0, 1]  # the scenes still follow --seed


@pytest.mark.parametrize("argv", [["--teleop", "keyboard", "--mistake-rate", "0.5"],
                                  ["--teleop", "scripted", "--mistake-rate", "1.5"],
                                  ["--teleop", "keyboard", "--expert-seed", "3"],
                                  ["--teleop", "keyboard", "--mistake-kind", "close_early"]])
def test_record_refuses_expert_knobs_without_the_scripted_expert(tmp_path, capsys, argv):
    assert main(["record", "--task", "pick_red_cube", *argv, "--root", str(tmp_path / "x")]) == 2
    assert argv[2] in capsys.readouterr().err


@pytest.mark.e2e  # `vla record` on the sim bridge
@pytest.mark.parametrize("code", ["deadline_exceeded", "safe_state"])
def test_a_refused_late_command_discards_the_episode_and_records_its_scene_again(tmp_path, capsys, monkeypatch,
                                                                                    code):
    """On a loaded machine a command can reach the robot after its deadline; the server refuses it
    (nothing moves). The recorder must not die with the dataset half-written: it discards that
    episode and records the same seed again, so the kept scenes are still --seed, --seed + 1, ..."""
    import vla.data.recording as recording
    from robot_io.client import CommandError

    real = recording.record_episode
    calls = {"n": 0}
    fail_at = int(np.random.default_rng().integers(1, 12))  # a random tick of the first episode

    def flaky(env, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            step, ticks = env.step, {"n": 0}

            def late_step(action):
                ticks["n"] += 1
                if ticks["n"] == fail_at:
                    raise CommandError("arm", code, "command arrived 0.3 ms after its deadline; not applied")
                return step(action)

            env.step = late_step
            try:
                return real(env, *a, **kw)
            finally:
                env.step = step
        return real(env, *a, **kw)

    monkeypatch.setattr(recording, "record_episode", flaky)
    root = tmp_path / "late"
    assert main(["record", "--robot", "sim-franka-fast", "--task", "pick_red_cube", "--teleop", "scripted",
                 "--episodes", "2", "--root", str(root)]) == 0
    out = capsys.readouterr()
    assert "recording seed 0 again" in out.out + out.err
    side = [json.loads(line) for line in open(root / "meta" / "vla_episodes.jsonl")]
    assert [s["seed"] for s in side] == [0, 1] and all(s["success"] for s in side)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/late", root=root)
    assert ds.num_episodes == 2 and ds.num_frames == sum(s["frames"] for s in side)


@pytest.mark.e2e  # `vla record` on the sim bridge
def test_label_subskills_gives_each_frame_the_experts_sub_skill(tmp_path):
    """--label-subskills: the frames of a long task carry the sub-skill the expert was in (LeRobot's
    per-frame task), the episode log keeps the task's instruction and the segments."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from vla.data.demos import load_demos

    root = tmp_path / "place"
    assert main(["record", "--robot", "sim-franka-fast", "--task", "place_cube_in_bowl", "--teleop", "scripted",
                 "--episodes", "1", "--label-subskills", "--root", str(root)]) == 0
    (row,) = [json.loads(line) for line in open(root / "meta" / "vla_episodes.jsonl")]
    assert row["instruction"] == "put the red cube in the bowl" and row["success"]
    (first, a), (switch, b) = row["segments"]
    assert (first, a, b) == (0, "pick up the red cube", "put it in the bowl") and 10 < switch < row["frames"] - 5
    ds = LeRobotDataset("local/place", root=root)
    tasks = {int(i): t for t, i in zip(ds.meta.tasks.index, ds.meta.tasks["task_index"])}
    per_frame = [tasks[int(i)] for i in ds.hf_dataset.with_format("numpy")["task_index"]]
    assert per_frame == [a] * switch + [b] * (row["frames"] - switch)
    (ep,) = load_demos([str(root)], 32, progress=False)
    assert ep.instruction == row["instruction"] and ep.frame_instructions == per_frame
    # the state at the switch: the red cube is up at the carry height, in the closed gripper
    assert ep.state[switch, 2] > 0.1 and ep.state[switch, 7] < 0.8


def test_label_subskills_is_refused_for_a_one_skill_task(tmp_path, capsys):
    assert main(["record", "--task", "pick_red_cube", "--teleop", "scripted", "--label-subskills",
                 "--root", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--label-subskills" in err and "place_cube_in_bowl" in err


@pytest.mark.e2e  # two `vla record` processes, each with its own bridge
def test_serve_own_lets_two_recordings_of_the_sim_run_at_once(tmp_path):
    """--serve own: each recording copies the simulated site onto leased ports and starts its own bridge, so two
    recordings of the same preset run side by side (the default port of the preset stays free)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "vla.cli", "record", "--robot", "sim-franka-fast", "--task", "pick_red_cube",
           "--teleop", "scripted", "--episodes", "1", "--serve", "own", "--no-video"]
    procs = [subprocess.Popen(cmd + ["--seed", str(s), "--root", str(tmp_path / f"d{s}")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for s in (0, 1)]
    outs = [p.communicate(timeout=280)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-2000:]
    for s in (0, 1):
        assert main(["dataset", "check", "--root", str(tmp_path / f"d{s}")]) == 0
    sites = sorted(tmp_path.glob("d*.bridge-*-site.yaml"))
    assert len(sites) == 2 and sites[0].read_text() != sites[1].read_text()  # ports of their own


def test_serve_own_is_refused_for_a_real_robot(tmp_path, capsys):
    assert main(["record", "--robot", "franka-lab", "--task", "pick_red_cube", "--teleop", "scripted",
                 "--serve", "own", "--root", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--serve own" in err and "real robot" in err and not (tmp_path / "x").exists()
