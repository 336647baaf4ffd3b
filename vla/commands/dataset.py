"""`vla dataset`: check, repair and view LeRobot v3 datasets."""

from __future__ import annotations

import argparse
import os


def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Check a LeRobot v3 dataset (every file readable, metadata consistent, lerobot opens it and its "
        "videos decode), repair one left by a crash (back to its last finished episode; removed files go "
        "to <root>/.repair_trash/, nothing is deleted), or view an episode (video + action/state plot)."),
        epilog="""\
examples:
  vla dataset check --root data/pick
  vla dataset repair --root data/pick --dry-run
  vla dataset view --root data/pick --episode 3 --out views/
""")
    dsub = p.add_subparsers(dest="dataset_command", metavar="ACTION", required=True)
    c = dsub.add_parser("check", help="validate a dataset; exit code 1 if anything is wrong", description=(
        "Validate a LeRobot v3 dataset: info.json parses, every parquet file has its footer, episode "
        "metadata matches the data, every video decodes with the frames its episodes need, every episode "
        "has exactly one outcome row in the episode log (meta/vla_episodes.jsonl, when the dataset keeps "
        "one), and lerobot opens it. Prints each problem with the file it is in; exit code 1 if there is any."))
    c.add_argument("--root", required=True, help="dataset folder")
    c.set_defaults(run=run_check)
    r = dsub.add_parser("repair", help="restore a dataset left by a crash to its last finished episode", description=(
        "Restore a dataset left by a crash (a killed recorder, a power cut) to its last finished "
        "episode: partial files, temp files and the half-written episode are moved to "
        "<root>/.repair_trash/<time>/ (nothing is deleted), metadata totals are rebuilt, and the "
        "result is checked. The episode log (meta/vla_episodes.jsonl) is brought back to one outcome "
        "row per episode: a row the recorder could not append before the kill is restored from its "
        "pending copy; the last episode(s) are dropped only when they have no row and none can be "
        "restored. Other finished episodes are never touched. A folder left by a creation killed "
        "before the dataset existed is reset. Run with --dry-run first to see what it would do."))
    r.add_argument("--root", required=True, help="dataset folder")
    r.add_argument("--dry-run", action="store_true", help="only print what would be done")
    r.set_defaults(run=run_repair)
    v = dsub.add_parser("view", help="write a video and a plot of actions/states of one episode", description=(
        "Write <out>/episode_NNNN.mp4 (all cameras side by side, at the dataset's rate) and "
        "<out>/episode_NNNN.png (state and applied action of every frame) for one episode."))
    v.add_argument("--root", required=True, help="dataset folder")
    v.add_argument("--repo-id", default=None, help="repo id (default local/<folder name>)")
    v.add_argument("--episode", type=int, default=0, help="episode index (default 0)")
    v.add_argument("--out", default=None, help="output folder (default <root>_views, beside the dataset)")
    v.set_defaults(run=run_view)


def _print_report(rep) -> None:
    print(f"{'OK' if rep.ok else 'PROBLEMS'}: {rep.episodes} episode(s), {rep.frames} frame(s)")
    for line in getattr(rep, "actions", []) or []:
        print(f"  action: {line}")
    for line in rep.problems:
        print(f"  problem: {line}")


def run_check(args) -> int:
    from vla.data.integrity import check_dataset

    rep = check_dataset(args.root)
    _print_report(rep)
    return 0 if rep.ok else 1


def run_repair(args) -> int:
    from vla.data.integrity import repair_dataset

    rep = repair_dataset(args.root, dry_run=args.dry_run)
    _print_report(rep)
    return 0 if rep.ok or args.dry_run else 1


def run_view(args) -> int:
    import cv2
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    repo_id = args.repo_id or f"local/{os.path.basename(os.path.normpath(args.root))}"
    ds = LeRobotDataset(repo_id, root=args.root, episodes=[args.episode])
    if ds.num_frames == 0:
        raise ValueError(f"episode {args.episode} has no frames in {args.root}")
    out = args.out or os.path.normpath(args.root) + "_views"  # never inside the dataset itself
    os.makedirs(out, exist_ok=True)
    cams = [k for k in ds.meta.camera_keys]
    video_path = os.path.join(out, f"episode_{args.episode:04d}.mp4")
    writer = None
    states, actions, task = [], [], ""
    for i in range(ds.num_frames):
        item = ds[i]
        states.append(item["observation.state"].numpy())
        actions.append(item["action"].numpy())
        task = item.get("task", task)
        tiles = [(item[c].permute(1, 2, 0).numpy() * 255).clip(0, 255).astype(np.uint8) for c in cams]
        if tiles:
            h = max(t.shape[0] for t in tiles)
            tiles = [cv2.resize(t, (int(t.shape[1] * h / t.shape[0]), h)) for t in tiles]
            img = cv2.cvtColor(np.concatenate(tiles, axis=1), cv2.COLOR_RGB2BGR)
            if writer is None:
                writer = cv2.VideoWriter(video_path, cv2.VideoWriter_fourcc(*"mp4v"), float(ds.fps),
                                         (img.shape[1], img.shape[0]))
            writer.write(img)
    if writer is not None:
        writer.release()
    states, actions = np.stack(states), np.stack(actions)
    t = np.arange(len(states)) / ds.fps
    fig, axes = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    def names(key, n):
        got = ds.meta.features.get(key, {}).get("names")
        got = list(got.values())[0] if isinstance(got, dict) else got
        return list(got) if got is not None and len(got) == n else [f"{key}[{j}]" for j in range(n)]

    for j, label in enumerate(names("observation.state", states.shape[1])):
        axes[0].plot(t, states[:, j], label=label)
    for j, label in enumerate(names("action", actions.shape[1])):
        axes[1].plot(t, actions[:, j], label=label)
    axes[0].set_ylabel("observation.state")
    axes[1].set_ylabel("action (applied)")
    axes[1].set_xlabel("time (s)")
    for ax in axes:
        ax.legend(fontsize=7, ncol=4, loc="upper right")
    fig.suptitle(f"{repo_id} episode {args.episode}: {task}")
    fig.tight_layout()
    plot_path = os.path.join(out, f"episode_{args.episode:04d}.png")
    fig.savefig(plot_path, dpi=100)
    plt.close(fig)
    print(f"episode {args.episode}: {len(states)} frames at {ds.fps} fps, task {task!r}")
    if writer is not None:
        print(f"  video: {video_path}")
    print(f"  plot:  {plot_path}")
    return 0
