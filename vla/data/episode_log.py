"""The episode log: one outcome row per committed episode, beside lerobot's files.

``vla record`` stores per episode what lerobot does not: task, seed, instruction, success,
frames, teleop, achieved control rate. ``vla replay`` re-creates the scene from it;
``vla train --success-only``, ``vla rl --demos`` and the success classifier read the outcomes.
This module is the only place that knows where the log lives and how it is read and written.

The file, :data:`EPISODE_LOG_PATH`, holds one JSON object per line, each with an integer
``episode_index``. **Invariant**: in a dataset that keeps the log, every committed episode has
exactly one row and every row belongs to a committed episode.

**One writer.** ``EpisodeWriter.save_episode(outcome_row=...)`` (``vla.data.writer``) writes the
row as part of its commit protocol:

1. the row is written to :data:`PENDING_PATH` (temp file, fsync, rename);
2. lerobot commits the episode (its ``meta/episodes`` file appears);
3. the row is appended to the log (:func:`append_row`, fsync);
4. the pending file is removed.

A kill between any two steps leaves a state that ``vla.data.integrity.repair_dataset`` makes
consistent again: a pending row of a committed episode that has no row is appended, a pending
row of an episode that never committed is discarded, rows of episodes that are not (or no
longer) in the dataset are removed, and a committed episode that has neither a row nor a
pending row (a dataset written by an older recorder) is dropped if it is the last one.

**One reader rule** (:func:`read_episode_log`, :func:`scan_episode_log`): a line that is not a
JSON object with an integer ``episode_index`` is a torn write (a kill in the middle of an
append) and is skipped; when an episode has more than one row the last one wins.
``vla dataset check`` reports both as problems and ``vla dataset repair`` rewrites the log
without them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

from vla.data.atomic import atomic_write_bytes, fsync_path

log = logging.getLogger(__name__)

EPISODE_LOG_PATH = "meta/vla_episodes.jsonl"
"""The log, relative to the dataset root."""

PENDING_PATH = ".recovery/vla_episode_pending.json"
"""The row of the episode being committed (protocol step 1); outside ``meta/``, so lerobot never reads it."""


def log_path(root: str | Path) -> Path:
    return Path(root) / EPISODE_LOG_PATH


def has_episode_log(root: str | Path) -> bool:
    """True when the dataset keeps an episode log (the log or a pending row exists)."""
    return log_path(root).exists() or (Path(root) / PENDING_PATH).exists()


def row_line(row: dict) -> bytes:
    """One row as one line of the log; raises ValueError for a row the log cannot hold."""
    index = row.get("episode_index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"an episode log row needs a non-negative integer 'episode_index', got {index!r}")
    try:
        text = json.dumps(row, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"episode {index}: the outcome row is not JSON ({e})") from e
    return (text + "\n").encode("utf-8")


# ------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LogScan:
    """What the log holds, read with the module's one rule."""

    exists: bool
    rows: dict[int, dict] = dataclasses.field(default_factory=dict)
    """episode_index -> its row (the last one when there are several)."""
    torn: list[int] = dataclasses.field(default_factory=list)
    """Line numbers (1-based) of lines that are not a row."""
    repeated: dict[int, int] = dataclasses.field(default_factory=dict)
    """episode_index -> how many rows it has, for episodes with more than one."""
    pending: dict | None = None
    """The row at :data:`PENDING_PATH`, if any (an unfinished commit)."""

    def problems(self, root: str | Path, episodes: int) -> list[str]:
        """What breaks the invariant for a dataset of ``episodes`` committed episodes."""
        path = log_path(root)
        out = []
        if self.torn:
            out.append(f"{path}: line(s) {self.torn} are not complete rows (torn writes)")
        for ep, n in sorted(self.repeated.items()):
            out.append(f"{path}: episode {ep} has {n} rows, should have one")
        extra = sorted(ep for ep in self.rows if ep >= episodes)
        if extra:
            out.append(f"{path}: rows for episode(s) {extra}, which are not in the dataset ({episodes} episodes)")
        missing = [ep for ep in range(episodes) if ep not in self.rows]
        if missing:
            out.append(f"{path}: no row for episode(s) {missing[:20]}{' ...' if len(missing) > 20 else ''}")
        if self.pending is not None:
            out.append(f"{Path(root) / PENDING_PATH}: row of episode {self.pending.get('episode_index')} "
                       "left by an unfinished save (run `vla dataset repair`)")
        return out


def _parse(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(row, dict):
        return None
    index = row.get("episode_index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        return None
    return row


def read_pending(root: str | Path) -> dict | None:
    path = Path(root) / PENDING_PATH
    try:
        return _parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def scan_episode_log(root: str | Path) -> LogScan:
    """The log with the module's rule applied, and what the rule had to skip. A missing log
    gives ``exists=False`` and no rows."""
    path = log_path(root)
    scan = LogScan(exists=path.exists(), pending=read_pending(root))
    if not scan.exists:
        return scan
    counts: dict[int, int] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = _parse(line)
            if row is None:
                scan.torn.append(number)
                continue
            ep = row["episode_index"]
            scan.rows[ep] = row  # a later row wins
            counts[ep] = counts.get(ep, 0) + 1
    scan.repeated = {ep: n for ep, n in counts.items() if n > 1}
    return scan


def read_episode_log(root: str | Path) -> dict[int, dict]:
    """``episode_index -> row`` of the dataset at ``root`` (module docstring: torn lines are
    skipped, the last of repeated rows wins). Raises FileNotFoundError when it has no log."""
    scan = scan_episode_log(root)
    if not scan.exists:
        raise FileNotFoundError(
            f"dataset {root}: no {EPISODE_LOG_PATH}, so no episode outcomes (record with `vla record`, which "
            'writes it, or add one line per episode: {"episode_index": 0, "success": true})')
    if scan.torn or scan.repeated:
        log.warning("%s: skipped torn line(s) %s; used the last row of episode(s) %s; `vla dataset repair --root %s` "
                    "rewrites it", log_path(root), scan.torn, sorted(scan.repeated), root)
    return scan.rows


def read_outcomes(root: str | Path) -> dict[int, bool]:
    """``episode_index -> success`` for the rows that say (raises FileNotFoundError without a log)."""
    return {ep: row["success"] for ep, row in read_episode_log(root).items() if isinstance(row.get("success"), bool)}


# ------------------------------------------------------------------------------------------
# Writing (EpisodeWriter's commit protocol, and repair)
# ------------------------------------------------------------------------------------------


def write_pending(root: str | Path, row: dict) -> None:
    """Protocol step 1: the row of the episode about to be committed, durable before the commit."""
    atomic_write_bytes(Path(root) / PENDING_PATH, row_line(row))


def clear_pending(root: str | Path) -> None:
    """Protocol step 4."""
    path = Path(root) / PENDING_PATH
    path.unlink(missing_ok=True)
    fsync_path(path.parent)


def append_row(root: str | Path, row: dict) -> None:
    """Protocol step 3: append one row and fsync it. A torn last line (no newline) is ended
    first, so the new row is a line of its own."""
    path = log_path(root)
    data = row_line(row)
    created = not path.exists()
    with open(path, "ab+") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if created:
        fsync_path(path.parent)


def write_log(root: str | Path, rows: list[dict]) -> None:
    """Replace the whole log atomically (an empty list makes an empty log)."""
    atomic_write_bytes(log_path(root), b"".join(row_line(r) for r in rows))
