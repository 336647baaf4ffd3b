"""3Dconnexion SpaceMouse teleop through ``pyspacemouse`` (>= 2.1; HID via easyhid + hidapi).

pyspacemouse is imported inside ``connect()`` (``pip install 'vla-stack[teleop]'``; it needs the
system hidapi library, e.g. ``apt install libhidapi-hidraw0``, and read access to the
``/dev/hidraw*`` node, usually via a udev rule); a test passes a fake module as
``pyspacemouse_module=``.

The device is opened non-blocking in pyspacemouse's right-handed, Z-up axis convention
(``hid_z_up``): +x right, +y away from the operator, +z up; roll / pitch / yaw about those axes,
counter-clockwise positive. Values are about -1..1 at full deflection. The device sends one HID
report per changed channel (translation, rotation, buttons), so each ``read()`` processes every
report queued since the last tick, not only one; a button tapped between two ticks is still seen.
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType
from typing import Any

import numpy as np

from hardware.base import DeviceError
from hardware.teleop.base import Teleop, TeleopCommand

_MAX_REPORTS_PER_READ = 64  # bound on the HID reports processed by one read()


class SpaceMouseTeleop(Teleop):
    """6-DoF end-effector teleop from a SpaceMouse.

    ===============================  ====================================================
    push / pull the cap              translation, up to ``step_m`` per tick at full deflection
    tilt / twist the cap             rotation (axis-angle), up to ``step_rad`` per tick
    button 0 (left)                  toggle the gripper open / closed
    button 1 (right)                 event ``success``
    ===============================  ====================================================

    The SpaceMouse has no other buttons on most models, so ``failure`` / ``rerecord`` / ``stop``
    come from the keyboard or the recorder's own controls.

    Each axis has a ``deadzone`` (rescaled so motion starts smoothly at its edge).
    ``operator_facing_deg``: the direction the operator faces, in the robot base frame, degrees
    counter-clockwise from +x. 0 (default): the operator stands behind the robot looking the way
    it reaches, so pushing the cap away moves the gripper along +x and pushing it right moves
    along -y. 180: the operator faces the robot from the front. The same rotation about z is
    applied to translation and rotation, so both stay consistent.
    ``intervening`` is True while the cap is deflected past the deadzone or a button is held or
    was pressed this tick (always with ``always_intervening=True``).
    """

    def __init__(self, name: str = "", *, step_m: float = 0.01, step_rad: float = 0.05,
                 deadzone: float = 0.1, operator_facing_deg: float = 0.0, always_intervening: bool = False,
                 initial_gripper: float = 1.0, device: str | None = None,
                 pyspacemouse_module: ModuleType | Any | None = None) -> None:
        super().__init__(name)
        if step_m <= 0 or step_rad <= 0:
            raise ValueError(f"spacemouse teleop: step_m and step_rad must be positive, got {step_m}, {step_rad}")
        if not 0.0 <= deadzone < 1.0:
            raise ValueError(f"spacemouse teleop: deadzone must be in [0, 1), got {deadzone}")
        if not 0.0 <= initial_gripper <= 1.0:
            raise ValueError(f"spacemouse teleop: initial_gripper is an opening in [0, 1], got {initial_gripper}")
        self.step_m, self.step_rad, self.deadzone = float(step_m), float(step_rad), float(deadzone)
        self.operator_facing_deg = float(operator_facing_deg)
        self.always_intervening = bool(always_intervening)
        self.initial_gripper = self.gripper = float(initial_gripper)
        self.device_name = device
        # device frame (x right, y away from the operator, z up) -> robot base frame: Rz(facing - 90 deg)
        phi = math.radians(self.operator_facing_deg - 90.0)
        c, s = math.cos(phi), math.sin(phi)
        self._rotation = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
        self._module = pyspacemouse_module
        self._dev: Any = None
        self._buttons: list[int] = []

    # ---------------------------------------------------------------- lifecycle

    def _connect(self) -> None:
        psm = self._module
        if psm is None:
            try:
                psm = importlib.import_module("pyspacemouse")
            except ImportError as e:
                raise DeviceError(f"spacemouse teleop needs pyspacemouse: pip install 'vla-stack[teleop]' ({e})") from e
            except OSError as e:  # easyhid loads the hidapi shared library at import
                raise DeviceError(f"spacemouse teleop: the hidapi library is missing "
                                  f"(apt install libhidapi-hidraw0): {e}") from e
        if not hasattr(psm, "AxisConvention"):
            raise DeviceError("spacemouse teleop needs pyspacemouse >= 2.1 (axis conventions): "
                              "pip install -U 'pyspacemouse>=2.1'")
        try:
            dev = psm.open(device=self.device_name, nonblocking=True, axis_convention=psm.AxisConvention.HID_Z_UP)
        except (RuntimeError, ValueError, OSError) as e:
            raise DeviceError(f"spacemouse teleop {self.name!r}: could not open the SpaceMouse: {e}. Is it "
                              "plugged in, and is /dev/hidraw* readable by this user (udev rule)?") from e
        if not dev:  # pyspacemouse 1.x returned None instead of raising
            raise DeviceError(f"spacemouse teleop {self.name!r}: no SpaceMouse found")
        self._dev = dev
        self._buttons = [int(b) for b in dev.read().buttons]
        self.gripper = self.initial_gripper

    def _disconnect(self) -> None:
        dev, self._dev = self._dev, None
        if dev is not None:
            dev.close()

    # ---------------------------------------------------------------- reading

    def _poll(self) -> tuple[np.ndarray, list[int]]:
        """Process the queued HID reports; return the last axes [6] and the buttons pressed meanwhile."""
        pressed = []
        state = None
        for _ in range(_MAX_REPORTS_PER_READ):
            t_before = None if state is None else float(state.t)
            try:
                state = self._dev.read()  # one report per call; returns the same state object, updated
            except (OSError, RuntimeError) as e:
                raise DeviceError(f"spacemouse teleop {self.name!r}: reading the device failed: {e}") from e
            buttons = [int(b) for b in state.buttons]
            pressed += [i for i, b in enumerate(buttons) if b and not (i < len(self._buttons) and self._buttons[i])]
            self._buttons = buttons
            if t_before is not None and float(state.t) == t_before:  # no new report: queue drained
                break
        axes = np.array([state.x, state.y, state.z, state.roll, state.pitch, state.yaw], float)
        return axes, pressed

    def read(self, obs: dict | None = None, privileged: dict | None = None) -> TeleopCommand:
        self._require_connected()
        axes, pressed = self._poll()
        v = np.clip(axes, -1.0, 1.0)
        v = np.sign(v) * np.maximum(0.0, np.abs(v) - self.deadzone) / (1.0 - self.deadzone)
        events = set()
        for button in pressed:
            if button == 0:
                self.gripper = 0.0 if self.gripper > 0.5 else 1.0
            elif button == 1:
                events.add("success")
        action = np.empty(7, np.float32)
        action[:3] = self._rotation @ v[:3] * self.step_m
        action[3:6] = self._rotation @ v[3:] * self.step_rad
        action[6] = self.gripper
        active = bool(np.any(v != 0.0)) or bool(pressed) or any(self._buttons)
        return TeleopCommand(action, frozenset(events), self.always_intervening or active)

    def begin_episode(self, task: str | None = None, seed: int | None = None, instruction: str = "") -> None:
        """Drop button presses made between episodes; the gripper goes back to ``initial_gripper``."""
        if self._connected:
            self._poll()
        self.gripper = self.initial_gripper

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "step_m": self.step_m, "step_rad": self.step_rad, "deadzone": self.deadzone,
                "operator_facing_deg": self.operator_facing_deg, "always_intervening": self.always_intervening}
