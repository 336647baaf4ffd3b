"""Grasp modes of the scripted expert (``grasp_mode``) and the scenes made for them (``pick_red_cube_yaw45``,
``pick_red_cube_crowded``): behaviour modes for ExToken's token prior (issue 33)."""

import math
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests.hardware.expert_driver import blocked_mode, run_mode_episode as run_episode  # noqa: E402
from hardware import sim_tasks  # noqa: E402
from hardware.sim_tasks import (CLEARANCE, CUBE_HALF, FOOTPRINT, HOME_FINGER_ANGLE, NEIGHBOUR_GAP, OBJECT_NAMES,  # noqa: E402
                                TASKS, achieved_tasks, base_tasks, cube_yaw, objects_from_state)
from hardware.teleop.scripted import (GRASP_MODES, ExpertKnobs, ScriptedExpert, down_quat, finger_angle,  # noqa: E402
                                      turned_angle)

QUARTER = math.pi / 2


def pose(x, y, z, yaw=0.0):
    return np.array([x, y, z, math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])


def test_turned_angle_goes_the_named_way_to_the_next_face_pair():
    for cur in (-3.0, -0.3, 0.0, 0.2, 2.9):
        for want in (-0.7, -0.1, 0.0, 0.4, 0.78):
            ccw, cw = turned_angle(want, cur, "ccw"), turned_angle(want, cur, "cw")
            assert cur < ccw <= cur + QUARTER + 1e-12 and cur - QUARTER - 1e-12 <= cw < cur
            for a in (ccw, cw):  # a finger angle of the cube's face pairs
                assert abs(math.remainder(a - want, QUARTER)) < 1e-9
    assert turned_angle(0.3, 0.3, "ccw") == pytest.approx(0.3 + QUARTER)  # already aligned: the next pair round
    assert turned_angle(0.3, 0.3, "cw") == pytest.approx(0.3 - QUARTER)
    with pytest.raises(ValueError, match="direction"):
        turned_angle(0.0, 0.0, "left")


def test_grasp_mode_knob_defaults_to_near_and_is_checked():
    assert ExpertKnobs().grasp_mode == "near" and ScriptedExpert().knobs.grasp_mode == "near"
    assert GRASP_MODES == ("near", "ccw", "cw", "random")
    with pytest.raises(ValueError, match="grasp_mode"):
        ScriptedExpert(grasp_mode="sideways")


def test_the_home_finger_angle_and_the_turned_cube_agree_with_the_simulator(sim):
    names = sim.describe()["objects"]
    s = sim.reset(seed=0, task="pick_red_cube_yaw45")
    assert abs(math.remainder(finger_angle(s.ee_quat) - HOME_FINGER_ANGLE, math.pi)) < 0.01
    red = objects_from_state(s, names)["red_cube"]
    assert abs(abs(math.remainder(cube_yaw(red) - HOME_FINGER_ANGLE, QUARTER)) - math.pi / 4) < 0.02  # 45 deg both ways


@pytest.mark.parametrize("task", ["pick_red_cube_yaw45", "pick_red_cube_crowded"])
def test_ccw_and_cw_turn_the_fingers_the_named_way_and_grasp(sim, task):
    """yaw45: both turns grasp. crowded: both turn the named way, and only the turn whose fingers clear the
    neighbour succeeds (the other tips the neighbour over, which the task counts as a failure)."""
    for seed in (0, 1):
        turns = {}
        for mode in ("ccw", "cw"):
            r = run_episode(sim, task, mode, seed)
            free = task == "pick_red_cube_yaw45" or mode != blocked_mode(TASKS[task].layout(np.random.default_rng(seed)))
            assert r["mode"] == mode and r["success"] == free, (task, seed, mode, r)
            turns[mode] = r["turn_deg"]
        assert 40 < turns["ccw"] < 50 and -50 < turns["cw"] < -40, turns  # ccw: a positive turn about world z


def _privileged(objs, angle):
    names = list(objs)
    return {"objects": np.stack([objs[n] for n in names]), "object_names": names,
            "ee_pos": np.array([0.55, 0.0, 0.30]), "ee_quat": down_quat(angle), "gripper": [1.0]}


def test_a_turning_mode_keeps_its_face_pair_through_the_approach_and_retries():
    """Decided once per pick: the fingers half way round do not flip it to the nearer pair, and a retry after a
    missed grasp grasps across the same faces (not the next pair round)."""
    objs = {n: pose(0.6, -0.2 + 0.1 * i, CUBE_HALF) for i, n in enumerate(OBJECT_NAMES)}
    objs["red_cube"] = pose(0.45, 0.10, CUBE_HALF, math.pi / 4)
    for mode, sign in (("ccw", 1.0), ("cw", -1.0)):
        ex = ScriptedExpert(noise_std=0.0, rot_noise_std=0.0, grasp_mode=mode)
        ex.begin_episode("pick_red_cube_yaw45", seed=0)
        assert ex.mode == mode and ex.describe()["mode"] == mode
        assert np.sign(ex.read(None, _privileged(objs, 0.0)).action[5]) == sign
        assert ex.last_info["mode"] == mode
        # turned 0.1 rad the other way: "near" would now go that way; the chosen pair still says turn back
        assert np.sign(ex.read(None, _privileged(objs, -sign * 0.1)).action[5]) == sign
        near = ScriptedExpert(noise_std=0.0, rot_noise_std=0.0)
        near.begin_episode("pick_red_cube_yaw45", seed=0)
        assert np.sign(near.read(None, _privileged(objs, -sign * 0.1)).action[5]) == -sign
        # a missed grasp: back to the approach with the fingers on the chosen pair; no turn to the next pair
        ex._back_to_pick()
        assert abs(ex.read(None, _privileged(objs, sign * math.pi / 4)).action[5]) < 1e-6


def test_random_mode_is_half_each_over_consecutive_seeds_and_deterministic():
    def modes(expert_seed, task="pick_red_cube_crowded", n=40, **kw):
        ex = ScriptedExpert(seed=expert_seed, grasp_mode="random", **kw)
        out = []
        for s in range(n):
            ex.begin_episode(task, seed=s)
            out.append(ex.mode)
        return out

    a = modes(0)
    assert set(a) == {"ccw", "cw"} and a == modes(0) and a == modes(0, noise_std=0.0, pause_prob=0.3)
    for es in range(4):
        m = modes(es)
        for start in range(0, 21):  # every run of 20 consecutive seeds: 10 +- 2 of each
            assert abs(m[start:start + 20].count("ccw") - 10) <= 2, (es, start)
    assert modes(1) != a  # the expert seed shifts the sequence
    # the mistake draw stays independent of the mode draw: both mistakes and clean episodes get both modes
    ex = ScriptedExpert(quality=0.5, grasp_mode="random")
    seen = set()
    for s in range(40):
        ex.begin_episode("pick_red_cube_crowded", seed=s)
        seen.add((ex.mistake is None, ex.mode))
    assert len(seen) == 4


def test_crowded_layout_puts_the_blue_cube_1cm_off_a_red_face_for_every_seed():
    task = TASKS["pick_red_cube_crowded"]
    assert NEIGHBOUR_GAP == 0.01
    kinds = set()
    for seed in range(60):
        p = task.layout(np.random.default_rng(seed))
        (x, y, yaw), (bx, by, byaw) = p["red_cube"], p["blue_cube"]
        assert abs(math.remainder(yaw - HOME_FINGER_ANGLE - math.pi / 4, QUARTER)) < 1e-9  # 45 deg from home
        assert abs(math.remainder(byaw - yaw, QUARTER)) < 1e-9  # faces parallel
        d = math.hypot(bx - x, by - y)
        toward = math.atan2(by - y, bx - x)
        assert abs(math.remainder(toward - yaw, QUARTER)) < 1e-9, seed  # along one of red's face axes
        assert d - 2 * CUBE_HALF == pytest.approx(0.01), seed  # 1 cm face to face
        kinds.add((round(math.remainder(toward - yaw, math.pi) / QUARTER), blocked_mode(p)))
        for n, (ox, oy, _) in p.items():
            assert 0.35 <= ox <= 0.65 and abs(oy) <= 0.22, (seed, n)
        for i, n in enumerate(OBJECT_NAMES):  # the rest kept apart as in every layout
            for m in OBJECT_NAMES[i + 1:]:
                if {n, m} != {"red_cube", "blue_cube"}:
                    assert math.dist(p[n][:2], p[m][:2]) > FOOTPRINT[n] + FOOTPRINT[m] + CLEARANCE, (seed, n, m)
    assert {k[1] for k in kinds} == {"ccw", "cw"} and len({k[0] for k in kinds}) >= 3  # both axes, both sides
    yaw45 = TASKS["pick_red_cube_yaw45"].layout(np.random.default_rng(3))
    assert yaw45["red_cube"][2] == pytest.approx(HOME_FINGER_ANGLE + math.pi / 4)


def test_variants_are_the_red_pick_and_relabelling_skips_them():
    base = TASKS["pick_red_cube"]
    for name in ("pick_red_cube_yaw45", "pick_red_cube_crowded"):
        t = TASKS[name]
        assert t.variant_of == "pick_red_cube" and t.instructions == base.instructions
        assert t.held_out == base.held_out and t.max_steps == base.max_steps == 100
        assert name not in base_tasks()
    assert all(t.variant_of is None for t in base_tasks().values()) and "pick_red_cube" in base_tasks()
    held = {n: pose(0.6, -0.2 + 0.1 * i, CUBE_HALF) for i, n in enumerate(OBJECT_NAMES)}
    held["red_cube"] = pose(0.45, 0.10, 0.12)
    ee = np.array([0.45, 0.10, 0.122])
    assert TASKS["pick_red_cube_crowded"].success(held, ee, 0.55)  # the same predicate ...
    assert achieved_tasks(held, ee, 0.55) == ["pick_red_cube"]  # ... named once, by the base task
    tipped = dict(held, blue_cube=np.array([*held["blue_cube"][:3], math.cos(math.pi / 4), math.sin(math.pi / 4), 0, 0]))
    assert TASKS["pick_red_cube"].success(tipped, ee, 0.55)  # ... but the crowded pick must leave its neighbour standing
    assert not TASKS["pick_red_cube_crowded"].success(tipped, ee, 0.55)
    assert not TASKS["pick_red_cube_crowded"].subgoals(tipped, ee, 0.55)["blue_standing"]
    from rewards.judges import sim_instructions

    assert sim_instructions().count("pick up the red cube") == 1


def test_in_a_crowded_scene_the_blocked_mode_lands_on_the_neighbour(sim):
    """Seed 0 (1 cm gap, the neighbour on the cw side): the free mode (ccw) grasps clear of the blue cube; the
    blocked mode (cw) comes down on it. The blocked mode still lifts the red cube in this simulator -- the finger
    presses the 50 g neighbour into the table, tips it over and slides in -- which is why the crowded task's success
    needs the neighbour standing (bench/archive/expert_modes.py)."""
    p = TASKS["pick_red_cube_crowded"].layout(np.random.default_rng(0))
    assert blocked_mode(p) == "cw"
    free = run_episode(sim, "pick_red_cube_crowded", "ccw", 0)
    blocked = run_episode(sim, "pick_red_cube_crowded", "cw", 0)
    assert free["success"] and not free["neighbour_disturbed"] and free["neighbour_moved_m"] < 0.003, free
    assert blocked["neighbour_disturbed"] and blocked["neighbour_tilt_deg"] > 30, blocked
    assert not blocked["success"], blocked


def test_gap_constant_is_read_when_the_scene_is_laid_out(monkeypatch):
    monkeypatch.setattr(sim_tasks, "NEIGHBOUR_GAP", 0.005)
    p = TASKS["pick_red_cube_crowded"].layout(np.random.default_rng(0))
    assert math.dist(p["red_cube"][:2], p["blue_cube"][:2]) == pytest.approx(2 * CUBE_HALF + 0.005)


def test_the_near_variant_stands_the_neighbour_3cm_off_whatever_the_module_gap(monkeypatch):
    """``pick_red_cube_near`` carries its own gap (3 cm, both turns fit): the crowded task's module-wide gap does not
    move it, and it keeps the crowded task's success (the neighbour must stay standing)."""
    monkeypatch.setattr(sim_tasks, "NEIGHBOUR_GAP", 0.005)
    near = TASKS["pick_red_cube_near"]
    for seed in range(20):
        p = near.layout(np.random.default_rng(seed))
        assert math.dist(p["red_cube"][:2], p["blue_cube"][:2]) == pytest.approx(2 * CUBE_HALF + 0.03), seed
    assert near.variant_of == "pick_red_cube" and near.neighbour == "blue_cube"
