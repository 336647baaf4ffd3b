"""The episode log (issue 12): one writer inside the commit protocol, one reader rule for torn
and repeated lines, and repair / check keeping "every committed episode has exactly one row"."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lerobot")

from vla.data import EpisodeWriter, check_dataset, make_features, repair_dataset  # noqa: E402
from vla.data.episode_log import EPISODE_LOG_PATH, PENDING_PATH  # noqa: E402
from vla.data.integrity import TRASH_DIR  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]


def _row(ep: int, success: bool = True, task: str = "pick_red_cube") -> str:
    return json.dumps({"episode_index": ep, "success": success, "frames": 12, "task": task})


@pytest.fixture
def dataset(tiny_dataset, tmp_path) -> Path:
    """A copy of the conftest dataset (4 episodes x 12 frames), still without an episode log."""
    root = tmp_path / "ds"
    shutil.copytree(tiny_dataset, root)
    return root


def _write_log(root: Path, lines: list[str], end: str = "\n") -> None:
    (root / EPISODE_LOG_PATH).write_text("\n".join(lines) + end)


def _indices_on_disk(root: Path) -> list[int]:
    """The log's rows, read line by line (every line must be a whole row)."""
    return [json.loads(line)["episode_index"] for line in (root / EPISODE_LOG_PATH).read_text().splitlines() if line.strip()]


def _trashed(root: Path) -> list[str]:
    if not (root / TRASH_DIR).exists():
        return []
    return sorted(str(p.relative_to(d)) for d in (root / TRASH_DIR).iterdir() for p in d.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------
# repair and check keep the invariant
# ------------------------------------------------------------------------------------------


def test_a_committed_episode_without_its_row_is_found_and_dropped(dataset):
    """The issue's state: the recorder was killed between episode 3's commit and its row, by a
    recorder that kept no pending row. check says so; repair drops episode 3 to the trash."""
    _write_log(dataset, [_row(0), _row(1, False), _row(2)])
    check = check_dataset(dataset, load_with_lerobot=False)
    assert not check.ok and any("no row for episode(s) [3]" in p for p in check.problems), check.problems

    report = repair_dataset(dataset)
    assert report.ok and (report.episodes, report.frames) == (3, 36), str(report)
    assert any(a.startswith("drop episode 3: committed without its outcome row") for a in report.actions), report.actions
    assert {"meta/episodes/chunk-000/file-003.parquet", "data/chunk-000/file-003.parquet"} <= set(_trashed(dataset))
    assert check_dataset(dataset).ok
    from vla.data.demos import load_demos  # what `vla train --success-only` runs

    assert [e.episode_index for e in load_demos([str(dataset)], 32, progress=False, success_only=True)] == [0, 2]


def test_repair_restores_the_row_of_a_committed_episode_from_the_pending_row(dataset):
    """Killed after the commit, before the append: the row waits in the pending file."""
    _write_log(dataset, [_row(0), _row(1), _row(2)])
    (dataset / PENDING_PATH).parent.mkdir(exist_ok=True)
    (dataset / PENDING_PATH).write_text(_row(3, False, task="restored") + "\n")
    assert any("unfinished save" in p for p in check_dataset(dataset, load_with_lerobot=False).problems)

    report = repair_dataset(dataset)
    assert report.ok and report.episodes == 4, str(report)
    assert any("restore the row of episode 3" in a for a in report.actions), report.actions
    assert _indices_on_disk(dataset) == [0, 1, 2, 3]
    assert json.loads((dataset / EPISODE_LOG_PATH).read_text().splitlines()[3])["task"] == "restored"
    assert not (dataset / PENDING_PATH).exists()
    assert check_dataset(dataset).ok
    assert repair_dataset(dataset).actions == []  # idempotent


def test_repair_discards_the_pending_row_of_an_episode_that_never_committed(dataset):
    _write_log(dataset, [_row(ep) for ep in range(4)])
    (dataset / PENDING_PATH).write_text(_row(4) + "\n")
    report = repair_dataset(dataset)
    assert report.ok and report.episodes == 4 and not (dataset / PENDING_PATH).exists(), str(report)
    assert _indices_on_disk(dataset) == [0, 1, 2, 3]
    assert check_dataset(dataset).ok


def test_rows_of_missing_episodes_torn_and_repeated_lines_are_reported_then_repaired(dataset):
    _write_log(dataset, [_row(0), _row(1), _row(1, False), _row(2), _row(3), _row(4), _row(5)],
               end='\n{"episode_index": 6, "succ')
    check = check_dataset(dataset, load_with_lerobot=False)
    assert not check.ok
    text = "\n".join(check.problems)
    assert "line(s) [8] are not complete rows" in text and "episode 1 has 2 rows" in text
    assert "rows for episode(s) [4, 5], which are not in the dataset" in text

    report = repair_dataset(dataset)
    assert report.ok and report.episodes == 4, str(report)
    assert _indices_on_disk(dataset) == [0, 1, 2, 3]
    assert json.loads((dataset / EPISODE_LOG_PATH).read_text().splitlines()[1])["success"] is False  # the last row won
    assert EPISODE_LOG_PATH in _trashed(dataset)  # the original is kept
    assert check_dataset(dataset).ok


def test_dropping_a_half_written_last_episode_drops_its_row(dataset):
    _write_log(dataset, [_row(ep) for ep in range(4)])
    path = dataset / "data/chunk-000/file-003.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    report = repair_dataset(dataset)
    assert report.ok and report.episodes == 3, str(report)
    assert _indices_on_disk(dataset) == [0, 1, 2]
    assert check_dataset(dataset).ok


def test_a_missing_row_in_the_middle_is_reported_not_guessed(dataset):
    _write_log(dataset, [_row(0), _row(1), _row(3)])
    report = repair_dataset(dataset)
    assert not report.ok and any("by hand" in p and "[2]" in p for p in report.problems), str(report)
    assert _trashed(dataset) == [] and _indices_on_disk(dataset) == [0, 1, 3]
    assert (dataset / "meta/episodes/chunk-000/file-003.parquet").exists()


def test_a_dataset_without_a_log_is_not_asked_for_one(dataset):
    assert check_dataset(dataset).ok and repair_dataset(dataset).actions == []


# ------------------------------------------------------------------------------------------
# one reader rule, used by every reader
# ------------------------------------------------------------------------------------------


def test_every_reader_applies_the_same_rule(dataset):
    """Torn lines are skipped, the last of repeated rows wins -- for the success classifier,
    `vla train` (sim tasks, --success-only), `vla replay` and `vla rl --demos` alike."""
    from rewards.success_classifier import read_episode_outcomes
    from vla.commands.replay import episode_record
    from vla.data.demos import load_demos
    from vla.train import _sim_tasks

    _write_log(dataset, ['{"episode_index": 9, "tas', _row(0, task="a"), _row(1, True, task="b"),
                         _row(2, True, task="a"), _row(3, True, task="a"), _row(1, False, task="c")],
               end='\n{"episode_index": 2, "success": fa')
    assert read_episode_outcomes(str(dataset)) == {0: True, 1: False, 2: True, 3: True}
    assert episode_record(str(dataset), 1)["task"] == "c" and episode_record(str(dataset), 7) == {}
    assert _sim_tasks([str(dataset)]) == ["a", "c"]
    assert [e.episode_index for e in load_demos([str(dataset)], 32, progress=False, success_only=True)] == [0, 2, 3]


def test_the_reader_skips_torn_lines_and_an_append_ends_a_torn_line(dataset):
    from vla.data.episode_log import append_row, read_episode_log

    _write_log(dataset, ['{"episode_index": 9, "tas', _row(0, task="a"), _row(1, True, task="b"),
                         _row(1, False, task="c")], end='\n{"episode_index": 2, "success": fa')
    rows = read_episode_log(dataset)
    assert sorted(rows) == [0, 1] and rows[1]["task"] == "c"
    append_row(dataset, {"episode_index": 1, "success": True, "task": "d"})
    assert read_episode_log(dataset)[1]["task"] == "d"
    assert (dataset / EPISODE_LOG_PATH).read_text().endswith('"success": fa\n' + json.dumps(
        {"episode_index": 1, "success": True, "task": "d"}) + "\n")


def test_vla_data_never_imports_rewards():
    """The episode log lives in vla.data, so vla.data.demos no longer imports
    rewards.success_classifier (which imports vla.data.demos): no import loop."""
    for path in sorted((REPO_ROOT / "vla/data").glob("*.py")) + [REPO_ROOT / "policies/common/demos.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "rewards" or n.startswith("rewards.") for n in names), (path, names)


# ------------------------------------------------------------------------------------------
# the writer: one owner of the log
# ------------------------------------------------------------------------------------------

CAMS = {"front": (32, 32)}


def _frames(writer: EpisodeWriter, n: int) -> None:
    for i in range(n):
        writer.add_frame({"observation.images.front": np.full((32, 32, 3), 20 * i, np.uint8),
                          "observation.state": np.zeros(8, np.float32), "action": np.zeros(7, np.float32),
                          "intervention": False, "observation.capture_time": i / 10}, task="t")


def test_the_row_is_written_before_the_commit_and_appended_after_it(tmp_path, monkeypatch):
    """save_episode(outcome_row=...) puts the row in the pending file before lerobot commits the
    episode: a failure between the commit and the append (a kill there) loses no row."""
    import vla.data.writer as writer_module

    root = tmp_path / "ds"
    writer = EpisodeWriter(root, "local/ds", 10, make_features(CAMS), episode_log=True)
    _frames(writer, 5)
    assert writer.save_episode(outcome_row={"success": True, "frames": 5}) == 0
    assert _indices_on_disk(root) == [0] and not (root / PENDING_PATH).exists()

    def killed(*_):
        raise RuntimeError("killed between the commit and the append")

    monkeypatch.setattr(writer_module, "append_row", killed)
    _frames(writer, 6)
    with pytest.raises(RuntimeError, match="killed"):
        writer.save_episode(outcome_row={"success": False, "frames": 6})
    writer.close()
    assert _indices_on_disk(root) == [0] and (root / PENDING_PATH).exists()
    report = repair_dataset(root)
    assert report.ok and report.episodes == 2 and _indices_on_disk(root) == [0, 1], str(report)
    assert check_dataset(root).ok


def test_the_writer_refuses_to_break_the_invariant(dataset, tmp_path):
    features = make_features({"front": (64, 64), "wrist": (64, 64)}, 8, 7)  # the conftest dataset's
    with pytest.raises(ValueError, match="without outcome rows"):  # 4 episodes and no log
        EpisodeWriter(dataset, "local/tiny", 10, features, episode_log=True)
    _write_log(dataset, [_row(ep) for ep in range(4)])
    with pytest.raises(ValueError, match="episode_log=True"):  # a log, and a writer that would not feed it
        EpisodeWriter(dataset, "local/tiny", 10, features)
    root = tmp_path / "new"
    writer = EpisodeWriter(root, "local/new", 10, make_features(CAMS), episode_log=True)
    try:
        _frames(writer, 3)
        with pytest.raises(ValueError, match="outcome_row"):
            writer.save_episode()
        with pytest.raises(ValueError, match="not JSON"):
            writer.save_episode(outcome_row={"success": object()})
        assert writer.save_episode(outcome_row={"success": True}) == 0
    finally:
        writer.close()
    assert _indices_on_disk(root) == [0] and check_dataset(root).ok
