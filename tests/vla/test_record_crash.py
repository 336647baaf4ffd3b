"""A recorder SIGKILLed at random moments never loses a saved episode, and repair always
leaves a dataset lerobot opens. Plus repair on hand-made damage.

The fast crash test forks its recorders from one pre-imported "zygote" process (importing
torch + lerobot takes ~5 s on 2 cores, forking takes ms); the slow variant starts a cold
``python -c`` process for every trial.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("lerobot")

from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

from vla.data import EpisodeWriter, check_dataset, make_features, repair_dataset  # noqa: E402
from vla.data.integrity import TRASH_DIR  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
FPS = 30

# The recorder: writes episodes in a loop, says SAVING before and SAVED after save_episode.
# observation.state = [episode index, frame index, ...] so the test can tell episodes apart.
RECORDER = r'''
import sys, time
import numpy as np
from vla.data import EpisodeWriter, make_features

def record(root, log_path, size, frames, max_episodes):
    log = open(log_path, "a", buffering=1)
    cams = {"front": (size, size), "wrist": (size, size)}
    writer = EpisodeWriter(root, "local/crash", 30, make_features(cams))
    ep = writer.num_episodes
    log.write(f"READY {ep}\n")
    rng = np.random.default_rng(ep)
    while ep < max_episodes:
        for i in range(frames):
            frame = {f"observation.images.{c}": rng.integers(0, 255, (size, size, 3), dtype=np.uint8) for c in cams}
            frame["observation.state"] = np.array([ep, i, 0, 0, 0, 0, 0, 0], np.float32)
            frame["action"] = np.zeros(7, np.float32)
            frame["intervention"] = False
            frame["observation.capture_time"] = i / 30
            writer.add_frame(frame, task=f"task {ep % 3}")
        log.write(f"SAVING {ep}\n")
        t0 = time.monotonic()
        saved = writer.save_episode()
        log.write(f"SAVED {saved} {time.monotonic() - t0:.3f}\n")
        ep = saved + 1
    writer.close()
    log.write("DONE\n")
'''

ZYGOTE = RECORDER + r'''
import os, signal
import lerobot.datasets.lerobot_dataset  # the slow imports, done once
print("ZYGOTE READY", flush=True)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed children are reaped automatically
for line in sys.stdin:
    root, log_path, size, frames, max_episodes = line.split()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        try:
            record(root, log_path, int(size), int(frames), int(max_episodes))
        finally:
            os._exit(0)
    print(pid, flush=True)
'''


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _log_lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _wait_for(log: Path, predicate, timeout_s: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = _log_lines(log)
        if predicate(lines):
            return lines
        time.sleep(0.001)
    raise AssertionError(f"recorder log {log} never reached the expected state: {_log_lines(log)}")


def _kill_and_wait(pid: int) -> None:
    """SIGKILL a zygote-forked recorder (the zygote reaps it) and wait until it is gone."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.005)
    raise AssertionError(f"recorder {pid} did not die")


def _assert_recoverable(root: Path, saved: set[int], frames: int) -> dict:
    """Repair, then lerobot opens the dataset and loads the first and last frame of every
    episode (check_dataset), and every episode reported SAVED is there with its own rows."""
    report = repair_dataset(root)
    assert report.ok, str(report)
    check = check_dataset(root)
    assert check.ok, str(check)
    assert all(ep < check.episodes for ep in saved), (saved, check.episodes)
    for ep in saved:
        table = pq.read_table(root / f"data/chunk-000/file-{ep:03d}.parquet", columns=["episode_index", "observation.state"])
        state = np.stack(table["observation.state"].to_numpy(zero_copy_only=False))
        assert table.num_rows == frames and set(table["episode_index"].to_pylist()) == {ep}
        np.testing.assert_array_equal(state[:, :2], [[ep, i] for i in range(frames)])
    return {"repair_actions": report.actions, "episodes": check.episodes}


def _run_crash_trials(tmp_path: Path, trials: int, size: int, frames: int, seed: int, start) -> dict:
    """``trials`` recorders on one dataset, each killed at a random moment; each resumes the
    dataset the previous one left (EpisodeWriter repairs it first), the lab's real workflow."""
    rng = np.random.default_rng(seed)
    root = tmp_path / "ds"
    saved: set[int] = set()
    stats = {"during_save": 0, "during_frames": 0, "right_after_saved": 0, "repairs": {}}
    save_s = [0.3]  # measured save_episode durations; kills during save spread over the longest
    for trial in range(trials):
        log = tmp_path / f"trial{trial}.log"
        kill = start(root, log, size, frames)
        ready = _wait_for(log, lambda lines: any(l.startswith("READY") for l in lines))
        first = int(next(l for l in ready if l.startswith("READY")).split()[1])
        target = first + int(rng.integers(0, 2))  # episode during which the kill lands
        mode = ["during_save", "during_save", "during_frames", "right_after_saved"][int(rng.integers(0, 4))]
        if mode == "during_save":
            _wait_for(log, lambda lines: f"SAVING {target}" in lines)
            time.sleep(float(rng.uniform(0.0, max(save_s))))
        elif mode == "right_after_saved":
            _wait_for(log, lambda lines: any(l.startswith(f"SAVED {target} ") for l in lines))
        else:
            _wait_for(log, lambda lines: target == first or any(l.startswith(f"SAVED {target - 1} ") for l in lines))
            time.sleep(float(rng.uniform(0.0, 0.1)))
        kill()
        lines = _log_lines(log)
        trial_saved = {int(l.split()[1]) for l in lines if l.startswith("SAVED")}
        save_s += [float(l.split()[2]) for l in lines if l.startswith("SAVED")]
        # where the kill landed, from the recorder's last word
        last = lines[-1].split()[0]
        stats["during_save" if last == "SAVING" else "during_frames"] += 1
        stats["right_after_saved"] += int(mode == "right_after_saved")
        saved |= trial_saved
        # check on a copy, so the next recorder resumes the raw crash leftovers itself
        copy = tmp_path / f"check{trial}"
        shutil.copytree(root, copy)
        repaired = _assert_recoverable(copy, saved, frames)
        for action in repaired["repair_actions"]:  # tally what repair had to do, by reason
            reason = action.split(": ", 1)[-1] if action.startswith("moved") else action.split(" ", 1)[0]
            stats["repairs"][reason] = stats["repairs"].get(reason, 0) + 1
        shutil.rmtree(copy)
    final = _assert_recoverable(root, saved, frames)
    return {**stats, "saved": len(saved), "episodes": final["episodes"]}


@pytest.fixture(scope="module")
def zygote():
    proc = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=_env()
    )
    assert proc.stdout.readline().strip() == "ZYGOTE READY"

    def start(root: Path, log: Path, size: int, frames: int):
        proc.stdin.write(f"{root} {log} {size} {frames} 1000\n")
        proc.stdin.flush()
        pid = int(proc.stdout.readline())
        return lambda: _kill_and_wait(pid)

    yield start
    proc.stdin.close()
    proc.wait(timeout=10)


@pytest.mark.e2e  # SIGKILLed recorder processes (the fast tier keeps tests/vla/test_record_sigkill.py)
def test_sigkill_never_loses_a_saved_episode(tmp_path, zygote):
    result = _run_crash_trials(tmp_path, trials=10, size=32, frames=10, seed=1234, start=zygote)
    print("crash trials:", result)
    assert result["during_save"] >= 3, result  # the kills really land inside save_episode
    assert result["saved"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_sigkill_cold_processes_bigger_frames(tmp_path):
    procs = []

    def start(root: Path, log: Path, size: int, frames: int):
        code = RECORDER + f"\nrecord({str(root)!r}, {str(log)!r}, {size}, {frames}, 1000)\n"
        procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, env=_env()))

        def kill() -> None:
            procs[-1].send_signal(signal.SIGKILL)
            procs[-1].wait(timeout=10)

        return kill

    try:
        result = _run_crash_trials(tmp_path, trials=20, size=160, frames=45, seed=99, start=start)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    print("crash trials:", result)
    assert result["during_save"] >= 6, result


# ------------------------------------------------------------------------------------------
# Repair on hand-made damage
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("template") / "ds"
    with EpisodeWriter(root, "local/crash", FPS, make_features({"front": (32, 32), "wrist": (32, 32)})) as writer:
        for ep in range(3):
            for i in range(8):
                writer.add_frame(
                    {
                        "observation.images.front": np.full((32, 32, 3), 10 * i, np.uint8),
                        "observation.images.wrist": np.full((32, 32, 3), 200 - 10 * i, np.uint8),
                        "observation.state": np.array([ep, i, 0, 0, 0, 0, 0, 0], np.float32),
                        "action": np.zeros(7, np.float32),
                        "intervention": False,
                        "observation.capture_time": i / FPS,
                    },
                    task=f"task {ep}",
                )
            writer.save_episode()
    assert check_dataset(template_root := root).ok
    return template_root


@pytest.fixture
def dataset(template, tmp_path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(template, root)
    return root


def _trashed(root: Path) -> list[str]:
    return sorted(str(p.relative_to(next((root / TRASH_DIR).iterdir()))) for p in (root / TRASH_DIR).rglob("*") if p.is_file())


def test_repair_drops_a_truncated_last_episode(dataset):
    path = dataset / "data/chunk-000/file-002.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    check = check_dataset(dataset)
    assert not check.ok and any("file-002.parquet" in p and "parquet" in p for p in check.problems)

    report = repair_dataset(dataset)
    assert report.ok and (report.episodes, report.frames) == (2, 16), str(report)
    assert "data/chunk-000/file-002.parquet" in _trashed(dataset)
    assert "videos/observation.images.front/chunk-000/file-002.mp4" in _trashed(dataset)
    assert check_dataset(dataset).ok
    assert LeRobotDataset("local/crash", root=dataset).num_episodes == 2


def test_repair_never_drops_finished_episodes_after_damage(dataset):
    path = dataset / "data/chunk-000/file-000.parquet"
    path.write_bytes(path.read_bytes()[:100])
    report = repair_dataset(dataset)
    assert not report.ok and any("by hand" in p for p in report.problems)
    assert not (dataset / TRASH_DIR).exists() or not _trashed(dataset)
    assert (dataset / "data/chunk-000/file-002.parquet").exists()


def test_repair_restores_garbage_info_json(dataset):
    (dataset / "meta/info.json").write_text('{"codebase_version": "v3.0", "fps": 3')
    assert not check_dataset(dataset).ok
    report = repair_dataset(dataset)
    assert report.ok and report.episodes == 3, str(report)
    assert "meta/info.json" in _trashed(dataset)
    assert check_dataset(dataset).ok


def test_repair_counts_a_committed_episode_info_json_missed(dataset):
    # a kill between the episode-metadata write and the info.json write
    info = json.loads((dataset / "meta/info.json").read_text())
    info.update(total_episodes=2, total_frames=16, splits={"train": "0:2"})
    (dataset / "meta/info.json").write_text(json.dumps(info))
    assert any("total_episodes" in p for p in check_dataset(dataset, load_with_lerobot=False).problems)
    report = repair_dataset(dataset)
    assert report.ok and (report.episodes, report.frames) == (3, 24)
    assert check_dataset(dataset).ok


def test_repair_moves_orphans_and_temp_files(dataset):
    video_dir = dataset / "videos/observation.images.wrist/chunk-000"
    shutil.copy(video_dir / "file-001.mp4", video_dir / "file-007.mp4")  # orphan video
    (dataset / "data/chunk-000/.file-003.parquet.4242.tmp").write_bytes(b"PAR1 half")
    (dataset / "tmpk2j3h4").mkdir()
    (dataset / "tmpk2j3h4/observation.images.front_streaming.mp4").write_bytes(b"\x00" * 100)
    check = check_dataset(dataset, load_with_lerobot=False)
    assert not check.ok and len(check.problems) == 3, check.problems

    dry = repair_dataset(dataset, dry_run=True)
    assert len(dry.actions) == 3 and not (dataset / TRASH_DIR).exists()
    report = repair_dataset(dataset)
    assert report.ok and report.episodes == 3
    assert _trashed(dataset) == [
        "data/chunk-000/.file-003.parquet.4242.tmp",
        "tmpk2j3h4/observation.images.front_streaming.mp4",
        "videos/observation.images.wrist/chunk-000/file-007.mp4",
    ]
    assert check_dataset(dataset).ok


def test_repair_of_an_intact_dataset_does_nothing(dataset):
    report = repair_dataset(dataset)
    assert report.ok and report.actions == [] and report.episodes == 3
    assert not (dataset / TRASH_DIR).exists()


def test_repair_refuses_a_dataset_being_recorded(dataset):
    writer = EpisodeWriter(dataset, "local/crash", FPS, make_features({"front": (32, 32), "wrist": (32, 32)}))
    try:
        report = repair_dataset(dataset)
        assert not report.ok and "held by a process recording" in report.problems[0]
        with pytest.raises(RuntimeError, match="another process"):
            EpisodeWriter(dataset, "local/crash", FPS, make_features({"front": (32, 32), "wrist": (32, 32)}))
    finally:
        writer.close()
    assert repair_dataset(dataset).ok
