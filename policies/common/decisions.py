"""Decision states in a replay buffer: where the executed chunk closes or opens the gripper (issue 61).

A pick or a stack succeeds or fails at a few moments: the first close, the release. A critic diagnostic that
averages over the first transitions of a session (the warm-up's approach) measures states where nothing is
decided. These are read from the stored executed chunks alone (no simulator state), so they exist on a real
robot too: the gripper opening is the last action column in robot units ([0, 1], ``robot_io.env``), snapped at
``GRIPPER_THRESHOLD`` by the binary execution.
"""

from __future__ import annotations

import numpy as np
import torch

GRIPPER_THRESHOLD = 0.5
"""Opening in robot units above which the gripper is commanded open (``robot_io.gripper``'s snap point)."""


def gripper_switches(buf, vla) -> np.ndarray:
    """Indices of the stored transitions whose executed chunk commands a close or a release: the opening crosses
    ``GRIPPER_THRESHOLD`` between two rows of the chunk, or between the previous step's last row (same episode)
    and this chunk's first. In storage order."""
    n = len(buf)
    if n == 0 or "chunk" not in buf.extras:
        return np.zeros(0, int)
    chunk_n = torch.from_numpy(buf.extras["chunk"][:n])
    with torch.no_grad():
        grip = vla.unnormalize_actions(chunk_n)[..., -1].numpy()  # [n, E] robot units
    open_ = grip > GRIPPER_THRESHOLD
    inside = (open_[:, 1:] != open_[:, :-1]).any(axis=1)
    idx = np.arange(n)
    prev = (idx - 1) % buf.capacity
    has_prev = np.zeros(n, bool)
    has_prev[1:] = buf.continues(prev[1:]) if n > 1 else has_prev[1:]
    across = has_prev & (open_[prev % n, -1] != open_[:, 0])
    return idx[inside | across]


def decision_indices(buf, vla, k: int) -> tuple[np.ndarray, bool]:
    """-> (up to ``k`` indices of decision states, the first ones found; True if they are decision states). A
    buffer with no gripper switch yet (or an env whose last action column is not a gripper) gives its first ``k``
    transitions and False."""
    sw = gripper_switches(buf, vla)
    if len(sw) == 0:
        return np.arange(min(k, len(buf))), False
    return sw[:k], True
