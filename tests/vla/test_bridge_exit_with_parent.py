"""A sim bridge started by `vla record / eval / rl` (``running_bridge``) stops when its starter dies,
even by SIGKILL: an orphaned bridge would hold the site's ports (the next run would silently join
it) and keep simulating."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.net import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]



def _bridges_of(site: Path) -> list[int]:
    """PIDs of processes whose command line serves ``site``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmd and str(site).encode() in cmd:
            pids.append(int(d.name))
    return pids


def _site_and_starter(tmp_path: Path) -> tuple[Path, str]:
    p = free_ports(2)
    tmp_path.mkdir(parents=True, exist_ok=True)
    site = tmp_path / "site.yaml"
    site.write_text(textwrap.dedent(f"""\
        name: orphan-test
        description: one simulated arm on free ports
        robot: {{arm: arm, cameras: []}}
        devices:
          arm:
            driver: sim_franka
            command: tcp://127.0.0.1:{p[0]}
            stream: tcp://127.0.0.1:{p[1]}
            params: {{realtime: false, seed: 0}}
        """))
    starter = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from robot_io.bridge_process import running_bridge
        from robot_io.site import load_site
        with running_bridge(load_site({str(site)!r}), {str(tmp_path / 'bridge.log')!r}):
            print("up", flush=True)
            time.sleep(600)
    """)
    return site, starter


def test_the_bridge_a_command_started_stops_when_the_command_is_killed(tmp_path):
    site, starter = _site_and_starter(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        lines = [proc.stdout.readline().strip() for _ in range(2)]  # "starting the ... bridge", "up"
        assert lines[-1] == "up", lines
        bridges = _bridges_of(site)
        assert len(bridges) == 1, bridges
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _bridges_of(site):
            time.sleep(0.2)
        left = _bridges_of(site)
        assert not left, f"bridge {left} outlived the process that started it"
        assert "stopping" in (tmp_path / "bridge.log").read_text()
    finally:
        proc.kill()
        for pid in _bridges_of(site):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.e2e  # starters killed during start-up, process trees
def test_a_starter_killed_at_a_random_moment_of_start_up_leaves_no_bridge(tmp_path):
    """Kill the starter at random times (independent of what either process prints): before the
    bridge process exists, while it imports and starts its devices, or once it serves."""
    import random

    rng = random.Random()
    for attempt in range(3):
        site, starter = _site_and_starter(tmp_path / str(attempt))
        delay = rng.uniform(0.0, 4.0)
        proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.DEVNULL, cwd=REPO_ROOT)
        try:
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and _bridges_of(site):
                time.sleep(0.2)
            assert not _bridges_of(site), f"killed after {delay:.2f} s: the bridge outlived its starter"
        finally:
            proc.kill()
            for pid in _bridges_of(site):
                os.kill(pid, signal.SIGKILL)
