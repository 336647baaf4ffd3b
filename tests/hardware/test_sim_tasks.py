"""Sim task suite: layouts, predicates, sub-goals, the scripted expert, the success reward."""

import math
import os
import types

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests.hardware.expert_driver import apply_ee_delta, privileged_from_state, run_episode  # noqa: E402
from hardware import sim_franka, sim_tasks  # noqa: E402
from hardware.base import DeviceError  # noqa: E402
from hardware.sim_tasks import (CUBE_HALF, FOOTPRINT, OBJECT_NAMES, TASKS, SubgoalTracker, achieved_skills, achieved_tasks,  # noqa: E402
                                cube_yaw, get_task, objects_from_state)
from hardware.teleop import load_teleop  # noqa: E402
from hardware.teleop.scripted import (HOME_DOWN_QUAT, ExpertKnobs, ScriptedExpert, expected_success,  # noqa: E402
                                      finger_angle)
from rewards.sim_success import success_reward  # noqa: E402
from robot_io.limits import ArmLimits  # noqa: E402
from robot_io.wire import Message  # noqa: E402

LONG = [n for n, t in TASKS.items() if len(t.skills) > 2]
SINGLE = [n for n in TASKS if n not in LONG and n != "pick_red_cube_crowded"]  # crowded: one turn fits (test_expert_modes)


def pose(x, y, z, yaw=0.0):
    return np.array([x, y, z, math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])


def scene(**over):
    """A hand-made state: everything resting apart on the table, overrides by name."""
    objs = {"red_cube": pose(0.45, 0.10, CUBE_HALF), "green_cube": pose(0.55, 0.15, CUBE_HALF),
            "blue_cube": pose(0.60, -0.05, CUBE_HALF), "bowl": pose(0.45, -0.15, 0.0045),
            "target": pose(0.60, 0.05, 0.0015)}
    objs.update(over)
    return objs


FAR = np.array([0.5, 0.0, 0.4])  # tcp well away from every object


def test_registry_and_scene_constants_agree_with_the_simulator():
    assert len(TASKS) >= 6 and LONG, "at least six tasks, one of them long-horizon"
    assert sim_tasks.OBJECT_NAMES == sim_franka.OBJECT_NAMES
    assert sim_tasks.CUBE_HALF == sim_franka.CUBE_HALF and sim_tasks.BOWL_RADIUS == sim_franka.BOWL_RADIUS
    assert sim_tasks.TARGET_RADIUS == sim_franka.TARGET_RADIUS and sim_tasks.OBJECT_REGION == sim_franka.OBJECT_REGION
    for name, t in TASKS.items():
        assert t.name == name and t.instruction and len(t.instructions) >= 3 and t.max_steps > 0
        assert len(set(t.instructions)) == len(t.instructions)


def test_get_task_suggests_on_typos():
    assert get_task("stack_cubes") is TASKS["stack_cubes"]
    with pytest.raises(KeyError, match="did you mean 'place_cube_in_bowl'"):
        get_task("place_cube_in_bowel")
    with pytest.raises(KeyError, match="Known:"):
        get_task("fly_to_the_moon")


@pytest.mark.parametrize("name", list(TASKS))
def test_layout_is_seeded_reachable_and_non_overlapping(name):
    task = TASKS[name]
    a, b = task.layout(np.random.default_rng(3)), task.layout(np.random.default_rng(3))
    assert a == b and set(a) == set(OBJECT_NAMES)
    assert a != task.layout(np.random.default_rng(4))
    for seed in range(20):
        p = task.layout(np.random.default_rng(seed))
        for n, (x, y, yaw) in p.items():
            assert 0.35 <= x <= 0.65 and abs(y) <= 0.22 and -math.pi <= yaw <= math.pi, (n, x, y)
        crowded = {task.cube, task.neighbour} if getattr(task, "neighbour", None) else set()
        for i, n in enumerate(OBJECT_NAMES):
            for m in OBJECT_NAMES[i + 1:]:
                d = math.dist(p[n][:2], p[m][:2])
                if {n, m} == crowded:  # set 1 cm apart on purpose: tests/hardware/test_expert_modes.py
                    continue
                assert d > FOOTPRINT[n] + FOOTPRINT[m] + 0.03, (seed, n, m, d)
        if name == "push_block_to_marker":
            assert 0.10 < math.dist(p["blue_cube"][:2], p["target"][:2]) < 0.20


def test_reset_with_a_task_places_its_layout(sim):
    task = TASKS["push_block_to_marker"]
    want = task.layout(np.random.default_rng(11))
    s = sim.reset(seed=11, task=task.name)
    objs = objects_from_state(s, sim.describe()["objects"])
    for n, (x, y, yaw) in want.items():
        assert math.dist(objs[n][:2], (x, y)) < 0.005, n
    assert abs(math.remainder(cube_yaw(objs["blue_cube"]) - want["blue_cube"][2], math.pi / 2)) < 0.02
    again = sim.reset(seed=11, task=task.name).extras["objects"]
    np.testing.assert_allclose(again, s.extras["objects"], atol=1e-9)
    with pytest.raises(DeviceError, match="did you mean 'stack_cubes'"):
        sim.reset(seed=1, task="stack_cube")


def test_predicates_on_hand_made_states():
    t = TASKS
    table = scene()
    assert not any(t[n].success(table, FAR, 1.0) for n in TASKS)
    assert achieved_tasks(table, FAR, 1.0) == []
    # held 12 cm up between closed fingers: picked; the same cube resting on the table is not
    held = scene(red_cube=pose(0.45, 0.10, 0.12))
    ee = np.array([0.45, 0.10, 0.122])
    assert t["pick_red_cube"].success(held, ee, 0.55)
    assert not t["pick_red_cube"].success(held, ee, 1.0)  # fingers open: it is falling, not held
    assert not t["lift_green_cube"].success(held, ee, 0.55)
    assert "pick_red_cube" in achieved_tasks(held, ee, 0.55)
    # held 8 cm up: below pick_red_cube's 10 cm, but the pick sub-skill is done (above 6 cm); open fingers: not held
    low = scene(red_cube=pose(0.45, 0.10, 0.08))
    ee_low = np.array([0.45, 0.10, 0.082])
    assert "pick_red_cube" not in achieved_tasks(low, ee_low, 0.55)
    assert achieved_skills(low, ee_low, 0.55) == ["pick up the red cube"]
    assert achieved_skills(low, ee_low, 1.0) == [] and achieved_skills(table, FAR, 1.0) == []
    grasp = scene(red_cube=pose(0.45, 0.10, CUBE_HALF + 0.01))  # in the closed hand, 1 cm up: grasped, not lifted
    assert achieved_skills(grasp, np.array([0.45, 0.10, CUBE_HALF + 0.012]), 0.55) == ["grasp the red cube"]
    # in the bowl and let go: placed; next to the bowl, or still in the hand, is not
    in_bowl = scene(red_cube=pose(0.45, -0.15, 0.0045 + 0.0085 + CUBE_HALF))
    assert t["place_cube_in_bowl"].success(in_bowl, FAR, 1.0)
    assert not t["place_cube_in_bowl"].success(in_bowl, in_bowl["red_cube"][:3], 0.55)
    beside = scene(red_cube=pose(0.45, -0.15 + 0.09, CUBE_HALF))
    assert not t["place_cube_in_bowl"].success(beside, FAR, 1.0)
    # green on red
    stack = scene(green_cube=pose(0.455, 0.105, 3 * CUBE_HALF, 0.3))
    assert t["stack_cubes"].success(stack, FAR, 1.0)
    assert not t["stack_cubes"].success(scene(green_cube=pose(0.48, 0.10, 3 * CUBE_HALF)), FAR, 1.0)
    assert not t["stack_cubes"].success(scene(green_cube=pose(0.45, 0.10, CUBE_HALF + 0.2)), FAR, 1.0)
    # blue on the marker
    assert t["push_block_to_marker"].success(scene(blue_cube=pose(0.61, 0.06, CUBE_HALF)), FAR, 1.0)
    assert not t["push_block_to_marker"].success(scene(blue_cube=pose(0.60, 0.10, CUBE_HALF)), FAR, 1.0)
    assert not t["push_block_to_marker"].success(scene(blue_cube=pose(0.60, 0.05, 0.10)), FAR, 1.0)  # lifted
    # all three in the bowl (two on the floor, one across them)
    fz = 0.0045 + 0.0085 + CUBE_HALF
    allin = scene(red_cube=pose(0.45, -0.124, fz), green_cube=pose(0.45, -0.176, fz),
                  blue_cube=pose(0.45, -0.15, fz + 2 * CUBE_HALF))
    assert t["put_all_cubes_in_bowl"].success(allin, FAR, 1.0)
    two = dict(allin, blue_cube=pose(0.60, -0.05, CUBE_HALF))
    assert not t["put_all_cubes_in_bowl"].success(two, FAR, 1.0)
    sg = t["put_all_cubes_in_bowl"].subgoals(two, FAR, 1.0)
    assert sg["2_in_bowl"] and not sg["3_in_bowl"] and sg["red_in_bowl"] and not sg["blue_in_bowl"]


def test_subgoals_are_milestones_and_accumulate():
    task = TASKS["place_cube_in_bowl"]
    r0 = scene()["red_cube"]
    ee_at = r0[:3] + [0, 0, -0.003]
    states = [  # (objects, ee, gripper): approach, grasp, carry over the bowl, release
        (scene(), np.array([0.45, 0.10, 0.15]), 1.0),
        (scene(), ee_at, 1.0),
        (scene(), ee_at, 0.56),
        (scene(red_cube=pose(0.45, -0.15, 0.12)), np.array([0.45, -0.15, 0.12]), 0.56),
        (scene(red_cube=pose(0.45, -0.15, 0.035)), np.array([0.45, -0.15, 0.05]), 1.0),
    ]
    per_tick = [task.subgoals(*s) for s in states]
    assert set(per_tick[0]) == {"reached_red", "grasped_red", "lifted_red", "red_over_bowl", "red_in_bowl", "released"}
    assert not any(per_tick[0].values())
    assert per_tick[1]["reached_red"] and not per_tick[1]["grasped_red"]
    assert per_tick[2]["grasped_red"] and not per_tick[2]["lifted_red"]
    assert per_tick[3]["lifted_red"] and per_tick[3]["red_over_bowl"] and not per_tick[3]["red_in_bowl"]
    assert per_tick[4]["red_in_bowl"] and per_tick[4]["released"] and not per_tick[4]["grasped_red"]
    tr = SubgoalTracker("place_cube_in_bowl")
    for s in states:
        acc = tr.update(*s)
    assert all(acc.values())  # every milestone was reached at some tick
    assert tr.first == {"reached_red": 1, "grasped_red": 2, "lifted_red": 3, "red_over_bowl": 3, "red_in_bowl": 4,
                        "released": 4}


def test_predicate_on_simulated_physics(sim):
    """Cube dropped into the bowl by setting its pose: after settling, place succeeds; on the
    table beside the bowl it does not."""
    names = sim.describe()["objects"]
    task = TASKS["place_cube_in_bowl"]
    s = sim.reset(seed=5, task=task.name)
    bowl = objects_from_state(s, names)["bowl"]
    sim.set_object_pose("red_cube", [bowl[0], bowl[1], 0.06])
    sim.advance(0.5)
    s = sim.read_state()
    objs = objects_from_state(s, names)
    assert task.success(objs, s.ee_pos, s.gripper), objs["red_cube"]
    sim.set_object_pose("red_cube", [bowl[0] + 0.11, bowl[1], CUBE_HALF + 0.001])
    sim.advance(0.3)
    s = sim.read_state()
    assert not task.success(objects_from_state(s, names), s.ee_pos, s.gripper)


@pytest.mark.parametrize("name", SINGLE)
def test_full_quality_expert_solves_single_step_tasks(sim, name):
    for seed in (0, 1):
        r = run_episode(sim, name, ScriptedExpert(quality=1.0, seed=seed), seed)
        assert r["success"], (name, seed, r)
        assert r["length"] <= TASKS[name].max_steps
        assert any(r["subgoals"].values())


@pytest.mark.parametrize("name", LONG)
def test_full_quality_expert_solves_the_long_horizon_task(sim, name):
    r = run_episode(sim, name, ScriptedExpert(quality=1.0, seed=0), 0)
    assert r["success"], r
    assert r["subgoals"]["1_in_bowl"] and r["subgoals"]["2_in_bowl"] and r["subgoals"]["3_in_bowl"]


def test_expert_events_actions_and_mistakes(sim):
    names = sim.describe()["objects"]
    task = TASKS["pick_red_cube"]
    ex = load_teleop("scripted")(quality=1.0, seed=0)
    assert ex.describe()["privileged"] and ex.describe()["oracle"]
    with pytest.raises(RuntimeError, match="begin_episode"):
        ex.read(None, {})
    s = sim.reset(seed=3, task=task.name)
    ex.begin_episode(task.name, seed=3, instruction=task.instruction)
    with pytest.raises(ValueError, match="privileged"):
        ex.read(None, None)
    events, steps = frozenset(), 0
    while not events and steps < task.max_steps:
        cmd = ex.read(None, privileged_from_state(s, names))
        a = cmd.action
        assert a.shape == (7,) and a.dtype == np.float32 and np.abs(a[:3]).max() <= 0.05 + 1e-6
        assert np.linalg.norm(a[3:6]) <= 0.25 and 0.0 <= a[6] <= 1.0
        apply_ee_delta(sim, a, ArmLimits())
        s = sim.read_state()
        events, steps = cmd.events, steps + 1
    assert events == {"success"}
    objs = objects_from_state(s, names)
    assert task.success(objs, s.ee_pos, s.gripper)
    assert abs(finger_angle(s.ee_quat) - 0) < math.pi / 4 + 0.1  # fingers kept near the home yaw
    # quality 0: every episode has one fatal mistake; here the wrong cube, then it gives up
    bad = ScriptedExpert(quality=0.0, seed=0)
    r = run_episode(sim, "pick_red_cube", bad, 3)
    assert bad.mistake[0] == "wrong_object" and not r["success"] and r["events"] == ["failure"]
    assert not r["subgoals"]["grasped_red"]


def test_close_early_mistake_closes_above_the_cube_and_gives_up(sim):
    """The opt-in ``close_early`` mistake: the fingers shut in the air over the cube, nothing is lifted,
    the episode fails; the default kinds never draw it."""
    names = sim.describe()["objects"]
    ex = ScriptedExpert(quality=1.0, seed=0, mistake_prob=1.0, mistake_kinds=["close_early"])
    s = sim.reset(seed=5, task="pick_red_cube")
    ex.begin_episode("pick_red_cube", seed=5)
    assert ex.mistake == ("close_early", 0)
    cube_z = objects_from_state(s, names)["red_cube"][2]
    close_z, events = None, frozenset()
    for _ in range(TASKS["pick_red_cube"].max_steps):
        cmd = ex.read(None, privileged_from_state(s, names))
        if close_z is None and cmd.action[6] < 0.5:
            close_z = float(s.ee_pos[2])
        apply_ee_delta(sim, cmd.action, ArmLimits())
        s = sim.read_state()
        if cmd.events:
            events = cmd.events
            break
    assert events == {"failure"} and close_z is not None
    assert close_z - cube_z > 0.03  # closed well above the cube (a real grasp closes at its centre)
    assert not TASKS["pick_red_cube"].success(objects_from_state(s, names), s.ee_pos, s.gripper)
    for seed in range(30):  # the default kinds on a pick task: only ever the wrong cube
        d = ScriptedExpert(quality=0.0, seed=seed)
        d.begin_episode("pick_red_cube", seed=seed)
        assert d.mistake[0] == "wrong_object"
    with pytest.raises(ValueError, match="allows none"):
        ScriptedExpert(mistake_prob=1.0, mistake_kinds=["stop_short"]).begin_episode("pick_red_cube", seed=0)
    with pytest.raises(ValueError, match="mistake_kinds"):
        ScriptedExpert(mistake_kinds=["butterfingers"])


def test_quality_knobs():
    assert ExpertKnobs.from_quality(1.0).mistake_prob == 0.0
    lo = ExpertKnobs.from_quality(0.2)
    assert lo.mistake_prob == pytest.approx(0.8) and lo.noise_std > ExpertKnobs.from_quality(0.9).noise_std
    assert expected_success(0.5, 0.98) == pytest.approx(0.49)
    with pytest.raises(ValueError, match="quality"):
        ScriptedExpert(quality=1.5)
    with pytest.raises(ValueError, match="unknown expert knob"):
        ScriptedExpert(hesitancy=0.3)
    assert ScriptedExpert(quality=0.3, noise_std=0.0).knobs.noise_std == 0.0
    # the mistake draw depends on (expert seed, task, episode seed) only, not on the other knobs
    draws = []
    for kw in ({}, {"noise_std": 0.0, "pause_prob": 0.0}):
        ex = ScriptedExpert(quality=0.5, seed=4, **kw)
        seq = []
        for ep in range(20):
            ex.begin_episode("stack_cubes", seed=ep)
            seq.append(ex.mistake)
        draws.append(seq)
    assert draws[0] == draws[1] and 9 <= sum(m is not None for m in draws[0]) <= 11  # 0.5 x 20, +-1


def test_success_reward_on_a_fake_env():
    names = list(OBJECT_NAMES)
    objs = scene(red_cube=pose(0.45, -0.15, 0.0045 + 0.0085 + CUBE_HALF))

    def env_with(objects, ee, grip):
        arrays = {"objects": np.stack([objects[n] for n in names]), "ee_pos": np.asarray(ee, np.float32),
                  "ee_quat": np.array([0, 0.7071, 0.7071, 0], np.float32), "gripper": np.array([grip], np.float32)}
        client = types.SimpleNamespace(last_state=Message("state", "arm", arrays), description={"objects": names})
        return types.SimpleNamespace(client=client)

    fn = success_reward("place_cube_in_bowl")
    info: dict = {}
    assert fn(env_with(objs, FAR, 1.0), {}, info) == (1.0, True)
    assert info["success"] and info["subgoals"]["red_in_bowl"]
    info = {}
    assert fn(env_with(scene(), FAR, 1.0), {}, info) == (0.0, False)
    assert not info["subgoals"]["red_in_bowl"]
    with pytest.raises(KeyError, match="did you mean"):
        success_reward("place_cube_in_bowls")
    no_state = types.SimpleNamespace(client=types.SimpleNamespace(last_state=None, description={"objects": names}))
    with pytest.raises(RuntimeError, match="no state"):
        fn(no_state, {}, {})
    real_arm = env_with(objs, FAR, 1.0)
    del real_arm.client.last_state.arrays["objects"]
    with pytest.raises(RuntimeError, match="objects"):
        fn(real_arm, {}, {})


@pytest.mark.parametrize("mode", [True, "correct"])
@pytest.mark.parametrize("name", ["pick_red_cube", "lift_green_cube"])
def test_follow_state_expert_still_solves_pick_tasks(sim, name, mode):
    """DAgger labelling reads the pick phase off the state: driving itself, it must still succeed."""
    for seed in (0, 1):
        ex = ScriptedExpert(quality=1.0, seed=seed)
        ex.follow_state = mode
        assert run_episode(sim, name, ex, seed)["success"], (name, seed)


def test_follow_state_labels_come_from_the_state_not_the_phase_memory():
    """A policy brought the open gripper just over the cube: the phase machine still thinks it is
    approaching (and would fly up to the hover height); the DAgger labeller says go down."""
    objs = scene()
    c = objs["red_cube"]
    names = list(objs)
    privileged = {"objects": np.stack([objs[n] for n in names]), "object_names": names,
                  "ee_pos": np.array([c[0] + 0.004, c[1], c[2] + 0.03]), "ee_quat": HOME_DOWN_QUAT, "gripper": [1.0]}
    labels = {}
    for follow in (False, True):
        ex = ScriptedExpert(quality=1.0, noise_std=0.0, rot_noise_std=0.0, seed=0)
        ex.follow_state = follow
        ex.begin_episode("pick_red_cube", seed=0)
        labels[follow] = ex.read(None, privileged).action
    assert labels[False][2] > 0.02 and labels[False][6] == 1.0  # memory: up to the hover height
    assert labels[True][2] < 0 and labels[True][6] == 1.0  # state: down onto the cube, fingers open
    privileged["ee_pos"] = np.array([c[0], c[1], c[2] - 0.002])  # at grasp height: close
    ex = ScriptedExpert(quality=1.0, noise_std=0.0, rot_noise_std=0.0, seed=0)
    ex.follow_state = True
    ex.begin_episode("pick_red_cube", seed=0)
    assert ex.read(None, privileged).action[6] == 0.0


@pytest.mark.parametrize("off_cm", [1.0, 1.5, 1.9])
def test_follow_state_correct_labels_a_descent_off_the_axis_back_onto_it(off_cm):
    """A policy came down 1-2 cm beside the cube's axis (round 19's lateral miss), fingers open: "realign" flies
    back up to the hover height beyond 1.2 cm; "correct" keeps coming down towards the axis, and at grasp height
    moves sideways onto it instead of closing on the cube's edge."""
    objs = scene()
    c = objs["red_cube"]
    names = list(objs)
    off = off_cm / 100

    def label(mode, dz):
        ex = ScriptedExpert(quality=1.0, noise_std=0.0, rot_noise_std=0.0, seed=0)
        ex.follow_state = mode
        ex.begin_episode("pick_red_cube", seed=0)
        privileged = {"objects": np.stack([objs[n] for n in names]), "object_names": names,
                      "ee_pos": np.array([c[0], c[1] + off, c[2] + dz]), "ee_quat": HOME_DOWN_QUAT, "gripper": [1.0]}
        return ex.read(None, privileged).action

    high, low = label("correct", 0.03), label("correct", -0.002)
    assert high[2] < 0 and high[1] < 0 and high[6] == 1.0  # down and towards the axis, open
    assert low[1] < -0.5 * min(off, 0.04) and abs(low[2]) < 0.01 and low[6] == 1.0  # sideways onto it, not closing
    old = label(True, 0.03)
    assert (old[2] > 0) == (off > 0.012)  # realign: up beyond 1.2 cm, down within


def test_held_out_wordings_are_paraphrases_and_never_trained():
    from hardware.sim_tasks import PickTask

    for t in TASKS.values():
        assert t.held_out, t.name  # every task keeps a wording back for evaluation
        assert set(t.held_out) <= set(t.paraphrases)
        assert t.train_wordings[0] == t.instruction and not set(t.held_out) & set(t.train_wordings)
        assert set(t.train_wordings) | set(t.held_out) == set(t.instructions)
    with pytest.raises(ValueError, match="held_out.*not among its paraphrases"):
        PickTask("x", "pick up x", ("grab x",), held_out=("lift x",))


def test_sub_skill_instructions_and_their_done_predicates():
    from hardware.sim_tasks import skill_done

    assert [n for n, t in TASKS.items() if t.segmented] == ["place_cube_in_bowl", "stack_cubes",
                                                          "put_all_cubes_in_bowl"]
    assert [TASKS["place_cube_in_bowl"].skill_instruction(s) for s in TASKS["place_cube_in_bowl"].skills] == [
        "pick up the red cube", "put it in the bowl"]
    assert [TASKS["stack_cubes"].skill_instruction(s) for s in TASKS["stack_cubes"].skills] == [
        "pick up the green cube", "put it on the red cube"]
    # a one-skill task answers its own instruction
    assert {TASKS["lift_green_cube"].skill_instruction(s) for s in TASKS["lift_green_cube"].skills} == {
        "lift the green cube high"}
    pick, place, on = ("pick", "red_cube"), ("place", "red_cube", "bowl"), ("place", "green_cube", ("on", "red_cube"))
    held = scene(red_cube=pose(0.45, 0.10, 0.12))
    ee = np.array([0.45, 0.10, 0.122])
    assert skill_done(pick, held, ee, 0.55) and not skill_done(pick, held, ee, 1.0)
    assert not skill_done(pick, scene(), FAR, 0.55)
    in_bowl = scene(red_cube=pose(0.45, -0.15, 0.0045 + 0.0085 + CUBE_HALF))
    assert skill_done(place, in_bowl, FAR, 1.0)
    assert not skill_done(place, in_bowl, in_bowl["red_cube"][:3], 0.55)  # still in the hand
    assert not skill_done(place, held, FAR, 1.0)
    stack = scene(green_cube=pose(0.455, 0.105, 3 * CUBE_HALF, 0.3))
    assert skill_done(on, stack, FAR, 1.0) and not skill_done(on, scene(), FAR, 1.0)
    with pytest.raises(ValueError, match="sub-skill"):
        skill_done(("push", "blue_cube", "target"), scene(), FAR, 1.0)


@pytest.mark.parametrize("mode", [True, "correct"])
@pytest.mark.parametrize("name", ["place_cube_in_bowl", "stack_cubes", "put_all_cubes_in_bowl"])
def test_follow_state_expert_still_solves_place_tasks(sim, name, mode):
    """The place phase read off the state too: driving itself, the DAgger labeller still places and stacks."""
    for seed in (0, 1):
        ex = ScriptedExpert(quality=1.0, seed=seed)
        ex.follow_state = mode
        assert run_episode(sim, name, ex, seed)["success"], (name, seed)


@pytest.mark.parametrize("mode", [True, "correct"])
def test_follow_state_expert_still_solves_the_push(sim, mode):
    """The push phase read off the state: driving itself, the DAgger labeller still pushes the cube onto the marker."""
    for seed in (0, 1):
        ex = ScriptedExpert(quality=1.0, seed=seed)
        ex.follow_state = mode
        assert run_episode(sim, "push_block_to_marker", ex, seed)["success"], seed


def _push_label(ee_xy_along_across, ee_z, follow, turned=True):
    """The expert's label on push_block_to_marker at its first tick, for a hand-made state: the blue cube 15 cm from
    the marker along +x, the closed hand at (along, across) from the cube's centre in the push frame, ``ee_z``
    high, its fingers turned across the push line (or along it). -> (action, expert)."""
    from hardware.teleop.scripted import down_quat

    objs = scene(blue_cube=pose(0.40, 0.0, CUBE_HALF), target=pose(0.55, 0.0, 0.001))
    names = list(objs)
    along, across = ee_xy_along_across
    ex = ScriptedExpert(quality=1.0, noise_std=0.0, rot_noise_std=0.0, seed=0)
    ex.follow_state = follow
    ex.begin_episode("push_block_to_marker", seed=0)
    privileged = {"objects": np.stack([objs[n] for n in names]), "object_names": names,
                  "ee_pos": np.array([0.40 + along, across, ee_z]),
                  "ee_quat": down_quat(math.pi / 2 if turned else 0.0), "gripper": [0.0]}
    return ex.read(None, privileged).action, ex


def test_follow_state_labels_a_policy_driven_push_from_the_state():
    """A policy brought the closed hand down behind the cube on the push line: the phase machine's memory is at the
    start ("pre": fly over the start point at 10 cm), so its label goes up; read off the state it pushes on, along
    +x at pushing height. Beside the line, low: up first. Over the start point, high and turned: down."""
    contact = CUBE_HALF + 0.012
    pushing, ex = _push_label((-contact - 0.02, 0.0), 0.02, True)
    assert ex.phase == "push" and pushing[0] > 0.005 and abs(pushing[2]) < 0.01 and pushing[6] == 0.0
    memory, ex = _push_label((-contact - 0.02, 0.0), 0.02, False)
    assert ex.phase == "pre" and memory[2] > 0.02
    beside, ex = _push_label((-contact - 0.02, 0.03), 0.02, True)
    assert ex.phase == "pre" and beside[2] > 0.02
    above, ex = _push_label((-contact - 0.03, 0.0), 0.10, True)
    assert ex.phase == "down" and above[2] < -0.01
    unturned, ex = _push_label((-contact - 0.03, 0.0), 0.10, True, turned=False)
    assert ex.phase == "pre" and abs(unturned[2]) < 0.01 and abs(unturned[5]) > 0.05  # turns first, stays up
    on_marker = scene(blue_cube=pose(0.546, 0.0, CUBE_HALF), target=pose(0.55, 0.0, 0.001))  # 4 mm short
    names = list(on_marker)
    ex = ScriptedExpert(quality=1.0, noise_std=0.0, rot_noise_std=0.0, seed=0)
    ex.follow_state = True
    ex.begin_episode("push_block_to_marker", seed=0)
    act = ex.read(None, {"objects": np.stack([on_marker[n] for n in names]), "object_names": names,
                         "ee_pos": np.array([0.546 - contact, 0.0, 0.02]), "ee_quat": HOME_DOWN_QUAT,
                         "gripper": [0.0]}).action
    assert ex.phase == "retreat" and act[2] > 0.02 and act[0] < 0  # pushed home: back off and up


def _stack_label(ee_dz, grip, follow, green_xy_off=(0.0, 0.0), phase_steps=0):
    """The expert's label on stack_cubes at its first tick, for a hand-made state where a policy brought the green
    cube (held when ``grip`` is between the closed-on-a-cube readings) ``ee_dz`` above its release height over
    the red cube, offset sideways by ``green_xy_off``. -> (action, expert)."""
    red = pose(0.45, 0.10, CUBE_HALF)
    release_z = CUBE_HALF + 2 * CUBE_HALF + 0.008
    g = pose(0.45 + green_xy_off[0], 0.10 + green_xy_off[1], release_z + ee_dz)
    objs = scene(red_cube=red, green_cube=g)
    names = list(objs)
    ex = ScriptedExpert(quality=1.0, noise_std=0.0, rot_noise_std=0.0, seed=0)
    ex.follow_state = follow
    ex.begin_episode("stack_cubes", seed=0)
    from hardware.teleop.scripted import down_quat

    privileged = {"objects": np.stack([objs[n] for n in names]), "object_names": names,  # fingers turned to the red cube
                  "ee_pos": g[:3].copy(), "ee_quat": down_quat(0.0), "gripper": [grip]}
    act = None
    for _ in range(1 + phase_steps):
        act = ex.read(None, privileged).action
    return act, ex


def test_follow_state_labels_a_policy_carried_stack_from_the_state():
    """A policy carried the green cube over the red one and lowered it to the release height; the phase machine's
    memory is at the start (approach the green cube). From memory the label opens the fingers to approach; read
    off the state it is the place: open to let go there, or come down first when still above, or move over the
    red cube when beside it, fingers shut."""
    held = 0.56  # the gripper reading with a 4.5 cm cube between the fingers, turned to the red cube's faces
    at_release, ex = _stack_label(0.0, held, True)
    assert ex.plan[ex.k][0] == "place" and ex.phase == "release" and at_release[6] == 1.0
    above, ex = _stack_label(0.03, held, True)
    assert ex.phase == "lower" and above[2] < -0.01 and above[6] == 0.0
    beside, ex = _stack_label(0.0, held, True, green_xy_off=(0.0, 0.02))
    assert ex.phase == "carry" and beside[1] < -0.005 and beside[6] == 0.0
    memory, ex = _stack_label(0.0, held, False)
    assert ex.plan[ex.k][0] == "pick" and memory[6] == 1.0  # the phase machine: still approaching, open
    # resting on the red cube, still held: let go; let go already: the plan is done, up and away with open fingers
    resting, ex = _stack_label(-0.008, held, True)
    assert ex.plan[ex.k][0] == "place" and ex.phase == "release" and resting[6] == 1.0
    done, ex = _stack_label(-0.008, 1.0, True)
    assert ex.k == len(ex.plan) and done[2] > 0 and done[6] == 1.0
