"""Success reward for the simulated tabletop tasks (``hardware.sim_tasks``), read from the
simulator's privileged state.

``success_reward(task_name)`` returns a ``reward_fn(env, obs, info) -> (reward, terminated)``
for ``robot_io.RobotEnv``: it reads the last arm state message the client received
(``env.client.last_state``: arrays ``objects`` [N, 7], ``ee_pos``, ``gripper``) and the object
names of the arm's description (``env.client.description["objects"]``), and returns
``(1.0, True)`` when the task's success predicate holds, else ``(0.0, False)``. It also puts
``info["subgoals"]`` (this tick's sub-goals), ``info["achieved_tasks"]`` (every registered task whose success
predicate holds on this state: what hindsight relabelling reads), ``info["achieved_skills"]`` (the pick
sub-skills done on it, as instructions) and ``info["success"]``. The state is the one the
observation was composed from, so reward and observation agree.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from hardware.sim_tasks import achieved_skills, achieved_tasks, get_task, objects_from_state


def success_reward(task_name: str) -> Callable[[Any, dict, dict], tuple[float, bool]]:
    task = get_task(task_name)  # a typo fails here, with a suggestion, not on the first step

    def reward_fn(env, obs: dict, info: dict) -> tuple[float, bool]:
        msg = env.client.last_state
        if msg is None:
            raise RuntimeError("success reward: the client has no state message yet (observe() first)")
        arrays = msg.arrays
        if "objects" not in arrays:
            raise RuntimeError(f"success reward for {task.name!r} needs the simulator's privileged `objects` "
                               f"array in the arm state; this arm sends only {sorted(arrays)}")
        names = env.client.description.get("objects")
        if not names:
            raise RuntimeError("success reward: the arm's description names no `objects` (not a simulator?)")
        objects = objects_from_state(arrays, names)
        ee = np.asarray(arrays["ee_pos"], np.float64)
        grip = float(np.asarray(arrays["gripper"]).reshape(-1)[0])
        ok = task.success(objects, ee, grip)
        info["subgoals"] = task.subgoals(objects, ee, grip)
        info["achieved_tasks"] = achieved_tasks(objects, ee, grip)  # every task done on this state (relabelling)
        info["achieved_skills"] = achieved_skills(objects, ee, grip)  # the pick sub-skills done on it
        info["success"] = bool(ok)
        return (1.0, True) if ok else (0.0, False)

    reward_fn.task = task  # type: ignore[attr-defined]
    return reward_fn
