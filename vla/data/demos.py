"""Load LeRobot v3 demonstration datasets into memory for supervised fine-tuning.

Tabular columns come from the dataset's parquet files through ``LeRobotDataset``; camera frames
are decoded one episode at a time with LeRobot's ``decode_video_frames`` (a sequential decode
of the episode's timestamps, much faster than frame-by-frame random access) and resized at once
to the model's input size, so a few thousand frames of several cameras fit in memory.

Every dataset must have ``observation.state``, ``action`` and the requested cameras
(``observation.images.<camera>``), with the same state / action sizes across datasets; anything
else is a ``ValueError`` that names the dataset and the field.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import torch


@dataclasses.dataclass
class DemoEpisode:
    dataset: str
    episode_index: int
    instruction: str
    state: np.ndarray
    """float32 [T, S]"""
    action: np.ndarray
    """float32 [T, A]"""
    images: dict[str, np.ndarray]
    """camera -> uint8 [T, size, size, 3]"""
    frame_instructions: list[str] | None = None
    """Each frame's own task when the frames carry more than the episode's instruction (sub-skill
    labels, ``vla record --label-subskills``); None when every frame has the episode's."""
    driven: np.ndarray | None = None
    """bool [T]: the frames a policy executed while the expert only labelled them (an episode that
    ``vla record --dagger`` recorded: its log row names the DAgger run and the frame's
    ``intervention`` flag is False); None for an episode no policy drove."""

    def __len__(self) -> int:
        return len(self.state)


def dataset_cameras(root: str) -> list[str]:
    """Camera names of a LeRobot dataset (``observation.images.<name>`` features)."""
    import json

    info_path = os.path.join(root, "meta", "info.json")
    if not os.path.isfile(info_path):
        raise ValueError(f"dataset {root}: no meta/info.json (not a LeRobot v3 dataset)")
    with open(info_path) as f:
        feats = json.load(f)["features"]
    return sorted(k.split(".", 2)[2] for k, v in feats.items()
                  if k.startswith("observation.images.") and v.get("dtype") in ("video", "image"))


def load_demos(roots: list[str], image_size: int | None, cameras: list[str] | None = None,
               progress: bool = True, success_only: bool = False,
               crops: dict[str, tuple[float, float, float, float]] | None = None) -> list[DemoEpisode]:
    """All episodes of ``roots`` (LeRobot v3 dataset directories) with images resized to
    ``image_size``. ``cameras`` defaults to the cameras of the first dataset.

    ``success_only`` keeps only the episodes that ``meta/vla_episodes.jsonl`` (written by
    ``vla record``) marks successful, i.e. filtered behaviour cloning on data recorded with
    ``--keep-failures``; a dataset without that file is refused. ``image_size`` None keeps the
    recorded resolution (the model then crops and resizes, as at inference). ``crops``: camera -> region
    ``(x0, y0, x1, y1)`` (fractions) cut out before the resize, as the model does at inference."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.datasets.video_utils import decode_video_frames
    from tqdm import tqdm

    from vla.models.encoders import crop_uint8, resize_uint8

    crops = crops or {}

    if not roots:
        raise ValueError("no dataset given (--dataset)")
    episodes: list[DemoEpisode] = []
    dims: tuple[int, int] | None = None
    for root in roots:
        root = os.path.abspath(root)
        cams_here = dataset_cameras(root)
        cams = list(cameras) if cameras is not None else cams_here
        if cameras is None:
            cameras = cams
        missing = [c for c in cams if c not in cams_here]
        if missing:
            raise ValueError(f"dataset {root}: no camera(s) {missing} (observation.images.<camera>); it has {cams_here}")
        try:
            ds = LeRobotDataset(f"local/{os.path.basename(root)}", root=root)
        except Exception as e:  # noqa: BLE001 - lerobot raises many types for a broken dataset
            raise ValueError(f"dataset {root} could not be opened by lerobot: {type(e).__name__}: {e}") from e
        for field in ("observation.state", "action"):
            if field not in ds.meta.features:
                raise ValueError(f"dataset {root}: has no '{field}' feature")
        table = ds.hf_dataset.with_format("numpy")
        state_all = np.asarray(table["observation.state"], np.float32)
        action_all = np.asarray(table["action"], np.float32)
        ts_all = np.asarray(table["timestamp"], np.float64)
        ep_all = np.asarray(table["episode_index"])
        task_all = np.asarray(table["task_index"])
        interv_all = (np.asarray(table["intervention"]).reshape(len(ep_all), -1)[:, 0].astype(bool)
                      if "intervention" in ds.meta.features else None)
        here = (state_all.shape[1], action_all.shape[1])
        if dims is None:
            dims = here
        elif here != dims:
            raise ValueError(f"dataset {root}: observation.state / action have sizes {here}, "
                             f"the other datasets {dims}")
        tasks = {int(i): t for t, i in zip(ds.meta.tasks.index, ds.meta.tasks["task_index"])}
        from vla.data.episode_log import read_episode_log

        try:
            side = read_episode_log(root)
        except FileNotFoundError:  # not recorded by vla record: the frames' tasks are all there is
            side = {}
        keep = None
        if success_only:
            from vla.data.episode_log import EPISODE_LOG_PATH, read_outcomes

            outcomes = read_outcomes(root)
            unknown = [ep for ep in range(ds.meta.total_episodes) if ep not in outcomes]
            if unknown:
                raise ValueError(f"dataset {root}: success_only needs every episode's outcome, but "
                                 f"{EPISODE_LOG_PATH} has none for episode(s) {unknown[:10]} "
                                 f"(`vla dataset check --root {root}` says why)")
            keep = {ep for ep, ok in outcomes.items() if ok}
        tol = max(float(ds.tolerance_s), 0.5 / ds.meta.fps)
        bar = tqdm(range(ds.meta.total_episodes), desc=f"load {os.path.basename(root)}", unit="ep",
                   disable=not progress)
        for ep in bar:
            rows = np.flatnonzero(ep_all == ep)
            if len(rows) == 0 or (keep is not None and ep not in keep):
                continue
            meta = ds.meta.episodes[ep]
            images = {}
            for cam in cams:
                key = f"observation.images.{cam}"
                if ds.meta.features[key]["dtype"] == "image":  # `vla record --no-video`: frames in the parquet rows
                    col = ds.hf_dataset.select(rows.tolist())[key]
                    frames = torch.from_numpy(np.stack([np.asarray(im.convert("RGB")) if hasattr(im, "convert")
                                                        else np.asarray(im) for im in col]))
                    if frames.ndim != 4 or frames.shape[-1] != 3:  # channels-first tensors
                        frames = frames.permute(0, 2, 3, 1)
                    if frames.dtype != torch.uint8:
                        frames = (frames.float() * (255 if frames.max() <= 1 else 1)).round().clamp(0, 255).to(torch.uint8)
                    frames = frames.contiguous()
                    if cam in crops:
                        frames = crop_uint8(frames, crops[cam])
                    images[cam] = (resize_uint8(frames, image_size) if image_size else frames).numpy()
                    continue
                path = os.path.join(root, str(ds.meta.get_video_file_path(ep, key)))
                ts = (float(meta[f"videos/{key}/from_timestamp"]) + ts_all[rows]).tolist()
                frames = decode_video_frames(path, ts, tol, return_uint8=True)  # [T, 3, H, W]
                if frames.dtype != torch.uint8:
                    frames = (frames * 255).round().clamp(0, 255).to(torch.uint8)
                frames = frames.permute(0, 2, 3, 1).contiguous()
                if cam in crops:
                    frames = crop_uint8(frames, crops[cam])
                if image_size:
                    frames = resize_uint8(frames, image_size)
                images[cam] = frames.numpy()
            frame_tasks = [tasks[int(i)] for i in task_all[rows]]
            # the episode's instruction: what vla record logged for it (a sub-skill-labelled episode's
            # frames carry the sub-skills), else its first frame's task
            instruction = (side.get(int(ep)) or {}).get("instruction") or frame_tasks[0]
            # a DAgger episode (its log row names the run): the frames the policy drove have intervention False
            driven = (~interv_all[rows] if (side.get(int(ep)) or {}).get("dagger") and interv_all is not None
                      else None)
            episodes.append(DemoEpisode(dataset=root, episode_index=int(ep), instruction=instruction,
                                        state=state_all[rows], action=action_all[rows], images=images,
                                        frame_instructions=(frame_tasks if set(frame_tasks) != {instruction}
                                                            else None),
                                        driven=driven if driven is not None and driven.any() else None))
    return episodes


def coherent_rows(driven: np.ndarray | None, length: int, horizon: int) -> np.ndarray:
    """bool [T, H]: row k of frame t's action chunk ``a[t : t + H]`` is a plan the expert carried out, i.e.
    the expert itself executed frames t .. t+k-1 (row 0, the label at frame t's own state, always is).
    ``driven`` [T]: the frames a policy executed (DAgger); None: every row of every frame. Rows past the
    episode's end (``action_chunks`` pads them by repeating the last action) follow the same rule."""
    mask = np.ones((length, horizon), bool)
    if driven is None:
        return mask
    driven = np.asarray(driven, bool)
    if driven.shape != (length,):
        raise ValueError(f"driven must be [{length}], got {list(driven.shape)}")
    ext = np.concatenate([driven, np.zeros(horizon, bool)])  # the padded rows: nobody drove past the end
    run = np.zeros(len(ext) + 1, np.int64)  # run[t]: how many frames from t on the expert executed in a row
    for t in range(len(ext) - 1, -1, -1):
        run[t] = 0 if ext[t] else run[t + 1] + 1
    return np.arange(horizon)[None, :] <= run[:length, None]


def action_chunks(action: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """For every frame t: actions[t : t + H], padded past the episode's end by repeating the last
    action. -> (chunks [T, H, A], is_pad [T, H])."""
    t = len(action)
    idx = np.arange(t)[:, None] + np.arange(horizon)[None]
    is_pad = idx >= t
    return action[np.minimum(idx, t - 1)], is_pad
