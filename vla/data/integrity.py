"""Check a LeRobot v3 dataset file by file, and repair one left behind by a crash.

``check_dataset(root)`` reads every file (info.json, tasks, episode metadata, data parquet
footers and rows, video decode and frame counts), then opens the dataset with
``LeRobotDataset`` and loads the first and last frame of every episode.

``repair_dataset(root)`` restores a dataset to its last committed episode (an episode is
committed once its ``meta/episodes`` row exists and every file it references is whole; see
``vla.data.writer``): it moves temp files, footer-less parquet files, files no committed
episode references and the trailing half-written episode into ``root/.repair_trash/<time>/``
(nothing is deleted), then rebuilds ``info.json`` totals and ``stats.json`` from what remains.
It never removes a committed episode in the middle of a dataset: such damage is reported.

When the dataset keeps an episode log (``vla.data.episode_log``), both also keep its invariant:
every committed episode has exactly one outcome row. ``check`` reports a missing, repeated or
torn row and rows of episodes that are not in the dataset; ``repair`` restores a committed
episode's row from the pending row the writer left, drops the last episode(s) when they have no
row to restore (an older recorder), removes rows of episodes that are not in the dataset and
torn or repeated lines, and reports (does not guess) a missing row in the middle.

A root left by a creation that was killed before ``meta/info.json`` existed (no episode, only
temp files and a staging folder) is reset: its leftovers go to the trash, and recording into it
creates the dataset.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vla.data.atomic import TEMP_SUFFIX, atomic_write_bytes, atomic_write_json
from vla.data.episode_log import EPISODE_LOG_PATH, PENDING_PATH, LogScan, has_episode_log, scan_episode_log, write_log
from vla.data.layout import BACKUP_INFO_PATH, CREATE_DIR_PREFIX, LOCK_PATH, DatasetLock

TRASH_DIR = ".repair_trash"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
_IGNORED_DIRS = (TRASH_DIR, ".recovery", ".cache")


@dataclass
class Report:
    ok: bool
    episodes: int
    frames: int
    problems: list[str] = field(default_factory=list)
    """Each names the file and what is wrong (for repair: what is still wrong after it)."""
    actions: list[str] = field(default_factory=list)
    """What repair did (or would do, with dry_run), one line per file."""

    def __str__(self) -> str:
        lines = [f"{'OK' if self.ok else 'NOT OK'}: {self.episodes} episodes, {self.frames} frames"]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  action: {a}" for a in self.actions]
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Reading pieces (shared by check and repair)
# ------------------------------------------------------------------------------------------


def load_info_dict(root: str | Path) -> dict:
    """``meta/info.json`` as a dict; raises ValueError (naming the file) when it is unreadable."""
    path = Path(root) / INFO_PATH
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot be read as JSON ({e})") from e
    for key in ("fps", "features", "data_path", "total_episodes", "total_frames"):
        if key not in info:
            raise ValueError(f"{path}: missing field '{key}'")
    return info


def _read_parquet(path: Path, columns: list[str] | None = None):
    """The table, or raises ValueError naming the file (no footer, not parquet, ...)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, columns=columns)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for a torn file
        raise ValueError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from e


def _video_frames(path: Path, decode: bool) -> int:
    """Frames in the first video stream (decoded, or demuxed packets when decode=False)."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            if decode:
                return sum(1 for _ in container.decode(stream))
            return sum(1 for p in container.demux(stream) if p.size > 0)
    except Exception as e:  # PyAV raises many error types for a torn or empty file
        raise ValueError(f"{path}: video cannot be {'decoded' if decode else 'read'} ({type(e).__name__}: {e})") from e


def _episode_paths(info: dict, row: dict, video_keys: list[str]) -> dict[str, str]:
    """Relative paths of the files one episode row references, keyed by role."""
    paths = {
        "data": info["data_path"].format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]),
        "meta": f"meta/episodes/chunk-{row['meta/episodes/chunk_index']:03d}/file-{row['meta/episodes/file_index']:03d}.parquet",
    }
    for key in video_keys:
        paths[key] = info["video_path"].format(
            video_key=key, chunk_index=row[f"videos/{key}/chunk_index"], file_index=row[f"videos/{key}/file_index"]
        )
    return paths


def _leftovers(root: Path) -> list[Path]:
    """Temp files and directories no finished dataset contains."""
    found: list[Path] = []
    for path in root.rglob(f"*{TEMP_SUFFIX}"):
        if not any(part in _IGNORED_DIRS for part in path.relative_to(root).parts):
            found.append(path)
    found += [p for p in root.glob("tmp*") if p.is_dir()]  # lerobot's tempfile.mkdtemp(dir=root)
    if any(p.is_file() for p in (root / "images").rglob("*")):  # PNG staging of an unfinished episode
        found.append(root / "images")
    found += [p for p in root.glob(CREATE_DIR_PREFIX + "*")]  # staging of a creation that was killed
    return sorted(found)


def unfinished_creation(root: str | Path) -> list[Path] | None:
    """The leftovers of a dataset creation that was killed before ``meta/info.json`` existed, or
    None when ``root`` holds anything else (a dataset, or files that are not ours).

    Such a root has no ``meta/info.json`` and no backup of it, and every file in it is a temp
    file of an unfinished write, a creation's staging folder, the lock or repair's trash. The
    returned paths (possibly none) are what repair moves to the trash to reset it."""
    root = Path(root)
    if (root / INFO_PATH).exists() or (root / BACKUP_INFO_PATH).exists() or not root.is_dir():
        return None
    leftovers = _leftovers(root)
    leftovers += [p for p in (root / ".recovery").glob("*") if p.is_file() and p != root / LOCK_PATH and p not in leftovers]
    for path in root.rglob("*"):
        if path.is_dir() or path == root / LOCK_PATH or path.relative_to(root).parts[0] == TRASH_DIR:
            continue
        if not any(path == p or p in path.parents for p in leftovers):
            return None
    return sorted(leftovers)


def _dataset_files(root: Path) -> list[Path]:
    files = [p for d in ("data", "meta/episodes") for p in (root / d).glob("*/*.parquet")]
    files += list((root / "videos").glob("*/*/*.mp4"))
    return sorted(files)


@dataclass
class _Scan:
    """What is on disk: episode rows (by index) and the problems met while reading them."""

    rows: dict[int, dict] = field(default_factory=dict)
    row_file: dict[int, Path] = field(default_factory=dict)
    unreadable: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    episode_problems: dict[int, list[str]] = field(default_factory=dict)
    data_rows: dict[Path, dict[int, np.ndarray]] = field(default_factory=dict)


def _scan(root: Path, info: dict, decode_videos: bool) -> _Scan:
    """Read every episode metadata file and validate each episode against its data and videos."""
    scan = _Scan()
    video_keys = [k for k, ft in info["features"].items() if ft["dtype"] == "video"]
    fps = info["fps"]
    for path in sorted((root / "meta" / "episodes").glob("*/*.parquet")):
        try:
            table = _read_parquet(path)
        except ValueError as e:
            scan.unreadable.append(path)
            scan.problems.append(str(e))
            continue
        for row in table.to_pylist():
            ep = int(row["episode_index"])
            if ep in scan.rows:
                scan.problems.append(f"{path}: episode {ep} also listed in {scan.row_file[ep]}")
                continue
            scan.rows[ep] = row
            scan.row_file[ep] = path

    video_cache: dict[Path, int | str] = {}
    for ep, row in sorted(scan.rows.items()):
        issues: list[str] = []
        paths = _episode_paths(info, row, video_keys)
        length = int(row["length"])
        data_path = root / paths["data"]
        if data_path not in scan.data_rows:
            try:
                table = _read_parquet(data_path, columns=["episode_index", "index", "frame_index"])
                eps = table["episode_index"].to_numpy()
                idx = table["index"].to_numpy()
                fidx = table["frame_index"].to_numpy()
                scan.data_rows[data_path] = {
                    int(e): (idx[eps == e], fidx[eps == e]) for e in np.unique(eps)
                }
            except ValueError as e:
                scan.data_rows[data_path] = {}
                issues.append(str(e))
        if data_path in scan.data_rows and not issues:
            index, frame_index = scan.data_rows[data_path].get(ep, (np.array([]), np.array([])))
            start, stop = int(row["dataset_from_index"]), int(row["dataset_to_index"])
            if len(index) != length:
                issues.append(f"{data_path}: has {len(index)} rows of episode {ep}, its metadata says {length}")
            elif not (np.array_equal(index, np.arange(start, stop)) and np.array_equal(frame_index, np.arange(length))):
                issues.append(f"{data_path}: episode {ep} rows are not indices {start}..{stop - 1} / frames 0..{length - 1}")
        for key in video_keys:
            vpath = root / paths[key]
            if vpath not in video_cache:
                try:
                    video_cache[vpath] = _video_frames(vpath, decode_videos)
                except ValueError as e:
                    video_cache[vpath] = str(e)
            got = video_cache[vpath]
            if isinstance(got, str):
                issues.append(got)
                continue
            from_ts, to_ts = row[f"videos/{key}/from_timestamp"], row[f"videos/{key}/to_timestamp"]
            needed = int(round(to_ts * fps))
            if round((to_ts - from_ts) * fps) != length:
                issues.append(f"{vpath}: episode {ep} spans {to_ts - from_ts:.3f} s of video, {length} frames need {length / fps:.3f} s")
            elif got < needed:
                issues.append(f"{vpath}: has {got} frames, episode {ep} needs frames up to {needed}")
        if issues:
            scan.episode_problems[ep] = issues
    return scan


def _committed_prefix(scan: _Scan) -> int:
    """K such that episodes 0..K-1 are all present and whole."""
    k = 0
    while k in scan.rows and k not in scan.episode_problems:
        k += 1
    return k


def _task_problems(root: Path, info: dict, scan: _Scan, episodes: list[int]) -> list[str]:
    problems = []
    try:
        tasks = _read_parquet(root / TASKS_PATH).to_pandas()
    except ValueError as e:
        return [str(e)] if episodes else []
    known = set(tasks.index if tasks.index.name == "task" else tasks.get("task", []))
    indices = set(int(i) for i in tasks["task_index"])
    for ep in episodes:
        missing = [t for t in scan.rows[ep]["tasks"] if t not in known]
        if missing:
            problems.append(f"{root / TASKS_PATH}: task(s) {missing} of episode {ep} missing")
    for path in {root / _episode_paths(info, scan.rows[ep], [])["data"] for ep in episodes}:
        try:
            used = set(int(i) for i in np.unique(_read_parquet(path, columns=["task_index"])["task_index"].to_numpy()))
        except ValueError:
            continue  # reported with the episode already
        if used - indices:
            problems.append(f"{path}: task_index {sorted(used - indices)} not in {root / TASKS_PATH}")
    return problems


# ------------------------------------------------------------------------------------------
# check
# ------------------------------------------------------------------------------------------


def check_dataset(root: str | Path, decode_videos: bool = True, load_with_lerobot: bool = True) -> Report:
    """Check every file of the dataset at ``root``, then open it with lerobot and load the
    first and last frame of every episode (videos decoded). Read-only."""
    root = Path(root)
    try:
        info = load_info_dict(root)
    except ValueError as e:
        return Report(ok=False, episodes=0, frames=0, problems=[str(e)])
    problems = [f"{p}: leftover temp file of an unfinished write" for p in _leftovers(root)]
    scan = _scan(root, info, decode_videos)
    problems += scan.problems
    for ep in sorted(scan.episode_problems):
        problems += scan.episode_problems[ep]
    episodes = sorted(scan.rows)
    if episodes != list(range(len(episodes))):
        problems.append(f"{root / 'meta/episodes'}: episode indices are not contiguous from 0: {episodes}")
    frames = sum(int(scan.rows[ep]["length"]) for ep in episodes)
    if info["total_episodes"] != len(episodes):
        problems.append(f"{root / INFO_PATH}: total_episodes={info['total_episodes']}, episode metadata has {len(episodes)}")
    if info["total_frames"] != frames:
        problems.append(f"{root / INFO_PATH}: total_frames={info['total_frames']}, episode metadata sums to {frames}")
    expected_start = 0
    for ep in episodes:
        if int(scan.rows[ep]["dataset_from_index"]) != expected_start:
            problems.append(f"{scan.row_file[ep]}: episode {ep} starts at index {scan.rows[ep]['dataset_from_index']}, expected {expected_start}")
        expected_start = int(scan.rows[ep]["dataset_to_index"])
    video_keys = [k for k, ft in info["features"].items() if ft["dtype"] == "video"]
    referenced = {root / p for ep in episodes for p in _episode_paths(info, scan.rows[ep], video_keys).values()}
    referenced |= set(scan.unreadable)
    for path in _dataset_files(root):
        if path not in referenced:
            problems.append(f"{path}: not referenced by any episode (orphan)")
    problems += _task_problems(root, info, scan, episodes)
    if has_episode_log(root):
        problems += scan_episode_log(root).problems(root, len(episodes))

    if load_with_lerobot and not problems and episodes:
        problems += _load_with_lerobot(root, scan, episodes, frames)
    return Report(ok=not problems, episodes=len(episodes), frames=frames, problems=problems)


def _load_with_lerobot(root: Path, scan: _Scan, episodes: list[int], frames: int) -> list[str]:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    try:
        ds = LeRobotDataset(f"local/{root.name}", root=root)
    except Exception as e:  # anything lerobot raises means "lerobot cannot open it"
        return [f"{root}: LeRobotDataset cannot open it ({type(e).__name__}: {e})"]
    problems = []
    if ds.num_episodes != len(episodes) or ds.num_frames != frames:
        problems.append(f"{root}: lerobot sees {ds.num_episodes} episodes / {ds.num_frames} frames, files hold {len(episodes)} / {frames}")
    for ep in episodes:
        for i in sorted({int(scan.rows[ep]["dataset_from_index"]), int(scan.rows[ep]["dataset_to_index"]) - 1}):
            try:
                item = ds[i]
            except Exception as e:  # decode or timestamp-sync failure inside lerobot
                problems.append(f"{root}: lerobot cannot load frame {i} of episode {ep} ({type(e).__name__}: {e})")
                continue
            if int(item["episode_index"]) != ep:
                problems.append(f"{root}: frame {i} belongs to episode {int(item['episode_index'])}, expected {ep}")
    return problems


# ------------------------------------------------------------------------------------------
# repair
# ------------------------------------------------------------------------------------------


class _Trash:
    def __init__(self, root: Path, dry_run: bool, actions: list[str]):
        self.root, self.dry_run, self.actions = root, dry_run, actions
        self.dir = root / TRASH_DIR / time.strftime("%Y%m%d-%H%M%S")
        suffix = 1
        while self.dir.exists():
            self.dir = root / TRASH_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
            suffix += 1

    def move(self, path: Path, reason: str) -> None:
        rel = path.relative_to(self.root)
        self.actions.append(f"moved {rel} to {self.dir.relative_to(self.root) / rel}: {reason}")
        if not self.dry_run:
            (self.dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(self.dir / rel))

    def copy(self, path: Path) -> None:
        """Keep the original of a file about to be rewritten."""
        if not self.dry_run and path.exists():
            rel = path.relative_to(self.root)
            (self.dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, self.dir / rel)


def repair_dataset(root: str | Path, dry_run: bool = False) -> Report:
    """Restore the dataset at ``root`` to its last committed episode (module docstring).

    With ``dry_run`` nothing is touched and ``actions`` says what would be done. A dataset that a
    live ``EpisodeWriter`` holds (``.recovery/lock``) is refused: its temp files are in use.
    """
    lock = DatasetLock(Path(root))
    if Path(root).exists() and not lock.acquire():
        return Report(ok=False, episodes=0, frames=0, problems=[f"{Path(root) / LOCK_PATH}: held by a process recording into {root}; not repairing"])
    try:
        return repair_locked_dataset(Path(root), dry_run)
    finally:
        lock.release()


def repair_locked_dataset(root: Path, dry_run: bool = False) -> Report:
    """``repair_dataset`` for a caller that already holds the dataset's lock (EpisodeWriter)."""
    import pyarrow.parquet as pq

    actions: list[str] = []
    problems: list[str] = []
    trash = _Trash(root, dry_run, actions)

    # 1. info.json, or its backup, or the leftovers of a creation killed before info.json existed
    try:
        info = load_info_dict(root)
    except ValueError as e:
        backup = root / BACKUP_INFO_PATH
        try:
            info = json.loads(backup.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            leftovers = unfinished_creation(root)
            if leftovers is None:
                return Report(ok=False, episodes=0, frames=0, problems=[f"{e}; no readable backup at {backup}"], actions=actions)
            for path in leftovers:
                trash.move(path, "left by a dataset creation that was killed before meta/info.json was written")
            actions.append(f"reset {root}: an unfinished dataset creation (no episode was ever committed); "
                           "recording into it creates the dataset")
            return Report(ok=True, episodes=0, frames=0, problems=problems, actions=actions)
        if (root / INFO_PATH).exists():
            trash.move(root / INFO_PATH, "unreadable JSON")
        actions.append(f"restore {INFO_PATH} from {BACKUP_INFO_PATH} (totals rebuilt below)")
        info["total_episodes"] = -1  # force the rewrite below

    # 2. temp files of unfinished writes
    for path in _leftovers(root):
        trash.move(path, "temp file of an unfinished write")

    # 3. episodes: keep the whole prefix 0..K-1
    scan = _scan(root, info, decode_videos=False)
    for path in scan.unreadable:
        trash.move(path, "episode metadata without a valid parquet footer (write never finished)")
    k = _committed_prefix(scan)
    later = sorted(ep for ep in scan.rows if ep >= k)
    whole_later = [ep for ep in later if ep not in scan.episode_problems]
    if whole_later:
        for ep in sorted(set(later) - set(whole_later)):
            problems += scan.episode_problems.get(ep, [f"episode {ep}: missing from the episode metadata"])
        problems.append(
            f"{root}: episodes {whole_later} are whole but follow damaged/missing episode {k}; "
            "not removing finished episodes -- repair this dataset by hand"
        )
        return Report(ok=False, episodes=k, frames=0, problems=problems, actions=actions)
    for ep in later:
        actions.append(f"drop unfinished episode {ep}: " + "; ".join(scan.episode_problems[ep]))

    # 3b. the episode log: every committed episode keeps exactly one row (vla.data.episode_log)
    log_scan = scan_episode_log(root) if has_episode_log(root) else None
    if log_scan is not None:
        rows = {ep: row for ep, row in log_scan.rows.items() if ep < k}
        pending = log_scan.pending
        restored = pending is not None and pending["episode_index"] < k and pending["episode_index"] not in rows
        if restored:
            rows[pending["episode_index"]] = pending
        missing = [ep for ep in range(k) if ep not in rows]
        if missing and missing != list(range(missing[0], k)):
            problems.append(
                f"{root / EPISODE_LOG_PATH}: no outcome row for episode(s) {missing}, which later episodes follow; "
                "repair cannot renumber episodes: add a row per missing episode by hand "
                '(e.g. {"episode_index": N, "success": false}) if you know its outcome')
            return Report(ok=False, episodes=k, frames=0, problems=problems, actions=actions)
        for ep in missing:  # the last episodes, committed by a recorder that never wrote their rows
            actions.append(f"drop episode {ep}: committed without its outcome row in {EPISODE_LOG_PATH} "
                           f"and no pending row to rebuild it from")
        if missing:
            k = missing[0]
            later = sorted(set(later) | set(missing))
    kept = list(range(k))

    # 4. files: rewrite files shared with dropped episodes, trash the ones nobody references
    video_keys = [key for key, ft in info["features"].items() if ft["dtype"] == "video"]
    referenced = {root / p for ep in kept for p in _episode_paths(info, scan.rows[ep], video_keys).values()}
    for path in sorted({scan.row_file[ep] for ep in later} & referenced):
        _rewrite_parquet_rows(path, kept, trash, dry_run)
    for path in sorted({root / _episode_paths(info, scan.rows[ep], [])["data"] for ep in later} & referenced):
        if path.exists():
            _rewrite_parquet_rows(path, kept, trash, dry_run)
    for path in _dataset_files(root):
        if path not in referenced and path not in scan.unreadable:
            trash.move(path, "not referenced by any finished episode")

    # 5. tasks
    tasks_path = root / TASKS_PATH
    try:
        _read_parquet(tasks_path)
    except ValueError as e:
        if kept:
            problems.append(f"{e}; cannot rebuild task indices from the episodes: restore it from {trash.dir} by hand")
        elif tasks_path.exists():
            trash.move(tasks_path, "unreadable and no episode needs it")

    # 6. info.json totals and stats.json
    frames = sum(int(scan.rows[ep]["length"]) for ep in kept)
    new_info = dict(info)
    new_info["total_episodes"] = k
    new_info["total_frames"] = frames
    try:
        new_info["total_tasks"] = pq.read_metadata(tasks_path).num_rows if tasks_path.exists() else 0
    except Exception:  # reported above
        new_info["total_tasks"] = info.get("total_tasks", 0)
    new_info["splits"] = {"train": f"0:{k}"} if k else {}
    if new_info != info:
        actions.append(f"rewrite {INFO_PATH}: total_episodes={k}, total_frames={frames}")
        if not dry_run:
            trash.copy(root / INFO_PATH)
            atomic_write_json(new_info, root / INFO_PATH)
            atomic_write_bytes(root / BACKUP_INFO_PATH, (root / INFO_PATH).read_bytes())
    stats_ok = (root / STATS_PATH).exists() == bool(kept)
    if stats_ok and kept:
        try:
            json.loads((root / STATS_PATH).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            stats_ok = False
    if later or not stats_ok:
        if kept:
            actions.append(f"rebuild {STATS_PATH} from the stats of episodes 0..{k - 1}")
            if not dry_run:
                trash.copy(root / STATS_PATH)
                atomic_write_json(_aggregate_episode_stats(root, scan, kept), root / STATS_PATH)
        elif (root / STATS_PATH).exists():
            trash.move(root / STATS_PATH, "no episode left")

    # 7. the episode log, last: a kill before this point leaves rows that the next repair removes
    if log_scan is not None:
        _repair_episode_log(root, log_scan, k, restored, trash, dry_run)
    return Report(ok=not problems, episodes=k, frames=frames, problems=problems, actions=actions)


def _repair_episode_log(root: Path, log_scan: LogScan, k: int, restored: bool, trash: _Trash, dry_run: bool) -> None:
    """Rewrite the log with exactly one row per kept episode (0..k-1); remove the pending row."""
    log_file = root / EPISODE_LOG_PATH
    rows = {ep: row for ep, row in log_scan.rows.items() if ep < k}
    changes = []
    if restored:
        rows[log_scan.pending["episode_index"]] = log_scan.pending
        changes.append(f"restore the row of episode {log_scan.pending['episode_index']} from {PENDING_PATH} "
                       "(the recorder was killed after the episode was committed)")
    if log_scan.torn:
        changes.append(f"remove torn line(s) {log_scan.torn}")
    for ep, n in sorted(log_scan.repeated.items()):
        if ep < k:
            changes.append(f"keep the last of the {n} rows of episode {ep}")
    gone = sorted(ep for ep in log_scan.rows if ep >= k)
    if gone:
        changes.append(f"remove the rows of episode(s) {gone}, which are not in the dataset")
    if changes or not log_file.exists():
        trash.actions.append(f"rewrite {EPISODE_LOG_PATH}: " + "; ".join(changes or ["create it"]))
        if not dry_run:
            trash.copy(log_file)
            write_log(root, [rows[ep] for ep in sorted(rows)])
    if (root / PENDING_PATH).exists():
        pending = log_scan.pending
        trash.move(root / PENDING_PATH, "the outcome row of an unfinished save" + (
            " (unreadable)" if pending is None else
            " (restored into the log)" if restored else
            " (its episode has its row)" if pending["episode_index"] < k else
            " (its episode was never committed)"))


def _rewrite_parquet_rows(path: Path, kept: list[int], trash: _Trash, dry_run: bool) -> None:
    """Rewrite a parquet file keeping only the rows of kept episodes (original to the trash)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    kept_ids = pa.array(kept, type=table["episode_index"].type)
    kept_table = table.filter(pc.is_in(table["episode_index"], value_set=kept_ids))
    trash.actions.append(f"rewrite {path.relative_to(trash.root)} without the rows of unfinished episodes ({table.num_rows} -> {kept_table.num_rows} rows)")
    if dry_run:
        return
    trash.copy(path)
    tmp = path.with_name(f".{path.name}{TEMP_SUFFIX}")
    pq.write_table(kept_table, tmp)
    tmp.replace(path)


def _aggregate_episode_stats(root: Path, scan: _Scan, kept: list[int]) -> dict:
    """stats.json content from the per-episode ``stats/<feature>/<stat>`` columns."""
    from lerobot.datasets.compute_stats import aggregate_stats
    from lerobot.datasets.utils import serialize_dict

    per_episode = []
    for ep in kept:
        stats: dict[str, dict[str, np.ndarray]] = {}
        for col, value in scan.rows[ep].items():
            if col.startswith("stats/") and value is not None:
                _, feature_and_stat = col.split("/", 1)
                feature, stat = feature_and_stat.rsplit("/", 1)
                stats.setdefault(feature, {})[stat] = np.asarray(value)
        per_episode.append(stats)
    return serialize_dict(aggregate_stats(per_episode))
