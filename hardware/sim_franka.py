"""A MuJoCo simulation of the Franka Emika Panda on a table with a few objects.

The robot model is the MuJoCo Menagerie Panda shipped inside the ``genesis-world`` package
(installed with ``pip install --no-deps genesis-world``; only its asset files are used). The
scene is built with ``mujoco.MjSpec`` on top of the Menagerie ``scene.xml``:

* a table whose top is the plane z = 0 (the robot base sits on it, the floor is 0.75 m lower);
* free-jointed objects, in this order (``OBJECT_NAMES``, also ``describe()["objects"]``):
  ``red_cube``, ``green_cube``, ``blue_cube`` (4.5 cm), ``bowl`` (14 cm wide, built from a
  disc and wall boxes) and ``target`` (a flat 8 cm disc with no collision and gravity
  compensation, so it lies where it was put; a task uses it as a place marker);
* cameras ``front`` (in front of the table, looking back at robot and objects) and ``wrist``
  (on the hand, looking along the fingers);
* a site ``tcp`` between the fingertips (0.1034 m from the flange, the Franka TCP): the
  end-effector frame of :class:`~hardware.base.ArmState` and of ``command_ee_pose``.
  Positions are in the robot base frame, which is the world frame here.

Calibration board (``calibration_board=`` param, off by default; see :func:`board_config`): a
printed ChArUco board (``calibration.board.BoardSpec``) as a textured quad whose texture puts the
printed image's top-left corner at the board frame origin, so the board's pose is known exactly.
``"table"``: face up on a stand 6 cm above the table, where the wrist camera looks from the home
pose (eye-in-hand calibration, and intrinsics of the wrist camera); ``set_board_pose`` moves it
(intrinsics of the fixed front camera). ``"hand"``: fixed to the hand, facing the front camera
(eye-to-hand). ``board_pose()`` is the ground truth; ``describe()["calibration_board"]`` tells
``vla calibrate`` which board to look for and where it is.

Control. The arm has position actuators (a PD per joint) and gravity compensation on every
link (the real Franka compensates gravity in its firmware), so a joint target is tracked with
no steady-state sag. Commands only set targets; a controller running at ``ik_hz`` (default
100 Hz) turns them into the actuators' joint targets ``q_des``:

* ``command_joint_positions(q)``: ``q_des`` moves towards ``q`` at the datasheet joint
  velocity limits (a simple rate limiter, no jumps).
* ``command_ee_pose(pos, quat)``: damped least-squares differential IK. Each tick runs
  ``ik_iters`` Gauss-Newton iterations on a private kinematics-only ``MjData`` starting from
  ``q_des``: ``dq = J^T (J J^T + lambda^2 I)^-1 e`` with ``J`` the 6x7 site Jacobian of ``tcp``
  (``mj_jacSite``) and ``e`` the pose error (position; rotation as a world-frame rotation
  vector), each iteration's error clipped to 5 cm / 0.3 rad. A small null-space term pulls the
  redundant elbow towards the home posture. The resulting step of ``q_des`` is scaled to the
  joint velocity limits and ``q_des`` is kept within 0.25 rad of the measured ``q`` (a blocked
  arm does not wind up a large target). Solving from ``q_des`` rather than from the measured
  ``q`` makes the IK exact at steady state (no tracking error feeds into it).
* gripper opening ``g`` in [0, 1] -> actuator8 control ``255 * g`` (0 closed, 255 = 8 cm).

Contacts. Friction uses elliptic cones with ``impratio`` 10 (``cone`` / ``impratio`` arguments), the setting
MuJoCo's documentation gives for grasping. With MuJoCo's defaults (pyramidal cones, impratio 1) friction is as
soft as the normal contact, so a cube held still by the fully closed gripper creeps down out of the fingers:
1.8-2.1 cm in 15 s, and faster while the arm moves, where a real Franka Hand holds it. With the default here it
moves under 1 mm in 15 s (bench/results/sim_grip.json). ``cone="pyramidal", impratio=1`` gives the scene every
figure before vla_sft round 22 was measured on.
* ``hold()``: ``q_des`` = measured ``q``, any pose target dropped, ``safe=True`` until the next
  command.

Time. ``physics_hz`` (default 500) sets the timestep. ``control_dt = control_substeps /
physics_hz`` (default 50 steps = 0.1 s) is the period one command is held for in fast mode.

* ``realtime=True``: ``connect()`` starts a daemon thread that steps physics paced to the wall
  clock (sim time advances with ``time.monotonic()``, in chunks of one IK tick). If it falls more
  than ``max_lag_s`` behind it drops the debt (the simulation runs slower than real time rather
  than spiralling), counts it in ``realtime_stats["late"]`` and logs a warning. Every public
  method takes one lock around the ``MjData`` and holds it only for a few physics steps.
* ``realtime=False`` (training, as fast as possible): no thread; physics advances only in
  :meth:`step` / :meth:`advance`. The bridge server (``robot_io.server.ArmService``) calls
  ``step()`` (one control period) after each motion command in this mode.

State. ``read_state()`` computes the tcp pose by forward kinematics of the current ``qpos``;
``extras["objects"]`` is ``[5, 7]`` float64 (position + quaternion wxyz of each object, in
``OBJECT_NAMES`` order) and ``extras["sim_time"]`` is ``[1]`` (seconds of simulated time).
``reset(seed)`` puts the arm at the Menagerie ``home`` pose with the gripper open, drops the
objects at seeded random, non-overlapping spots of ``OBJECT_REGION`` (random yaw) and settles
``settle_s`` of physics. ``seed=None`` continues the generator seeded by the constructor.
``reset(seed, task=name)`` places the objects by that task's seeded layout instead
(``hardware.sim_tasks.TASKS``; an unknown name raises ``DeviceError`` with a suggestion).
``set_object_pose(name, pos, quat)`` teleports one object (scene set-up, tests).

Speed (2-core CPU build machine): building the model ~1 s; fast mode runs at ~8-9x real time
while tracking a pose target (IK ~0.2 ms per tick) and ~13-18x in joint mode or holding; ``reset`` ~10 ms.
Tracking: a 10 cm pose step converges to < 1 mm in ~0.6 s; following 1 cm / 0.1 s steps the tcp
lags the target by ~6 mm. ``hold()`` from full joint speed overshoots by up to ~0.1 rad (the
joint torque limits bound the deceleration) and is back at the hold pose within ~1 s.

Cameras (``hardware.sim_camera.SimCamera``) render from their own ``MjData``: they read a copy of
the state with :meth:`snapshot_qpos` (a short lock hold) and never hold the physics lock while
rendering. ``model`` is shared and must not be modified after construction.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import pathlib
import threading
import time
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from hardware.base import Arm, ArmState, DeviceError, JointLimits  # noqa: E402
from hardware.realtime_physics import RealtimePhysics  # noqa: E402

log = logging.getLogger(__name__)

ARM_JOINTS = tuple(f"joint{i}" for i in range(1, 8))
FINGER_JOINTS = ("finger_joint1", "finger_joint2")
# Franka Emika Panda datasheet joint velocity limits, rad/s.
VELOCITY_LIMITS = np.array([2.175, 2.175, 2.175, 2.175, 2.61, 2.61, 2.61])
HOME_Q = np.array([0.0, 0.0, 0.0, -1.57079, 0.0, 1.57079, -0.7853])  # Menagerie keyframe "home"
FINGER_OPEN = 0.04  # m per finger at gripper opening 1
OBJECT_NAMES = ("red_cube", "green_cube", "blue_cube", "bowl", "target")
CUBE_HALF = 0.0225  # 4.5 cm cubes
BOWL_RADIUS = 0.07
TARGET_RADIUS = 0.04
# Objects are placed at random in this table region (x, y ranges, m): reachable top-down.
OBJECT_REGION = ((0.35, 0.65), (-0.22, 0.22))
TABLE_TOP_Z = 0.0
TCP_OFFSET = 0.1034  # flange (= hand body origin) to the point between the fingertips, m
INSTALL_HINT = "pip install --no-deps genesis-world"


def panda_model_dir() -> pathlib.Path:
    """The folder holding the Menagerie ``panda.xml`` / ``scene.xml`` (inside ``genesis-world``)."""
    spec = importlib.util.find_spec("genesis")
    if spec is None or not spec.submodule_search_locations:
        raise DeviceError(f"SimFranka needs the MuJoCo Menagerie Panda model from the 'genesis-world' package, "
                          f"which is not installed: run `{INSTALL_HINT}`")
    folder = pathlib.Path(list(spec.submodule_search_locations)[0]) / "assets" / "xml" / "franka_emika_panda"
    if not (folder / "scene.xml").is_file():
        raise DeviceError(f"the 'genesis-world' package has no Panda model at {folder}: reinstall it with "
                          f"`{INSTALL_HINT}`")
    return folder


def look_at_quat(pos, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """Quaternion (wxyz) of a MuJoCo camera at ``pos`` looking at ``target`` (camera looks along
    its -z axis with +y up in the image)."""
    f = np.asarray(target, float) - np.asarray(pos, float)
    f /= np.linalg.norm(f)
    x = np.cross(f, up)
    x /= np.linalg.norm(x)
    y = np.cross(x, f)
    mat = np.column_stack([x, y, -f])
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, mat.flatten())
    return quat


def _yaw_quat(yaw: float) -> np.ndarray:
    return np.array([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)])


def _quat_err(target: np.ndarray, current: np.ndarray) -> np.ndarray:
    """World-frame rotation vector taking ``current`` to ``target`` (both wxyz)."""
    conj = current * np.array([1.0, -1.0, -1.0, -1.0])
    q = np.zeros(4)
    mujoco.mju_mulQuat(q, target, conj)
    if q[0] < 0:  # shortest way round
        q = -q
    v = np.zeros(3)
    mujoco.mju_quat2Vel(v, q, 1.0)
    return v


BOARD_MOUNTS = ("table", "hand")
BOARD_BODY = "calibration_board"
# Where the printed ChArUco board sits. "table": face up on a stand 6 cm above the table (above
# the objects, so that they never hide it), centred where the wrist camera looks from the home
# pose; a freejoint body with gravity compensation and no collision, so it stays where it is
# put (``set_board_pose`` moves it, ``reset`` puts it back). "hand": screwed to the side of the
# hand that faces the front camera at home, clear of the hand and the open fingers (eye-to-hand
# calibration: the arm shows the board to a fixed camera).
_BOARD_DEFAULTS = {
    "table": {"board": {}, "center": [0.45, -0.265, 0.06]},
    "hand": {"board": {"squares_x": 6, "squares_y": 5, "square_m": 0.045, "marker_m": 0.034},
             "center": [0.0, 0.12, 0.05]},
}
_BOARD_KEYS = {"mount", "center", "squares_x", "squares_y", "square_m", "marker_m", "dictionary"}


def board_config(value: Any) -> dict | None:
    """The site param ``calibration_board`` -> ``{mount, board: BoardSpec, pos, quat}`` or None.

    ``value``: None / false (no board), ``"table"`` or ``"hand"`` (the default board of that mount),
    or a mapping with ``mount`` and any of ``center`` ([3] m: the board centre, world frame on the
    table, hand frame on the hand) and the ``calibration.board.BoardSpec`` fields. ``pos`` / ``quat``
    (wxyz) are the pose of the board frame (OpenCV's: origin at the printed image's top-left
    corner, z into the board) in the world (table) or hand (hand) frame."""
    if value is None or value is False:
        return None
    if isinstance(value, str):
        value = {"mount": value}
    if not isinstance(value, dict):
        raise ValueError(f"calibration_board must be 'table', 'hand' or a mapping, got {value!r}")
    bad = set(value) - _BOARD_KEYS
    if bad:
        raise ValueError(f"calibration_board: unknown field {sorted(bad)[0]!r}; known: {', '.join(sorted(_BOARD_KEYS))}")
    mount = value.get("mount", "table")
    if mount not in BOARD_MOUNTS:
        raise ValueError(f"calibration_board.mount must be one of {list(BOARD_MOUNTS)}, got {mount!r}")
    from calibration.board import BoardSpec  # numpy + OpenCV only; imported when a board is asked for

    defaults = _BOARD_DEFAULTS[mount]
    board = BoardSpec(**{**defaults["board"], **{k: v for k, v in value.items() if k not in ("mount", "center")}})
    center = np.asarray(value.get("center", defaults["center"]), np.float64).reshape(-1)
    if center.shape != (3,) or not np.all(np.isfinite(center)):
        raise ValueError(f"calibration_board.center must be [x, y, z] in metres, got {value.get('center')!r}")
    if mount == "table":  # face up: board x = world x, board y = world -y, board z = world -z
        rot = np.diag([1.0, -1.0, -1.0])
    else:  # facing hand +y (the front camera at home): board x = hand x, y = hand z, z = hand -y
        rot = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    w, h = board.size_m
    pos = center - rot @ np.array([w / 2, h / 2, 0.0])
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, rot.flatten())
    return {"mount": mount, "board": board, "pos": pos, "quat": quat}


def _add_board(spec: mujoco.MjSpec, cfg: dict) -> None:
    """The board as a textured quad: a mesh whose texture coordinates put the printed image's
    top-left corner at the board frame origin and its columns along +x, seen from -z."""
    board = cfg["board"]
    img = board.image(px_per_square=100)
    h_px, w_px = img.shape
    tex = spec.add_texture(name=f"{BOARD_BODY}_tex", type=mujoco.mjtTexture.mjTEXTURE_2D, width=w_px, height=h_px,
                           nchannel=3)
    tex.data = np.repeat(img[:, :, None], 3, axis=2).tobytes()
    mat = spec.add_material(name=f"{BOARD_BODY}_mat")
    mat.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = f"{BOARD_BODY}_tex"
    w, h = board.size_m
    mesh = spec.add_mesh(name=f"{BOARD_BODY}_mesh")
    mesh.uservert = [0, 0, 0, w, 0, 0, w, h, 0, 0, h, 0]
    mesh.usertexcoord = [0, 0, 1, 0, 1, 1, 0, 1]
    mesh.userface = [0, 2, 1, 0, 3, 2]  # wound so that the face is seen from the board's -z side
    mesh.inertia = mujoco.mjtMeshInertia.mjMESH_INERTIA_SHELL
    parent = spec.worldbody if cfg["mount"] == "table" else spec.body("hand")
    body = parent.add_body(name=BOARD_BODY, pos=cfg["pos"], quat=cfg["quat"])
    geom = dict(name=f"{BOARD_BODY}_geom", type=mujoco.mjtGeom.mjGEOM_MESH, meshname=f"{BOARD_BODY}_mesh",
                material=f"{BOARD_BODY}_mat", contype=0, conaffinity=0)
    if cfg["mount"] == "table":  # floats where it is put (like the target marker)
        body.gravcomp = 1.0
        body.add_freejoint(name=f"{BOARD_BODY}_joint")
        body.add_geom(**geom, mass=0.1)
    else:
        body.add_geom(**geom, mass=0.0)


CONES = {"elliptic": mujoco.mjtCone.mjCONE_ELLIPTIC, "pyramidal": mujoco.mjtCone.mjCONE_PYRAMIDAL}


def build_model(physics_hz: float = 500.0, board: dict | None = None, cone: str = "elliptic",
                impratio: float = 10.0) -> mujoco.MjModel:
    """Compile the Panda + table + objects + cameras scene (+ a ChArUco board: ``board_config``), with
    friction cones ``cone`` and ``impratio`` (module doc, Contacts)."""
    if cone not in CONES:
        raise ValueError(f"cone must be one of {sorted(CONES)}, got {cone!r}")
    if not (math.isfinite(impratio) and impratio >= 1.0):
        raise ValueError(f"impratio must be a finite number >= 1, got {impratio}")
    spec = mujoco.MjSpec.from_file(str(panda_model_dir() / "scene.xml"))
    spec.option.timestep = 1.0 / physics_hz
    spec.option.cone = CONES[cone]
    spec.option.impratio = float(impratio)
    # Renderer settings: no multisampling (fast software rendering), buffer big enough for 640x480.
    spec.visual.quality.offsamples = 0
    spec.visual.global_.offwidth = max(spec.visual.global_.offwidth, 640)
    spec.visual.global_.offheight = max(spec.visual.global_.offheight, 480)
    for key in list(spec.keys):  # the Menagerie keyframe has the robot's qpos only; we reset by hand
        spec.delete(key)

    # Gravity compensation on the arm and hand (the real Franka does this in firmware).
    for b in spec.bodies:
        if b.name.startswith("link") or b.name in ("hand", "left_finger", "right_finger"):
            b.gravcomp = 1.0

    world = spec.worldbody
    spec.geom("floor").pos = [0.0, 0.0, -0.75]
    wood = [0.55, 0.42, 0.30, 1.0]
    world.add_geom(name="table", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.6, 0.5, 0.025],
                   pos=[0.3, 0.0, TABLE_TOP_Z - 0.025], rgba=wood)
    for i, (lx, ly) in enumerate([(-0.25, -0.45), (-0.25, 0.45), (0.85, -0.45), (0.85, 0.45)]):
        world.add_geom(name=f"table_leg{i}", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.03, 0.03, 0.35],
                       pos=[lx, ly, TABLE_TOP_Z - 0.05 - 0.35], rgba=[0.35, 0.27, 0.2, 1.0])

    # Cubes.
    for name, rgba in (("red_cube", [0.85, 0.08, 0.08, 1]), ("green_cube", [0.1, 0.7, 0.15, 1]),
                       ("blue_cube", [0.1, 0.2, 0.85, 1])):
        b = world.add_body(name=name, pos=[0.5, 0.0, CUBE_HALF])
        b.add_freejoint(name=f"{name}_joint")
        b.add_geom(name=f"{name}_geom", type=mujoco.mjtGeom.mjGEOM_BOX, size=[CUBE_HALF] * 3, rgba=rgba,
                   mass=0.05, friction=[1.5, 0.01, 0.001], condim=4)
    # Bowl: a disc and 12 wall boxes.
    bowl = world.add_body(name="bowl", pos=[0.5, 0.0, 0.005])
    bowl.add_freejoint(name="bowl_joint")
    bowl_rgba = [0.95, 0.7, 0.15, 1]
    bowl.add_geom(name="bowl_base", type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[BOWL_RADIUS - 0.01, 0.004, 0],
                  rgba=bowl_rgba, mass=0.1)
    n_walls = 12
    for i in range(n_walls):
        a = 2 * np.pi * i / n_walls
        r = BOWL_RADIUS - 0.004
        bowl.add_geom(name=f"bowl_wall{i}", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.004, 0.0195, 0.02],
                      pos=[r * np.cos(a), r * np.sin(a), 0.016], quat=_yaw_quat(a), rgba=bowl_rgba, mass=0.01)
    # Target marker: visual only, floats where it is put.
    tgt = world.add_body(name="target", pos=[0.5, 0.0, 0.001], gravcomp=1.0)
    tgt.add_freejoint(name="target_joint")
    tgt.add_geom(name="target_geom", type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[TARGET_RADIUS, 0.001, 0],
                 rgba=[0.8, 0.2, 0.8, 1], contype=0, conaffinity=0, mass=0.01)

    # TCP site and wrist camera on the hand (hand z runs along the fingers, y is the opening axis).
    hand = spec.body("hand")
    hand.add_site(name="tcp", pos=[0, 0, TCP_OFFSET], size=[0.005, 0, 0], group=4)
    wrist_pos = [0.1, 0.0, 0.035]
    hand.add_camera(name="wrist", pos=wrist_pos, quat=look_at_quat(wrist_pos, [0.0, 0.0, 0.18], up=[1.0, 0, 0]),
                    fovy=62.0)
    front_pos = [1.45, 0.0, 0.8]
    world.add_camera(name="front", pos=front_pos, quat=look_at_quat(front_pos, [0.42, 0.0, 0.12]), fovy=50.0)
    # A second fixed view from the robot's right, across the front camera's viewing axis: what the front
    # camera sees as depth (x), this one sees as left / right (sites that list it: sim-franka-fast-3cam).
    side_pos = [0.5, -0.8, 0.45]
    world.add_camera(name="side", pos=side_pos, quat=look_at_quat(side_pos, [0.5, 0.0, 0.06]), fovy=50.0)
    if board is not None:  # added last: the qpos addresses of everything else do not move
        _add_board(spec, board)
    return spec.compile()


class SimFranka(RealtimePhysics, Arm):
    """Simulated Franka Panda (see the module docstring for scene, controller and timing)."""

    def __init__(self, name: str = "arm", realtime: bool = True, physics_hz: float = 500.0,
                 control_substeps: int = 50, ik_hz: float = 100.0, ik_iters: int = 3, seed: int = 0,
                 settle_s: float = 0.2, max_lag_s: float = 0.1, calibration_board: Any = None,
                 cone: str = "elliptic", impratio: float = 10.0) -> None:
        super().__init__(name)
        self.board = board_config(calibration_board)
        ik_every = physics_hz / ik_hz if physics_hz > 0 and ik_hz > 0 else 0.0
        if abs(ik_every - round(ik_every)) > 1e-9 or round(ik_every) < 1:
            raise ValueError(f"physics_hz ({physics_hz}) must be a positive whole multiple of ik_hz ({ik_hz})")
        if control_substeps < 1:
            raise ValueError(f"control_substeps must be >= 1, got {control_substeps}")
        self.realtime = bool(realtime)
        self.physics_hz = float(physics_hz)
        self.control_substeps = int(control_substeps)
        self.ik_iters = int(ik_iters)
        self.settle_s, self.max_lag_s = float(settle_s), float(max_lag_s)
        self._ik_every = int(round(ik_every))
        self._ik_dt = self._ik_every / self.physics_hz

        self.model = build_model(self.physics_hz, self.board, cone=cone, impratio=impratio)
        self.cone, self.impratio = cone, float(impratio)
        m = self.model
        self._data = mujoco.MjData(m)
        self._kin = mujoco.MjData(m)  # kinematics-only scratch data for IK and read_state
        jid = [mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, j) for j in ARM_JOINTS]
        self._arm_qadr = np.array([m.jnt_qposadr[j] for j in jid])
        self._arm_vadr = np.array([m.jnt_dofadr[j] for j in jid])
        self._finger_qadr = np.array([m.jnt_qposadr[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, j)]
                                      for j in FINGER_JOINTS])
        rng = m.jnt_range[jid]
        self._limits = JointLimits(lower=rng[:, 0].copy(), upper=rng[:, 1].copy(), velocity=VELOCITY_LIMITS.copy())
        self._tcp = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, "tcp")
        self._obj_body = np.array([mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, n) for n in OBJECT_NAMES])
        self._obj_qadr = np.array([m.jnt_qposadr[m.body_jntadr[b]] for b in self._obj_body])
        self._obj_vadr = np.array([m.jnt_dofadr[m.body_jntadr[b]] for b in self._obj_body])
        self._grip_act = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_ACTUATOR, "actuator8")
        self._board_body = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, BOARD_BODY) if self.board else -1
        self._jac = np.zeros((6, m.nv))  # rows: translational, rotational
        self._lam2_eye6 = 1e-3 * np.eye(6)

        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self._mode = "joint"  # "joint" | "ee" | "hold"
        self._q_des = HOME_Q.copy()
        self._q_goal = HOME_Q.copy()
        self._grip_ctrl = 255.0
        self._ee_target: tuple[np.ndarray, np.ndarray] | None = None
        self._safe = False
        self._substep = 0  # physics steps since construction (IK runs every _ik_every of them)
        self.resets = 0
        """Resets so far: a camera rendering this scene starts each episode from a fresh scene (``SimCamera``)."""
        self._init_realtime()
        with self._lock:
            self._reset_locked(self._rng)

    # -- properties ---------------------------------------------------------------------------
    @property
    def joint_limits(self) -> JointLimits:
        return self._limits

    @property
    def control_dt(self) -> float:
        """Seconds of simulated time one command is held for in fast mode (``step()`` advances this)."""
        return self.control_substeps / self.physics_hz

    @property
    def timestep(self) -> float:
        return self.model.opt.timestep

    @property
    def sim_time(self) -> float:
        with self._lock:
            return float(self._data.time)

    @property
    def object_names(self) -> tuple[str, ...]:
        return OBJECT_NAMES

    @property
    def _tick_steps(self) -> int:
        """Physics steps per control tick (the real-time thread steps whole ticks)."""
        return self._ik_every

    # -- lifecycle ----------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        from hardware.sim_tasks import TASKS  # numpy only; imported on use

        return {**super().describe(), "sim": True, "objects": list(OBJECT_NAMES), "cameras": ["front", "wrist", "side"],
                "tasks": sorted(TASKS),  # what reset(task=...) accepts; the bridge checks it before the driver
                "ee_site": "tcp", "physics_hz": self.physics_hz, "control_dt": self.control_dt,
                "realtime": self.realtime, "contact": {"cone": self.cone, "impratio": self.impratio},
                "object_region": [list(r) for r in OBJECT_REGION],
                "table_top_z": TABLE_TOP_Z,
                **({"calibration_board": self.board_description()} if self.board else {})}

    def board_description(self) -> dict[str, Any]:
        """The printed board (``calibration.board.BoardSpec`` fields), its mount, and its default
        pose (board frame in the world for ``table``, in the hand frame for ``hand``)."""
        if not self.board:
            raise DeviceError(f"SimFranka {self.name!r} has no calibration board: construct it with "
                              "calibration_board='table' or 'hand'")
        return {**self.board["board"].to_dict(), "mount": self.board["mount"],
                "pos": [float(v) for v in self.board["pos"]], "quat": [float(v) for v in self.board["quat"]]}

    # -- commands -----------------------------------------------------------------------------
    def command_ee_pose(self, pos: np.ndarray, quat: np.ndarray, gripper: float | None = None) -> None:
        self._require_connected()
        pos = np.asarray(pos, np.float64).reshape(-1)
        quat = np.asarray(quat, np.float64).reshape(-1)
        if pos.shape != (3,) or quat.shape != (4,) or not (np.all(np.isfinite(pos)) and np.all(np.isfinite(quat))):
            raise ValueError(f"command_ee_pose needs finite pos [3] and quat [4], got shapes {pos.shape}, {quat.shape}")
        n = np.linalg.norm(quat)
        if n < 1e-6:
            raise ValueError("command_ee_pose: quaternion has zero norm")
        grip = self._gripper_ctrl(gripper)
        with self._lock:
            if self._mode != "ee":  # start solving from where the arm is
                self._q_des = self._data.qpos[self._arm_qadr].copy()
            self._mode = "ee"
            self._ee_target = (pos.copy(), quat / n)
            self._set_gripper_locked(grip)
            self._safe = False

    def command_joint_positions(self, q: np.ndarray, gripper: float | None = None) -> None:
        self._require_connected()
        q = np.asarray(q, np.float64).reshape(-1)
        if q.shape != (self.num_joints,) or not np.all(np.isfinite(q)):
            raise ValueError(f"command_joint_positions needs finite q [{self.num_joints}], got shape {q.shape}")
        grip = self._gripper_ctrl(gripper)
        with self._lock:
            if self._mode == "ee":
                self._ee_target = None
            self._mode = "joint"
            self._q_goal = np.clip(q, self._limits.lower, self._limits.upper)
            self._set_gripper_locked(grip)
            self._safe = False

    def hold(self) -> None:
        self._require_connected()
        with self._lock:
            self._mode = "hold"
            self._ee_target = None
            self._q_des = self._data.qpos[self._arm_qadr].copy()
            self._data.ctrl[:7] = self._q_des
            self._safe = True

    def reset(self, seed: int | None = None, task: str | None = None) -> ArmState:
        """Home pose, gripper open, objects placed at random (``seed``) or, with ``task`` (a name
        in ``hardware.sim_tasks.TASKS``), by that task's seeded layout; then settle."""
        self._require_connected()
        placements = None
        rng = self._rng if seed is None else np.random.default_rng(seed)
        if task is not None:
            from hardware.sim_tasks import get_task  # numpy only; imported on use

            try:
                placements = get_task(task).layout(rng)
            except KeyError as e:
                raise DeviceError(e.args[0]) from None
        with self._lock:
            self._reset_locked(rng, placements)
            self._reanchor = True
            self.resets += 1
        return self.read_state()

    def read_state(self) -> ArmState:
        self._require_connected()
        with self._lock:
            d, kd = self._data, self._kin
            kd.qpos[:] = d.qpos
            q = d.qpos[self._arm_qadr].copy()
            dq = d.qvel[self._arm_vadr].copy()
            grip = float(np.sum(d.qpos[self._finger_qadr]) / (2 * FINGER_OPEN))
            safe, t = self._safe, float(d.time)
            ee_pos, ee_quat, objects = self._pose_from_qpos(kd)
        return ArmState(q=q, dq=dq, ee_pos=ee_pos, ee_quat=ee_quat, gripper=float(np.clip(grip, 0.0, 1.0)),
                        t_mono_ns=time.monotonic_ns(), safe=safe,
                        extras={"objects": objects, "sim_time": np.array([t])})

    # -- stepping -----------------------------------------------------------------------------
    def step(self, n_steps: int | None = None) -> None:
        """Fast mode only: advance physics by ``n_steps`` (default ``control_substeps``, one control period)."""
        self._require_connected()
        if self.realtime:
            raise DeviceError(f"SimFranka {self.name!r} runs in real time: its physics thread owns stepping")
        n = self.control_substeps if n_steps is None else int(n_steps)
        if n < 0:
            raise ValueError(f"n_steps must be >= 0, got {n}")
        with self._lock:
            self._step_locked(n)

    def advance(self, seconds: float) -> None:
        """Fast mode only: advance physics by ``seconds`` of simulated time (rounded to whole steps)."""
        self.step(int(round(seconds * self.physics_hz)))

    def set_object_pose(self, name: str, pos, quat=(1.0, 0.0, 0.0, 0.0)) -> None:
        """Teleport object ``name`` to ``pos`` [3] / ``quat`` [4] wxyz at rest (scene set-up, tests)."""
        self._require_connected()
        if name not in OBJECT_NAMES:
            raise ValueError(f"unknown object {name!r}; objects: {list(OBJECT_NAMES)}")
        i = OBJECT_NAMES.index(name)
        q = np.asarray(quat, np.float64)
        with self._lock:
            qadr, vadr = self._obj_qadr[i], self._obj_vadr[i]
            self._data.qpos[qadr:qadr + 3] = np.asarray(pos, np.float64)
            self._data.qpos[qadr + 3:qadr + 7] = q / np.linalg.norm(q)
            self._data.qvel[vadr:vadr + 6] = 0.0
            mujoco.mj_forward(self.model, self._data)

    def set_board_pose(self, pos, quat) -> None:
        """Teleport a table-mounted calibration board: ``pos`` [3] / ``quat`` [4] wxyz of the board
        frame in the world (scene set-up, tests; ``reset`` puts it back)."""
        self._require_connected()
        if not self.board or self.board["mount"] != "table":
            raise DeviceError(f"SimFranka {self.name!r}: set_board_pose needs calibration_board mounted on the table")
        m = self.model
        jnt = m.body_jntadr[self._board_body]
        qadr, vadr = m.jnt_qposadr[jnt], m.jnt_dofadr[jnt]
        q = np.asarray(quat, np.float64)
        with self._lock:
            self._data.qpos[qadr:qadr + 3] = np.asarray(pos, np.float64)
            self._data.qpos[qadr + 3:qadr + 7] = q / np.linalg.norm(q)
            self._data.qvel[vadr:vadr + 6] = 0.0
            mujoco.mj_forward(m, self._data)

    def board_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """The calibration board frame in the world now: ``(pos [3], quat [4] wxyz)`` (ground truth)."""
        self._require_connected()
        if not self.board:
            raise DeviceError(f"SimFranka {self.name!r} has no calibration board")
        with self._lock:
            kd = self._kin
            kd.qpos[:] = self._data.qpos
            mujoco.mj_kinematics(self.model, kd)
            return kd.xpos[self._board_body].copy(), kd.xquat[self._board_body].copy()

    def snapshot_qpos(self) -> tuple[np.ndarray, np.ndarray, float]:
        """Copies of ``(qpos, qvel, sim_time)`` taken under the lock (for renderers with their own MjData)."""
        with self._lock:
            return self._data.qpos.copy(), self._data.qvel.copy(), float(self._data.time)

    # -- internals (call with the lock held) --------------------------------------------------
    @staticmethod
    def _gripper_ctrl(gripper: float | None) -> float | None:
        """Opening in [0, 1] (clipped) -> actuator8 control 0..255; None keeps the current one."""
        if gripper is None:
            return None
        g = float(gripper)
        if not np.isfinite(g):
            raise ValueError(f"gripper opening must be finite, got {gripper}")
        return 255.0 * float(np.clip(g, 0.0, 1.0))

    def _set_gripper_locked(self, ctrl: float | None) -> None:
        if ctrl is not None:
            self._grip_ctrl = ctrl
            self._data.ctrl[self._grip_act] = ctrl

    def _pose_from_qpos(self, kd: mujoco.MjData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Forward kinematics on the scratch data ``kd`` whose qpos is set: tcp pose and object poses."""
        mujoco.mj_kinematics(self.model, kd)
        ee_pos = kd.site_xpos[self._tcp].copy()
        ee_quat = np.zeros(4)
        mujoco.mju_mat2Quat(ee_quat, kd.site_xmat[self._tcp])
        objects = np.concatenate([kd.xpos[self._obj_body], kd.xquat[self._obj_body]], axis=1).astype(np.float64)
        return ee_pos, ee_quat, objects

    def _reset_locked(self, rng: np.random.Generator, placements: dict | None = None) -> None:
        m, d = self.model, self._data
        mujoco.mj_resetData(m, d)
        d.qpos[self._arm_qadr] = HOME_Q
        d.qpos[self._finger_qadr] = FINGER_OPEN
        self._mode, self._ee_target, self._safe = "joint", None, False
        self._q_des, self._q_goal, self._grip_ctrl = HOME_Q.copy(), HOME_Q.copy(), 255.0
        d.ctrl[:7] = HOME_Q
        d.ctrl[self._grip_act] = self._grip_ctrl
        radius = {"bowl": BOWL_RADIUS + 0.005, "target": TARGET_RADIUS + 0.005}
        heights = {"bowl": 0.0045, "target": 0.0015}
        placed: list[tuple[np.ndarray, float]] = []
        for name, qadr, vadr in zip(OBJECT_NAMES, self._obj_qadr, self._obj_vadr):
            z = TABLE_TOP_Z + heights.get(name, CUBE_HALF + 0.002)
            if placements is not None:  # a task's layout: (x, y, yaw) per object
                x, y, yaw = placements[name]
                d.qpos[qadr:qadr + 3] = [x, y, z]
                d.qpos[qadr + 3:qadr + 7] = _yaw_quat(yaw)
                d.qvel[vadr:vadr + 6] = 0.0
                continue
            r = radius.get(name, CUBE_HALF * np.sqrt(2) + 0.005)
            for _ in range(1000):
                xy = np.array([rng.uniform(*OBJECT_REGION[0]), rng.uniform(*OBJECT_REGION[1])])
                if all(np.linalg.norm(xy - p) > r + pr for p, pr in placed):
                    break
            else:
                raise DeviceError(f"SimFranka: could not place {name!r} without overlap in {OBJECT_REGION}")
            placed.append((xy, r))
            d.qpos[qadr:qadr + 3] = [xy[0], xy[1], z]
            d.qpos[qadr + 3:qadr + 7] = _yaw_quat(rng.uniform(-np.pi, np.pi))
            d.qvel[vadr:vadr + 6] = 0.0
        mujoco.mj_forward(m, d)
        self._step_locked(int(round(self.settle_s * self.physics_hz)))

    def _step_locked(self, n: int) -> None:
        m, d = self.model, self._data
        while n > 0:
            phase = self._substep % self._ik_every
            if phase == 0:
                self._control_tick_locked()
            k = min(n, self._ik_every - phase)
            mujoco.mj_step(m, d, nstep=k)
            self._substep += k
            n -= k

    def _control_tick_locked(self) -> None:
        d = self._data
        q_meas = d.qpos[self._arm_qadr]
        vmax = self._limits.velocity * self._ik_dt
        if self._mode == "joint":
            self._q_des = self._q_des + np.clip(self._q_goal - self._q_des, -vmax, vmax)
        elif self._mode == "ee" and self._ee_target is not None:
            delta = self._ik_delta(self._q_des, *self._ee_target)
            scale = np.max(np.abs(delta) / vmax)
            if scale > 1.0:
                delta = delta / scale
            q = np.clip(self._q_des + delta, q_meas - 0.25, q_meas + 0.25)
            self._q_des = np.clip(q, self._limits.lower, self._limits.upper)
        d.ctrl[:7] = self._q_des
        d.ctrl[self._grip_act] = self._grip_ctrl

    def _ik_delta(self, q0: np.ndarray, pos: np.ndarray, quat: np.ndarray) -> np.ndarray:
        """Damped least-squares IK from ``q0`` towards the tcp pose: the joint step to take."""
        m, kd, jac, dofs = self.model, self._kin, self._jac, self._arm_vadr
        lo, hi = self._limits.lower + 1e-3, self._limits.upper - 1e-3
        q = q0.copy()
        kd.qpos[:] = self._data.qpos
        cur = np.zeros(4)
        err = np.zeros(6)
        for _ in range(self.ik_iters):
            kd.qpos[self._arm_qadr] = q
            mujoco.mj_kinematics(m, kd)
            mujoco.mj_comPos(m, kd)
            err[:3] = pos - kd.site_xpos[self._tcp]
            mujoco.mju_mat2Quat(cur, kd.site_xmat[self._tcp])
            err[3:] = _quat_err(quat, cur)
            for sl, cap in ((slice(0, 3), 0.05), (slice(3, 6), 0.3)):  # clip the error: 5 cm, 0.3 rad
                n = float(np.sqrt(err[sl] @ err[sl]))
                if n > cap:
                    err[sl] *= cap / n
            mujoco.mj_jacSite(m, kd, jac[:3], jac[3:], self._tcp)
            J = jac[:, dofs]
            A = J @ J.T + self._lam2_eye6  # damped: J^T (J J^T + lambda^2 I)^-1 stays bounded near singularities
            q = np.clip(q + J.T @ np.linalg.solve(A, err), lo, hi)
        # Null-space pull towards the home posture (keeps the redundant elbow from drifting).
        null = (HOME_Q - q0) * self._ik_dt
        null -= J.T @ np.linalg.solve(A, J @ null)
        return (q - q0) + null
