"""Trajectory diversity of a group of rollouts (ExToken's claim is that diversity, not the number of rollouts, is what
a small interaction budget needs): end-effector voxels visited and the pairwise distance of the rollouts' first
chunks. Plain arrays in, so any method's logs can use them (GRPO logs them per update)."""

from __future__ import annotations

import itertools

import numpy as np

from robot_io.robot import STATE_DIM


def ee_position(obs: dict, info: dict) -> np.ndarray | None:
    """The end effector's position [3]: ``info["ee_pos"]`` where the env gives it, else the arm's state layout
    ``[ee_pos(3), ee_quat(4), gripper(1)]`` (``robot_io.robot.state_vector``); None for any other state."""
    if info.get("ee_pos") is not None:
        return np.asarray(info["ee_pos"], np.float64).reshape(3)
    state = np.asarray(obs.get("state", ()), np.float64).reshape(-1)
    return state[:3].copy() if state.size == STATE_DIM else None


def ee_coverage(positions: list[np.ndarray], voxel: float = 0.02) -> int:
    """Distinct ``voxel``-sized cubes (metres; default 2 cm) visited by a group's end effectors: ``positions`` one
    array [T, 3] per rollout, the cubes of all rollouts pooled."""
    pts = [np.asarray(p, np.float64).reshape(-1, 3) for p in positions if len(p)]
    if not pts:
        return 0
    return int(len(np.unique(np.floor(np.concatenate(pts) / voxel).astype(np.int64), axis=0)))


def chunk_distance(chunks: list[np.ndarray]) -> float:
    """Mean pairwise L2 distance between a group's chunks (each flattened; e.g. every rollout's first macro-step's
    chunk, in the VLA's normalised units). 0 for fewer than two."""
    flat = [np.asarray(c, np.float64).reshape(-1) for c in chunks]
    pairs = list(itertools.combinations(range(len(flat)), 2))
    if not pairs:
        return 0.0
    return float(np.mean([np.linalg.norm(flat[i] - flat[j]) for i, j in pairs]))
