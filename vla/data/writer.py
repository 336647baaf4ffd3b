"""Crash-safe episode recording into a LeRobot v3 dataset, written through the lerobot library.

Why this exists. Out of the box, lerobot 0.6.1's ``LeRobotDataset`` keeps pyarrow
``ParquetWriter``s open across episodes (``data/`` and ``meta/episodes/``), appends several
episodes into one parquet / mp4 file, buffers 10 episodes of metadata in memory and rewrites
``meta/info.json`` / ``stats.json`` / ``tasks.parquet`` in place. A SIGKILL or power cut then
leaves parquet files without footers, half-written JSON and a dataset lerobot can't open.

What ``EpisodeWriter`` does about it, without reimplementing the v3 format (every byte is
still written by lerobot's ``LeRobotDatasetMetadata.create``, ``LeRobotDataset.resume``,
``add_frame`` and ``save_episode``):

1. **One episode per file, written once.** The chunk settings ``data_files_size_in_mb`` and
   ``video_files_size_in_mb`` are set to ~1 byte (:data:`ONE_EPISODE_PER_FILE_MB`), so
   lerobot's own roll-over logic starts a new ``data/``, ``videos/`` and ``meta/episodes/``
   file for every episode and never appends to (or concatenates into) an existing one.
   The setting is stored in ``info.json``, so plain lerobot resuming the dataset keeps it.
2. **Writers closed after every episode.** The dataset's ``DatasetWriter._save_episode_data``
   and ``LeRobotDatasetMetadata._flush_metadata_buffer`` are wrapped *on this dataset's
   instances only* to close their ``ParquetWriter`` right after they write, and the metadata
   buffer size is 1. Because of (1), lerobot never reopens a closed path (which would
   truncate it); :meth:`EpisodeWriter.save_episode` checks that after every episode.
3. **Temp file + rename for every file lerobot writes while we call it.** During our calls
   into lerobot (:func:`_crash_safe_io`), ``pq.ParquetWriter`` inside lerobot's
   ``dataset_writer`` / ``dataset_metadata`` modules writes ``.<name>.<pid>.tmp`` and renames
   it over the final name on ``close()``; ``io_utils.write_json`` (``info.json``,
   ``stats.json``) and ``dataset_metadata.write_tasks`` (``tasks.parquet``) write a temp file,
   fsync and ``os.replace``. Videos were already encoded into a temp dir and moved (renamed)
   into place by lerobot. The swaps are undone when the call returns, so other lerobot users
   in the process are unaffected.
4. **Order = commit protocol.** Inside lerobot's ``save_episode`` the files land in this order:
   tasks, data parquet, videos, ``meta/episodes`` parquet, ``info.json``, ``stats.json``. The
   episode is committed once its ``meta/episodes`` file exists (all files it references exist
   by then). A kill before that leaves only temp files / orphan files, which
   :func:`vla.data.integrity.repair_dataset` moves to ``.repair_trash/``; a kill after it
   leaves a complete episode whose ``info.json`` totals ``repair_dataset`` rebuilds. Resuming
   (``resume="auto"``) runs ``repair_dataset`` first. Files are fsynced at the end of
   ``save_episode``, so a returned episode also survives a power cut. With an episode log
   (``episode_log=True``) the episode's outcome row is written to a pending file before the
   commit and appended to the log after it (``vla.data.episode_log``), so repair can always
   give a committed episode its row.
5. **Atomic creation.** A new dataset's ``info.json`` is written by lerobot into a staging
   folder under ``.recovery/`` and renamed into ``meta/``; a kill before the rename leaves only
   leftovers that ``repair_dataset`` (and a new ``EpisodeWriter``) recognise and reset.

Video. Frames are streamed to per-camera encoder threads while they are added (lerobot's
``streaming_encoding``: no PNG round-trip, ``save_episode`` only flushes the encoder), with the
``h264`` codec (libx264, ``preset=ultrafast``): on a 2-core CPU libsvtav1 (lerobot's default)
is several times slower. lerobot's streaming encoder silently *drops* frames when its queue is
full; :meth:`EpisodeWriter.add_frame` applies back-pressure instead (waits for queue room), and
``save_episode`` refuses an episode whose video lost frames.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from vla.data.atomic import atomic_write_bytes, atomic_write_json, fsync_path, temp_path_for
from vla.data.episode_log import (
    EPISODE_LOG_PATH,
    append_row,
    clear_pending,
    has_episode_log,
    write_log,
    write_pending,
)
from vla.data.integrity import INFO_PATH, load_info_dict, repair_locked_dataset, unfinished_creation
from vla.data.layout import BACKUP_INFO_PATH, CREATE_DIR_PREFIX, LOCK_PATH, DatasetLock

logger = logging.getLogger(__name__)

ONE_EPISODE_PER_FILE_MB = 1e-6
"""File-size limit (MB) given to lerobot: any non-empty file exceeds it, so every episode
starts new data / video / episode-metadata files (see the module docstring, point 1)."""

_LEROBOT_DEFAULT_KEYS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


# ------------------------------------------------------------------------------------------
# Features
# ------------------------------------------------------------------------------------------


# robot_io's arm layouts (robot_io.robot.state_vector, robot_io.env.RobotEnv actions)
ARM_STATE_NAMES = ("ee_x", "ee_y", "ee_z", "ee_qw", "ee_qx", "ee_qy", "ee_qz", "gripper")
ARM_ACTION_NAMES = ("dx", "dy", "dz", "drx", "dry", "drz", "gripper")


def make_features(
    cameras: dict[str, tuple[int, int]],
    state_dim: int = 8,
    action_dim: int = 7,
    video: bool = True,
) -> dict:
    """The lerobot feature spec of a teleop demonstration.

    - ``observation.images.<cam>``: ``video`` (or ``image`` when ``video=False``), HxWx3 uint8.
    - ``observation.state``: float32 ``[state_dim]``; ``action``: float32 ``[action_dim]``.
    - ``intervention``: bool ``[1]``, True when a human commanded that frame.
    - ``observation.capture_time``: float64 ``[1]``, the real capture time of the frame in
      seconds since the episode's first frame. lerobot's own ``timestamp`` column stays the
      nominal ``frame_index / fps`` (lerobot fills it in), so lerobot's timestamp-sync check
      and video frame lookup keep working while the measured jitter is still recorded here.

    Args:
        cameras: camera name -> (height, width).
    """
    if state_dim <= 0 or action_dim <= 0:
        raise ValueError(f"state_dim and action_dim must be positive, got {state_dim}, {action_dim}")
    features: dict[str, dict] = {}
    for name, (height, width) in cameras.items():
        features[f"observation.images.{name}"] = {
            "dtype": "video" if video else "image",
            "shape": (int(height), int(width), 3),
            "names": ["height", "width", "channels"],
        }
    features["observation.state"] = {
        "dtype": "float32",
        "shape": (state_dim,),
        "names": list(ARM_STATE_NAMES) if state_dim == len(ARM_STATE_NAMES) else [f"state_{i}" for i in range(state_dim)],
    }
    features["action"] = {
        "dtype": "float32",
        "shape": (action_dim,),
        "names": list(ARM_ACTION_NAMES) if action_dim == len(ARM_ACTION_NAMES) else [f"action_{i}" for i in range(action_dim)],
    }
    features["intervention"] = {"dtype": "bool", "shape": (1,), "names": None}
    features["observation.capture_time"] = {"dtype": "float64", "shape": (1,), "names": None}
    return features


def _atomic_write_tasks(tasks, local_dir: Path) -> None:
    """Same output as lerobot's ``io_utils.write_tasks``, written atomically."""
    from lerobot.datasets.utils import DEFAULT_TASKS_PATH

    path = Path(local_dir) / DEFAULT_TASKS_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    tasks.to_parquet(tmp)
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)


class _AtomicParquetModule:
    """Stands in for ``pyarrow.parquet`` inside lerobot's writer modules during our calls:
    ``ParquetWriter`` writes a temp file that ``close()`` fsyncs and renames into place."""

    def __init__(self) -> None:
        import pyarrow.parquet as pq

        self._pq = pq

        class AtomicParquetWriter(pq.ParquetWriter):
            def __init__(self, where, *args, **kwargs):
                self.final_path = Path(where)
                self.temp_path = temp_path_for(self.final_path)
                super().__init__(str(self.temp_path), *args, **kwargs)

            def close(self) -> None:
                was_open = self.is_open
                super().close()
                if was_open:
                    fsync_path(self.temp_path)
                    os.replace(self.temp_path, self.final_path)
                    fsync_path(self.final_path.parent)

        self.ParquetWriter = AtomicParquetWriter

    def __getattr__(self, name: str):
        return getattr(self._pq, name)


@contextlib.contextmanager
def _crash_safe_io() -> Iterator[None]:
    """Swap lerobot's file writers for atomic ones while we call into lerobot (module
    docstring, point 3). Restored on exit, so code outside our calls sees stock lerobot."""
    from lerobot.datasets import dataset_metadata, dataset_writer, io_utils

    swaps = [
        (io_utils, "write_json", atomic_write_json),
        (dataset_metadata, "write_tasks", _atomic_write_tasks),
        (dataset_writer, "pq", _AtomicParquetModule()),
        (dataset_metadata, "pq", _AtomicParquetModule()),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in swaps]
    for module, name, value in swaps:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


# ------------------------------------------------------------------------------------------
# The writer
# ------------------------------------------------------------------------------------------


def _user_features(features: dict) -> dict:
    return {k: v for k, v in features.items() if k not in _LEROBOT_DEFAULT_KEYS}


def _feature_mismatch(existing: dict, wanted: dict) -> str | None:
    """First difference between the dataset's features and the requested ones, as a sentence."""
    existing, wanted = _user_features(existing), _user_features(wanted)
    for key in sorted(set(existing) | set(wanted)):
        if key not in existing:
            return f"features['{key}'] is requested but not in the dataset"
        if key not in wanted:
            return f"features['{key}'] is in the dataset but not requested"
        for field in ("dtype", "shape", "names"):
            have, want = existing[key].get(field), wanted[key].get(field)
            if field == "shape":
                have, want = tuple(have), tuple(want)
            elif field == "names" and have is not None and want is not None:
                have, want = list(have), list(want)
            if have != want:
                return f"features['{key}']['{field}']: dataset has {have!r}, requested {want!r}"
    return None


class EpisodeWriter:
    """Record episodes into a LeRobot v3 dataset so that a kill loses at most the episode in
    progress (see the module docstring for how).

    ``resume``: ``"auto"`` creates the dataset when ``root`` does not exist (or is an empty
    directory, or holds only the leftovers of a creation that was killed) and appends to it when
    it is an existing dataset with the same fps and features (after ``repair_dataset`` has
    restored it to its last committed episode); ``True`` requires
    an existing dataset, ``False`` a new one. A mismatch raises ``ValueError`` naming the field.

    ``streaming``: encode video while frames are added (default) instead of writing PNGs and
    encoding in ``save_episode``.

    ``episode_log``: keep one outcome row per episode in the dataset's episode log
    (``vla.data.episode_log``, what ``vla record`` writes); ``save_episode`` then needs its
    ``outcome_row``. A new dataset gets an empty log; an existing one must already keep a log
    (or have no episode yet), and a dataset that keeps a log is refused without it.

    ``encoder_threads``: threads per video encoder (default 1). With x264's default (one per
    core) the encoder can take every core of a small machine for a few hundred ms, starving the
    bridge and the control loop; on 2 cores that stalled the loop past the 200 ms watchdog
    (measured with bench/record.py). ``None`` lets the codec decide.
    """

    def __init__(
        self,
        root: str | Path,
        repo_id: str,
        fps: int,
        features: dict,
        robot_type: str = "",
        video: bool = True,
        vcodec: str = "h264",
        resume: bool | Literal["auto"] = "auto",
        streaming: bool = True,
        encoder_threads: int | None = 1,
        episode_log: bool = False,
    ) -> None:
        import av
        from lerobot.configs import RGBEncoderConfig
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        # libx264 prints a statistics block per video otherwise. lerobot's encoder thread calls
        # av.logging.restore_default_callback() after each video, which hands logging back to FFmpeg's
        # own printer: FFmpeg's level must be lowered too, not only PyAV's.
        av.logging.set_level(av.logging.ERROR)
        av.logging.set_libav_level(av.logging.ERROR)
        # lerobot writes each episode's parquet through datasets' Dataset.map, whose "Map: 0%| ..."
        # bar would land between the recorder's own bars after every episode.
        import datasets

        datasets.disable_progress_bars()
        if resume not in (True, False, "auto"):
            raise ValueError(f"resume must be True, False or 'auto', got {resume!r}")
        if fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self._root = Path(root)
        self._features = features
        self._closed = False
        has_video = any(ft["dtype"] == "video" for ft in features.values())
        if has_video and not video:
            raise ValueError("features contain 'video' cameras but video=False; build them with make_features(video=False)")

        preset = "ultrafast" if vcodec in ("h264", "hevc") else None
        rgb_encoder = RGBEncoderConfig(vcodec=vcodec, preset=preset) if has_video else None
        exists = (self._root / "meta" / "info.json").exists() or (self._root / BACKUP_INFO_PATH).exists()
        if self._root.exists() and not exists and unfinished_creation(self._root) is None:
            raise ValueError(f"{self._root} exists, is not empty and is not a LeRobot dataset (no meta/info.json)")
        if resume is True and not exists:
            raise ValueError(f"resume=True but {self._root} holds no dataset")
        if resume is False and exists:
            raise ValueError(f"resume=False but {self._root} already holds a dataset")

        self._lock = DatasetLock(self._root)  # taken before anything is written, creation included
        if not self._lock.acquire():
            raise RuntimeError(f"{self._root} is being recorded by another process ({self._root / LOCK_PATH} is locked)")
        try:
            with _crash_safe_io():
                if not exists:
                    self._create(repo_id, fps, features, robot_type, video)
                self._check_and_repair(repo_id, fps, features, robot_type)
                self._open_episode_log(episode_log)
                ds = LeRobotDataset.resume(
                    repo_id,
                    root=self._root,
                    rgb_encoder=rgb_encoder,
                    streaming_encoding=streaming,
                    encoder_queue_maxsize=_QUEUE_FRAMES,
                    encoder_threads=encoder_threads,
                )
                ds.meta._metadata_buffer_size = 1
                ds.meta.update_chunk_settings(
                    data_files_size_in_mb=ONE_EPISODE_PER_FILE_MB,
                    video_files_size_in_mb=ONE_EPISODE_PER_FILE_MB,
                )
        except BaseException:
            self._lock.release()
            raise
        self._ds = ds
        self._close_writers_after_each_write()
        # torch + lerobot + datasets leave millions of long-lived objects; a full cyclic-GC pass
        # over them stalled the recording process for ~300 ms (measured with bench/record.py),
        # long enough to trip the bridge's 200 ms watchdog mid-episode. Freeze what exists now
        # so collections only scan objects made while recording.
        gc.collect()
        gc.freeze()
        self._backup_info()

    # -- setup ------------------------------------------------------------------------------

    def _create(self, repo_id: str, fps: int, features: dict, robot_type: str, video: bool) -> None:
        """Create the dataset atomically (we hold its lock): lerobot writes ``info.json`` into a
        staging folder and it is renamed into ``meta/``; until that rename the root holds only
        what ``repair_dataset`` resets as an unfinished creation (:data:`CREATE_DIR_PREFIX`)."""
        from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

        if unfinished_creation(self._root):
            report = repair_locked_dataset(self._root)  # a killed creation: its leftovers go to the trash
            for action in report.actions:
                logger.warning("repair before create: %s", action)
            if not report.ok:
                raise RuntimeError(f"{self._root}: cannot reset the unfinished dataset in it: {report.problems}")
        staging = self._root / f"{CREATE_DIR_PREFIX}{os.getpid()}"
        if staging.exists():
            shutil.rmtree(staging)
        LeRobotDatasetMetadata.create(
            repo_id,
            fps,
            features,
            robot_type=robot_type or None,
            root=staging,
            use_videos=video,
            metadata_buffer_size=1,
            data_files_size_in_mb=ONE_EPISODE_PER_FILE_MB,
            video_files_size_in_mb=ONE_EPISODE_PER_FILE_MB,
        )
        (self._root / "meta").mkdir(parents=True, exist_ok=True)
        os.replace(staging / INFO_PATH, self._root / INFO_PATH)  # the dataset exists from here on
        fsync_path(self._root / "meta")
        shutil.rmtree(staging)

    def _open_episode_log(self, wanted: bool) -> None:
        """Make the dataset's episode log match ``episode_log`` (class docstring)."""
        episodes = load_info_dict(self._root)["total_episodes"]
        has_log = has_episode_log(self._root)
        if wanted and not has_log:
            if episodes:
                raise ValueError(
                    f"{self._root} has {episodes} episode(s) recorded without outcome rows (no "
                    f"{EPISODE_LOG_PATH}); every episode of a dataset needs one, so record into a new folder")
            write_log(self._root, [])
        elif has_log and not wanted:
            raise ValueError(
                f"{self._root} keeps an outcome row per episode ({EPISODE_LOG_PATH}): open it with "
                "EpisodeWriter(..., episode_log=True) and give save_episode(outcome_row=...)")
        self._episode_log = wanted

    def _check_and_repair(self, repo_id: str, fps: int, features: dict, robot_type: str) -> None:
        """Restore the dataset to its last committed episode (we hold its lock), then compare."""
        report = repair_locked_dataset(self._root)
        if not report.ok:
            raise RuntimeError(
                f"{self._root} could not be restored to a consistent dataset; not appending to it:\n  "
                + "\n  ".join(report.problems)
            )
        for action in report.actions:
            logger.warning("repair before resume: %s", action)
        info = load_info_dict(self._root)
        if info["fps"] != fps:
            raise ValueError(f"fps: dataset at {self._root} has fps={info['fps']}, requested fps={fps}")
        mismatch = _feature_mismatch(info["features"], features)
        if mismatch:
            raise ValueError(f"cannot append to {self._root}: {mismatch}")
        if robot_type and info.get("robot_type") not in (None, "", robot_type):
            raise ValueError(
                f"robot_type: dataset at {self._root} has {info['robot_type']!r}, requested {robot_type!r}"
            )

    def _close_writers_after_each_write(self) -> None:
        """Instance-level wraps (module docstring, point 2)."""
        writer, meta = self._ds.writer, self._ds.meta
        save_data = writer._save_episode_data
        flush_meta = meta._flush_metadata_buffer

        def save_episode_data_then_close(episode_buffer: dict) -> dict:
            result = save_data(episode_buffer)
            writer.close_writer()
            return result

        def flush_metadata_then_close() -> None:
            flush_meta()
            if meta._pq_writer is not None:
                meta._pq_writer.close()
                meta._pq_writer = None

        writer._save_episode_data = save_episode_data_then_close
        meta._flush_metadata_buffer = flush_metadata_then_close

    def _backup_info(self) -> None:
        info_path = self._root / "meta" / "info.json"
        atomic_write_bytes(self._root / BACKUP_INFO_PATH, info_path.read_bytes())

    # -- recording --------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self._root

    @property
    def num_episodes(self) -> int:
        return self._ds.meta.total_episodes

    @property
    def num_frames(self) -> int:
        return self._ds.meta.total_frames

    @property
    def frames_in_episode(self) -> int:
        """Frames added to the episode in progress."""
        buffer = self._ds.writer.episode_buffer
        return 0 if buffer is None else int(buffer["size"])

    def add_frame(self, frame: dict, task: str) -> None:
        """Add one frame to the episode in progress.

        ``frame`` holds every feature key (images HxWx3 uint8). Numeric values may be Python
        scalars or arrays of another dtype: they are converted to the feature's dtype and shape
        (``intervention=True``, ``observation.capture_time=0.033`` work).
        """
        self._require_open()
        if not task:
            raise ValueError("task must be a non-empty string")
        converted: dict[str, Any] = {}
        for key, value in frame.items():
            ft = self._ds.meta.features.get(key)
            if ft is None or ft["dtype"] in ("video", "image", "string"):
                converted[key] = value  # lerobot names unknown keys and checks image shapes
            else:
                array = np.asarray(value, dtype=ft["dtype"])
                if array.size != int(np.prod(ft["shape"])):
                    raise ValueError(f"frame['{key}'] has {array.size} values, feature shape is {tuple(ft['shape'])}")
                converted[key] = array.reshape(tuple(ft["shape"]))
        self._wait_for_encoder_room()
        converted["task"] = task
        self._ds.add_frame(converted)

    def _wait_for_encoder_room(self, timeout_s: float = 30.0) -> None:
        """Back-pressure instead of lerobot's drop-on-full for the streaming encoder."""
        encoder = self._ds.writer._streaming_encoder
        if encoder is None or not encoder._episode_active:
            return
        deadline = time.monotonic() + timeout_s
        for key, q in encoder._frame_queues.items():
            while q.full():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"video encoder for {key} made no progress for {timeout_s:.0f} s")
                time.sleep(0.002)

    def save_episode(self, outcome_row: dict | None = None) -> int:
        """Write the episode in progress; returns its index. When this returns the episode is
        durable (committed, fsynced): a kill or power cut right after loses nothing of it.

        ``outcome_row`` (required with ``episode_log=True``, refused without): the episode's row
        of the episode log (JSON-serialisable; ``episode_index`` is filled in). It is written
        as part of the commit (``vla.data.episode_log``): after a kill at any point either the
        episode is not committed, or it is and ``repair_dataset`` finds its row."""
        self._require_open()
        if self.frames_in_episode == 0:
            raise ValueError("save_episode() called with no frames added")
        if self._episode_log and outcome_row is None:
            raise ValueError(f"{self._root} keeps an outcome row per episode ({EPISODE_LOG_PATH}): "
                             "give save_episode(outcome_row=...)")
        if not self._episode_log and outcome_row is not None:
            raise ValueError("outcome_row given, but this writer was opened without episode_log=True")
        encoder = self._ds.writer._streaming_encoder
        if encoder is not None:
            dropped = {k: n for k, n in encoder._dropped_frames.items() if n > 0}
            if dropped:
                raise RuntimeError(
                    f"the video encoder dropped frames {dropped}: the episode cannot be saved "
                    "consistently; call discard_episode() and re-record"
                )
        episode_index = self._ds.meta.total_episodes
        row = None
        if outcome_row is not None:
            if outcome_row.get("episode_index", episode_index) != episode_index:
                raise ValueError(f"outcome_row['episode_index'] is {outcome_row['episode_index']}, "
                                 f"the episode being saved is {episode_index}")
            row = {"episode_index": episode_index, **outcome_row}
            write_pending(self._root, row)  # 1. the row survives a kill during the commit (refuses a non-JSON row)
        previous = self._ds.meta.latest_episode
        with _crash_safe_io():
            self._ds.save_episode(parallel_encoding=False)  # 2. commit: the meta/episodes file appears
        latest = self._ds.meta.latest_episode
        self._check_own_files(previous, latest)
        self._fsync_episode(latest)
        self._backup_info()
        if row is not None:
            append_row(self._root, row)  # 3.
            clear_pending(self._root)  # 4.
        return episode_index

    def _check_own_files(self, previous: dict | None, latest: dict) -> None:
        """Guard for point 1: the new episode must not share a file with the one before."""
        if previous is None:
            return
        for key in [k for k in latest if k.endswith("/file_index")]:
            prefix = key[: -len("file_index")]
            here = (latest[prefix + "chunk_index"][0], latest[key][0])
            before = (previous[prefix + "chunk_index"][0], previous[key][0])
            if here == before:
                raise RuntimeError(f"lerobot appended episode into the previous episode's file ({prefix}); crash safety broken")

    def _fsync_episode(self, latest: dict) -> None:
        from lerobot.datasets.utils import DEFAULT_EPISODES_PATH

        meta = self._ds.meta
        paths = [
            self._root / meta.data_path.format(
                chunk_index=latest["data/chunk_index"][0], file_index=latest["data/file_index"][0]
            ),
            self._root / DEFAULT_EPISODES_PATH.format(
                chunk_index=latest["meta/episodes/chunk_index"][0],
                file_index=latest["meta/episodes/file_index"][0],
            ),
        ]
        for key in meta.video_keys:
            paths.append(
                self._root / meta.video_path.format(
                    video_key=key,
                    chunk_index=latest[f"videos/{key}/chunk_index"][0],
                    file_index=latest[f"videos/{key}/file_index"][0],
                )
            )
        for path in paths:
            fsync_path(path)
            fsync_path(path.parent)

    def discard_episode(self) -> None:
        """Drop the episode in progress (frames, staged images, the encoder's temp video)."""
        self._require_open()
        self._ds.clear_episode_buffer(delete_images=True)

    def close(self) -> None:
        """Finalize the dataset. An episode in progress is discarded (not saved). Idempotent."""
        if self._closed:
            return
        if self.frames_in_episode > 0:
            logger.warning("closing with %d unsaved frames: the episode in progress is discarded", self.frames_in_episode)
            self._ds.clear_episode_buffer(delete_images=True)
        with _crash_safe_io():
            self._ds.finalize()
        self._lock.release()
        self._closed = True

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("EpisodeWriter is closed")

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EpisodeWriter(root={str(self._root)!r}, episodes={self.num_episodes}, frames={self.num_frames})"


_QUEUE_FRAMES = 60
"""Frames buffered per camera between ``add_frame`` and its encoder thread."""
