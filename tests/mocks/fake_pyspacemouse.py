"""A fake of the part of ``pyspacemouse`` (2.x) that ``hardware.teleop.spacemouse`` uses.

Make one per test and pass it as ``SpaceMouseTeleop(..., pyspacemouse_module=FakePySpaceMouse())``.
Its public names mirror pyspacemouse 2.1 (a test checks them, and ``open``'s keyword arguments,
against the real package when it is installed); the test controls live under ``.sim`` only.

Real behaviours imitated: ``open()`` raises RuntimeError when no device is connected; the device
processes **one HID report per** ``read()`` (a report updates either the translation, the rotation
or the buttons) and returns the **same** mutable state object every time, whose ``t`` changes only
when a report was processed; after ``close()``, ``read()`` returns the stale state.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from typing import Any


class AxisConvention(str, enum.Enum):
    LEGACY = "legacy"
    HID = "hid"
    HID_Z_UP = "hid_z_up"
    ROS = "ros"
    UNITY = "unity"


@dataclasses.dataclass
class SpaceMouseState:
    t: float = -1.0
    x: float = 0.0
    y: float = 0.0
    z: float = 0.0
    roll: float = 0.0
    pitch: float = 0.0
    yaw: float = 0.0
    buttons: list = dataclasses.field(default_factory=list)


class Sim:
    """Test controls: whether a device is plugged in, and the HID reports it will send."""

    def __init__(self, connected: bool = True, num_buttons: int = 2) -> None:
        self.connected = connected
        self.num_buttons = num_buttons
        self.reports: list[dict[str, Any]] = []
        self.open_kwargs: dict[str, Any] | None = None
        self.device: SpaceMouseDevice | None = None
        self.read_error: Exception | None = None
        self._clock = itertools.count(1)

    def move(self, **axes: float) -> None:
        """Queue the reports a deflection sends: one for translation, one for rotation (as the real device)."""
        trans = {k: v for k, v in axes.items() if k in ("x", "y", "z")}
        rot = {k: v for k, v in axes.items() if k in ("roll", "pitch", "yaw")}
        for report in (trans, rot):
            if report:
                self.reports.append(report)

    def buttons(self, *pressed: int) -> None:
        """Queue a button report with these buttons held (the others released)."""
        self.reports.append({"buttons": [int(i in pressed) for i in range(self.num_buttons)]})

    def tap(self, button: int) -> None:
        self.buttons(button)
        self.buttons()


class SpaceMouseDevice:
    def __init__(self, sim: Sim) -> None:
        self._sim = sim
        self._state = SpaceMouseState(buttons=[0] * sim.num_buttons)
        self._open = True

    @property
    def connected(self) -> bool:
        return self._open

    def read(self) -> SpaceMouseState:
        if not self._open:
            return self._state
        if self._sim.read_error is not None:
            raise self._sim.read_error
        if self._sim.reports:
            for k, v in self._sim.reports.pop(0).items():
                setattr(self._state, k, list(v) if k == "buttons" else float(v))
            self._state.t = float(next(self._sim._clock))
        return self._state

    def close(self) -> None:
        self._open = False


class FakePySpaceMouse:
    """Stands in for the ``pyspacemouse`` module."""

    AxisConvention = AxisConvention
    SpaceMouseState = SpaceMouseState
    SpaceMouseDevice = SpaceMouseDevice

    def __init__(self, connected: bool = True, num_buttons: int = 2) -> None:
        self.sim = Sim(connected, num_buttons)

    def open(self, callback=None, dof_callback=None, dof_callbacks=None, button_callback=None,  # noqa: A003
             button_callbacks=None, nonblocking=True, device=None, device_index=0, device_spec=None,
             axis_convention=None) -> SpaceMouseDevice:
        if not self.sim.connected:
            raise RuntimeError("No connected or supported devices found.")
        self.sim.open_kwargs = {"nonblocking": nonblocking, "device": device, "axis_convention": axis_convention}
        self.sim.device = SpaceMouseDevice(self.sim)
        return self.sim.device


API_NAMES = ("open", "AxisConvention", "SpaceMouseState", "SpaceMouseDevice")
"""The public names the fake mirrors (checked against the real package when installed)."""
