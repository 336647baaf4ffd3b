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
    """Return the teleop class registered under ``name`` (with a did-you-mean on typos)."""
    from hardware import load_registered

    return load_registered(TELEOP_REGISTRY, name, "teleop device")
