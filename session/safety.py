"""``--safety workspace``: AutoSafe's workspace blend on every chunk the session executes on the arm.

Whatever steers the VLA (any method, the base VLA's evaluations, an operator's chunk), each row's
end-effector displacement is blended, before it is sent, with a proportional move back toward the
centre of a box: ``(1 - lambda) a + lambda a_safe`` with ``lambda = (e^{p (1 - Delta)} - 1) / (e^p - 1)``
and ``Delta`` the normalised distance to the nearest face (``policies.safety.workspace.ChunkGuard``,
rolled through the chunk from the measured end-effector position). Rotation and gripper entries
stay as they were. For a displacement-commanded arm no blended row leaves the box when
``step b <= min h (1 - e^{-p}) / p`` (b: the bridge's ``max_step_m``, h: the box's half extents);
the sharpness ``p`` defaults to that bound, the most control it can leave to the agent. The box
defaults to the site's ``limits`` workspace box (the bridge's hard clip stays underneath).

The blend acts in the whole box, more near the faces (at p = 5: 8% of the way back at half way,
36% at a fifth of the half extent): a box that cuts through where the task works (a table-top
pick near the box's floor) costs success; give the task room with ``--workspace-box``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from policies.safety.workspace import ChunkGuard, Workspace, certified_sharpness
MAX_SHARPNESS = 20.0
"""A cap for the default sharpness when the certificate allows any (a tiny step in a big box)."""


class WorkspaceGuard:
    """``__call__(obs, chunk [n, 7]) -> (chunk [n, 7], lambda [n])`` on RobotEnv's action layout (dpos(3) m, drot(3)
    rad, gripper) and state layout (ee_pos first)."""

    def __init__(self, env: Any, box: tuple[float, ...] = (), sharpness: float | None = None) -> None:
        space = getattr(env, "action_space", None)
        shape = getattr(space, "shape", None)
        if shape != (7,):
            raise ValueError("--safety workspace needs the arm's action layout (dpos(3) m, drot(3) rad, gripper: "
                             f"[7]); this env's action space is {shape}")
        max_step = float(space.high[0])
        if not box:
            lim = getattr(getattr(env, "client", None), "description", {}).get("limits", {})
            if "workspace_min" not in lim or "workspace_max" not in lim:
                raise ValueError("--safety workspace: the env's arm reports no workspace limits; give --workspace-box "
                                 "x0 y0 z0 x1 y1 z1")
            box = tuple(lim["workspace_min"]) + tuple(lim["workspace_max"])
        box = tuple(float(v) for v in box)
        if len(box) != 6 or not all(math.isfinite(v) for v in box):
            raise ValueError(f"--workspace-box takes 6 finite numbers (low x y z, high x y z), got {list(box)}")
        self.ws = Workspace(low=box[:3], high=box[3:], step=1.0, action_bound=max_step)
        bound = certified_sharpness(self.ws)
        self.sharpness = min(bound, MAX_SHARPNESS) if sharpness is None else float(sharpness)
        self.guard = ChunkGuard(self.ws, self.sharpness)  # refuses a sharpness outside the certified range
        self.box = box

    def describe(self) -> dict[str, Any]:
        return {"layer": "workspace", "box": list(self.box), "sharpness": self.sharpness,
                "certified_sharpness": certified_sharpness(self.ws), "max_step_m": self.ws.action_bound,
                "safe_gain": self.ws.gain}

    def __call__(self, obs: dict, chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.asarray(obs["state"], np.float32)[:3]
        c = torch.from_numpy(np.ascontiguousarray(chunk, np.float32))[None]
        out, lam = self.guard(torch.from_numpy(pos)[None], c)
        return out[0].numpy(), lam[0].numpy()
