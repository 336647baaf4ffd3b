"""DAgger while recording (`vla record --dagger CHECKPOINT`): a policy drives the robot, the expert
labels every state the policy reaches; DAgger's beta hands whole chunks back to the expert; a
fine-tuning run starts from the policy's weights (`vla train --init`)."""

import contextlib
import json

import numpy as np
import pytest

from tests.vla.test_dart import _Env, _Expert, _Writer
from vla.data.recording import record_episode
from vla.envs import ChunkDriver


class _Policy:
    """A VLAPolicy stand-in: chunks of ``exec_steps`` rows that push x by +0.1 per tick."""

    exec_steps = 3

    def __init__(self):
        self.calls = 0

    def __call__(self, obs):
        self.calls += 1
        return np.tile(np.array([0.1, 0, 0, 0, 0, 0, 0.5], np.float32), (self.exec_steps, 1))


def test_policy_drives_and_the_expert_labels_the_states_it_reaches():
    env, writer, pol = _Env(), _Writer(), _Policy()
    driver = ChunkDriver(pol)
    driver.reset(0)
    res = record_episode(env, _Expert(), writer, "go", max_steps=12, seed=1, driver=driver)
    assert res.frames == 12 and pol.calls == 4  # re-planned every exec_steps ticks
    executed = np.stack(env.executed)
    np.testing.assert_allclose(executed[:, 0], 0.1)  # the policy's actions ran ...
    states = np.stack([f["observation.state"] for f in writer.frames])
    labels = np.stack([f["action"] for f in writer.frames])
    np.testing.assert_allclose(labels[:, 0], -0.5 * states[:, 0], atol=1e-6)  # ... the expert's are stored
    assert states[-1, 0] > 1.0  # the states left the expert's path (it would have stayed at 0)
    assert not any(bool(f["intervention"][0]) for f in writer.frames)  # the expert did not drive


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_beta_hands_whole_chunks_to_the_expert(beta):
    env, writer, pol = _Env(), _Writer(), _Policy()
    driver = ChunkDriver(pol, beta=beta, seed=7)
    driver.reset(3)
    record_episode(env, _Expert(), writer, "go", max_steps=60, seed=3, driver=driver)
    executed = np.stack(env.executed)
    by_policy = np.isclose(executed[:, 0], 0.1) & np.isclose(executed[:, 6], 0.5)
    expert_ticks = ~by_policy
    flags = np.array([bool(f["intervention"][0]) for f in writer.frames])
    np.testing.assert_array_equal(flags, expert_ticks)  # the flag says who drove
    share = expert_ticks.reshape(-1, 3)  # chunks of exec_steps ticks are handed over whole
    assert np.all(share.all(1) | (~share).all(1))
    if beta == 0:
        assert not expert_ticks.any()
    elif beta == 1:
        assert expert_ticks.all()
    else:
        assert 0.2 < expert_ticks.mean() < 0.8


def test_driver_is_reseeded_per_episode_and_rejects_bad_beta():
    def run(seed):
        d = ChunkDriver(_Policy(), beta=0.5, seed=1)
        d.reset(seed)
        return [d({}) is None for _ in range(60)]

    assert run(4) == run(4)
    assert run(4) != run(5)
    with pytest.raises(ValueError, match="beta"):
        ChunkDriver(_Policy(), beta=1.5)


class _TickChunks:
    """A VLAPolicy stand-in for a TemporalEnsemble: whole chunks of H rows whose x is the episode tick each row is
    for, planned from the tick count the policy was called at (so a history out of step with the ticks shows)."""

    H = 4

    def __init__(self):
        self.exec_steps = self.H
        self.model = type("M", (), {"action_shape": (self.H, 7)})()
        self.t = 0

    def reset(self, seed=None):
        self.t = 0

    def __call__(self, obs):
        rows = np.zeros((self.H, 7), np.float32)
        rows[:, 0] = self.t + np.arange(self.H)
        rows[:, 6] = 0.5
        self.t += 1
        return rows


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_a_temporal_ensemble_plans_every_tick_also_those_the_expert_drives(beta):
    from vla.envs import TemporalEnsemble

    env, writer, pol = _Env(), _Writer(), _TickChunks()
    driver = ChunkDriver(TemporalEnsemble(pol), beta=beta, seed=2)
    driver.reset(0)
    record_episode(env, _Expert(), writer, "go", max_steps=24, seed=0, driver=driver)
    assert pol.t == 24  # one plan per tick, whoever drove it
    executed = np.stack(env.executed)
    flags = np.array([bool(f["intervention"][0]) for f in writer.frames])
    ticks = np.flatnonzero(~flags)
    # every chunk covering a tick agrees on it, so the ensemble's row is the tick itself unless its history slipped
    np.testing.assert_allclose(executed[ticks, 0], ticks)
    assert flags.any() == (beta > 0) and (~flags).any()


@pytest.mark.parametrize("argv, field", [
    (["--dagger-noise", "zero"], "--dagger"),
    (["--dagger-temporal-ensemble"], "--dagger"),
    (["--dagger-gripper", "binary"], "--dagger CHECKPOINT"),
    (["--dagger", "ckpt", "--dagger-noise", "loud"], "noise"),
    (["--dagger", "ckpt", "--dagger-temporal-ensemble", "-1"], "--dagger-temporal-ensemble"),
])
def test_vla_record_refuses_dagger_settings_it_cannot_use(tmp_path, capsys, argv, field):
    from vla.cli import main

    rc = main(["record", "--task", "pick_red_cube", "--teleop", "scripted", "--root", str(tmp_path / "d"), *argv])
    assert rc != 0 and field in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # refused before anything was recorded


class _ClosesAt:
    """Chunks of 3 rows that push x by +0.1 per tick and command the gripper closed (0.0) from tick ``k`` on."""

    exec_steps = 3

    def __init__(self, k):
        self.k, self.t = k, 0

    def reset(self, seed=None):
        self.t = 0

    def __call__(self, obs):
        rows = np.tile(np.array([0.1, 0, 0, 0, 0, 0, 1.0], np.float32), (3, 1))
        rows[:, 6] = (self.t + np.arange(3) < self.k).astype(np.float32)
        self.t += 3
        return rows


@pytest.mark.parametrize("k", [0, 5, 100])
def test_handover_at_close_gives_the_rest_of_the_episode_to_the_expert(k):
    env, writer = _Env(), _Writer()
    driver = ChunkDriver(_ClosesAt(k), handover_at_close=True)
    driver.reset(0)
    record_episode(env, _Expert(), writer, "go", max_steps=20, seed=0, driver=driver)
    flags = np.array([bool(f["intervention"][0]) for f in writer.frames])
    executed = np.stack(env.executed)
    first = min(k, 20)
    assert not flags[:first].any() and flags[first:].all()  # the policy up to its close, the expert after
    np.testing.assert_allclose(executed[:first, 6], 1.0)  # the policy's close command itself never ran
    assert driver.handed_over_at == (k if k < 20 else None)
    driver.reset(1)  # a new episode starts with the policy driving
    assert driver.handed_over_at is None


def test_with_handover_at_close_the_policy_drives_only_a_tasks_opening_pick():
    """Every sim task: without handover the policy may drive any skill, so each must be one the expert labels from
    the state; with --dagger-handover close it drives a task that opens with a pick only up to its first close, and
    the expert carries out the rest (place, stack) itself."""
    from hardware.sim_tasks import TASKS
    from hardware.teleop.scripted import ScriptedExpert
    from vla.commands.record import dagger_unsupported_skills

    ok = set(ScriptedExpert.FOLLOW_STATE_SKILLS)
    for name, task in TASKS.items():
        kinds = {s[0] for s in task.skills}
        assert dagger_unsupported_skills(task.skills, ok, "never") == sorted(kinds - ok), name
        opens_with_pick = task.skills[0][0] == "pick"
        assert dagger_unsupported_skills(task.skills, ok, "close") == ([] if opens_with_pick else sorted(kinds - ok)), name
    assert dagger_unsupported_skills(TASKS["stack_cubes"].skills, ok, "never") == []  # place is read off the state
    assert dagger_unsupported_skills(TASKS["push_block_to_marker"].skills, ok, "never") == []  # so is a push
    assert dagger_unsupported_skills(TASKS["push_block_to_marker"].skills, ("pick", "lift", "place"), "never") == ["push"]
    assert dagger_unsupported_skills(TASKS["push_block_to_marker"].skills, ("pick", "lift", "place"), "close") == ["push"]
    assert dagger_unsupported_skills(TASKS["stack_cubes"].skills, ok, "close") == []


def test_vla_record_refuses_a_dagger_task_with_skills_the_expert_cannot_label(tmp_path, capsys, monkeypatch):
    from hardware.teleop.scripted import ScriptedExpert
    from vla.cli import main

    monkeypatch.setattr(ScriptedExpert, "FOLLOW_STATE_SKILLS", ("pick", "lift", "place"))  # an expert without the push

    rc = main(["record", "--task", "push_block_to_marker", "--teleop", "scripted", "--root", str(tmp_path / "d"),
               "--dagger", "ckpt"])
    err = capsys.readouterr().err
    assert rc != 0 and "also has ['push']" in err
    assert not (tmp_path / "d").exists()


def test_handover_at_close_applies_only_to_a_task_that_opens_with_a_pick():
    from hardware.sim_tasks import TASKS
    from vla.commands.record import dagger_hands_over

    for name, task in TASKS.items():
        assert dagger_hands_over(task.skills, "close") == (task.skills[0][0] == "pick"), name
        assert not dagger_hands_over(task.skills, "never"), name
    assert not dagger_hands_over(TASKS["push_block_to_marker"].skills, "close")


@pytest.mark.e2e  # `vla record --dagger` on the sim bridge
def test_vla_record_dagger_push_with_handover_close_is_driven_by_the_policy(tmp_path, capsys):
    """Round 24: a push's fingers are shut from the first tick, so a handover at the policy's first close gave the
    whole episode to the expert (pure expert demos, logged as DAgger). With --dagger-handover close the policy now
    drives a push every tick, and the log says no handover applied."""
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla
    from vla.cli import main

    ckpt = save_tiny_vla(str(tmp_path / "ckpt"))
    root = tmp_path / "d"
    rc = main(["record", "--robot", "sim-franka-fast", "--task", "push_block_to_marker", "--teleop", "scripted",
               "--dagger", ckpt, "--dagger-handover", "close", "--dagger-exec-steps", "2", "--episodes", "1",
               "--max-steps", "6", "--serve", "own", "--root", str(root)])
    assert rc == 0, capsys.readouterr().err
    assert "does not open with a pick" in capsys.readouterr().out
    log = [json.loads(line) for line in open(root / "meta" / "vla_episodes.jsonl")]
    assert len(log) == 1 and log[0]["dagger"]["handover"] == "never" and log[0]["dagger"]["handed_over_at"] is None


class _Prompted:
    """Chunks of 3 rows whose x is the number of the plan; records the instruction of each plan and its resets."""

    exec_steps = 3

    def __init__(self):
        self.seen, self.resets = [], []

    def reset(self, seed=None):
        self.resets.append(seed)

    def __call__(self, obs):
        self.seen.append(obs["instruction"])
        return np.tile(np.array([len(self.seen), 0, 0, 0, 0, 0, 1.0], np.float32), (3, 1))


@pytest.mark.parametrize("switch", [1, 4, 6])
def test_prompt_fn_prompts_the_policy_and_replans_when_the_sub_skill_changes(switch):
    """`vla record --dagger-prompts subskills`: the policy is prompted with what prompt_fn says on each tick, not the
    observation's instruction; at a change the queued rows and the policy's history are dropped (one reset, with the
    episode's seed) and it re-plans on that very tick, also in the middle of a chunk."""
    pol, tick = _Prompted(), [0]
    driver = ChunkDriver(pol, prompt_fn=lambda: "pick up the red cube" if tick[0] < switch else "put it in the bowl")
    driver.reset(11)
    pol.resets.clear()
    rows = []
    for tick[0] in range(9):
        rows.append(driver({"instruction": "put the red cube in the bowl"})[0])
    assert driver.prompts == [[0, "pick up the red cube"], [switch, "put it in the bowl"]]
    assert pol.resets == [11]
    before = -(-switch // 3)  # plans made under the first prompt (one per 3 ticks)
    assert pol.seen[:before] == ["pick up the red cube"] * before
    assert set(pol.seen[before:]) == {"put it in the bowl"}
    assert rows[switch] == before + 1  # a new plan on the tick of the switch
    assert "put the red cube in the bowl" not in pol.seen


def test_prompt_fn_must_answer_an_instruction():
    driver = ChunkDriver(_Prompted(), prompt_fn=lambda: "")
    driver.reset(0)
    with pytest.raises(ValueError, match="prompt_fn"):
        driver({"instruction": "go"})


@pytest.mark.parametrize("argv, field", [
    (["--label-subskills", "--dagger-prompts", "subskills"], "--dagger CHECKPOINT"),
    (["--dagger", "ckpt", "--dagger-prompts", "subskills"], "--label-subskills"),
    (["--dagger", "ckpt", "--label-subskills", "--dagger-prompts", "subskills", "--dagger-handover", "close"],
     "--dagger-handover never"),
    (["--dagger", "ckpt", "--dagger-prompts", "steps"], "--dagger-prompts"),
])
def test_vla_record_refuses_subskill_prompts_it_cannot_use(tmp_path, capsys, argv, field):
    from vla.cli import main

    with pytest.raises(SystemExit) if "steps" in argv else contextlib.nullcontext():  # argparse's choices exit
        rc = main(["record", "--task", "place_cube_in_bowl", "--teleop", "scripted", "--root", str(tmp_path / "d"),
                   *argv])
        assert rc != 0
    assert field in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # refused before anything was recorded


@pytest.mark.e2e  # `vla record --dagger` on the sim bridge
def test_vla_record_dagger_prompts_the_policy_with_the_expert_sub_skill(tmp_path, capsys):
    """A long task's DAgger episode driven by sub-skill prompts: the log keeps the prompts the policy was driven
    with, and the frames' sub-skill labels are those prompts."""
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla
    from vla.cli import main

    ckpt = save_tiny_vla(str(tmp_path / "ckpt"))
    root = tmp_path / "d"
    rc = main(["record", "--robot", "sim-franka-fast", "--task", "place_cube_in_bowl", "--teleop", "scripted",
               "--dagger", ckpt, "--label-subskills", "--dagger-prompts", "subskills", "--dagger-exec-steps", "2",
               "--episodes", "1", "--max-steps", "6", "--serve", "own", "--root", str(root)])
    assert rc == 0, capsys.readouterr().err
    log = [json.loads(line) for line in open(root / "meta" / "vla_episodes.jsonl")]
    assert log[0]["dagger"]["prompts"] == [[0, "pick up the red cube"]]
    assert log[0]["segments"] == [[0, "pick up the red cube"]]
    assert log[0]["instruction"] == "put the red cube in the bowl"
