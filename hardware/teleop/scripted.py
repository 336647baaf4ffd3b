"""``ScriptedExpert``: a PRIVILEGED ORACLE demonstrator for the simulated tabletop tasks.

It is not a policy and not a human: every tick it reads the simulator's true object poses from
``privileged`` (``objects`` [N, 7], ``object_names``, ``ee_pos`` [3], ``ee_quat`` [4],
``gripper`` [1]; the raw state arrays of the bridge plus ``describe()["objects"]``) and drives
the task's sub-skills (``hardware.sim_tasks.Task.skills``) as closed-loop state machines:

* ``pick(cube)``: rise if low, fly over the cube with the fingers across two opposite faces
  (the cube's yaw), come down to its centre, close, lift; a missed or slipped grasp is retried.
* ``place(cube, where)``: carry at 15 cm over the goal (bowl centre, a slot in the bowl, the
  top of another cube, turning the cube to line up with it), lower, open, back off upwards.
  A cube dropped on the way sends it back to ``pick``.
* ``push(cube, "target")``: closed fingers come down behind the cube and push it along the
  line to the marker at 1.5 cm per tick, re-approaching when the cube slides off the line.
* ``lift(cube, z)``: raise the held cube to ``z``.

Actions are the ``TeleopCommand`` layout: dpos (m per tick, at most ``speed`` <= ``max_step_m``
long), drot (world-frame axis-angle, at most ``max_rot`` rad, to keep the fingers pointing down
at the wanted yaw), gripper opening (absolute). Events: ``success`` once the task's predicate
has held for ``settle_ticks`` ticks (so place tasks have let go and the scene has settled);
``failure`` on the last tick of ``task.max_steps``, after too many failed grasps, or when its
plan is done without success (which only happens after a mistake, see below).

Quality. One knob, ``quality`` in [0, 1] (1 = best), sets the imperfections (any of them can
be overridden by keyword; :meth:`ExpertKnobs.from_quality` is the mapping):

================  ==========================================  ========  ========  ========
knob              meaning                                     q = 1     q = 0.5   q = 0
================  ==========================================  ========  ========  ========
mistake_prob      share of episodes with one fatal mistake:   0         0.5       1
                  wrong cube, cube set down away from the
                  goal, push stopped short (the plan then
                  ends in ``failure``); which episodes is a
                  golden-ratio sequence over the episode
                  seed, so N consecutive seeds hold
                  mistake_prob * N of them (+-1); which
                  kinds: ``mistake_kinds`` (below)
noise_std         Gaussian action noise, m per tick            0.001     0.003     0.005
rot_noise_std     rad per tick                                0.005     0.0125    0.02
pause_prob        chance per tick to start a 1-4 tick pause   0         0.05      0.10
speed             approach speed, m per tick                  0.040     0.032     0.024
grasp_error_m     std of the grasp point offset (x, y)        0         0.003     0.006
place_error_m     std of the release point offset (x, y)      0         0.0025    0.005
================  ==========================================  ========  ========  ========

``mistake_kinds`` (default: every kind the task allows of the first three) picks the mistakes drawn from:
``wrong_object`` (pick / push a spare cube), ``misplace`` (release away from the goal), ``stop_short`` (push
stops 7 cm before the marker) and, only when named, ``close_early`` (the first pick closes the fingers 5 cm
above the cube, lifts nothing and gives up). ``close_early`` was written for latent-noise RL bases: every
episode reaches the same hover-over-the-cube state, where demos descend or close (``vla record --mistake-kind
close_early``; what a VLA trained on them gave: ``bench/results/vla_sft/README.md``, round 13).

Grasp modes. ``grasp_mode`` picks which face pair of a cube a pick grasps across, a behaviour mode rather
than a quality (the multi-modal demos of ExToken's token prior: ``vla record --expert-mode``):

* ``near`` (default): the face pair nearest the current finger angle, re-chosen every tick;
* ``ccw`` / ``cw``: turn the fingers counter-clockwise / clockwise (about world z, seen from above) to the
  next face pair on that side: the finger angle equal to the cube's yaw modulo 90 degrees in
  (cur, cur + 90] (ccw) or [cur - 90, cur) (cw), decided when the pick's first approach starts and kept
  (following the cube if it turns) through the approach and every retry of that pick;
* ``random``: ``ccw`` or ``cw`` per episode, from the episode seed on a low-discrepancy sequence (like the
  mistake draw, on its own axis), so N consecutive seeds hold N/2 of each (+-2).

``mode`` holds the episode's mode (``ccw`` / ``cw`` for ``random``); ``describe()`` and ``last_info`` carry
it. ``hardware.sim_tasks`` has scenes made for the modes (``pick_red_cube_yaw45``,
``pick_red_cube_crowded``; ``bench/archive/expert_modes.py`` measures them).

The non-fatal knobs are absorbed by the closed loop (retries, re-approaches, redoing a place
that did not hold), so the success rate follows the mistake rate: expected success ~=
full-quality success x quality (see
:func:`expected_success`; ``bench/experts.py`` measures it).
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import numpy as np

from hardware.sim_tasks import (BOWL_FLOOR, BOWL_SLOTS, CUBE_HALF, CUBES, OBJECT_REGION, Task, cube_yaw, dist_xy,
                                get_task, grasped, in_bowl, objects_from_state, on_marker, stacked)
from hardware.teleop.base import Teleop, TeleopCommand

HOME_DOWN_QUAT = np.array([0.0, math.sqrt(0.5), math.sqrt(0.5), 0.0])  # fingers down, finger axis = world x
CARRY_Z = 0.15
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_SILVER = math.sqrt(2.0) - 1.0  # the grasp mode's sequence: independent of the mistake draw's golden one
GRASP_MODES = ("near", "ccw", "cw", "random")
MISTAKE_KINDS = ("wrong_object", "misplace", "stop_short", "close_early")
DEFAULT_MISTAKE_KINDS = MISTAKE_KINDS[:3]
CLOSE_EARLY_DZ = 0.05
HOVER_DZ = 0.10
PUSH_CONTACT = CUBE_HALF + 0.012  # tcp to cube centre while pushing (finger half thickness ~1 cm)
PUSH_START_BACK = 0.03  # a push comes down this far behind the contact point, on the line from the marker


# --------------------------------------------------------------------------------------------
# Small quaternion helpers (wxyz, numpy only)
# --------------------------------------------------------------------------------------------


def _qmul(a, b) -> np.ndarray:
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return np.array([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2])


def _rotvec(q) -> np.ndarray:
    """Axis-angle vector of a unit quaternion (shortest way round)."""
    q = np.asarray(q, float)
    if q[0] < 0:
        q = -q
    s = float(np.linalg.norm(q[1:]))
    if s < 1e-12:
        return np.zeros(3)
    return q[1:] / s * 2.0 * math.atan2(s, q[0])


def down_quat(angle: float) -> np.ndarray:
    """Fingers pointing down with the finger (opening) axis at ``angle`` rad from world x."""
    return _qmul(np.array([math.cos(angle / 2), 0.0, 0.0, math.sin(angle / 2)]), HOME_DOWN_QUAT)


def finger_angle(ee_quat) -> float:
    """Angle of the finger axis (hand y) in the table plane, in (-pi, pi]."""
    w, x, y, z = (float(v) for v in ee_quat)
    # hand y = second column of the rotation matrix: (R01, R11)
    return math.atan2(1 - 2 * (x * x + z * z), 2 * (x * y - z * w))


def _wrap(a: float, period: float) -> float:
    """``a`` wrapped into [-period/2, period/2)."""
    return (a + period / 2) % period - period / 2


def nearest_angle(want: float, current: float, period: float) -> float:
    """The angle equal to ``want`` modulo ``period`` that is closest to ``current``."""
    return current + _wrap(want - current, period)


def turned_angle(want: float, current: float, direction: str, period: float = math.pi / 2) -> float:
    """The angle equal to ``want`` modulo ``period`` reached by turning from ``current`` in ``direction``:
    ``"ccw"`` (counter-clockwise seen from above, angles grow) in (current, current + period], ``"cw"`` in
    [current - period, current)."""
    if direction == "ccw":
        d = (want - current) % period
        return current + (d if d > 0 else period)
    if direction == "cw":
        d = (current - want) % period
        return current - (d if d > 0 else period)
    raise ValueError(f"direction must be 'ccw' or 'cw', got {direction!r}")


# --------------------------------------------------------------------------------------------
# Quality knobs
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExpertKnobs:
    mistake_prob: float = 0.0
    """Probability that an episode contains one fatal mistake (wrong cube, misplaced, stopped short)."""
    noise_std: float = 0.001
    """Std of Gaussian noise added to dpos, m per tick."""
    rot_noise_std: float = 0.005
    """Std of Gaussian noise added to drot, rad per tick."""
    pause_prob: float = 0.0
    """Chance per tick of starting a hesitation (1-4 ticks of zero motion)."""
    speed: float = 0.04
    """Largest translation per tick, m (the server allows 0.05)."""
    grasp_error_m: float = 0.0
    """Std of the offset of the grasp point from the cube centre, per horizontal axis, m."""
    place_error_m: float = 0.0
    """Std of the offset of the release point from the goal, per horizontal axis, m."""
    mistake_kinds: tuple[str, ...] = ()
    """Kinds the fatal mistake is drawn from, among those the task allows (module docstring); () = the
    default kinds (``DEFAULT_MISTAKE_KINDS``; ``close_early`` only when named)."""
    grasp_mode: str = "near"
    """Which face pair a pick grasps across (module docstring): near (the nearest), ccw / cw (turn the fingers
    counter-clockwise / clockwise to the next pair), random (ccw or cw per episode, from the episode seed)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.mistake_prob <= 1.0 or not 0.0 <= self.pause_prob <= 1.0:
            raise ValueError("mistake_prob and pause_prob must lie in [0, 1]")
        if not 0.0 < self.speed <= 0.05:
            raise ValueError(f"speed must be in (0, 0.05] m per tick (the server's max step), got {self.speed}")
        if any(k not in MISTAKE_KINDS for k in self.mistake_kinds):
            raise ValueError(f"mistake_kinds must be a tuple of {MISTAKE_KINDS}, got {self.mistake_kinds!r}")
        if self.grasp_mode not in GRASP_MODES:
            raise ValueError(f"grasp_mode must be one of {GRASP_MODES}, got {self.grasp_mode!r}")
        for f in ("noise_std", "rot_noise_std", "grasp_error_m", "place_error_m"):
            if getattr(self, f) < 0:
                raise ValueError(f"{f} must be >= 0, got {getattr(self, f)}")

    @classmethod
    def from_quality(cls, quality: float) -> "ExpertKnobs":
        q = float(quality)
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quality must lie in [0, 1] (1 = best), got {quality}")
        b = 1.0 - q
        return cls(mistake_prob=b, noise_std=0.001 + 0.004 * b, rot_noise_std=0.005 + 0.015 * b,
                   pause_prob=0.10 * b, speed=0.04 - 0.016 * b, grasp_error_m=0.006 * b, place_error_m=0.005 * b)


def expected_success(quality: float, full_quality_success: float = 1.0) -> float:
    """Predicted success rate at ``quality``: the chance of no fatal mistake times the
    full-quality rate (the other knobs are recovered by the closed loop)."""
    return float(full_quality_success) * (1.0 - ExpertKnobs.from_quality(quality).mistake_prob)


# --------------------------------------------------------------------------------------------
# The expert
# --------------------------------------------------------------------------------------------


class ScriptedExpert(Teleop):
    """PRIVILEGED ORACLE expert for ``hardware.sim_tasks`` (reads true object poses; see module doc).

    ``ScriptedExpert(name="scripted", quality=1.0, noise_std=None, seed=0, **knob_overrides)``
    then per episode ``begin_episode(task, seed, instruction)`` and every tick
    ``read(obs, privileged) -> TeleopCommand``. ``last_info`` tells what it is doing
    (skill, phase, retries, mistake, grasp mode); ``mode`` is the episode's grasp mode.
    """

    max_regrasps = 5
    settle_ticks = 3
    follow_state: bool | str = False
    """DAgger labelling (``vla record --dagger``): a policy drives, so every tick the pick and place phases are
    read off the state instead of the phase machine's memory (see :meth:`_sync_pick`, :meth:`_sync_place`).
    Every skill supports it (:attr:`FOLLOW_STATE_SKILLS`: pick, lift, place, push). ``True``: the open gripper
    descends only within 1.2 cm of the cube's axis, else it flies back up to the hover height and
    re-aligns there (bench/results/vla_sft round 7). ``"correct"``: within the 2 cm its own descent
    tolerates it keeps descending towards the axis, and closes only once within 0.8 cm at grasp
    height (round 20)."""
    FOLLOW_STATE_SKILLS = ("pick", "lift", "place", "push")

    def __init__(self, name: str = "scripted", quality: float = 1.0, noise_std: float | None = None, seed: int = 0,
                 max_step_m: float = 0.05, max_rot: float = 0.2, **knobs) -> None:
        super().__init__(name)
        base = ExpertKnobs.from_quality(quality)
        if noise_std is not None:
            knobs["noise_std"] = noise_std
        unknown = set(knobs) - {f.name for f in dataclasses.fields(ExpertKnobs)}
        if unknown:
            raise ValueError(f"unknown expert knob(s) {sorted(unknown)}; known: "
                             f"{[f.name for f in dataclasses.fields(ExpertKnobs)]}")
        if "mistake_kinds" in knobs:
            knobs["mistake_kinds"] = tuple(knobs["mistake_kinds"])
        self.knobs = dataclasses.replace(base, **knobs)
        if self.knobs.speed > max_step_m:
            raise ValueError(f"speed {self.knobs.speed} exceeds max_step_m {max_step_m}")
        self.quality, self.max_step_m, self.max_rot = float(quality), float(max_step_m), float(max_rot)
        self._base_seed = int(seed)
        self._master = np.random.default_rng(seed)  # episode seeds when begin_episode gets none
        self._rng = self._master
        self.task: Task | None = None
        self.mode: str | None = None
        """The grasp mode of the episode under way (``near``, ``ccw`` or ``cw``; None before the first)."""
        self.last_info: dict = {}

    def _connect(self) -> None:  # nothing to open: it reads the privileged state it is given
        pass

    def _disconnect(self) -> None:
        pass

    def describe(self) -> dict:
        return {**super().describe(), "privileged": True, "oracle": True, "quality": self.quality,
                "knobs": dataclasses.asdict(self.knobs), "mode": self.mode}

    # -- episode ------------------------------------------------------------------------------
    def begin_episode(self, task: str | Task | None = None, seed: int | None = None, instruction: str = "") -> None:
        if task is None:
            raise ValueError("ScriptedExpert needs a task name (one of hardware.sim_tasks.TASKS)")
        self.task = get_task(task)
        self.instruction = instruction or self.task.instruction
        # one stream for the mistake draw, one for everything else: the knobs do not shift the draws
        if seed is None:
            seed = int(self._master.integers(2**31))
        key = [self._base_seed, zlib.crc32(self.task.name.encode()), int(seed)]
        self._mistake_rng = np.random.default_rng(key + [1])
        self._rng = np.random.default_rng(key + [2])
        self.plan: list[tuple] = list(self.task.skills)
        self.k = 0  # index in plan
        self.phase, self.phase_t = "", 0
        self.t = 0
        self.regrasps = 0
        self.held_ticks = 0
        self.pause_left = 0
        self.grip_cmd = 1.0
        self.done_plan_ticks = 0
        self.finished = False
        self.grasp_offset = np.zeros(2)
        self.place_offset = np.zeros(2)
        self.short_goal = None
        self.mis_spot = None
        self.mistake = self._draw_mistake(int(seed))
        self.mode = self._draw_mode(int(seed))
        self._pick_angles: dict[int, float] = {}  # plan index -> finger angle chosen by a turning mode
        if self.mistake and self.mistake[0] == "wrong_object":
            good, bad = self.mistake[1], self.mistake[2]
            self.plan = [tuple(bad if x == good else x for x in step) for step in self.plan]
        self._enter(self._first_phase())

    def _draw_mistake(self, seed: int) -> tuple | None:
        rng = self._mistake_rng
        # Whether this episode has a mistake: a low-discrepancy (golden-ratio) sequence over the
        # episode seed with a phase per (expert seed, task), so that any run of N consecutive
        # seeds has mistake_prob * N mistakes to within about one: the rate is set, not sampled.
        phase = np.random.default_rng([self._base_seed, zlib.crc32(self.task.name.encode())]).random()
        if (phase + seed * _GOLDEN) % 1.0 >= self.knobs.mistake_prob:
            return None
        used = {x for step in self.task.skills for x in _flatten(step) if x in CUBES}
        spare = [c for c in CUBES if c not in used]
        kinds = []
        handled = [s for s in self.task.skills if s[0] in ("pick", "push")]
        if spare and handled:
            kinds.append("wrong_object")
        if any(s[0] == "place" for s in self.task.skills):
            kinds.append("misplace")
        if any(s[0] == "push" for s in self.task.skills):
            kinds.append("stop_short")
        if any(s[0] == "pick" for s in self.task.skills):
            kinds.append("close_early")
        wanted = self.knobs.mistake_kinds or DEFAULT_MISTAKE_KINDS
        kinds = [k for k in kinds if k in wanted]
        if not kinds:
            if self.knobs.mistake_kinds:
                raise ValueError(f"task {self.task.name!r} allows none of the mistake kinds "
                                 f"{list(self.knobs.mistake_kinds)}")
            return None
        kind = kinds[int(rng.integers(len(kinds)))]
        if kind == "close_early":  # the first pick of the plan
            return ("close_early", next(i for i, s in enumerate(self.task.skills) if s[0] == "pick"))
        if kind == "wrong_object":
            return ("wrong_object", handled[0][1], spare[int(rng.integers(len(spare)))])
        if kind == "misplace":  # which of the place steps goes wrong
            places = [i for i, s in enumerate(self.task.skills) if s[0] == "place"]
            return ("misplace", places[int(rng.integers(len(places)))])
        return ("stop_short",)

    def _draw_mode(self, seed: int) -> str:
        if self.knobs.grasp_mode != "random":
            return self.knobs.grasp_mode
        # ccw or cw on a low-discrepancy sequence over the episode seed (as the mistake draw, but on the
        # sqrt(2) sequence, so the two draws do not line up): N consecutive seeds hold N/2 of each, +-2.
        phase = np.random.default_rng([self._base_seed, zlib.crc32(self.task.name.encode()),
                                       zlib.crc32(b"grasp_mode")]).random()
        return "ccw" if (phase + seed * _SILVER) % 1.0 < 0.5 else "cw"

    # -- one tick -----------------------------------------------------------------------------
    def read(self, obs: dict | None = None, privileged: dict | None = None) -> TeleopCommand:
        if self.task is None:
            raise RuntimeError("call begin_episode(task, seed, instruction) before read()")
        if privileged is None:
            raise ValueError("ScriptedExpert is a privileged oracle: read() needs `privileged` "
                             "(objects, object_names, ee_pos, ee_quat, gripper)")
        names = privileged.get("object_names") or privileged.get("names")
        objs = objects_from_state(privileged["objects"], names)
        ee = np.asarray(privileged["ee_pos"], float).reshape(3)
        eq = np.asarray(privileged["ee_quat"], float).reshape(4)
        grip = float(np.asarray(privileged["gripper"]).reshape(-1)[0])
        events: set[str] = set()

        if self.task.success(objs, ee, grip):
            self.held_ticks += 1
        else:
            self.held_ticks = 0
        if self.finished:
            target, angle, g = ee, finger_angle(eq), self.grip_cmd
        else:
            target, angle, g = self._control(objs, ee, eq, grip)
        if self.held_ticks >= self.settle_ticks and not self.finished:
            events.add("success")
            self.finished = True
        elif not self.finished and (self.t >= self.task.max_steps - 1 or self.regrasps > self.max_regrasps
                                    or self.done_plan_ticks > self.settle_ticks + 2):
            events.add("failure")
            self.finished = True
        self.t += 1
        action = self._action(target, angle, g, ee, eq)
        self.last_info = {"skill": self.plan[min(self.k, len(self.plan) - 1)], "phase": self.phase, "t": self.t,
                          "regrasps": self.regrasps, "mistake": self.mistake, "mode": self.mode}
        return TeleopCommand(action=action, events=frozenset(events), intervening=True)

    def _action(self, target, angle, g, ee, eq) -> np.ndarray:
        kn = self.knobs
        if not self.finished and self.pause_left == 0 and self._rng.random() < kn.pause_prob:
            self.pause_left = int(self._rng.integers(1, 5))
        dpos = np.asarray(target, float) - ee
        n = float(np.linalg.norm(dpos))
        if n > kn.speed:
            dpos *= kn.speed / n
        drot = _rotvec(_qmul(down_quat(angle), eq * np.array([1.0, -1.0, -1.0, -1.0])))
        r = float(np.linalg.norm(drot))
        if r > self.max_rot:
            drot *= self.max_rot / r
        if self.pause_left > 0:  # hesitation: hold still, keep the gripper as it was
            self.pause_left -= 1
            dpos, drot, g = np.zeros(3), np.zeros(3), self.grip_cmd
        dpos = dpos + self._rng.normal(0.0, kn.noise_std, 3)
        drot = drot + self._rng.normal(0.0, kn.rot_noise_std, 3)
        self.grip_cmd = g
        dpos = np.clip(dpos, -self.max_step_m, self.max_step_m)
        return np.concatenate([dpos, drot, [g]]).astype(np.float32)

    # -- skills -------------------------------------------------------------------------------
    def _enter(self, phase: str) -> None:
        self.phase, self.phase_t = phase, 0
        self._grip_prev = 1.0  # the gripper reading one tick ago (the close phase waits for it to settle)

    def _first_phase(self) -> str:
        if self.k >= len(self.plan):
            return "done"
        kind = self.plan[self.k][0]
        if kind == "pick":
            self.grasp_offset = self._rng.normal(0.0, self.knobs.grasp_error_m, 2)
        if kind == "place":
            self.place_offset = self._rng.normal(0.0, self.knobs.place_error_m, 2)
            self.mis_spot = None
        return {"pick": "approach", "place": "carry", "push": "pre", "lift": "lift"}[kind]

    def _next_skill(self, objs) -> None:
        self.k += 1
        # skip a pick + place pair whose goal already holds (e.g. a cube that is in the bowl)
        while (self.k + 1 < len(self.plan) and self.plan[self.k][0] == "pick" and self.plan[self.k + 1][0] == "place"
               and self._place_done(self.plan[self.k + 1], objs)):
            self.k += 2
        self._enter(self._first_phase())

    def _back_to_pick(self) -> None:
        while self.k > 0 and self.plan[self.k][0] != "pick":
            self.k -= 1
        self.regrasps += 1
        self._enter(self._first_phase())

    def _control(self, objs, ee, eq, grip):
        self.phase_t += 1
        if self.follow_state:
            self._sync_plan(objs, ee, grip)
        if self.k >= len(self.plan):
            self.done_plan_ticks += 1
            if self.mistake is None and self.done_plan_ticks > self.settle_ticks + 1:
                # the plan ran but the goal does not hold (a cube rolled off): do the undone parts again
                self.k, self.done_plan_ticks = -1, 0
                self.regrasps += 1
                self._next_skill(objs)
                return self._control(objs, ee, eq, grip)
            return ee + np.array([0, 0, 0.02 if ee[2] < 0.12 else 0.0]), finger_angle(eq), self.grip_cmd
        step = self.plan[self.k]
        return getattr(self, f"_{step[0]}")(step, objs, ee, eq, grip)

    def _sync_plan(self, objs, ee, grip) -> None:
        """``follow_state``: a pick whose place already holds is behind the policy. Still held there: label the
        place (its release); let go: skip the pair, as :meth:`_next_skill` skips one whose goal holds."""
        while (self.k + 1 < len(self.plan) and self.plan[self.k][0] == "pick" and self.plan[self.k + 1][0] == "place"
               and self.plan[self.k + 1][1] == self.plan[self.k][1] and self._place_done(self.plan[self.k + 1], objs)):
            held = grasped(objs[self.plan[self.k][1]], ee, grip)
            self.k += 1 if held else 2
            self._enter(self._first_phase())
            if held:
                break

    def _sync_pick(self, c, xy, hover, grasp_z, ee, grip) -> None:
        """``follow_state``: someone else drives the robot (DAgger), so the phase machine's memory says
        nothing about where the robot is. Read the pick phase off the state instead, so that the
        label is what this expert does from that state in its own demonstrations."""
        if grasped(c, ee, grip):
            want = "lift"
        elif grip < 0.9:  # closing or closed: keep closing on the cube, else open and start over
            near = dist_xy(ee, xy) < 0.015 and ee[2] - grasp_z < 0.015
            want = "close" if near and self.phase == "close" else "approach"
        elif self.follow_state == "correct" and dist_xy(ee, xy) < 0.02 and ee[2] < hover + 0.03:
            # inside the drift its own descent tolerates: keep coming down onto the cube's axis (the descend
            # target is the cube, so the step corrects sideways), close only once centred at grasp height
            want = "close" if ee[2] - grasp_z < 0.006 and dist_xy(ee, xy) < 0.008 else "descend"
        elif dist_xy(ee, xy) < 0.012 and ee[2] < hover + 0.03:
            want = "close" if ee[2] - grasp_z < 0.006 else "descend"
        else:
            want = "approach"
        if want != self.phase:
            self._enter(want)

    def _grasp_angle(self, c, cur: float) -> float:
        """The finger angle to grasp cube pose ``c`` with, by the episode's grasp mode."""
        if self.mode == "near":  # the nearest face pair, every tick
            return nearest_angle(cube_yaw(c), cur, math.pi / 2)
        chosen = self._pick_angles.get(self.k)
        if chosen is None:  # the first tick of this pick's first approach: turn to the next pair that way
            chosen = self._pick_angles[self.k] = turned_angle(cube_yaw(c), cur, self.mode)
        # the same face pair from then on, retries too (it follows the cube if the cube turns)
        return nearest_angle(cube_yaw(c), chosen, math.pi / 2)

    def _pick(self, step, objs, ee, eq, grip):
        c = objs[step[1]]
        cur = finger_angle(eq)
        angle = self._grasp_angle(c, cur)
        xy = c[:2] + self.grasp_offset
        hover = max(float(c[2]) + HOVER_DZ, 0.12)
        grasp_z = float(c[2]) - 0.004
        early = bool(self.mistake) and self.mistake[0] == "close_early" and self.mistake[1] == self.k
        if early:  # the mistake: close the fingers in the air above the cube
            grasp_z += CLOSE_EARLY_DZ
        if self.follow_state:
            self._sync_pick(c, xy, hover, grasp_z, ee, grip)
        if self.phase == "approach":
            if ee[2] < hover - 0.03 and dist_xy(ee, xy) > 0.03:  # rise before flying over things
                return np.array([ee[0], ee[1], hover]), cur, 1.0
            if dist_xy(ee, xy) < 0.008 and abs(ee[2] - hover) < 0.03 and abs(_wrap(angle - cur, math.pi / 2)) < 0.08:
                self._enter("descend")
            return np.array([xy[0], xy[1], hover]), angle, 1.0
        if self.phase == "descend":
            centred = self.follow_state != "correct" or dist_xy(ee, xy) < 0.008
            if (ee[2] - grasp_z < 0.006 and centred) or self.phase_t > 20:
                self._enter("close")
            if dist_xy(ee, xy) > 0.02:  # drifted: back up
                self._enter("approach")
            return np.array([xy[0], xy[1], grasp_z]), angle, 1.0
        if self.phase == "close":
            settled = abs(grip - self._grip_prev) < 0.01
            self._grip_prev = grip
            if self.phase_t >= 4 and settled:
                self._enter("lift")
            return np.array([ee[0], ee[1], grasp_z]), cur, 0.0
        # lift: up to the carry height; a missed grasp is retried
        if ee[2] > float(c[2]) + 0.04 or self.phase_t > 6:
            if not grasped(c, ee, grip):
                if early:  # it does not notice: the plan ends, empty-handed
                    self.k = len(self.plan)
                    return np.array([ee[0], ee[1], CARRY_Z]), cur, 0.0
                self._back_to_pick()
                return ee.copy(), cur, 1.0
        if grasped(c, ee, grip) and (ee[2] > CARRY_Z - 0.03 or self._carried_near_goal(c, objs, eq)):
            self._next_skill(objs)
            if self.follow_state and self.k < len(self.plan):  # label the next skill from this very state
                self.phase_t = 1
                return getattr(self, f"_{self.plan[self.k][0]}")(self.plan[self.k], objs, ee, eq, grip)
        return np.array([ee[0], ee[1], CARRY_Z]), cur, 0.0

    def _carried_near_goal(self, c, objs, eq) -> bool:
        """``follow_state``: the policy brought the held cube within 3 cm of the next place step's goal below the
        carry height, where this expert's own carry would hold its height and lower (:meth:`_place`): label the
        place from there instead of a lift back up to the carry height."""
        nxt = self.plan[self.k + 1] if self.k + 1 < len(self.plan) else None
        if not self.follow_state or nxt is None or nxt[0] != "place" or nxt[1] != self.plan[self.k][1]:
            return False
        goal, _, _ = self._place_goal(nxt, objs, eq)
        return dist_xy(c, goal) < 0.03

    def _lift(self, step, objs, ee, eq, grip):
        c, z = objs[step[1]], float(step[2])
        if not grasped(c, ee, grip):
            self._back_to_pick()
            return ee.copy(), finger_angle(eq), 1.0
        if abs(ee[2] - z) < 0.01:
            self._next_skill(objs)
        return np.array([ee[0], ee[1], z]), finger_angle(eq), 0.0

    def _place_goal(self, step, objs, eq) -> tuple[np.ndarray, float, float]:
        """(goal xy, finger angle, release height of the cube centre) for a place step."""
        where = step[2]
        cur = finger_angle(eq)
        if where == "bowl":
            b = objs["bowl"]
            return b[:2].copy(), cur, float(b[2]) + BOWL_FLOOR + CUBE_HALF + 0.015
        if where[0] == "bowl":
            b = objs["bowl"]
            dx, dy = BOWL_SLOTS[where[1]]
            lift = 2 * CUBE_HALF if where[1] == "top" else 0.0
            return b[:2] + [dx, dy], nearest_angle(0.0, cur, math.pi / 2), float(b[2]) + BOWL_FLOOR + CUBE_HALF + lift + 0.015
        if where[0] == "on":
            bot = objs[where[1]]
            return bot[:2].copy(), nearest_angle(cube_yaw(bot), cur, math.pi / 2), float(bot[2]) + 2 * CUBE_HALF + 0.008
        raise ValueError(f"unknown place goal {where!r}")

    def _place_done(self, step, objs) -> bool:
        c, where = objs[step[1]], step[2]
        if where == "bowl" or where[0] == "bowl":
            return in_bowl(c, objs["bowl"])
        return stacked(c, objs[where[1]])

    def _misplace_spot(self, objs, goal) -> np.ndarray:
        """A free spot on the table well away from the goal (the 'misplace' mistake)."""
        for _ in range(200):
            p = np.array([self._rng.uniform(*OBJECT_REGION[0]), self._rng.uniform(*OBJECT_REGION[1])])
            if np.linalg.norm(p - goal[:2]) > 0.14 and all(dist_xy(p, o) > 0.11 if n == "bowl" else dist_xy(p, o) > 0.07
                                                             for n, o in objs.items() if n != "target"):
                return p
        return goal[:2] + np.array([0.0, 0.15 if goal[1] < 0 else -0.15])

    def _place(self, step, objs, ee, eq, grip):
        c = objs[step[1]]
        goal, angle, release_z = self._place_goal(step, objs, eq)
        if self.mistake and self.mistake[0] == "misplace" and self.mistake[1] == self.k:
            if self.mis_spot is None:
                self.mis_spot = self._misplace_spot(objs, goal)
            goal, release_z = self.mis_spot, CUBE_HALF + 0.01
        goal = goal + self.place_offset
        hold = float(ee[2] - c[2])  # tcp above the cube centre while held
        cur = finger_angle(eq)
        if self.follow_state:
            self._sync_place(step, c, goal, angle, release_z, ee, eq, grip, objs)
        if self.phase in ("carry", "lower") and not grasped(c, ee, grip):
            self._back_to_pick()  # dropped it on the way
            return ee.copy(), cur, 1.0
        # servo the held cube (not the tcp) over the goal: a grasp off the cube's centre does not matter
        aim = ee[:2] + (goal - c[:2])
        if self.phase == "carry":
            if dist_xy(c, goal) < 0.005 and abs(_wrap(angle - cur, math.pi / 2)) < 0.05:
                self._enter("lower")
            z = CARRY_Z if dist_xy(c, goal) > 0.03 else max(release_z + hold, 0.0)
            return np.array([aim[0], aim[1], max(z, min(ee[2], CARRY_Z))]), angle, 0.0
        if self.phase == "lower":
            if c[2] - release_z < 0.004 or self.phase_t > 20:
                self._enter("release")
            if dist_xy(c, goal) > 0.02:
                self._enter("carry")
            return np.array([aim[0], aim[1], release_z + hold]), angle, 0.0
        if self.phase == "release":
            if self.phase_t >= 3 and grip > 0.9:
                self._enter("retreat")
            return ee.copy(), cur, 1.0
        # retreat straight up, then the next skill
        up = max(float(c[2]) + 0.09, 0.12)
        if ee[2] > up - 0.01:
            self._next_skill(objs)
        return np.array([ee[0], ee[1], up]), cur, 1.0

    def _sync_place(self, step, c, goal, angle, release_z, ee, eq, grip, objs) -> None:
        """``follow_state`` for a place step (as :meth:`_sync_pick` for a pick): the phase read off the state.
        Held: ``release`` once centred over the goal (2 cm once lowering, as :meth:`_place` tolerates; 5 mm and
        turned to the goal before) at the release height (or within 2 cm of it once releasing), ``lower`` when
        centred above it, else ``carry``. Not held:
        ``retreat`` when the goal holds (let go in place); else ``carry``, which sends the plan back to the pick
        (dropped on the way, or let go off the goal)."""
        if grasped(c, ee, grip):
            lowering = self.phase in ("lower", "release")
            centred = dist_xy(c, goal) < (0.02 if lowering else 0.005)
            turned = lowering or abs(_wrap(angle - finger_angle(eq), math.pi / 2)) < 0.05
            if self.phase == "release" and centred and c[2] - release_z < 0.02:
                want = "release"  # letting go (also after the lowering's time-out): keep opening
            elif centred and turned:
                want = "release" if c[2] - release_z < 0.004 else "lower"
            else:
                want = "carry"
        elif self._place_done(step, objs):
            want = "retreat" if self.phase != "release" or grip > 0.9 else "release"
        else:
            want = "carry"
        if want != self.phase:
            self._enter(want)

    def _push(self, step, objs, ee, eq, grip):
        c, tgt = objs[step[1]], objs[step[2]]
        goal = tgt[:2].copy()
        if self.mistake and self.mistake[0] == "stop_short":  # aim 7 cm before the marker
            if self.short_goal is None:
                d0 = goal - c[:2]
                self.short_goal = goal - d0 / max(float(np.linalg.norm(d0)), 1e-9) * min(0.07, float(np.linalg.norm(d0)))
            goal = self.short_goal
        to_goal = goal - c[:2]
        dist = float(np.linalg.norm(to_goal))
        d = to_goal / max(dist, 1e-9)
        angle = nearest_angle(math.atan2(d[1], d[0]) + math.pi / 2, finger_angle(eq), math.pi)
        angle = _wrap(angle, math.pi)
        contact = PUSH_CONTACT
        push_z = 0.02
        behind = c[:2] - d * (contact + PUSH_START_BACK)
        rel = ee[:2] - c[:2]
        along, across = float(rel @ d), float(rel @ np.array([-d[1], d[0]]))
        if self.follow_state:
            self._sync_push(dist, along, across, contact, push_z, behind, angle, ee, eq)
        if self.phase == "pre":  # over the start point, fingers closed, turned across the push line
            if ee[2] < 0.06 and np.linalg.norm(ee[:2] - behind) > 0.02:
                return np.array([ee[0], ee[1], 0.10]), finger_angle(eq), 0.0
            if np.linalg.norm(ee[:2] - behind) < 0.008 and abs(_wrap(angle - finger_angle(eq), math.pi)) < 0.08:
                self._enter("down")
            return np.array([behind[0], behind[1], max(0.10, ee[2] if ee[2] < 0.2 else 0.10)]), angle, 0.0
        if self.phase == "down":
            if ee[2] < push_z + 0.006 or self.phase_t > 15:
                self._enter("push")
            return np.array([behind[0], behind[1], push_z]), angle, 0.0
        if self.phase == "push":
            if dist < 0.006:
                self._enter("retreat")
            elif abs(across) > 0.012 or along > -contact + 0.015:  # slid off the line: come again
                self._enter("pre")
                return np.array([ee[0] - 0.02 * d[0], ee[1] - 0.02 * d[1], 0.10]), angle, 0.0
            step_len = min(0.015, dist + 0.002)
            p = c[:2] - d * contact + d * step_len
            return np.array([p[0], p[1], push_z]), angle, 0.0
        # retreat: back off and up
        if ee[2] > 0.09:
            self._next_skill(objs)
        return np.array([ee[0] - 0.01 * d[0], ee[1] - 0.01 * d[1], 0.10]), finger_angle(eq), 0.0

    def _sync_push(self, dist, along, across, contact, push_z, behind, angle, ee, eq) -> None:
        """``follow_state`` for a push (as :meth:`_sync_pick` for a pick): the phase read off the state. On the
        marker (within the 6 mm :meth:`_push` stops at): ``retreat``. Down at pushing height on the push line
        behind the cube (within the 1.2 cm across and the along window :meth:`_push` keeps pushing in):
        ``push``. Over the start point and turned across the line, or already coming down there: ``down``.
        Else ``pre``, which lifts a low hand before it flies over to the start point."""
        low = ee[2] < push_z + 0.02
        if dist < 0.006:
            want = "retreat"
        elif low and abs(across) <= 0.012 and -(contact + 0.045) < along <= -contact + 0.015:
            want = "push"
        elif (np.linalg.norm(ee[:2] - behind) < (0.02 if self.phase == "down" else 0.008)
              and abs(_wrap(angle - finger_angle(eq), math.pi)) < (0.2 if self.phase == "down" else 0.08)):
            want = "down"
        else:
            want = "pre"
        if want != self.phase:
            self._enter(want)


def _flatten(step) -> list:
    out = []
    for x in step:
        out.extend(_flatten(x) if isinstance(x, tuple) else [x])
    return out
