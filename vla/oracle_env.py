"""A labelled oracle: the sim task env with the simulator's privileged state in its observation.

``PrivilegedTaskEnv`` is ``robot_io.RobotEnv`` plus ``obs["privileged"]``, a float32 vector read off
the arm state message that every simulated arm sends (``objects`` [N, 7], ``ee_pos``, ``gripper``):

    for each object, in the arm description's order: position - end-effector position (3)
    for each object: orientation quaternion (4)
    end-effector position (3), gripper opening (1)

No real robot has this: it is what the scripted expert reads (``vla record --teleop scripted``), and
what DSRL's ``--encoder oracle`` hands its actor and critics to tell "the critic cannot see what
decides success" apart from "the critic cannot learn it from this much sparse reward" (issue 15).
A real arm's state has no ``objects``: the env refuses to start on one.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from robot_io.env import RobotEnv


def privileged_dim(n_objects: int) -> int:
    return 7 * n_objects + 4


def privileged_vector(arrays, n_objects: int) -> np.ndarray:
    """The privileged vector (module docstring) from a state message's ``arrays``."""
    objects = np.asarray(arrays["objects"], np.float64).reshape(-1, 7)
    if len(objects) != n_objects:
        raise ValueError(f"privileged state: the arm sent {len(objects)} object poses, its description names "
                         f"{n_objects}")
    ee = np.asarray(arrays["ee_pos"], np.float64).reshape(3)
    grip = float(np.asarray(arrays["gripper"]).reshape(-1)[0])
    v = np.concatenate([(objects[:, :3] - ee).ravel(), objects[:, 3:].ravel(), ee, [grip]])
    return v.astype(np.float32)


class PrivilegedTaskEnv(RobotEnv):
    """``RobotEnv`` whose observations carry ``privileged`` (a labelled oracle; simulators only)."""

    def __init__(self, client, **kwargs) -> None:
        names = client.description.get("objects")
        if not names:
            raise ValueError("the privileged observation (DSRL --encoder oracle) reads the simulator's object "
                             "poses: this arm's description names no `objects` (a real robot has none)")
        self.n_objects = len(names)
        super().__init__(client, **kwargs)
        self.observation_space.spaces["privileged"] = spaces.Box(
            -np.inf, np.inf, (privileged_dim(self.n_objects),), np.float32)

    def _obs(self, newer_than_ns: int = 0, cameras_newer_than_ns: int | None = 0) -> dict:
        o = super()._obs(newer_than_ns, cameras_newer_than_ns)
        msg = self.client.last_state
        if msg is None or "objects" not in msg.arrays:
            raise RuntimeError("the privileged observation needs the simulator's `objects` array in the arm state")
        o["privileged"] = privileged_vector(msg.arrays, self.n_objects)
        return o
