"""The scripted expert driven on a simulator in process (no bridge), for the hardware tests: one ``ee_delta``
command applied as the arm server applies it, whole expert episodes, and a lifted cube held still.

A test helper, not imported from bench/ (tests never import bench): ``bench/experts.py`` drives its episodes the
same way. One home in ``hardware/`` for both would remove the copy."""

from __future__ import annotations

import math

import numpy as np

from hardware.sim_tasks import HOME_FINGER_ANGLE, get_task, grasped, objects_from_state, quat_to_mat
from hardware.teleop.scripted import ScriptedExpert, finger_angle, turned_angle
from robot_io import limits as L

DISTURBED_M, DISTURBED_DEG = 0.01, 10.0
"""A neighbour moved more than this (m) or tilted more than this (degrees) was disturbed."""


def apply_ee_delta(sim, action: np.ndarray, lim: L.ArmLimits) -> None:
    """One ``ee_delta`` command, applied the way ``ArmService.handle`` does, then one control period."""
    a = np.asarray(action, np.float32).tolist()
    s = sim.read_state()
    target, _, drot, grip, _ = L.clip_ee_delta(lim, s.ee_pos, a[:3], a[3:6], a[6])
    quat = L.quat_mul(L.axis_angle_to_quat(drot), s.ee_quat)
    sim.command_ee_pose(target, quat / math.sqrt(float(quat @ quat)), grip)
    sim.step()


def privileged_from_state(s, names) -> dict:
    """What a recorder hands a scripted expert: the raw state arrays and the object names."""
    return {"objects": s.extras["objects"], "object_names": list(names), "ee_pos": s.ee_pos,
            "ee_quat": s.ee_quat, "gripper": np.array([s.gripper])}


def run_episode(sim, task_name: str, expert: ScriptedExpert, seed: int, lim: L.ArmLimits | None = None) -> dict:
    """One expert episode on ``sim`` (fast mode, connected). Returns success, length, subgoals."""
    lim = lim or L.ArmLimits()
    task = get_task(task_name)
    names = sim.describe()["objects"]
    s = sim.reset(seed=seed, task=task_name)
    expert.begin_episode(task_name, seed=seed, instruction=task.instruction)
    success, length, events, achieved = False, task.max_steps, frozenset(), {}
    for t in range(task.max_steps):
        cmd = expert.read(None, privileged_from_state(s, names))
        apply_ee_delta(sim, cmd.action, lim)
        s = sim.read_state()
        objs = objects_from_state(s, names)
        for k, v in task.subgoals(objs, s.ee_pos, s.gripper).items():
            achieved[k] = achieved.get(k, False) or v
        if task.success(objs, s.ee_pos, s.gripper):
            success, length = True, t + 1
            break
        if cmd.events & {"success", "failure"}:
            events, length = cmd.events, t + 1
            break
    return {"success": success, "length": length, "events": sorted(events), "subgoals": achieved,
            "mistake": expert.mistake is not None, "regrasps": expert.regrasps}


def blocked_mode(layout: dict, cube: str = "red_cube", neighbour: str = "blue_cube") -> str:
    """The turning mode whose finger axis (turned from the home finger angle) lies along the neighbour's side."""
    (x, y, yaw), (nx, ny, _) = layout[cube], layout[neighbour]
    toward = math.atan2(ny - y, nx - x)
    off = {m: abs(math.remainder(turned_angle(yaw, HOME_FINGER_ANGLE, m) - toward, math.pi)) for m in ("ccw", "cw")}
    return min(off, key=off.get)


def run_mode_episode(sim, task_name: str, mode: str, seed: int) -> dict:
    """One full-quality expert episode in grasp ``mode``: success, the finger turn at the first close (degrees,
    ccw > 0) and how far the blue neighbour moved and tilted."""
    task = get_task(task_name)
    lim = L.ArmLimits()
    names = sim.describe()["objects"]
    s = sim.reset(seed=seed, task=task_name)
    expert = ScriptedExpert(quality=1.0, seed=0, grasp_mode=mode)
    expert.begin_episode(task_name, seed=seed, instruction=task.instruction)
    a0 = finger_angle(s.ee_quat)
    nb0 = objects_from_state(s, names)["blue_cube"].copy()
    moved = tilt = 0.0
    success, length, turn = False, task.max_steps, None
    for t in range(task.max_steps):
        cmd = expert.read(None, privileged_from_state(s, names))
        if turn is None and cmd.action[6] < 0.5:  # the first close: the grasp's finger angle
            turn = math.degrees(math.remainder(finger_angle(s.ee_quat) - a0, 2 * math.pi))
        apply_ee_delta(sim, cmd.action, lim)
        s = sim.read_state()
        objs = objects_from_state(s, names)
        nb = objs["blue_cube"]
        moved = max(moved, float(np.linalg.norm(nb[:2] - nb0[:2])))
        tilt = max(tilt, math.degrees(math.acos(min(1.0, abs(quat_to_mat(nb[3:7])[2, 2])))))
        if task.success(objs, s.ee_pos, s.gripper):
            success, length = True, t + 1
            break
        if cmd.events & {"success", "failure"}:
            length = t + 1
            break
    return {"mode": expert.mode, "success": success, "length": length, "regrasps": expert.regrasps,
            "turn_deg": turn, "neighbour_moved_m": moved, "neighbour_tilt_deg": tilt,
            "neighbour_disturbed": bool(moved > DISTURBED_M or tilt > DISTURBED_DEG)}


def grasp_and_lift(sim, seed: int, task: str = "pick_red_cube", cube: str = "red_cube", lift_z: float = 0.10,
                   max_ticks: int = 120) -> bool:
    """The scripted expert picks ``cube`` and lifts it above ``lift_z`` (tcp height). -> whether it got there."""
    lim = L.ArmLimits()
    names = sim.describe()["objects"]
    s = sim.reset(seed=seed, task=task)
    expert = ScriptedExpert(seed=0)
    expert.begin_episode(task, seed=seed)
    for _ in range(max_ticks):
        objs = objects_from_state(s, names)
        if expert.phase == "lift" and grasped(objs[cube], s.ee_pos, s.gripper) and s.ee_pos[2] > lift_z:
            return True
        apply_ee_delta(sim, expert.read(None, privileged_from_state(s, names)).action, lim)
        s = sim.read_state()
    return False


def hold(sim, opening: float, ticks: int, cube: str = "red_cube") -> tuple[list[float], int | None]:
    """Hold the present pose with the gripper at ``opening`` for ``ticks`` ticks. -> the cube's slide (m, down
    positive) relative to the tcp after every tick, and the tick at which it left the fingers (None: held)."""
    names = sim.describe()["objects"]
    s = sim.read_state()
    pos, quat = s.ee_pos.copy(), s.ee_quat.copy()
    z0 = float(objects_from_state(s, names)[cube][2] - s.ee_pos[2])
    slide, dropped = [], None
    for t in range(ticks):
        sim.command_ee_pose(pos, quat, opening)
        sim.step()
        s = sim.read_state()
        c = objects_from_state(s, names)[cube]
        slide.append(z0 - float(c[2] - s.ee_pos[2]))
        if dropped is None and not grasped(c, s.ee_pos, s.gripper):
            dropped = t
    return slide, dropped
