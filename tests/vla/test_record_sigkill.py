"""`vla record` SIGKILLed at file-system events, at random moments and at log markers: after
`vla dataset repair`, every episode committed before the kill is in the dataset with exactly one
outcome row, lerobot opens the dataset and its videos decode, and `vla record` appends to it.

The recorders drive the simulated Franka through one bridge this module starts (private ports,
64 px cameras, so other users of the default sim ports do not interfere) and run with
``--serve never``, each in its own process group. The default-run tests fork them from a
pre-imported "zygote" process (importing torch + lerobot takes seconds on 2 cores, forking
takes ms); the slow test starts a cold ``python -m vla.cli record`` per trial.

Fault timing never depends on what the recorder prints, except in the "marker" mode, whose
point is to kill at a progress-bar update. The file-system modes poll the dataset every ms and
kill within a few ms of the event (the episode's ``meta/episodes`` file appearing -- its commit
--, a data parquet, a video, ``info.json`` replaced, a row appended to the episode log). What
counts as "saved" is read from disk just before the kill: the committed ``meta/episodes`` files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.net import free_ports

pytest.importorskip("lerobot")

from vla.cli import main  # noqa: E402
from vla.data import check_dataset, repair_dataset  # noqa: E402
from vla.data.episode_log import EPISODE_LOG_PATH  # noqa: E402
from vla.data.integrity import TRASH_DIR  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 12  # frames per episode (the scripted expert never finishes in 12 ticks: failures, kept)
WATCHDOG_MS = 1000
"""The site's command_timeout_ms. A killed recorder leaves the arm owned by a dead client until
the bridge's watchdog trips; the next recorder starts after that (``_after_watchdog``)."""
_LAST_KILL = [0.0]


def _after_watchdog() -> None:
    time.sleep(max(0.0, _LAST_KILL[0] + WATCHDOG_MS / 1e3 + 0.5 - time.monotonic()))

# Runs one `vla record` (argv in a JSON job) in this process and exits. A job may carry a kill
# hook: SIGKILL the process group right before / after the n-th os.replace onto a matching path
# (the dataset writer puts every file in place with os.replace), to kill at an exact point.
CHILD = r'''
import json, os, re, signal, sys, traceback

def run_job(job):
    out = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    kill = job.get("kill")
    if kill:
        pattern, when, nth = re.compile(kill["dst"]), kill["when"], kill.get("nth", 1)
        real, hits = os.replace, [0]

        def replace(src, dst, *args, **kwargs):
            hit = pattern.search(os.fspath(dst)) is not None
            hits[0] += hit
            if hit and hits[0] == nth and when == "before":
                os.killpg(0, signal.SIGKILL)
            real(src, dst, *args, **kwargs)
            if hit and hits[0] == nth and when == "after":
                os.killpg(0, signal.SIGKILL)

        os.replace = replace
    from vla.cli import main
    try:
        rc = main(job["argv"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        rc = 99
    sys.stdout.flush()
    sys.stderr.flush()
    with open(job["rc"], "w") as f:
        f.write(str(rc))
    os._exit(0)
'''

ZYGOTE = CHILD + r'''
import lerobot.datasets.lerobot_dataset, av, tqdm  # the slow imports, done once
import vla.cli, vla.commands.record, vla.data.integrity, vla.data.recording
import robot_io.env, robot_io.robot, robot_io.site, hardware.teleop, hardware.sim_tasks, rewards.sim_success
print("ZYGOTE READY", flush=True)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed children are reaped automatically
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()  # its own process group, killed as a whole
        run_job(job)
    print(pid, flush=True)
'''


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "HF_HUB_OFFLINE": "1"}



@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """A simulated Franka site on free ports with 64 px cameras, served for the whole module."""
    from robot_io.robot import wait_for_bridge
    from robot_io.site import load_site

    folder = tmp_path_factory.mktemp("site")
    p = free_ports(4)
    path = folder / "site.yaml"
    path.write_text(f"""\
name: sigkill-test
description: the fast simulated Franka with small cameras, for the recorder's kill tests
robot: {{arm: arm, cameras: [front, wrist]}}
devices:
  arm:
    driver: sim_franka
    command: tcp://127.0.0.1:{p[0]}
    stream: tcp://127.0.0.1:{p[1]}
    command_timeout_ms: {WATCHDOG_MS}
    params: {{realtime: false, seed: 0}}
  front:
    driver: sim_camera
    command: tcp://127.0.0.1:{p[2]}
    streaming: false
    params: {{sim: "@arm", camera: front, width: 64, height: 64, fps: 30}}
  wrist:
    driver: sim_camera
    command: tcp://127.0.0.1:{p[3]}
    streaming: false
    params: {{sim: "@arm", camera: wrist, width: 64, height: 64, fps: 30}}
""")
    with open(folder / "bridge.log", "w") as log:
        bridge = subprocess.Popen([sys.executable, "-m", "vla.cli", "bridge", "serve", "--site", str(path)],
                                  stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=_env(),
                                  start_new_session=True)
    try:
        wait_for_bridge(load_site(str(path)), timeout_s=120)
        yield str(path)
    finally:
        bridge.terminate()
        try:
            bridge.wait(timeout=10)
        except subprocess.TimeoutExpired:
            bridge.kill()
            bridge.wait(timeout=10)


def record_argv(site: str, root: Path, episodes: int, seed: int = 0) -> list[str]:
    return ["record", "--robot", site, "--serve", "never", "--task", "pick_red_cube", "--teleop", "scripted",
            "--episodes", str(episodes), "--max-steps", str(MAX_STEPS), "--keep-failures", "--seed", str(seed),
            "--root", str(root)]


class Recorder:
    """One `vla record` process (group): ``done()``, ``rc`` (None when it was killed), ``kill()``."""

    def __init__(self, pid: int, job: dict, popen: subprocess.Popen | None = None) -> None:
        self.pid, self.job, self.popen = pid, job, popen
        self.started = time.monotonic()

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> float:
        """SIGKILL the process group; returns the monotonic time the signal was sent."""
        with contextlib.suppress(ProcessLookupError):  # the recorder may have finished on its own already
            os.killpg(self.pid, signal.SIGKILL)
        sent = time.monotonic()
        self.wait(10)
        return sent

    def wait(self, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() > deadline:
                raise AssertionError(f"recorder {self.pid} still running after {timeout_s} s:\n{self.output()[-3000:]}")
            time.sleep(0.005)
        if self.rc is None:
            _LAST_KILL[0] = time.monotonic()
        return self.rc

    @property
    def rc(self) -> int | None:
        path = Path(self.job["rc"])
        return int(path.read_text()) if path.exists() else None

    def output(self) -> str:
        path = Path(self.job["out"])
        return path.read_text(errors="replace") if path.exists() else ""


def _job(argv: list[str], folder: Path, name: str, kill: dict | None = None) -> dict:
    return {"argv": argv, "out": str(folder / f"{name}.out"), "rc": str(folder / f"{name}.rc"), "kill": kill}


@pytest.fixture(scope="module")
def zygote():
    # -W: numpy's BLAS and pyarrow start idle native threads at import, so Python warns about
    # fork(); the children only run a fresh `vla record` (test_record_crash.py's zygote does the same)
    proc = subprocess.Popen([sys.executable, "-W", "ignore::DeprecationWarning", "-c", ZYGOTE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=_env())
    assert proc.stdout.readline().strip() == "ZYGOTE READY"

    def start(job: dict) -> Recorder:
        _after_watchdog()
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()
        return Recorder(int(proc.stdout.readline()), job)

    yield start
    proc.stdin.close()
    proc.wait(timeout=30)


def cold_start(job: dict) -> Recorder:
    _after_watchdog()
    code = CHILD + "\nrun_job(json.loads(sys.argv[1]))\n"
    popen = subprocess.Popen([sys.executable, "-c", code, json.dumps(job)], cwd=REPO_ROOT, env=_env(),
                             stdin=subprocess.DEVNULL, start_new_session=True)
    return Recorder(popen.pid, job, popen)


# ------------------------------------------------------------------------------------------
# What must hold after a kill
# ------------------------------------------------------------------------------------------


def _committed_files(root: Path) -> set[str]:
    """The episodes' commit points on disk: complete ``meta/episodes`` files (renamed into place)."""
    try:
        return {n for n in os.listdir(root / "meta/episodes/chunk-000") if re.fullmatch(r"file-\d+\.parquet", n)}
    except FileNotFoundError:
        return set()


def _episodes_in(root: Path, files: set[str]) -> set[int]:
    return {int(i) for n in files for i in pq.read_table(root / "meta/episodes/chunk-000" / n,
                                                          columns=["episode_index"])["episode_index"].to_pylist()}


def assert_repaired_and_consistent(root: Path, saved: set[int]) -> dict:
    """Repair, then: the dataset checks (every file, lerobot loads the first and last frame of
    every episode, videos decode), every saved episode is in it, and the episode log has exactly
    one complete row per episode -- read line by line here, not through the reader under test."""
    report = repair_dataset(root)
    assert report.ok, str(report)
    if not (root / "meta/info.json").exists():  # killed while creating it: reset, nothing was saved
        assert not saved and any(a.startswith("reset") for a in report.actions), (saved, str(report))
        return {"episodes": 0, "actions": report.actions}
    check = check_dataset(root)
    assert check.ok, str(check)
    assert saved <= set(range(check.episodes)), (saved, check.episodes)
    lengths = {}
    for path in sorted((root / "meta/episodes").glob("*/*.parquet")):
        table = pq.read_table(path, columns=["episode_index", "length"])
        lengths.update(zip(table["episode_index"].to_pylist(), table["length"].to_pylist()))
    lines = [line for line in (root / EPISODE_LOG_PATH).read_text().splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines]  # every line is a whole row
    assert sorted(r["episode_index"] for r in rows) == list(range(check.episodes)), rows
    for r in rows:  # and the row is its episode's (the restored rows too)
        assert r["frames"] == lengths[r["episode_index"]], (r, lengths)
        assert r["task"] == "pick_red_cube" and r["success"] is False
    return {"episodes": check.episodes, "actions": report.actions}


# ------------------------------------------------------------------------------------------
# Exact kill points
# ------------------------------------------------------------------------------------------


def test_kill_right_after_an_episode_commits_keeps_its_outcome_row(zygote, site, tmp_path):
    """Issue 12: SIGKILL right after episode 1's meta/episodes file lands (the commit), before
    the recorder could log its outcome. Repair must give it its row (or drop it); training with
    --success-only and the RL demo loader must then accept the dataset."""
    root = tmp_path / "ds"
    rec = zygote(_job(record_argv(site, root, 3), tmp_path, "killed",
                      kill={"dst": r"meta/episodes/chunk-000/file-001\.parquet$", "when": "after"}))
    assert rec.wait(120) is None, rec.output()[-3000:]  # killed by its hook
    saved = _episodes_in(root, _committed_files(root))
    assert saved == {0, 1}
    result = assert_repaired_and_consistent(root, saved)
    assert result["episodes"] == 2, result
    from vla.data.demos import load_demos

    assert load_demos([str(root)], 32, progress=False, success_only=True) == []  # every outcome known: all failures
    rec = zygote(_job(record_argv(site, root, 2, seed=5), tmp_path, "again"))
    assert rec.wait(120) == 0, rec.output()[-3000:]
    assert assert_repaired_and_consistent(root, set())["episodes"] == 4


def test_kill_during_dataset_creation_leaves_a_root_record_and_repair_accept(zygote, site, tmp_path):
    """Issue 12: SIGKILL while the dataset is being created (right before its info.json is put
    in place). `vla dataset repair` must reset the root (exit 0) and `vla record` must just work
    in it, with or without that repair."""
    root = tmp_path / "ds"
    rec = zygote(_job(record_argv(site, root, 2), tmp_path, "killed",
                      kill={"dst": r"/meta/info\.json$", "when": "before"}))
    assert rec.wait(120) is None, rec.output()[-3000:]
    assert root.exists() and not (root / "meta/info.json").exists()
    repaired = tmp_path / "repaired"
    shutil.copytree(root, repaired)
    assert main(["dataset", "repair", "--root", str(repaired)]) == 0
    assert (repaired / TRASH_DIR).exists()
    legacy = tmp_path / "legacy"  # what the recorder before issue 12 left: only the temp info.json
    (legacy / "meta").mkdir(parents=True)
    (legacy / "meta/.info.json.4242.tmp").write_text('{"codebase_version": "v3.0", "fps": 1')

    for target in (root, repaired, legacy):
        rec = zygote(_job(record_argv(site, target, 1), tmp_path, f"record-{target.name}"))
        assert rec.wait(120) == 0, rec.output()[-3000:]
        assert assert_repaired_and_consistent(target, set())["episodes"] == 1


# ------------------------------------------------------------------------------------------
# Kills at file-system events, random moments and log markers
# ------------------------------------------------------------------------------------------

_DIRS = {"meta": "meta/episodes/chunk-000", "data": "data/chunk-000",
         "video": "videos/observation.images.front/chunk-000"}


def _snapshot(root: Path) -> dict:
    snap: dict = {"root": root.exists()}
    for key, rel in _DIRS.items():
        try:
            snap[key] = frozenset(n for n in os.listdir(root / rel) if not n.startswith("."))
        except FileNotFoundError:
            snap[key] = frozenset()
    for key, rel in (("info", "meta/info.json"), ("log", EPISODE_LOG_PATH)):
        try:
            st = os.stat(root / rel)
            snap[key] = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            snap[key] = None
    return snap


_PROGRESS = re.compile(r"episodes:\s+\d+%\|[^|]*\|\s*(\d+)/\d+")


def _run_trials(start, site: str, tmp_path: Path, modes: list[str], seed: int, random_span_s: float) -> dict:
    """One recorder per mode, all on one dataset (each appends to what the previous kill left,
    as a lab does); each is SIGKILLed when its mode's event happens, then the dataset is checked
    on a copy (repair, check, one row per episode). "random" kills at a uniform moment within
    twice the median time recorders took to commit their first episode (``random_span_s``
    until one was seen)."""
    rng = np.random.default_rng(seed)
    root = tmp_path / "ds"
    saved: set[int] = set()
    stats: dict = {"killed": {}, "finished_unkilled": 0, "detect_to_kill_ms": [], "repairs": {}}
    first_commit_s: list[float] = []
    for trial, mode in enumerate(modes):
        nth = int(rng.integers(1, 3))  # the first or the second such event of this recorder
        rec = start(_job(record_argv(site, root, 3, seed=100 * trial), tmp_path, f"trial{trial}"))
        first = prev = _snapshot(root)
        events = 0
        span = 2 * float(np.median(first_commit_s)) if first_commit_s else random_span_s
        deadline = rec.started + float(rng.uniform(0.0, span)) if mode == "random" else None
        fired, committed_seen = False, False
        while rec.alive():
            snap = _snapshot(root)
            if not committed_seen and snap["meta"] - first["meta"]:
                committed_seen = True
                first_commit_s.append(time.monotonic() - rec.started)
            if mode == "root":
                fired = snap["root"] and not first["root"] or (first["root"] and bool(snap["meta"] - first["meta"]))
            elif mode in ("meta", "data", "video"):
                fired = len(snap[mode] - first[mode]) >= nth
            elif mode in ("info", "log"):
                events += snap[mode] != prev[mode]
                fired = events >= nth
            elif mode == "random":
                fired = time.monotonic() >= deadline
            elif mode == "marker":
                counts = _PROGRESS.findall(rec.output())
                fired = bool(counts) and int(counts[-1]) >= nth
            else:
                raise ValueError(mode)
            prev = snap
            if fired:
                t_detect = time.monotonic()
                committed = _committed_files(root)  # on disk before the kill: these were saved
                stats["detect_to_kill_ms"].append((rec.kill() - t_detect) * 1e3)
                break
            if time.monotonic() - rec.started > 300:
                rec.kill()
                raise AssertionError(f"trial {trial} ({mode}) ran for 300 s:\n{rec.output()[-3000:]}")
            time.sleep(0.001)
        if fired:
            stats["killed"][mode] = stats["killed"].get(mode, 0) + 1
        else:  # the recorder finished before its event: then it must have succeeded
            assert rec.rc == 0, rec.output()[-3000:]
            stats["finished_unkilled"] += 1
            stats.setdefault("unkilled_run_s", []).append(round(time.monotonic() - rec.started, 1))
            committed = _committed_files(root)
        saved |= _episodes_in(root, committed)
        copy = tmp_path / f"check{trial}"
        shutil.copytree(root, copy)
        result = assert_repaired_and_consistent(copy, saved)
        for action in result["actions"]:
            reason = action.split(": ", 1)[-1] if action.startswith("moved") else action.split(" ", 1)[0]
            stats["repairs"][reason] = stats["repairs"].get(reason, 0) + 1
        shutil.rmtree(copy)
    # the dataset the last kill left: a recorder appends to it, and it finishes cleanly
    shutil.copytree(root, tmp_path / "final_check")
    before = assert_repaired_and_consistent(tmp_path / "final_check", saved)
    rec = start(_job(record_argv(site, root, 2, seed=999), tmp_path, "final"))
    assert rec.wait(300) == 0, rec.output()[-3000:]
    after = assert_repaired_and_consistent(root, saved)
    assert after["episodes"] == before["episodes"] + 2
    stats["saved"], stats["episodes"] = len(saved), after["episodes"]
    stats["detect_to_kill_ms"] = round(max(stats["detect_to_kill_ms"], default=0.0), 1)
    return stats


@pytest.mark.timeout(240)
def test_sigkill_at_file_events_random_moments_and_markers(zygote, site, tmp_path):
    t0 = time.monotonic()
    result = _run_trials(zygote, site, tmp_path, ["meta", "random", "marker"], seed=12, random_span_s=4.0)
    print(f"record kill trials ({time.monotonic() - t0:.1f} s):", result)
    assert result["killed"].get("meta") == 1, result  # the kill point was really hit
    assert result["saved"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkill_cold_recorders_many_trials(site, tmp_path):
    modes = ["root"] + ["meta", "data", "video", "info", "log", "random", "marker"] * 3
    t0 = time.monotonic()
    result = _run_trials(cold_start, site, tmp_path, modes, seed=2024, random_span_s=14.0)
    print(f"record kill trials ({time.monotonic() - t0:.1f} s):", result)
    assert len(modes) >= 20
    assert sum(result["killed"].values()) >= 18, result
    assert result["killed"].get("meta", 0) >= 2 and result["killed"].get("log", 0) >= 2, result
