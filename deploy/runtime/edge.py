"""The edge runner: an exported policy drives a robot over the bridge at a fixed control rate.
onnxruntime, numpy and the bridge client only (no torch): it runs on a Raspberry Pi.

One control tick every ``1 / hz`` seconds, on an absolute schedule (tick k is due at
``t0 + k / hz``)::

    wait for tick k
    chunk queue empty?  observe (arm state newer than the last command, newest camera frames),
                        run the policy -> chunk [H, A], queue its first exec_steps rows
    send the next row (ee_delta); its reply carries what the arm applied

``latency`` of a tick is the time from its due time to the moment its command was answered
(sleep overshoot + observation + inference + the command's round trip). A tick whose latency
is over one period has missed its deadline. A tick that ends after the next one was due makes
the schedule skip the ticks it overran (no burst of catch-up commands); they are counted as
``skipped``: executed + skipped = ``seconds * hz``, the ticks due in the run. ``EdgeStats``
keeps counters and the latest ``window`` samples (bounded memory).

Any exception inside the loop -- the policy, a non-finite or wrongly shaped chunk, a bridge
error, Ctrl-C -- sends the arm's ``stop`` (its safe state: the arm holds) before it propagates;
the server's watchdog is the second line if even that cannot get through. A run that ends
normally also stops the arm.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any, Callable

import numpy as np

from robot_io.gripper import gripper_mode, snap_opening

log = logging.getLogger(__name__)

ACTION_DIM = 7


@dataclasses.dataclass(frozen=True)
class EdgeConfig:
    hz: float = 10.0
    """Control rate (ticks per second); one chunk row is sent per tick."""
    seconds: float = 30.0
    """How long to run (0: until Ctrl-C)."""
    exec_steps: int | None = None
    """Rows of each chunk executed before the next inference (default: the policy's metadata, else the whole chunk)."""
    noise: str = "sample"
    """The policy's noise input: ``sample`` (N(0, I) per chunk: the policy as trained) or ``zero`` (deterministic)."""
    gripper: str = "raw"
    """The executed gripper opening (``robot_io.gripper``): ``raw`` as the policy puts it out, ``binary`` snapped
    to 0 / 1 at 0.5."""
    seed: int = 0
    """Seed of the noise and of the scene reset (sim)."""
    window: int = 100_000
    """Latest per-tick samples kept for the percentiles (counters cover the whole run)."""

    def __post_init__(self) -> None:
        if not self.hz > 0:
            raise ValueError(f"hz must be positive, got {self.hz}")
        if self.seconds < 0:
            raise ValueError(f"seconds must be >= 0 (0: until Ctrl-C), got {self.seconds}")
        if self.exec_steps is not None and self.exec_steps < 1:
            raise ValueError(f"exec_steps must be >= 1, got {self.exec_steps}")
        if self.noise not in ("sample", "zero"):
            raise ValueError(f"noise must be 'sample' or 'zero', got {self.noise!r}")
        gripper_mode(self.gripper, "gripper")


class EdgeStats:
    """Counters and the latest samples of one run (bounded), summarised by ``summary()``."""

    def __init__(self, hz: float, window: int = 100_000) -> None:
        self.hz, self.period = hz, 1.0 / hz
        self.latency_s: collections.deque[float] = collections.deque(maxlen=window)
        self.infer_s: collections.deque[float] = collections.deque(maxlen=window)
        self.observe_s: collections.deque[float] = collections.deque(maxlen=window)
        self.ticks = self.misses = self.skipped = self.chunks = self.clipped = 0
        self.t_first = self.t_last = None

    def tick(self, due: float, done: float) -> None:
        lat = done - due
        self.latency_s.append(lat)
        self.ticks += 1
        self.misses += lat > self.period
        self.t_first = due if self.t_first is None else self.t_first
        self.t_last = due

    def summary(self) -> dict[str, Any]:
        def pct(xs, q):
            return float(np.percentile(np.asarray(xs) * 1e3, q)) if xs else None

        span = (self.t_last - self.t_first) if self.ticks > 1 else 0.0
        return {
            "target_hz": self.hz, "ticks": self.ticks,
            "achieved_hz": (self.ticks - 1) / span if span > 0 else None,
            "deadline_misses": self.misses, "miss_fraction": self.misses / self.ticks if self.ticks else None,
            "skipped_ticks": self.skipped, "chunks": self.chunks, "clipped_commands": self.clipped,
            "latency_ms": {"p50": pct(self.latency_s, 50), "p90": pct(self.latency_s, 90),
                           "p99": pct(self.latency_s, 99), "max": pct(self.latency_s, 100)},
            "inference_ms": {"p50": pct(self.infer_s, 50), "p99": pct(self.infer_s, 99),
                             "max": pct(self.infer_s, 100)},
            "observe_ms": {"p50": pct(self.observe_s, 50), "p99": pct(self.observe_s, 99)},
        }


def check_chunk(chunk: np.ndarray, what: str = "the policy's chunk") -> np.ndarray:
    chunk = np.asarray(chunk, np.float32)
    if chunk.ndim != 2 or chunk.shape[1] != ACTION_DIM or len(chunk) == 0:
        raise ValueError(f"{what} must be [H, {ACTION_DIM}], got shape {list(chunk.shape)}")
    if not np.isfinite(chunk).all():
        raise ValueError(f"{what} contains NaN or inf; nothing was sent")
    return chunk


def run_edge(client, policy: Callable[..., np.ndarray], instruction: str, cfg: EdgeConfig = EdgeConfig(),
             noise_shape: tuple[int, ...] | None = None, exec_steps: int | None = None,
             stop_flag: Callable[[], bool] | None = None,
             on_tick: Callable[[int, np.ndarray], None] | None = None) -> dict[str, Any]:
    """Drive ``client`` (a ``robot_io.RobotClient``: ``observe``, ``ee_delta``, ``stop``) with
    ``policy(obs, noise=...) -> chunk [H, 7]`` at ``cfg.hz`` for ``cfg.seconds``; returns the
    stats summary. ``noise_shape``: the policy's noise input (None: the policy draws its own).
    Any exception stops the arm (safe state), then propagates."""
    stats = EdgeStats(cfg.hz, cfg.window)
    rng = np.random.default_rng(cfg.seed)
    steps = cfg.exec_steps or exec_steps
    period = stats.period
    queue: collections.deque[np.ndarray] = collections.deque()
    t_sent_ns = 0
    try:
        t0 = time.perf_counter() + period
        k = 0
        n_ticks = round(cfg.seconds * cfg.hz) if cfg.seconds else float("inf")  # ticks due in the run
        while k < n_ticks and not (stop_flag is not None and stop_flag()):
            due = t0 + k * period
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            if not queue:
                t_obs = time.perf_counter()
                obs = client.observe(instruction, newer_than_ns=t_sent_ns, cameras_newer_than_ns=0)
                t_inf = time.perf_counter()
                noise = None
                if noise_shape is not None:
                    noise = (rng.standard_normal(noise_shape) if cfg.noise == "sample"
                             else np.zeros(noise_shape)).astype(np.float32)
                chunk = check_chunk(policy(obs, noise=noise))
                if cfg.gripper == "binary":
                    chunk = snap_opening(chunk)
                t_done = time.perf_counter()
                stats.observe_s.append(t_inf - t_obs)
                stats.infer_s.append(t_done - t_inf)
                stats.chunks += 1
                queue.extend(chunk[: steps or len(chunk)])
            row = queue.popleft()
            t_sent_ns = time.monotonic_ns()
            reply = client.ee_delta(row)
            stats.tick(due, time.perf_counter())
            stats.clipped += bool(reply.get("clipped"))
            if on_tick is not None:
                on_tick(k, row)
            k += 1
            behind = time.perf_counter() - (t0 + k * period)
            if behind > 0:  # overran the next tick: skip the ticks already missed, keep the phase
                skip = min(int(behind // period) + 1, n_ticks - k)  # only ticks due within the run
                stats.skipped += skip
                k += skip
    except BaseException as e:
        log.error("edge runner: %s: %s -- putting the arm in its safe state", type(e).__name__, e)
        safe_stop(client)
        raise
    safe_stop(client)
    return stats.summary()


def safe_stop(client) -> bool:
    """Send the arm's ``stop`` (safe state: hold). True if the arm confirmed it."""
    try:
        client.stop()
        return True
    except Exception as e:  # noqa: BLE001 - the watchdog (command_timeout_ms) is the next line of defence
        log.error("could not send stop to the arm (%s: %s); the bridge watchdog will hold it once "
                  "heartbeats stop", type(e).__name__, e)
        return False
