"""bench's own tests: MuJoCo renders headless (EGL), as in tests/."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
