"""Drivers and simulators, one device class per file. No torch here.

``REGISTRY`` maps a site-file ``driver`` name to ``"module:Class"``; classes are imported only
when a site asks for them, so importing ``hardware`` has no side effects and pulls in no
vendor library.
"""

from hardware.base import (Arm, ArmState, Camera, CameraFrame, Device, DeviceError, JointLimits, KeyAck, KeyPresser,
                           Legged, LeggedState, NotConnectedError, Screen, ScreenFrame)

REGISTRY: dict[str, str] = {
    "sim_franka": "hardware.sim_franka:SimFranka",
    "sim_camera": "hardware.sim_camera:SimCamera",
    "synthetic_camera": "hardware.synthetic_camera:SyntheticCamera",
    "null_arm": "hardware.null_arm:NullArm",
    "opencv_camera": "hardware.opencv_camera:OpenCVCamera",
    "realsense_camera": "hardware.realsense_camera:RealSenseCamera",
    "franka": "hardware.franka_franky:FrankyArm",
    "serial_keypresser": "hardware.serial_keypresser:SerialKeyPresser",
    "emulated_keypresser": "hardware.emulated_keypresser:EmulatedKeyPresser",
    "ale_screen": "hardware.ale_screen:AleScreen",
    "screen_camera": "hardware.screen_camera:ScreenCamera",
    "sim_go1": "hardware.sim_go1:SimGo1",
    "go1": "hardware.go1_unitree:UnitreeGo1",
}


def load_registered(registry: dict[str, str], name: str, what: str = "driver") -> type:
    """Import and return the class ``registry`` names ``name`` ("module:Class"), with a
    did-you-mean on typos."""
    import difflib
    import importlib

    if name not in registry:
        close = difflib.get_close_matches(name, registry, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown {what} {name!r}{hint} Known: {', '.join(sorted(registry))}")
    module, cls = registry[name].split(":")
    return getattr(importlib.import_module(module), cls)


def load_driver(name: str) -> type[Device]:
    """Return the device class registered under ``name``."""
    return load_registered(REGISTRY, name, "driver")


__all__ = ["Arm", "ArmState", "Camera", "CameraFrame", "Device", "DeviceError", "JointLimits", "KeyAck",
           "KeyPresser", "Legged", "LeggedState", "NotConnectedError", "REGISTRY", "Screen", "ScreenFrame",
           "load_driver", "load_registered"]
