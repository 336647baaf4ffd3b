"""robot_io and the runtime half of deploy must run on a Raspberry Pi without torch; hardware/
never imports torch either, and neither does calibration/ (the bridge reads calibration files on the Pi).

Each check runs in a fresh interpreter in which importing torch (or transformers, lerobot, the
vla / policies packages) raises ImportError, as on a machine where they are not installed. A
second check imports every module of each package with nothing blocked and asserts that torch and
transformers did not land in ``sys.modules`` (an import guarded by ``try`` would pass the first).
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("torch", "torchvision", "transformers", "lerobot", "diffusers", "peft", "vla", "policies")

BLOCKER = f"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {BLOCKED!r}:
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
"""


TORCH_FREE = ("robot_io", "deploy.runtime", "hardware", "calibration")
CHIP_ONLY = frozenset({"hardware.firmware.code", "hardware.firmware.boot"})
"""Microcontroller programs (CircuitPython: they import usb_hid, usb_cdc, adafruit_hid): not host
modules; tests/hardware/test_firmware.py runs them against stubs of those libraries."""


def _modules(pkg: str) -> list[str]:
    """The package and every host module under it (subpackages included)."""
    out = []
    for f in sorted((ROOT / pkg.replace(".", "/")).rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if ".".join(parts) not in CHIP_ONLY:
            out.append(".".join(parts))
    return out


@pytest.mark.parametrize("module", [m for pkg in TORCH_FREE for m in _modules(pkg)])
def test_imports_without_torch(module):
    code = BLOCKER + f"import {module}\nprint('ok')"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_blocker_really_blocks():
    r = subprocess.run([sys.executable, "-c", BLOCKER + "import vla.cli"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "blocked for this test" in r.stderr


@pytest.mark.parametrize("pkg", TORCH_FREE)
def test_importing_every_module_loads_no_torch(pkg):
    mods = _modules(pkg)
    code = (f"import importlib, sys\nfor m in {mods!r}:\n    importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]", f"importing {pkg} loaded: {r.stdout.strip()[:500]}"
