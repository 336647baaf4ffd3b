"""Blending overlapping action chunks into one action per control tick. numpy only (no torch).

An asynchronous client asks for the next chunk while it still executes the current one, so two
chunks cover the same ticks for a while. Row ``i`` of a chunk computed for the observation of tick
``s`` is meant for tick ``s + i``; rows for ticks that passed before the chunk arrived are stale and
never executed. What to execute where chunks overlap is the blend mode:

``none``
    The newest chunk wins as soon as it arrives. The arm jumps at every chunk boundary by however
    much the new plan disagrees with the old one (a flow policy's fresh noise draw, a moved scene).
``ensemble``
    ACT's temporal ensembling (Zhao et al., 2023; ``vla.envs.TemporalEnsemble`` in torch): the
    weighted mean of every chunk covering the tick, weights ``exp(-m * i)``, ``i = 0`` the oldest.
    With two overlapping chunks each boundary becomes two half-size steps (when the new chunk
    joins the mean and when the old one leaves it).
``crossfade``
    A linear cross-fade over the overlap: with the new chunk executable from tick ``s`` and the old
    one ending at tick ``e`` (exclusive), tick ``s + j`` executes
    ``(1 - w) old + w new``, ``w = (j + 1) / (e - s + 1)``: the new plan takes over in equal steps
    and the old one has no weight left when it runs out.

The blender keeps at most ``max_chunks`` chunks (the oldest are dropped once nothing covers their
ticks, and never more than that bound: no buffer grows without bound).
"""

from __future__ import annotations

import dataclasses

import numpy as np

BLEND_MODES = ("none", "ensemble", "crossfade")


@dataclasses.dataclass(frozen=True)
class _Chunk:
    id: int
    start: int
    """Tick of row 0 (the tick the observation was taken at)."""
    first: int
    """First tick this chunk may be executed at (its arrival tick, or ``start`` if later)."""
    rows: np.ndarray

    @property
    def end(self) -> int:
        """First tick after the chunk (exclusive)."""
        return self.start + len(self.rows)

    def covers(self, tick: int) -> bool:
        return self.first <= tick < self.end


class ChunkBlender:
    """Chunks in, one row per tick out. ``add(chunk, start, arrival)`` then ``action(tick)``."""

    def __init__(self, mode: str = "crossfade", m: float = 0.01, max_chunks: int = 8) -> None:
        if mode not in BLEND_MODES:
            raise ValueError(f"blend mode must be one of {', '.join(BLEND_MODES)}, got {mode!r}")
        if not (np.isfinite(m) and m >= 0):
            raise ValueError(f"ensemble weight m must be >= 0, got {m}")
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
        self.mode, self.m, self.max_chunks = mode, float(m), int(max_chunks)
        self._chunks: list[_Chunk] = []  # oldest first
        self._next_id = 0

    def reset(self) -> None:
        self._chunks = []

    def add(self, chunk: np.ndarray, start: int, arrival: int) -> int:
        """Add a chunk ``[H, A]`` whose row 0 is meant for tick ``start``, received before tick
        ``arrival`` is executed. Returns its id. Rows for ticks before ``arrival`` are skipped."""
        rows = np.asarray(chunk, np.float32)
        if rows.ndim != 2 or len(rows) == 0:
            raise ValueError(f"a chunk must be [H, A] with H >= 1, got shape {list(rows.shape)}")
        if self._chunks and rows.shape[1] != self._chunks[-1].rows.shape[1]:
            raise ValueError(f"chunk action width {rows.shape[1]} differs from the previous chunk's "
                             f"{self._chunks[-1].rows.shape[1]}")
        c = _Chunk(self._next_id, int(start), max(int(start), int(arrival)), rows)
        self._next_id += 1
        if self.mode == "none":
            self._chunks = [c]
        else:  # keep the chunks that still overlap the new one, at most max_chunks in all
            self._chunks = ([old for old in self._chunks if old.end > c.first] + [c])[-self.max_chunks:]
        return c.id

    def remaining(self, tick: int) -> int:
        """Ticks from ``tick`` on that the newest chunk still covers (the client's queue length)."""
        if not self._chunks:
            return 0
        c = self._chunks[-1]
        return max(0, c.end - max(tick, c.first))

    def action(self, tick: int) -> tuple[np.ndarray | None, tuple[int, ...]]:
        """The row to execute at ``tick`` and the ids of the chunks that made it (oldest first);
        ``(None, ())`` when no chunk covers the tick (the queue ran dry)."""
        self._chunks = [c for c in self._chunks if c.end > tick]
        live = [c for c in self._chunks if c.covers(tick)]
        if not live:
            return None, ()
        if self.mode == "none":
            c = live[-1]
            return c.rows[tick - c.start].copy(), (c.id,)
        rows = np.stack([c.rows[tick - c.start] for c in live])
        if self.mode == "ensemble":
            w = np.exp(-self.m * np.arange(len(rows)))  # i = 0: the oldest prediction (ACT)
            return ((w[:, None] * rows).sum(0) / w.sum()).astype(np.float32), tuple(c.id for c in live)
        # crossfade: fold newer chunks in, each over its overlap with the one before it
        out = rows[0].astype(np.float64)
        for prev, c, row in zip(live, live[1:], rows[1:]):
            n = prev.end - c.first  # length of the overlap (>= 1: prev still covers this tick)
            w = (tick - c.first + 1) / (n + 1)
            out = (1.0 - w) * out + w * row
        return out.astype(np.float32), tuple(c.id for c in live)


def boundary_jumps(actions: np.ndarray, sources: list[tuple[int, ...]],
                   dims: slice | None = None) -> dict[str, dict[str, float | int | None]]:
    """Change between consecutive commands ``|a_t - a_(t-1)|`` (L2 over the action), split into
    chunk-boundary commands (the set of chunks behind the action changed: one joined or left) and
    within-chunk commands. ``actions`` [T, A] per tick, ``sources[t]`` the chunk ids behind tick t
    (``ChunkBlender.action``); a tick without a command (skipped or starved: empty sources) is left
    out, and the next command is compared with the last one sent -- the step the arm was given.
    ``dims``: the action dimensions to measure (e.g. ``slice(0, 6)``: the arm's motion without the
    gripper, whose open / close steps are meant to be steps)."""
    acts = np.asarray(actions, np.float64)
    if dims is not None:
        acts = acts[:, dims]
    out: dict[str, list[float]] = {"boundary": [], "within": []}
    prev = None
    for t in range(len(acts)):
        if not sources[t]:
            continue
        if prev is not None:
            jump = float(np.linalg.norm(acts[t] - acts[prev]))
            out["boundary" if sources[t] != sources[prev] else "within"].append(jump)
        prev = t

    def summary(xs: list[float]) -> dict[str, float | int | None]:
        if not xs:
            return {"n": 0, "mean": None, "p95": None, "max": None}
        a = np.asarray(xs)
        return {"n": len(a), "mean": float(a.mean()), "p95": float(np.percentile(a, 95)), "max": float(a.max())}

    return {k: summary(v) for k, v in out.items()}
