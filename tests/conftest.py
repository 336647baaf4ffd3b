import os

# MuJoCo reads MUJOCO_GL at first import: render headless (EGL) in every test.
os.environ.setdefault("MUJOCO_GL", "egl")
