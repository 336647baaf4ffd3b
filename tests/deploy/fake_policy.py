"""A deterministic policy source for the policy server's tests (no torch): chunks that follow one
smooth trajectory in the tick, each shifted by an offset whose sign alternates from chunk to
chunk, so consecutive plans disagree by exactly ``2 * offset`` per action dimension. With
``seed`` the signs are drawn at random instead (seeded: the same sequence every run), so two
consecutive plans disagree by ``2 * offset`` or agree, as independent samples would."""

from __future__ import annotations

import sys
import time

import numpy as np


class OffsetSource:
    def __init__(self, horizon: int = 10, offset: float = 0.004, delay_s: float = 0.0, cameras=(),
                 seed: int | None = None) -> None:
        self.horizon, self.offset, self.delay_s, self.cameras = horizon, offset, delay_s, list(cameras)
        self.rng = np.random.default_rng(seed) if seed is not None else None
        self.calls = 0

    def describe(self) -> dict:
        return {"policy": "offset", "horizon": self.horizon, "action_dim": 7, "cameras": self.cameras,
                "state_dim": 8, "instructions": ["test"]}

    @staticmethod
    def base(ticks: np.ndarray) -> np.ndarray:
        """The smooth trajectory: row for tick t (a change of at most ~1e-3 per tick and dimension)."""
        t = np.asarray(ticks, np.float64)[:, None]
        return (0.003 * np.sin(0.25 * t + np.arange(7))).astype(np.float32)

    def __call__(self, obs: dict) -> np.ndarray:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.rng is not None:
            sign = 1.0 if self.rng.random() < 0.5 else -1.0
        else:
            sign = 1.0 if self.calls % 2 == 0 else -1.0
        self.calls += 1
        return self.base(obs["tick"] + np.arange(self.horizon)) + np.float32(sign * self.offset)


def serve(bind: str, delay_s: float = 0.0, seed: int | None = None) -> None:
    """Serve an OffsetSource on ``bind`` until killed; prints the bound endpoint first."""
    from deploy.server import PolicyServer

    srv = PolicyServer(OffsetSource(delay_s=delay_s, seed=seed), bind)
    print(srv.bind(), flush=True)
    srv.serve()


if __name__ == "__main__":
    serve(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0, int(sys.argv[3]) if len(sys.argv) > 3 else None)
