"""PRIVILEGED teachers for the rig's pixel agents: they read the ball and the paddle from the
emulator's RAM, which no camera-fed agent can. They label games for behaviour cloning
(``policies.dqn.bc``) and are never scored as the agent.

A tracker per game (RAM addresses from the AtariARI annotations, Anand et al. 2019: Pong ball x/y
49/54, player y 51; Breakout ball x/y 99/101, player x 72) moves the paddle towards where the ball
will cross the paddle's line (straight-line extrapolation with wall reflections), with a dead band.
Measured over games from 10 no-op starts, 5-minute games (18000 frames, Nature's evaluation cap):
Pong 7.9 (offset 6, band 6), Breakout 30.6 (offset 10, band 2); most other offsets lose, since the
deterministic opponent punishes a fixed contact point. One step of policy iteration on top (try each
action, then the tracker, for 30 steps on a saved emulator state) did not win more Pong points
(4 / 12 / 12 vs 3 / 13 / 13 on three starts) at 75x the cost, so the teacher is the tracker alone.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Tracker(Protocol):
    def reset(self) -> None: ...

    def __call__(self, ram: np.ndarray) -> int: ...

    def clone(self) -> "Tracker": ...

    def features(self, ram: np.ndarray) -> np.ndarray:
        """The RAM quantities the tracker reads (ball and paddle positions), scaled to about [-1, 1]:
        auxiliary training targets for the student (``policies.dqn.bc``), never its input."""
        ...


def _reflect(y: float, lo: float, hi: float) -> float:
    span = hi - lo
    y = (y - lo) % (2 * span)
    return lo + (y if y <= span else 2 * span - y)


class PongTracker:
    """Pong (minimal actions NOOP, FIRE, RIGHT = up, LEFT = down, RIGHTFIRE, LEFTFIRE): the paddle's
    RAM y plus ``offset`` is aimed at the ball's predicted y where it reaches the paddle; the paddle's
    own velocity is extrapolated one step (it has momentum); ``band``: dead band, RAM pixels."""

    ACTIONS = {"NOOP": 0, "UP": 2, "DOWN": 3}
    PADDLE_X, Y_LO, Y_HI, HOME = 188, 47, 205, 125

    def __init__(self, offset: float = 6.0, band: float = 6.0) -> None:
        self.offset, self.band = float(offset), float(band)
        self.reset()

    def reset(self) -> None:
        self.ball: tuple[int, int] | None = None
        self.paddle: int | None = None

    def clone(self) -> "PongTracker":
        c = PongTracker(self.offset, self.band)
        c.ball, c.paddle = self.ball, self.paddle
        return c

    def features(self, ram: np.ndarray) -> np.ndarray:
        return np.asarray([ram[49], ram[54], ram[51]], np.float32) / 128.0 - 1.0  # ball x, ball y, paddle y

    def target(self, ram: np.ndarray) -> float:
        bx, by = int(ram[49]), int(ram[54])
        if bx == 0 or by == 0:  # no ball in play
            self.ball = None
            return self.HOME
        prev, self.ball = self.ball, (bx, by)
        if prev is None:
            return by
        vx, vy = bx - prev[0], by - prev[1]
        if vx <= 0:
            return by
        return _reflect(by + vy * (self.PADDLE_X - bx) / vx, self.Y_LO, self.Y_HI)

    def __call__(self, ram: np.ndarray) -> int:
        t = self.target(ram)
        py = int(ram[51])
        v = 0 if self.paddle is None else py - self.paddle
        self.paddle = py
        c = py + v + self.offset
        if t > c + self.band:
            return self.ACTIONS["DOWN"]
        if t < c - self.band:
            return self.ACTIONS["UP"]
        return self.ACTIONS["NOOP"]


class BreakoutTracker:
    """Breakout (minimal actions NOOP, FIRE, RIGHT, LEFT): FIRE when no ball is in play, else move
    the paddle's centre (RAM x + ``offset``) to where the falling ball will reach the paddle's row."""

    ACTIONS = {"NOOP": 0, "FIRE": 1, "RIGHT": 2, "LEFT": 3}
    PADDLE_Y, X_LO, X_HI = 189, 55, 191

    def __init__(self, offset: float = 10.0, band: float = 2.0) -> None:
        self.offset, self.band = float(offset), float(band)
        self.reset()

    def reset(self) -> None:
        self.ball: tuple[int, int] | None = None

    def clone(self) -> "BreakoutTracker":
        c = BreakoutTracker(self.offset, self.band)
        c.ball = self.ball
        return c

    def features(self, ram: np.ndarray) -> np.ndarray:
        return np.asarray([ram[99], ram[101], ram[72]], np.float32) / 128.0 - 1.0  # ball x, ball y, paddle x

    def __call__(self, ram: np.ndarray) -> int:
        bx, by = int(ram[99]), int(ram[101])
        if by == 0:  # no ball: serve
            self.ball = None
            return self.ACTIONS["FIRE"]
        prev, self.ball = self.ball, (bx, by)
        t = float(bx)
        if prev is not None:
            vx, vy = bx - prev[0], by - prev[1]
            if vy > 0:
                t = _reflect(bx + vx * (self.PADDLE_Y - by) / vy, self.X_LO, self.X_HI)
        c = int(ram[72]) + self.offset
        if t > c + self.band:
            return self.ACTIONS["RIGHT"]
        if t < c - self.band:
            return self.ACTIONS["LEFT"]
        return self.ACTIONS["NOOP"]


TRACKERS = {"pong": PongTracker, "breakout": BreakoutTracker}


def make_teacher(game: str, **kw) -> Tracker:
    """The RAM teacher of ``game`` (``pong`` or ``breakout``)."""
    if game not in TRACKERS:
        raise ValueError(f"no RAM teacher for {game!r}: there are {sorted(TRACKERS)}")
    return TRACKERS[game](**kw)
