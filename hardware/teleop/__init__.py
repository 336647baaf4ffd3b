"""Teleoperation devices behind one ``Teleop`` interface (hardware.teleop.base).

Registry: name -> "module:Class", imported on use (no import-time side effects, no vendor
library imported until a device is made).
"""

TELEOP_REGISTRY: dict[str, str] = {
    "keyboard": "hardware.teleop.keyboard:KeyboardTeleop",
    "gamepad": "hardware.teleop.gamepad:GamepadTeleop",
    "spacemouse": "hardware.teleop.spacemouse:SpaceMouseTeleop",
    "scripted": "hardware.teleop.scripted:ScriptedExpert",
}


def load_teleop(name: str):
    import difflib
    import importlib

    if name not in TELEOP_REGISTRY:
        close = difflib.get_close_matches(name, TELEOP_REGISTRY, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown teleop device {name!r}{hint} Known: {', '.join(sorted(TELEOP_REGISTRY))}")
    module, cls = TELEOP_REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)
