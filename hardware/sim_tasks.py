"""Language-conditioned tabletop tasks for the simulated Panda (``hardware.sim_franka``).

A :class:`Task` is the scene side of a task: an instruction (and paraphrases), a seeded
``layout(rng)`` that places every object of the scene, a ``success`` predicate and ``subgoals``
read from simulator state, and ``max_steps`` (control ticks at 10 Hz). ``skills`` names the
sub-skills the task is made of (``pick`` / ``place`` / ``push``); the scripted expert
(``hardware.teleop.scripted``) executes them, nothing else reads them.

Registry: ``TASKS`` (name -> Task); ``get_task(name)`` raises ``KeyError`` with a "did you
mean" on typos. ``SimFranka.reset(seed, task=name)`` places the scene by the task's layout.
Scene variants (``Task.variant_of``) are a task under another name with other scenes: same
instruction and wordings. ``pick_red_cube_yaw45`` turns the red cube 45 degrees from the
home finger axis and ``pick_red_cube_crowded`` also stands the blue cube 1 cm from it, which must be
left standing (:class:`TurnedPickTask`): scenes for behaviour modes (``ScriptedExpert(grasp_mode=...)``);
``pick_red_cube_near`` stands it 3 cm off, where both turns fit.
:func:`base_tasks` leaves the variants out.

State. Predicates take ``objects: {name: pose7}`` (position + quaternion wxyz, world frame =
robot base frame, the table top is z = 0), ``ee_pos`` [3] (the tcp, between the fingertips)
and ``gripper`` (opening 0 closed .. 1 open, 8 cm). :func:`objects_from_state` builds the dict
from an ``ArmState``, a state message's arrays or a bare ``[N, 7]`` array plus the object names
(``describe()["objects"]``).

Sub-goals are milestones of the task (``reached_red``, ``grasped_red``, ``lifted_red``,
``red_in_bowl`` ...), each a predicate on one state. A rollout "achieved" a sub-goal if it held
at any tick: OR them over time with :class:`SubgoalTracker` (hindsight relabelling uses that).
:func:`achieved_tasks` evaluates every registered task's success on one state (an episode
that stacked the wrong cube can be relabelled with the instruction it did carry out), and
:func:`achieved_skills` the pick sub-skills ("pick up the red cube": a cube held above 6 cm) and the
cubes only grasped ("grasp the red cube").

Nothing here imports mujoco or torch: rewards and relabelling use it on recorded states.
The scene constants mirror ``hardware.sim_franka`` (a test checks they agree).
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
import math
from typing import Any, Callable, Mapping

import numpy as np

OBJECT_NAMES = ("red_cube", "green_cube", "blue_cube", "bowl", "target")
CUBES = ("red_cube", "green_cube", "blue_cube")
CUBE_HALF = 0.0225  # 4.5 cm cubes
BOWL_RADIUS = 0.07  # outer radius of the bowl walls
BOWL_INNER = 0.062  # inside of the walls
BOWL_FLOOR = 0.0085  # top of the bowl's base disc above the bowl body origin
BOWL_WALL_TOP = 0.036  # top of the walls above the bowl body origin
TARGET_RADIUS = 0.04
OBJECT_REGION = ((0.35, 0.65), (-0.22, 0.22))
FINGER_SPAN = 0.08  # gripper opening 1.0 = 8 cm between the fingers
HOME_FINGER_ANGLE = 0.0
"""Finger (opening) axis of the home pose in the table plane, rad from world x (``hardware.sim_franka.HOME_Q``:
the hand's y axis lies along world x; ``hardware.teleop.scripted.finger_angle`` of the reset tcp pose)."""
NEIGHBOUR_GAP = 0.01
"""``pick_red_cube_crowded``: gap between the red cube and its neighbour, face to face, m."""

# Footprint radii for non-overlap (cube: half diagonal) and the clearance kept between
# footprints so that open fingers fit between objects.
FOOTPRINT = {"red_cube": CUBE_HALF * math.sqrt(2), "green_cube": CUBE_HALF * math.sqrt(2),
             "blue_cube": CUBE_HALF * math.sqrt(2), "bowl": BOWL_RADIUS, "target": TARGET_RADIUS}
CLEARANCE = 0.035

Pose7 = np.ndarray
Placements = dict[str, tuple[float, float, float]]  # name -> (x, y, yaw)


# --------------------------------------------------------------------------------------------
# State helpers (pure numpy)
# --------------------------------------------------------------------------------------------


def objects_from_state(state: Any, names: list[str] | tuple[str, ...] = OBJECT_NAMES) -> dict[str, Pose7]:
    """``{name: pose7}`` from an ArmState (``extras["objects"]``), a state message's arrays
    (a mapping with ``"objects"``) or a bare ``[N, 7]`` array; ``names`` in the array's row order."""
    if hasattr(state, "extras"):
        arr = state.extras["objects"]
    elif isinstance(state, Mapping):
        arr = state["objects"]
    else:
        arr = state
    arr = np.asarray(arr, np.float64)
    if arr.ndim != 2 or arr.shape[1] != 7 or arr.shape[0] != len(names):
        raise ValueError(f"objects must be [{len(names)}, 7] (one pose per name in {list(names)}), "
                         f"got shape {list(arr.shape)}")
    return {n: arr[i] for i, n in enumerate(names)}


def quat_to_mat(q) -> np.ndarray:
    w, x, y, z = (float(v) for v in q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def cube_yaw(pose: Pose7) -> float:
    """Yaw of a cube's side faces in [-pi/4, pi/4) (a cube looks the same every quarter turn),
    whichever face is up."""
    R = quat_to_mat(pose[3:7])
    up = int(np.argmax(np.abs(R[2])))  # the body axis closest to world z
    side = R[:, (up + 1) % 3]
    yaw = math.atan2(side[1], side[0])
    return (yaw + math.pi / 4) % (math.pi / 2) - math.pi / 4


def dist_xy(a, b) -> float:
    return float(math.hypot(a[0] - b[0], a[1] - b[1]))


def grasped(obj: Pose7, ee_pos, gripper: float) -> bool:
    """The cube sits between the fingertips and the fingers are closed on it (not empty, not open)."""
    return bool(np.linalg.norm(np.asarray(obj[:3]) - np.asarray(ee_pos)) < 0.03 and 0.3 < gripper < 0.8)


def reached(obj: Pose7, ee_pos) -> bool:
    """The tcp is at the cube, ready to close (within 2.5 cm sideways, 4 cm in height)."""
    return bool(dist_xy(obj, ee_pos) < 0.025 and abs(float(ee_pos[2]) - float(obj[2])) < 0.04)


UPRIGHT_DEG = 20.0
"""A cube stands (``upright``) while its body z axis is within this angle of vertical."""


def upright(obj: Pose7) -> bool:
    """The cube stands on the face it was placed on: its body z axis within ``UPRIGHT_DEG`` of world z."""
    return bool(quat_to_mat(obj[3:7])[2, 2] > math.cos(math.radians(UPRIGHT_DEG)))


def on_table(obj: Pose7) -> bool:
    return bool(obj[2] < CUBE_HALF + 0.012)


def in_bowl(obj: Pose7, bowl: Pose7) -> bool:
    """Centre inside the bowl's walls, above its floor, at most two cube layers up (a pile of
    two counts; a cube carried over the bowl at 10 cm does not)."""
    return bool(dist_xy(obj, bowl) < BOWL_INNER - 0.01 and bowl[2] + BOWL_FLOOR < obj[2] < bowl[2] + 0.095)


def on_marker(obj: Pose7, target: Pose7) -> bool:
    """The cube's centre is over the marker (within 3 cm of its centre) and it is on the table."""
    return bool(dist_xy(obj, target) < 0.03 and on_table(obj))


def stacked(top: Pose7, bottom: Pose7) -> bool:
    """``top`` rests on ``bottom``: centred within 2 cm, one cube height above (+-1.2 cm)."""
    return bool(dist_xy(top, bottom) < 0.02 and abs(float(top[2] - bottom[2]) - 2 * CUBE_HALF) < 0.012)


def _short(name: str) -> str:
    return name.replace("_cube", "")


# --------------------------------------------------------------------------------------------
# Layout sampling
# --------------------------------------------------------------------------------------------


def _seg_point_dist(p, a, b) -> float:
    p, a, b = (np.asarray(v, float)[:2] for v in (p, a, b))
    ab = b - a
    t = float(np.clip((p - a) @ ab / max(ab @ ab, 1e-12), 0.0, 1.0))
    return float(np.linalg.norm(p - (a + t * ab)))


def sample_layout(rng: np.random.Generator, constraints: Callable[[Placements], bool] | None = None,
                  fixed: Placements | None = None, region=OBJECT_REGION, tries: int = 2000) -> Placements:
    """Every object of the scene at a random, non-overlapping spot (footprints kept ``CLEARANCE``
    apart, random yaw), in ``OBJECT_NAMES`` order; ``fixed`` placements are kept as given.
    ``constraints(placements)`` (checked once all are placed) may reject a whole layout."""
    fixed = dict(fixed or {})
    for _ in range(tries):
        placed: Placements = dict(fixed)
        ok = True
        for name in OBJECT_NAMES:
            if name in placed:
                continue
            r = FOOTPRINT[name]
            for _ in range(200):
                x, y = rng.uniform(*region[0]), rng.uniform(*region[1])
                if all(math.hypot(x - px, y - py) > r + FOOTPRINT[n] + CLEARANCE for n, (px, py, _) in placed.items()):
                    break
            else:
                ok = False
                break
            placed[name] = (float(x), float(y), float(rng.uniform(-math.pi, math.pi)))
        if ok and (constraints is None or constraints(placed)):
            return {n: placed[n] for n in OBJECT_NAMES}
    raise RuntimeError(f"could not sample a layout satisfying the constraints in {tries} tries")


# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task(abc.ABC):
    """One language-conditioned task. Subclasses define ``skills``, ``success`` and ``subgoals``."""

    name: str
    instruction: str
    paraphrases: tuple[str, ...] = ()
    max_steps: int = 120
    """Episode length limit in control ticks (10 Hz)."""
    held_out: tuple[str, ...] = ()
    """Paraphrases kept out of training (``vla train --paraphrases sim`` leaves them out), so that
    following an unseen wording can be measured (``bench/vla_confusion.py --wording held-out``)."""
    variant_of: str | None = None
    """The task this one is a scene variant of (same instruction and wordings, other scenes), or None.
    Relabelling (:func:`achieved_tasks`, the sim judge) knows only the base task: a variant would repeat it."""

    def __post_init__(self) -> None:
        if not set(self.held_out) <= set(self.paraphrases):
            raise ValueError(f"task {self.name}: held_out {sorted(set(self.held_out) - set(self.paraphrases))} "
                             "are not among its paraphrases")

    @property
    def instructions(self) -> tuple[str, ...]:
        return (self.instruction, *self.paraphrases)

    @property
    def train_wordings(self) -> tuple[str, ...]:
        """The instruction and the paraphrases that are not held out."""
        return tuple(w for w in self.instructions if w not in self.held_out)

    @property
    @abc.abstractmethod
    def skills(self) -> tuple[tuple, ...]:
        """The sub-skills that make up the task, for the scripted expert: ``("pick", cube)``,
        ``("place", cube, where)`` with where ``"bowl"``, ``("bowl", slot)`` or ``("on", cube)``,
        ``("push", cube, "target")``, ``("lift", cube, height)``."""

    def layout(self, rng: np.random.Generator) -> Placements:
        """Seeded initial placements ``{name: (x, y, yaw)}`` for every object of the scene."""
        return sample_layout(rng)

    @abc.abstractmethod
    def success(self, objects: Mapping[str, Pose7], ee_pos, gripper: float) -> bool:
        """True when the task is done in this simulator state."""

    @abc.abstractmethod
    def subgoals(self, objects: Mapping[str, Pose7], ee_pos, gripper: float) -> dict[str, bool]:
        """Which of the task's sub-goals hold in this state."""

    def sample_instruction(self, rng: np.random.Generator) -> str:
        return self.instructions[int(rng.integers(len(self.instructions)))]

    @property
    def segmented(self) -> bool:
        """Whether the task is made of sub-skills that can each be prompted on their own (it has a
        place step). A pick-and-lift or a push is one skill: its instruction is the skill's."""
        return any(s[0] == "place" for s in self.skills)

    def skill_instruction(self, skill: tuple) -> str:
        """The instruction that prompts one of the task's sub-skills from the state where it starts:
        ``("pick", "red_cube")`` -> "pick up the red cube" (up to the carry height), a place into
        the bowl -> "put it in the bowl", a place on a cube -> "put it on the red cube". A task that
        is not :attr:`segmented` answers its own instruction for every skill."""
        if not self.segmented:
            return self.instruction
        return skill_instruction(skill)


def _into_bowl(where) -> bool:
    """A place step's goal is the bowl (``"bowl"`` or a ``("bowl", slot)``), not ``("on", cube)``."""
    return where == "bowl" or where[0] == "bowl"


def skill_done(skill: tuple, objects: Mapping[str, Pose7], ee_pos, gripper: float) -> bool:
    """Whether one pick or place sub-skill is done in this state: a pick holds its cube lifted
    (grasped, centre above 6 cm: the ``lifted_*`` sub-goal); a place has let go of its cube in the
    bowl or on the named cube, gripper open."""
    c = objects[skill[1]]
    if skill[0] == "pick":
        return bool(grasped(c, ee_pos, gripper) and c[2] > 0.06)
    if skill[0] == "place":
        where = skill[2]
        if _into_bowl(where):
            there = in_bowl(c, objects["bowl"])
        elif where[0] == "on":
            there = stacked(c, objects[where[1]]) and on_table(objects[where[1]])
        else:
            raise ValueError(f"unknown place goal {where!r}")
        return bool(there and not grasped(c, ee_pos, gripper) and gripper > 0.7)
    raise ValueError(f"no done predicate for the sub-skill {skill!r} (pick and place sub-skills have one)")


def skill_instruction(skill: tuple) -> str:
    """The instruction of one pick or place sub-skill (see :meth:`Task.skill_instruction`)."""
    if skill[0] == "pick":
        return f"pick up the {_short(skill[1])} cube"
    if skill[0] == "place":
        where = skill[2]
        if _into_bowl(where):
            return "put it in the bowl"
        if where[0] == "on":
            return f"put it on the {_short(where[1])} cube"
    raise ValueError(f"no instruction for the sub-skill {skill!r} (pick and place sub-skills have one)")


def _pick_subgoals(c: str, objects, ee_pos, gripper) -> dict[str, bool]:
    o = objects[c]
    g = grasped(o, ee_pos, gripper)
    s = _short(c)
    return {f"reached_{s}": reached(o, ee_pos), f"grasped_{s}": g, f"lifted_{s}": g and o[2] > 0.06}


@dataclasses.dataclass(frozen=True)
class PickTask(Task):
    """Pick ``cube`` up and hold it with its centre above ``height`` (m over the table)."""

    cube: str = "red_cube"
    height: float = 0.10

    @property
    def skills(self):
        return (("pick", self.cube), ("lift", self.cube, self.height + 0.05))

    def success(self, objects, ee_pos, gripper) -> bool:
        o = objects[self.cube]
        return bool(grasped(o, ee_pos, gripper) and o[2] > self.height)

    def subgoals(self, objects, ee_pos, gripper) -> dict[str, bool]:
        sg = _pick_subgoals(self.cube, objects, ee_pos, gripper)
        sg[f"{_short(self.cube)}_above_{int(round(self.height * 100))}cm"] = self.success(objects, ee_pos, gripper)
        return sg


@dataclasses.dataclass(frozen=True)
class PlaceInBowlTask(Task):
    """Put ``cube`` into the bowl and let go of it."""

    cube: str = "red_cube"

    @property
    def skills(self):
        return (("pick", self.cube), ("place", self.cube, "bowl"))

    def success(self, objects, ee_pos, gripper) -> bool:
        o = objects[self.cube]
        return in_bowl(o, objects["bowl"]) and not grasped(o, ee_pos, gripper) and gripper > 0.7

    def subgoals(self, objects, ee_pos, gripper) -> dict[str, bool]:
        s, o, bowl = _short(self.cube), objects[self.cube], objects["bowl"]
        sg = _pick_subgoals(self.cube, objects, ee_pos, gripper)
        sg[f"{s}_over_bowl"] = bool(sg[f"grasped_{s}"] and dist_xy(o, bowl) < BOWL_INNER - 0.01)
        sg[f"{s}_in_bowl"] = in_bowl(o, bowl)
        sg["released"] = self.success(objects, ee_pos, gripper)
        return sg


@dataclasses.dataclass(frozen=True)
class PushToMarkerTask(Task):
    """Push ``cube`` along the table until it lies on the marker (never lifted)."""

    cube: str = "blue_cube"

    @property
    def skills(self):
        return (("push", self.cube, "target"),)

    def layout(self, rng):
        def ok(p: Placements) -> bool:
            c, t = np.array(p[self.cube][:2]), np.array(p["target"][:2])
            d = float(np.linalg.norm(t - c))
            if not 0.10 < d < 0.20:
                return False
            start = c - (t - c) / d * 0.07  # where the pusher comes down
            if not (0.30 < start[0] < 0.70 and abs(start[1]) < 0.28):
                return False
            # the corridor swept by the cube and the pusher is free of the other objects
            for n in OBJECT_NAMES:
                if n in (self.cube, "target"):
                    continue
                if _seg_point_dist(p[n], start, t) < FOOTPRINT[n] + FOOTPRINT[self.cube] + 0.02:
                    return False
            return True

        return sample_layout(rng, ok)

    def success(self, objects, ee_pos, gripper) -> bool:
        return on_marker(objects[self.cube], objects["target"])

    def subgoals(self, objects, ee_pos, gripper) -> dict[str, bool]:
        s, o, t = _short(self.cube), objects[self.cube], objects["target"]
        touching = dist_xy(o, ee_pos) < CUBE_HALF + 0.025 and float(ee_pos[2]) < 0.06
        return {f"reached_{s}": bool(touching), f"{s}_near_marker": bool(dist_xy(o, t) < 0.08 and on_table(o)),
                f"{s}_on_marker": self.success(objects, ee_pos, gripper),
                f"{s}_not_lifted": bool(on_table(o))}


@dataclasses.dataclass(frozen=True)
class StackTask(Task):
    """Put ``top`` on ``bottom`` and let go."""

    top: str = "green_cube"
    bottom: str = "red_cube"

    @property
    def skills(self):
        return (("pick", self.top), ("place", self.top, ("on", self.bottom)))

    def success(self, objects, ee_pos, gripper) -> bool:
        top, bot = objects[self.top], objects[self.bottom]
        return stacked(top, bot) and on_table(bot) and not grasped(top, ee_pos, gripper) and gripper > 0.7

    def subgoals(self, objects, ee_pos, gripper) -> dict[str, bool]:
        t, b = _short(self.top), _short(self.bottom)
        top, bot = objects[self.top], objects[self.bottom]
        sg = _pick_subgoals(self.top, objects, ee_pos, gripper)
        sg[f"{t}_over_{b}"] = bool(sg[f"grasped_{t}"] and dist_xy(top, bot) < 0.02 and top[2] > bot[2] + 0.03)
        sg[f"{t}_on_{b}"] = stacked(top, bot)
        sg["released"] = self.success(objects, ee_pos, gripper)
        return sg


@dataclasses.dataclass(frozen=True)
class TurnedPickTask(PickTask):
    """``PickTask`` in scenes made for behaviour modes (ExToken's token prior): the cube is turned so that the
    home finger axis (``HOME_FINGER_ANGLE``) is 45 degrees from both of its face pairs, so a demonstrator must
    turn the fingers one way or the other to grasp it (``ScriptedExpert(grasp_mode="ccw" | "cw")``), 45 degrees
    either way. The other objects are laid out as usual.

    With ``neighbour`` (a cube), that cube stands ``NEIGHBOUR_GAP`` from ``cube``, face to face, along one of
    ``cube``'s two face axes (the axis and the side drawn from the scene seed). The fingers open 8 cm across one
    face pair of a 4.5 cm cube: across the neighbour's axis a finger comes down on the neighbour. Measured
    (``bench/archive/expert_modes.py``): in this simulator the finger tips the 50 g neighbour over and the blocked turn
    still lifts the cube, while the free turn never touches the neighbour. So with a neighbour the task is "pick up
    the cube without knocking its neighbour over": success also needs the neighbour standing, its body z axis
    within ``UPRIGHT_DEG`` of vertical (a state predicate: a tipped cube lies on a side face). Only one turning
    direction succeeds, and which one depends on the scene."""

    neighbour: str | None = None
    gap: float | None = None
    """Gap between ``cube`` and ``neighbour``, face to face, m (None: the module's ``NEIGHBOUR_GAP``, read at layout
    time)."""

    def success(self, objects, ee_pos, gripper) -> bool:
        return super().success(objects, ee_pos, gripper) and (self.neighbour is None
                                                              or upright(objects[self.neighbour]))

    def subgoals(self, objects, ee_pos, gripper) -> dict[str, bool]:
        sg = super().subgoals(objects, ee_pos, gripper)
        if self.neighbour is not None:
            sg[f"{_short(self.neighbour)}_standing"] = upright(objects[self.neighbour])
        return sg

    def layout(self, rng):
        yaw = HOME_FINGER_ANGLE + math.pi / 4
        if self.neighbour is None:
            p = sample_layout(rng)
            p[self.cube] = (*p[self.cube][:2], yaw)
            return p
        axis = yaw + math.pi / 2 * int(rng.integers(2))  # one of the cube's two face axes
        gap = NEIGHBOUR_GAP if self.gap is None else self.gap
        d = (2 * CUBE_HALF + gap) * (1.0 if rng.random() < 0.5 else -1.0)  # centre to centre, either side
        (x0, x1), (y0, y1) = OBJECT_REGION
        for _ in range(1000):
            x, y = rng.uniform(x0, x1), rng.uniform(y0, y1)
            nx, ny = x + d * math.cos(axis), y + d * math.sin(axis)
            if x0 <= nx <= x1 and y0 <= ny <= y1:
                break
        return sample_layout(rng, fixed={self.cube: (float(x), float(y), yaw), self.neighbour: (nx, ny, yaw)})


# Where the long-horizon task's expert puts each cube, in the bowl frame (x, y) with the bowl's
# axes taken as the world's: two cubes side by side on the floor, the third across them.
BOWL_SLOTS = {"left": (0.0, 0.026), "right": (0.0, -0.026), "top": (0.0, 0.0)}


@dataclasses.dataclass(frozen=True)
class AllInBowlTask(Task):
    """Long horizon: every cube into the bowl (three pick-and-place sub-tasks), then let go."""

    cubes: tuple[str, ...] = CUBES

    @property
    def skills(self):
        slots = ("left", "right", "top")
        out: list[tuple] = []
        for c, slot in zip(self.cubes, slots):
            out += [("pick", c), ("place", c, ("bowl", slot))]
        return tuple(out)

    def layout(self, rng):
        # the bowl in the middle band, so that every cube is within reach of it
        return sample_layout(rng, lambda p: 0.42 < p["bowl"][0] < 0.58 and abs(p["bowl"][1]) < 0.12)

    def success(self, objects, ee_pos, gripper) -> bool:
        bowl = objects["bowl"]
        return (all(in_bowl(objects[c], bowl) for c in self.cubes)
                and not any(grasped(objects[c], ee_pos, gripper) for c in self.cubes) and gripper > 0.7)

    def subgoals(self, objects, ee_pos, gripper) -> dict[str, bool]:
        sg: dict[str, bool] = {}
        bowl = objects["bowl"]
        for c in self.cubes:
            s = _short(c)
            g = grasped(objects[c], ee_pos, gripper)
            sg[f"grasped_{s}"] = g
            sg[f"{s}_in_bowl"] = in_bowl(objects[c], bowl) and not g
        n = sum(sg[f"{_short(c)}_in_bowl"] for c in self.cubes)
        sg.update({f"{k}_in_bowl": n >= k for k in range(1, len(self.cubes) + 1)})
        sg["released"] = self.success(objects, ee_pos, gripper)
        return sg


# Held-out wordings: each is a composition the training wordings teach in parts (the red pick is
# trained on "lift the red cube off the table" and the blue one on "grab the blue block"; held out
# are "grab the red block" and "lift the blue cube off the table"), or a new phrase for the same goal.
TASKS: dict[str, Task] = {t.name: t for t in (
    PickTask("pick_red_cube", "pick up the red cube",
             ("grab the red block", "lift the red cube off the table", "pick the red cube up"),
             max_steps=100, held_out=("grab the red block",), cube="red_cube", height=0.10),
    PickTask("lift_green_cube", "lift the green cube high",
             ("raise the green block up high", "pick up the green cube and lift it high"),
             max_steps=100, held_out=("pick up the green cube and lift it high",), cube="green_cube",
             height=0.18),
    PickTask("pick_blue_cube", "pick up the blue cube",
             ("grab the blue block", "lift the blue cube off the table"),
             max_steps=100, held_out=("lift the blue cube off the table",), cube="blue_cube", height=0.10),
    PlaceInBowlTask("place_cube_in_bowl", "put the red cube in the bowl",
                    ("place the red block into the bowl", "drop the red cube in the bowl",
                     "move the red cube into the yellow bowl"),
                    max_steps=150, held_out=("move the red cube into the yellow bowl",), cube="red_cube"),
    PushToMarkerTask("push_block_to_marker", "push the blue cube to the pink marker",
                     ("slide the blue block onto the pink marker", "push the blue cube onto the target"),
                     max_steps=150, held_out=("push the blue cube onto the target",), cube="blue_cube"),
    StackTask("stack_cubes", "stack the green cube on the red cube",
              ("put the green block on top of the red block", "place the green cube onto the red cube"),
              max_steps=150, held_out=("place the green cube onto the red cube",), top="green_cube",
              bottom="red_cube"),
    AllInBowlTask("put_all_cubes_in_bowl", "put all the cubes in the bowl",
                  ("put every cube into the bowl", "clear the cubes off the table into the bowl",
                   "place the red, green and blue cubes in the bowl"),
                  max_steps=420, held_out=("clear the cubes off the table into the bowl",)),
)}



def _variant(base: Task, cls: type, name: str, **fields) -> Task:
    """A scene variant of ``base``: its instruction, wordings, limits and success, under another name and class."""
    kept = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    return cls(**{**kept, "name": name, "variant_of": base.name, **fields})


# Scene variants (``Task.variant_of``): the same task, in scenes made for behaviour modes (``TurnedPickTask``).
TASKS.update({t.name: t for t in (
    _variant(TASKS["pick_red_cube"], TurnedPickTask, "pick_red_cube_yaw45"),
    _variant(TASKS["pick_red_cube"], TurnedPickTask, "pick_red_cube_crowded", neighbour="blue_cube"),
    # the neighbour 3 cm off a face: both turns fit (bench/archive/expert_modes.py, gap 3 cm: 20/20 each, nothing
    # tipped), so demonstrations in both turns show a token-conditioned VLA a neighbour beside the cube
    _variant(TASKS["pick_red_cube"], TurnedPickTask, "pick_red_cube_near", neighbour="blue_cube", gap=0.03),
)})


def base_tasks() -> dict[str, Task]:
    """The registered tasks that are not a scene variant of another (``Task.variant_of`` is None): what
    relabelling and judges enumerate, since a variant's success and wordings are its base task's."""
    return {n: t for n, t in TASKS.items() if t.variant_of is None}


def get_task(name: str) -> Task:
    """The registered task called ``name``; a typo raises KeyError with the closest names."""
    if isinstance(name, Task):
        return name
    if name not in TASKS:
        close = difflib.get_close_matches(name, TASKS, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"unknown sim task {name!r}{hint} Known: {', '.join(sorted(TASKS))}")
    return TASKS[name]


def achieved_tasks(objects: Mapping[str, Pose7], ee_pos, gripper: float) -> list[str]:
    """Names of the registered tasks whose success predicate holds on this state (scene variants left out:
    their base task names the same success)."""
    return [n for n, t in base_tasks().items() if t.success(objects, ee_pos, gripper)]


def achieved_skills(objects: Mapping[str, Pose7], ee_pos, gripper: float) -> list[str]:
    """What a rollout that failed its task may still have carried out on this state, as instructions, the most
    complete first: the pick sub-skills done (a cube held with its centre above 6 cm: ``skill_done``) as "pick up
    the red cube" (the words the VLA was trained on), then the cubes only grasped (held, not lifted) as "grasp the
    red cube". For hindsight relabelling; a place sub-skill's "put it in the bowl" needs the state it starts from
    and is not proposed on its own."""
    picked = [c for c in CUBES if skill_done(("pick", c), objects, ee_pos, gripper)]
    held = [c for c in CUBES if c not in picked and grasped(objects[c], ee_pos, gripper)]
    return [skill_instruction(("pick", c)) for c in picked] + [f"grasp the {_short(c)} cube" for c in held]


class SubgoalTracker:
    """ORs a task's sub-goals over the ticks of a rollout (a sub-goal, once reached, stays
    achieved). ``first`` records the tick each was first reached."""

    def __init__(self, task: Task | str) -> None:
        self.task = get_task(task) if isinstance(task, str) else task
        self.achieved: dict[str, bool] = {}
        self.first: dict[str, int] = {}
        self.t = 0

    def update(self, objects: Mapping[str, Pose7], ee_pos, gripper: float) -> dict[str, bool]:
        now = self.task.subgoals(objects, ee_pos, gripper)
        for k, v in now.items():
            if v and not self.achieved.get(k, False):
                self.first[k] = self.t
            self.achieved[k] = self.achieved.get(k, False) or bool(v)
        self.t += 1
        return dict(self.achieved)
