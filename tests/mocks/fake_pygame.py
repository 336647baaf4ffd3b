"""A fake of the part of ``pygame`` that ``hardware.teleop.gamepad`` uses (display, joystick, event).

Make one per test and pass it as ``GamepadTeleop(..., pygame_module=FakePygame())``. Every public
name on it mirrors pygame 2 (a test checks them against the real pygame when it is installed);
the test controls -- the physical pads and their sticks and buttons -- live under ``.sim`` only.

Real behaviours imitated: ``event.get`` raises ``pygame.error`` while the video subsystem is not
initialised (pygame's event queue needs it, even with the dummy driver); ``Joystick(i)`` raises
before ``joystick.init()`` or for a bad index; a removed pad queues ``JOYDEVICEREMOVED``; events
carry ``instance_id``; triggers rest at -1.
"""

from __future__ import annotations

from typing import Any

# pygame 2 event type numbers (SDL2)
JOYAXISMOTION = 1536
JOYBALLMOTION = 1537
JOYHATMOTION = 1538
JOYBUTTONDOWN = 1539
JOYBUTTONUP = 1540
JOYDEVICEADDED = 1541
JOYDEVICEREMOVED = 1542


class error(RuntimeError):  # noqa: N801 -- pygame's own name
    pass


class Event:
    def __init__(self, type: int, **attrs: Any) -> None:  # noqa: A002 -- pygame's signature
        self.type = type
        self.__dict__.update(attrs)


class FakePad:
    """Test control: one physical controller (Xbox layout on Linux: triggers on axes 2 and 5)."""

    def __init__(self, instance_id: int, name: str = "Xbox 360 Controller", num_axes: int = 6,
                 num_buttons: int = 11) -> None:
        self.instance_id, self.name = instance_id, name
        self.axes = [0.0] * num_axes
        for trigger in (2, 5):
            if trigger < num_axes:
                self.axes[trigger] = -1.0
        self.buttons = [0] * num_buttons
        self.plugged = True


class Sim:
    """Test controls: the pads attached and the event queue they feed."""

    def __init__(self, pads: int) -> None:
        self.pads = [FakePad(instance_id=i) for i in range(pads)]
        self.queue: list[Event] = []
        self.display_init = self.joystick_init = False
        self.open_joysticks: set[int] = set()

    def set_axis(self, axis: int, value: float, pad: int = 0) -> None:
        p = self.pads[pad]
        p.axes[axis] = float(value)
        self.queue.append(Event(JOYAXISMOTION, instance_id=p.instance_id, axis=axis, value=float(value)))

    def press(self, button: int, pad: int = 0) -> None:
        p = self.pads[pad]
        p.buttons[button] = 1
        self.queue.append(Event(JOYBUTTONDOWN, instance_id=p.instance_id, button=button))

    def release(self, button: int, pad: int = 0) -> None:
        p = self.pads[pad]
        p.buttons[button] = 0
        self.queue.append(Event(JOYBUTTONUP, instance_id=p.instance_id, button=button))

    def tap(self, button: int, pad: int = 0) -> None:
        self.press(button, pad)
        self.release(button, pad)

    def unplug(self, pad: int = 0) -> None:
        p = self.pads[pad]
        p.plugged = False
        self.queue.append(Event(JOYDEVICEREMOVED, instance_id=p.instance_id))


class _Display:
    def __init__(self, sim: Sim) -> None:
        self._sim = sim

    def init(self) -> None:
        self._sim.display_init = True

    def quit(self) -> None:
        self._sim.display_init = False

    def get_init(self) -> bool:
        return self._sim.display_init


class _Joystick:
    """pygame.joystick.Joystick (pygame 2: usable once constructed; ``init`` is kept for old code)."""

    def __init__(self, sim: Sim, index: int) -> None:
        if not sim.joystick_init:
            raise error("joystick system not initialized")
        if not 0 <= index < len(sim.pads):
            raise error("Invalid joystick device number")
        self._sim, self._pad = sim, sim.pads[index]
        sim.open_joysticks.add(self._pad.instance_id)

    def _check(self) -> FakePad:
        if not self._sim.joystick_init or self._pad.instance_id not in self._sim.open_joysticks:
            raise error("Joystick not initialized")
        return self._pad

    def init(self) -> None:
        self._sim.open_joysticks.add(self._pad.instance_id)

    def quit(self) -> None:
        self._sim.open_joysticks.discard(self._pad.instance_id)

    def get_init(self) -> bool:
        return self._pad.instance_id in self._sim.open_joysticks

    def get_instance_id(self) -> int:
        return self._pad.instance_id

    def get_name(self) -> str:
        return self._pad.name

    def get_numaxes(self) -> int:
        return len(self._pad.axes)

    def get_numbuttons(self) -> int:
        return len(self._pad.buttons)

    def get_axis(self, axis: int) -> float:
        pad = self._check()
        if not 0 <= axis < len(pad.axes):
            raise error("Invalid joystick axis")
        return pad.axes[axis] if pad.plugged else 0.0

    def get_button(self, button: int) -> bool:
        pad = self._check()
        if not 0 <= button < len(pad.buttons):
            raise error("Invalid joystick button")
        return bool(pad.buttons[button]) if pad.plugged else False


class _JoystickModule:
    def __init__(self, sim: Sim) -> None:
        self._sim = sim
        sim_ref = sim

        class Joystick(_Joystick):
            def __init__(self, index: int) -> None:
                super().__init__(sim_ref, index)

        self.Joystick = Joystick
        self.JoystickType = _Joystick  # pygame 2: Joystick() is a factory returning a JoystickType

    def init(self) -> None:
        self._sim.joystick_init = True

    def quit(self) -> None:
        self._sim.joystick_init = False
        self._sim.open_joysticks.clear()

    def get_init(self) -> bool:
        return self._sim.joystick_init

    def get_count(self) -> int:
        if not self._sim.joystick_init:
            raise error("joystick system not initialized")
        return sum(p.plugged for p in self._sim.pads)


class _EventModule:
    Event = Event

    def __init__(self, sim: Sim) -> None:
        self._sim = sim

    def get(self, eventtype: int | list[int] | None = None, pump: bool = True,
            exclude: int | list[int] | None = None) -> list[Event]:
        if not self._sim.display_init:
            raise error("video system not initialized")
        if eventtype is None:
            taken, self._sim.queue = self._sim.queue, []
            return taken
        types = {eventtype} if isinstance(eventtype, int) else set(eventtype)
        taken = [e for e in self._sim.queue if e.type in types]
        self._sim.queue = [e for e in self._sim.queue if e.type not in types]
        return taken

    def pump(self) -> None:
        if not self._sim.display_init:
            raise error("video system not initialized")


class FakePygame:
    """Stands in for the ``pygame`` module. ``pads``: how many controllers are plugged in."""

    error = error
    JOYAXISMOTION = JOYAXISMOTION
    JOYBALLMOTION = JOYBALLMOTION
    JOYHATMOTION = JOYHATMOTION
    JOYBUTTONDOWN = JOYBUTTONDOWN
    JOYBUTTONUP = JOYBUTTONUP
    JOYDEVICEADDED = JOYDEVICEADDED
    JOYDEVICEREMOVED = JOYDEVICEREMOVED

    def __init__(self, pads: int = 1) -> None:
        self.sim = Sim(pads)
        self.display = _Display(self.sim)
        self.joystick = _JoystickModule(self.sim)
        self.event = _EventModule(self.sim)


def api_names(fake: FakePygame) -> list[str]:
    """Every public dotted name the fake mirrors (``joystick.Joystick.get_axis``, ...), for drift checks."""
    names = []
    for top in (n for n in dir(fake) if not n.startswith("_") and n != "sim"):
        names.append(top)
        obj = getattr(fake, top)
        if top in ("display", "joystick", "event"):
            for sub in (n for n in dir(obj) if not n.startswith("_")):
                names.append(f"{top}.{sub}")
                if sub == "JoystickType":
                    names += [f"{top}.{sub}.{m}" for m in dir(_Joystick) if not m.startswith("_")]
    return names
