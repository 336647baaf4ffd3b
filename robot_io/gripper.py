"""How an arm's executed gripper opening is formed from a policy's rows. numpy only (runs on the edge).

The arm's ``ee_delta`` action is ``[dx, dy, dz, drx, dry, drz, opening]``, opening 0 closed .. 1 open
(``robot_io.server``). A flow policy trained on demonstrations that command the gripper fully open or fully
shut still puts out openings in between near its open / close decision, and blending overlapping chunks
(temporal ensembling, a cross-fade) averages chunks that disagree about when to close. A position-servo hand
squeezes with force in proportion to how far the command lies inside the object, so an opening of 0.45 on a
4.5 cm cube holds it with a fifth of the force of 0 (bench/results/vla_sft round 22). Modes:

``raw``
    the opening as the policy (and the blend) put it out;
``binary``
    snapped shut (0) below ``threshold`` (0.5) and open (1) at or above it, after any blending: what every
    scripted demonstration commanded.

A checkpoint names the mode it was measured with (``config.json``: ``execution.gripper``; an exported graph's
metadata: ``gripper``); ``auto`` takes that, else ``raw``.
"""

from __future__ import annotations

import numpy as np

GRIPPER_MODES = ("raw", "binary")
GRIPPER_CHOICES = ("auto",) + GRIPPER_MODES
"""What a ``--gripper`` flag takes: ``auto`` defers to the policy's own record."""
GRIPPER_COLUMN = 6
"""The gripper opening's column in the arm's ``ee_delta`` action."""
GRIPPER_THRESHOLD = 0.5


def gripper_mode(spec, what: str = "--gripper", auto: bool = False) -> str:
    """``spec`` checked against :data:`GRIPPER_MODES` (and ``auto`` where ``auto``); the error names ``what``."""
    allowed = GRIPPER_CHOICES if auto else GRIPPER_MODES
    mode = spec.strip() if isinstance(spec, str) else spec
    if mode not in allowed:
        raise ValueError(f"{what} {spec!r}: give " + ("auto (the checkpoint's own choice, else raw), " if auto else "")
                         + "raw (the policy's opening as it comes) or binary (snapped to 0 / 1 at 0.5, as the "
                           "demonstrations commanded it)")
    return mode


def snap_opening(rows, threshold: float = GRIPPER_THRESHOLD, column: int = GRIPPER_COLUMN) -> np.ndarray:
    """A float32 copy of ``rows`` (``[..., A]``) with column ``column`` set to 1.0 where it is at or above
    ``threshold`` and 0.0 below (NaN stays NaN: the caller's finiteness check refuses it); the other columns
    unchanged."""
    if not (np.isfinite(threshold) and 0.0 < threshold < 1.0):
        raise ValueError(f"gripper threshold must lie in (0, 1), got {threshold}")
    out = np.array(rows, dtype=np.float32, copy=True)
    if out.ndim == 0 or out.shape[-1] <= column:
        raise ValueError(f"binary gripper: the opening is column {column} of the arm's ee_delta action; these rows "
                         f"have shape {list(out.shape)}")
    g = out[..., column]
    out[..., column] = np.where(np.isnan(g), g, np.where(g >= threshold, 1.0, 0.0))
    return out
