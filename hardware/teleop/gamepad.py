"""Gamepad teleop through pygame's joystick API (SDL2), headless: no window is opened.

pygame is imported inside ``connect()`` (``pip install 'vla-stack[teleop]'``); a test passes a fake
module as ``pygame_module=``. The SDL video driver defaults to ``dummy`` (set
``SDL_VIDEODRIVER`` yourself to override) because pygame's event queue needs the video subsystem;
``SDL_JOYSTICK_ALLOW_BACKGROUND_EVENTS=1`` keeps events flowing without a focused window.

Each ``read()`` takes the joystick events queued since the last tick (only joystick events, so a
pygame window elsewhere in the process keeps its own) -- a button tapped between two ticks is
never missed -- and samples the sticks and triggers.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from types import ModuleType
from typing import Any

import numpy as np

from hardware.base import DeviceError
from hardware.teleop.base import Teleop, TeleopCommand


@dataclasses.dataclass(frozen=True)
class GamepadLayout:
    """Axis and button indices of a controller in ``pygame.joystick`` (they depend on OS and driver).

    Sticks read -1..1 with up and left negative; triggers read -1 (released) .. 1 (pressed).
    """

    left_x: int = 0
    left_y: int = 1
    left_trigger: int = 2
    right_x: int = 3
    right_y: int = 4
    right_trigger: int = 5
    a: int = 0
    b: int = 1
    x: int = 2
    y: int = 3
    lb: int = 4
    rb: int = 5
    back: int = 6
    start: int = 7


LAYOUTS: dict[str, GamepadLayout] = {
    # Xbox 360 / One / Series pad on Linux (xpad / evdev through SDL2).
    "xbox": GamepadLayout(),
    # The same pad on Windows (XInput through SDL2): right stick on axes 2/3, triggers on 4/5.
    "xbox_windows": GamepadLayout(right_x=2, right_y=3, left_trigger=4, right_trigger=5),
}


class GamepadTeleop(Teleop):
    """End-effector teleop from a gamepad (Xbox layout).

    ==================================  ==============================================
    left stick up / down                +x / -x (proportional, up to ``step_m``)
    left stick left / right             +y / -y
    right stick up / down               +z / -z
    right stick left / right            yaw - / + (up to ``step_rad``)
    RT (right trigger) pressed          close the gripper
    LT (left trigger) pressed           open the gripper
    A                                   toggle the gripper
    Y                                   event ``success``
    B                                   event ``failure``
    X                                   event ``rerecord``
    Start (Menu)                        event ``stop``
    ==================================  ==============================================

    Sticks have a ``deadzone`` (rescaled so motion starts smoothly at its edge); a trigger counts
    as pressed past ``trigger_threshold`` of its travel. The gripper is a held state: it stays
    where the last A / trigger put it. ``intervening`` is True while a stick is out of its deadzone,
    a trigger is pressed, or A was pressed this tick (always with ``always_intervening=True``).

    ``layout``: a name in :data:`LAYOUTS` or a :class:`GamepadLayout`. ``index``: which joystick.
    A pad unplugged while connected raises :class:`DeviceError` from ``read()``.
    """

    def __init__(self, name: str = "", *, index: int = 0, layout: str | GamepadLayout = "xbox",
                 step_m: float = 0.01, step_rad: float = 0.05, deadzone: float = 0.15,
                 trigger_threshold: float = 0.6, always_intervening: bool = False,
                 initial_gripper: float = 1.0, pygame_module: ModuleType | Any | None = None) -> None:
        super().__init__(name)
        if isinstance(layout, str):
            if layout not in LAYOUTS:
                raise ValueError(f"unknown gamepad layout {layout!r}; known: {', '.join(LAYOUTS)}")
            layout = LAYOUTS[layout]
        if step_m <= 0 or step_rad <= 0:
            raise ValueError(f"gamepad teleop: step_m and step_rad must be positive, got {step_m}, {step_rad}")
        if not 0.0 <= deadzone < 1.0:
            raise ValueError(f"gamepad teleop: deadzone must be in [0, 1), got {deadzone}")
        if not 0.0 < trigger_threshold < 1.0:
            raise ValueError(f"gamepad teleop: trigger_threshold must be in (0, 1), got {trigger_threshold}")
        if not 0.0 <= initial_gripper <= 1.0:
            raise ValueError(f"gamepad teleop: initial_gripper is an opening in [0, 1], got {initial_gripper}")
        self.index, self.layout = int(index), layout
        self.step_m, self.step_rad = float(step_m), float(step_rad)
        self.deadzone, self.trigger_threshold = float(deadzone), float(trigger_threshold)
        self.always_intervening = bool(always_intervening)
        self.initial_gripper = self.gripper = float(initial_gripper)
        self._pygame_module = pygame_module
        self._pg: Any = None
        self._joystick: Any = None
        self._instance_id: int | None = None

    # ---------------------------------------------------------------- lifecycle

    def _connect(self) -> None:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_JOYSTICK_ALLOW_BACKGROUND_EVENTS", "1")
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        pg = self._pygame_module
        if pg is None:
            try:
                pg = importlib.import_module("pygame")
            except ImportError as e:
                raise DeviceError(f"gamepad teleop needs pygame: pip install 'vla-stack[teleop]' ({e})") from e
        self._pg = pg
        try:
            pg.display.init()  # the event queue needs the video subsystem (dummy driver: no window)
            pg.joystick.init()
            count = pg.joystick.get_count()
            if count == 0:
                raise DeviceError("no gamepad found: is it plugged in (`ls /dev/input/js*`) and readable by "
                                  "this user (group 'input')?")
            if not 0 <= self.index < count:
                raise DeviceError(f"gamepad index {self.index} out of range: {count} joystick(s) found")
            js = pg.joystick.Joystick(self.index)
            js.init()
            lay = self.layout
            need_axes = 1 + max(lay.left_x, lay.left_y, lay.right_x, lay.right_y, lay.left_trigger, lay.right_trigger)
            need_buttons = 1 + max(lay.a, lay.b, lay.x, lay.y, lay.lb, lay.rb, lay.back, lay.start)
            if js.get_numaxes() < need_axes or js.get_numbuttons() < need_buttons:
                raise DeviceError(
                    f"gamepad {js.get_name()!r} has {js.get_numaxes()} axes and {js.get_numbuttons()} buttons; "
                    f"the layout needs {need_axes} and {need_buttons}: pick another layout= or pass a GamepadLayout")
            self._joystick, self._instance_id = js, js.get_instance_id()
            pg.event.get(eventtype=self._event_types())  # drop what was queued before connect
        except pg.error as e:
            self._quit()
            raise DeviceError(f"gamepad teleop {self.name!r}: pygame failed: {e}") from e
        except DeviceError:
            self._quit()
            raise
        self.gripper = self.initial_gripper

    def _disconnect(self) -> None:
        self._quit()

    def _quit(self) -> None:
        pg, js = self._pg, self._joystick
        self._joystick = self._instance_id = None
        if js is not None:
            js.quit()
        if pg is not None:
            pg.joystick.quit()
            pg.display.quit()

    def _event_types(self) -> list[int]:
        pg = self._pg
        return [pg.JOYAXISMOTION, pg.JOYBALLMOTION, pg.JOYHATMOTION, pg.JOYBUTTONDOWN, pg.JOYBUTTONUP,
                pg.JOYDEVICEADDED, pg.JOYDEVICEREMOVED]

    # ---------------------------------------------------------------- reading

    def _stick(self, axis: int) -> float:
        v = float(np.clip(self._joystick.get_axis(axis), -1.0, 1.0))
        return float(np.sign(v)) * max(0.0, abs(v) - self.deadzone) / (1.0 - self.deadzone)

    def _trigger(self, axis: int) -> bool:
        return (float(self._joystick.get_axis(axis)) + 1.0) / 2.0 > self.trigger_threshold

    def _button_presses(self) -> list[int]:
        """Buttons pressed since the last call (from the event queue, so short taps count)."""
        pg, pressed = self._pg, []
        for ev in pg.event.get(eventtype=self._event_types()):
            if ev.type == pg.JOYDEVICEREMOVED and ev.instance_id == self._instance_id:
                raise DeviceError(f"gamepad teleop {self.name!r}: the gamepad was unplugged")
            if ev.type == pg.JOYBUTTONDOWN and ev.instance_id == self._instance_id:
                pressed.append(ev.button)
        return pressed

    def read(self, obs: dict | None = None, privileged: dict | None = None) -> TeleopCommand:
        self._require_connected()
        pg, lay = self._pg, self.layout
        try:
            pressed = self._button_presses()
            lx, ly, rx, ry = (self._stick(a) for a in (lay.left_x, lay.left_y, lay.right_x, lay.right_y))
            close, open_ = self._trigger(lay.right_trigger), self._trigger(lay.left_trigger)
        except pg.error as e:
            raise DeviceError(f"gamepad teleop {self.name!r}: pygame failed: {e}") from e

        events = set()
        for button in pressed:
            if button == lay.a:
                self.gripper = 0.0 if self.gripper > 0.5 else 1.0
            elif button == lay.y:
                events.add("success")
            elif button == lay.b:
                events.add("failure")
            elif button == lay.x:
                events.add("rerecord")
            elif button == lay.start:
                events.add("stop")
        if close and not open_:
            self.gripper = 0.0
        elif open_ and not close:
            self.gripper = 1.0

        action = np.zeros(7, np.float32)
        action[0], action[1], action[2] = -ly * self.step_m, -lx * self.step_m, -ry * self.step_m
        action[5] = rx * self.step_rad
        action[6] = self.gripper
        active = bool(np.any(action[:6] != 0.0)) or close or open_ or lay.a in pressed
        return TeleopCommand(action, frozenset(events), self.always_intervening or active)

    def begin_episode(self, task: str | None = None, seed: int | None = None, instruction: str = "") -> None:
        """Drop button presses queued between episodes; the gripper goes back to ``initial_gripper``."""
        if self._connected:
            self._button_presses()
        self.gripper = self.initial_gripper

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "index": self.index, "step_m": self.step_m, "step_rad": self.step_rad,
                "deadzone": self.deadzone, "always_intervening": self.always_intervening}
