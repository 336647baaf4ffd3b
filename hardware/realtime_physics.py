"""Real-time pacing of a MuJoCo device's physics on its own thread (the sim Franka, the sim Go1).

A simulator in real-time mode advances its physics on a background thread at wall-clock pace, one
control tick (``_tick_steps`` physics steps) at a time, so commands from the bridge land on a
world that keeps moving as a real robot's does. :class:`RealtimePhysics` is that thread, shared by
the simulators; a device mixes it in before its interface class and provides:

* ``timestep`` (s per physics step), ``max_lag_s``, ``name``;
* ``_lock`` (guards the MuJoCo data), ``_substep`` (physics steps since construction),
  ``_step_locked(k)`` (advance k physics steps, lock held);
* ``_tick_steps``: physics steps per control tick; the thread steps whole ticks, aligned to
  ``_substep``.

When the thread falls more than ``max_lag_s`` behind the wall clock (a busy machine) it drops the
backlog, keeps one tick, counts it in ``realtime_stats["late"]`` and logs every 100th time:
catching up would run the robot in fast-forward. ``_reanchor = True`` (set on connect and on a
reset) restarts the pacing from now.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)


class RealtimePhysics:
    _tick_steps: int

    def _init_realtime(self) -> None:
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reanchor = True
        self._late = 0

    @property
    def realtime_stats(self) -> dict[str, Any]:
        """``late``: how often the physics thread fell more than ``max_lag_s`` behind the wall clock."""
        return {"late": self._late, "sim_time": self.sim_time, "running": self._thread is not None}

    def _connect(self) -> None:
        if self.realtime:
            self._stop.clear()
            self._reanchor = True
            self._thread = threading.Thread(target=self._run, name=f"{type(self).__name__}-{self.name}", daemon=True)
            self._thread.start()

    def _disconnect(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2.0)
            if self._thread.is_alive():
                log.error("%s %r: physics thread did not stop within 2 s", type(self).__name__, self.name)
            self._thread = None

    def _run(self) -> None:
        every = self._tick_steps
        wall0, steps_done = time.monotonic(), 0
        while not self._stop.is_set():
            with self._lock:
                if self._reanchor:
                    self._reanchor = False
                    wall0, steps_done = time.monotonic(), 0
                due = int((time.monotonic() - wall0) / self.timestep) - steps_done
                if due * self.timestep > self.max_lag_s:
                    self._late += 1
                    if self._late == 1 or self._late % 100 == 0:
                        log.warning("%s %r: physics fell %.3f s behind real time (%d times); dropping the backlog",
                                    type(self).__name__, self.name, due * self.timestep, self._late)
                    steps_done += due - every  # forget the backlog, keep one tick
                    due = every
                if due >= every:
                    k = every - self._substep % every
                    self._step_locked(k)
                    steps_done += k
            next_t = wall0 + (steps_done + every) * self.timestep
            wait = next_t - time.monotonic()
            if wait > 0:
                self._stop.wait(wait)
