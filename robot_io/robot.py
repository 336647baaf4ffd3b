"""RobotClient: one observation composed from several device streams, and the arm's commands.

An observation (DESIGN.md) is ``{"images": {camera: HxWx3 uint8}, "state": float32 [8],
"instruction": str, "t": {device: capture time ns}}``. The arm state vector is
``[ee_pos(3), ee_quat wxyz(4), gripper(1)]``. The raw last state message (joint positions,
a simulator's privileged object poses) is kept in ``last_state`` for reward hooks; it is not
part of the observation.

Two ways to observe: streaming (real robots, real-time simulation: latest-only readers on each
device's stream) and ``sync=True`` (fast simulation: ask each device for a sample with the
``capture`` command right after the physics advanced).
"""

from __future__ import annotations

import time

import numpy as np

from robot_io.client import BridgeTimeout, CommandError, DeviceClient, StreamReader
from robot_io.site import SiteConfig, load_site
from robot_io.wire import Message

STATE_DIM = 8


def state_vector(msg: Message) -> np.ndarray:
    a = msg.arrays
    return np.concatenate([a["ee_pos"], a["ee_quat"], a["gripper"]]).astype(np.float32)


class RobotClient:
    def __init__(self, site: SiteConfig | str, arm: str | None = None, cameras: list[str] | None = None,
                 sync: bool | None = None, timeout_s: float = 2.0, heartbeat_hz: float | None = 20.0) -> None:
        self.site = load_site(site) if isinstance(site, str) else site
        if sync is None:  # a site whose devices do not stream (fast simulation) is observed on request
            sync = any(not d.streaming or d.stream is None for d in self.site.devices.values())
        self.arm_name = arm or self.site.arm
        if self.arm_name is None:
            raise ValueError(f"site {self.site.name!r} names no arm: set robot.arm in the site file or pass arm=")
        self.camera_names = list(cameras if cameras is not None else self.site.cameras)
        self.sync, self.timeout_s = sync, timeout_s
        keys = self.site.security
        dev = self.site.devices
        self.arm = DeviceClient(_connectable(dev[self.arm_name].command), self.arm_name, timeout_s, keys,
                                heartbeat_hz=heartbeat_hz)
        self.cams = {c: DeviceClient(_connectable(dev[c].command), c, timeout_s, keys) for c in self.camera_names}
        self.readers: dict[str, StreamReader] = {}
        if not sync:
            for n in [self.arm_name, *self.camera_names]:
                if dev[n].stream is None:
                    raise ValueError(f"device {n!r} has no stream endpoint; use sync=True (fast simulation sites)")
                self.readers[n] = StreamReader(_connectable(dev[n].stream), "latest", keys, name=n)
        self.last_state: Message | None = None
        self.description = self.arm.describe()
        if sync:  # the first on-demand render sets up a GL context (seconds on a busy CPU): do it now
            for cl in self.cams.values():
                cl.request("capture", timeout_s=60.0)

    # -- observing ---------------------------------------------------------------------------
    def observe(self, instruction: str = "", newer_than_ns: int = 0, cameras_newer_than_ns: int | None = None) -> dict:
        """Compose one observation. In streaming mode each sample is the newest one stamped after
        ``newer_than_ns`` (waits for it, up to the timeout); ``cameras_newer_than_ns``, when given,
        sets a different bound for the camera frames."""
        cam_bound = newer_than_ns if cameras_newer_than_ns is None else cameras_newer_than_ns
        images, t = {}, {}
        if self.sync:
            st = self.arm.request("capture")
            st.t_mono_ns = st.get("state_t_mono_ns", st.t_mono_ns)
            for c, cl in self.cams.items():
                m = cl.request("capture")
                images[c], t[c] = np.asarray(m.arrays["rgb"]), int(m["frame_t_mono_ns"])
        else:
            st = self.readers[self.arm_name].latest(self.timeout_s, newer_than_ns)
            for c in self.camera_names:
                m = self.readers[c].latest(self.timeout_s, cam_bound)
                images[c], t[c] = np.asarray(m.arrays["rgb"]), m.t_mono_ns
        t[self.arm_name] = st.t_mono_ns
        self.last_state = st
        return {"images": images, "state": state_vector(st), "instruction": instruction, "t": t}

    # -- commands ----------------------------------------------------------------------------
    def ee_delta(self, action: np.ndarray) -> Message:
        return self.arm.request("ee_delta", {"action": np.asarray(action, np.float32).reshape(7)})

    def joint_position(self, q: np.ndarray, gripper: float | None = None) -> Message:
        arrays = {"q": np.asarray(q, np.float32)}
        if gripper is not None:
            arrays["gripper"] = np.array([gripper], np.float32)
        return self.arm.request("joint_position", arrays)

    def reset(self, seed: int | None = None, task: str | None = None, timeout_s: float = 30.0) -> Message:
        meta = {"seed": seed} if task is None else {"seed": seed, "task": task}
        return self.arm.request("reset", timeout_s=timeout_s, **meta)

    def stop(self) -> Message:
        return self.arm.request("stop")

    def ping_all(self) -> dict[str, float]:
        out = {self.arm_name: self.arm.ping()}
        out.update({c: cl.ping() for c, cl in self.cams.items()})
        return out

    def close(self) -> None:
        for r in self.readers.values():
            r.close()
        for c in [self.arm, *self.cams.values()]:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _connectable(endpoint: str) -> str:
    """A server binding tcp://0.0.0.0 or tcp://* is reached on loopback from this machine."""
    return endpoint.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:").replace("tcp://*:", "tcp://127.0.0.1:")


def ping_answer(cl: DeviceClient) -> str:
    """One ping: ``ok``; ``late`` when a bridge still busy (starting on a loaded machine) read the ping after its
    deadline and answered deadline_exceeded (it is alive); ``none`` with no answer in time. Other refusals raise."""
    try:
        cl.ping()
        return "ok"
    except CommandError as e:
        if e.code != "deadline_exceeded":
            raise
        return "late"
    except BridgeTimeout:
        return "none"


def wait_for_bridge(site: SiteConfig, timeout_s: float = 60.0) -> None:
    """Block until every device of the site answers a ping in time (used after starting a server); a late answer
    is asked again."""
    deadline = time.monotonic() + timeout_s
    for name, spec in site.devices.items():
        cl = DeviceClient(_connectable(spec.command), name, 0.5, site.security)
        try:
            while (answer := ping_answer(cl)) != "ok":
                if time.monotonic() > deadline:
                    why = "did not answer" if answer == "none" else "answered each ping after its deadline"
                    raise BridgeTimeout(f"bridge device {name!r} {why} within {timeout_s:.0f} s")
        finally:
            cl.close()
