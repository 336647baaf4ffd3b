"""robot_io and the runtime half of deploy must run on a Raspberry Pi without torch.

Each check runs in a fresh interpreter in which importing torch (or transformers, lerobot, the
vla / policies packages) raises ImportError, as on a machine where they are not installed.
"""

import pkgutil
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


def _modules(pkg: str) -> list[str]:
    return [pkg] + [f"{pkg}.{m.name}" for m in pkgutil.walk_packages([str(ROOT / pkg.replace('.', '/'))])]


@pytest.mark.parametrize("module", _modules("robot_io") + _modules("deploy.runtime"))
def test_imports_without_torch(module):
    code = BLOCKER + f"import {module}\nprint('ok')"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_blocker_really_blocks():
    r = subprocess.run([sys.executable, "-c", BLOCKER + "import vla.cli"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "blocked for this test" in r.stderr
