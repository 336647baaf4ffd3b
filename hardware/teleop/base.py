"""The ``Teleop`` interface: a human (or scripted) operator producing end-effector actions.

Every control tick the recorder calls ``read(obs, privileged)`` and gets a :class:`TeleopCommand`:

* ``action``: float32 [7] = dpos (3, metres per tick), drot (3, rad axis-angle per tick),
  gripper opening in [0, 1] (absolute, 1 = open). Same layout as ``robot_io.RobotEnv`` actions.
* ``events``: operator events raised since the last read, a subset of ``EVENTS``:
  ``success`` (end the episode, it succeeded), ``failure`` (end it, it failed),
  ``rerecord`` (discard the episode in progress and record it again), ``stop`` (end the session
  after discarding the episode in progress).
* ``intervening``: True when the human is actively commanding the robot on this tick. During
  plain demonstration recording every device reports True while it drives; in human-in-the-loop
  RL a device reports True only while the operator has taken over (e.g. is touching the
  controls), and those frames are flagged in the data.

``privileged`` is the simulator's ground truth (the raw arm state arrays, e.g. ``objects``
poses and names), given only to scripted experts, which are labelled as such.
"""

from __future__ import annotations

import abc
import dataclasses

import numpy as np

from hardware.base import Device

EVENTS = ("success", "failure", "rerecord", "stop")


@dataclasses.dataclass
class TeleopCommand:
    action: np.ndarray
    events: frozenset[str] = frozenset()
    intervening: bool = True

    def __post_init__(self) -> None:
        self.action = np.asarray(self.action, np.float32).reshape(7)
        bad = set(self.events) - set(EVENTS)
        if bad:
            raise ValueError(f"unknown teleop event(s) {sorted(bad)}; known: {EVENTS}")
        self.events = frozenset(self.events)


class Teleop(Device):
    kind = "teleop"

    def begin_episode(self, task: str | None = None, seed: int | None = None, instruction: str = "") -> None:
        """Called before each episode (a scripted expert plans for its task here)."""

    @abc.abstractmethod
    def read(self, obs: dict | None = None, privileged: dict | None = None) -> TeleopCommand:
        """The operator's command for this tick. Must not block longer than a control period."""
