"""Reach a site's bridge from another process, starting a bridge process for an all-simulated site.

Used by the `vla` commands that drive a robot (record, eval, rl, replay, calibrate, demo), by the
session's worker pools and by tests and benches. The bridge it starts is ``vla bridge serve`` in a
subprocess (a command line, not an import: this module imports nothing above ``robot_io``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from robot_io.client import BridgeTimeout, DeviceClient
from robot_io.robot import _connectable, ping_answer, wait_for_bridge
from robot_io.site import SiteConfig

SIM_DRIVERS = {"sim_franka", "sim_camera", "synthetic_camera"}


class BridgeExited(BridgeTimeout):
    """The bridge process this command started exited before its devices answered (e.g. a port in use)."""


def is_simulated(site: SiteConfig) -> bool:
    """Every device of ``site`` is a simulator (a bridge for it may be started here, and copied onto other ports)."""
    return all(d.driver in SIM_DRIVERS for d in site.devices.values())


def bridge_is_up(site: SiteConfig) -> bool:
    for name, spec in site.devices.items():
        with DeviceClient(_connectable(spec.command), name, 0.3, site.security) as c:
            if ping_answer(c) == "none":  # a late answer (a busy bridge) is an answer
                return False
    return True


@contextlib.contextmanager
def running_bridge(site: SiteConfig, log_path: str, start: str = "auto"):
    """Yield once every device of ``site`` answers. ``start``: ``auto`` starts a bridge process
    for an all-simulated site that is not already served (and stops it afterwards), ``always``
    starts one regardless, ``never`` only waits for an existing one."""
    if start not in ("auto", "always", "never"):
        raise ValueError(f"--serve must be auto, always or never, got {start!r}")
    simulated = is_simulated(site)
    proc = None
    if start == "always" or (start == "auto" and simulated and not bridge_is_up(site)):
        print(f"starting the '{site.name}' bridge (log: {log_path})", flush=True)
        with open(log_path, "w") as log_f:
            proc = subprocess.Popen([sys.executable, "-m", "vla.cli", "bridge", "serve", "--site", site.path,
                                     "--exit-with-parent", str(os.getpid())],
                                    stdout=log_f, stderr=subprocess.STDOUT)
    try:
        wait_s = 120 if proc else 5
        deadline = time.monotonic() + wait_s
        while True:  # in short waits, so that a bridge that exits (e.g. a port in use) is told at once
            try:
                wait_for_bridge(site, timeout_s=2.0)
                break
            except BridgeTimeout as e:
                if proc is not None and proc.poll() is not None:
                    raise BridgeExited(f"the bridge exited with code {proc.returncode}; see {log_path}") from None
                if time.monotonic() < deadline:
                    continue
                if proc is None:
                    raise BridgeTimeout(f"site '{site.name}' is not being served: start it with "
                                        f"`vla bridge serve --site {site.path}`") from None
                raise BridgeTimeout(f"{e.args[0].split(' within ')[0]} within {wait_s} s; see {log_path}") from None
        yield
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
