"""`vla replay`: play a recorded episode's actions back through the bridge."""

from __future__ import annotations

import argparse
import os


def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Replay the applied actions of a recorded episode through the bridge at the dataset's rate. In "
        "simulation the scene is re-created from the episode's task and seed (its row of the episode log, "
        "meta/vla_episodes.jsonl), so the replay should reproduce the demonstration; the end-effector "
        "divergence from the recorded states is reported."), epilog="example:\n  vla replay --robot sim-franka --root data/pick --episode 0\n")
    p.add_argument("--robot", default="sim-franka", help="site YAML or preset (default sim-franka)")
    p.add_argument("--root", required=True, help="dataset folder")
    p.add_argument("--repo-id", default=None, help="repo id (default local/<folder name>)")
    p.add_argument("--episode", type=int, default=0, help="episode index (default 0)")
    p.add_argument("--serve", default="auto", choices=("auto", "always", "never"),
                   help="start the bridge for a simulated site when it is not running (auto, default)")
    p.set_defaults(run=run)


def episode_record(root: str, episode: int) -> dict:
    """The episode's row of the dataset's episode log, or {} (a dataset recorded elsewhere)."""
    from vla.data.episode_log import read_episode_log

    try:
        return read_episode_log(root).get(episode, {})
    except FileNotFoundError:
        return {}


def run(args) -> int:
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from robot_io.bridge_process import running_bridge
    from robot_io.env import RobotEnv
    from robot_io.robot import RobotClient
    from robot_io.site import load_site

    repo_id = args.repo_id or f"local/{os.path.basename(os.path.normpath(args.root))}"
    ds = LeRobotDataset(repo_id, root=args.root, episodes=[args.episode])
    if ds.num_frames == 0:
        raise ValueError(f"episode {args.episode} has no frames in {args.root}")
    cols = ds.hf_dataset.with_format("numpy")
    actions = np.stack(cols["action"]).astype(np.float32)
    states = np.stack(cols["observation.state"]).astype(np.float32)
    rec = episode_record(args.root, args.episode)
    site = load_site(args.robot)
    reward_fn = None
    if rec.get("task"):
        from rewards.sim_success import success_reward

        reward_fn = success_reward(rec["task"])
    log_path = os.path.abspath(args.root.rstrip("/") + f".replay-ep{args.episode}-bridge.log")
    with running_bridge(site, log_path, start=args.serve):
        client = RobotClient(site)
        env = RobotEnv(client, instruction=rec.get("instruction", ""), control_hz=float(ds.fps), reward_fn=reward_fn,
                       reset_fn=lambda env, seed: client.reset(seed=seed, task=rec.get("task")))
        obs, _ = env.reset(seed=rec.get("seed"))
        err, success = [], False
        for k, a in enumerate(actions):
            err.append(float(np.linalg.norm(obs["state"][:3] - states[k, :3])))
            obs, r, term, trunc, info = env.step(a)
            success = success or bool(term)
        env.close()
    err = np.asarray(err)
    print(f"replayed episode {args.episode}: {len(actions)} actions at {ds.fps} fps"
          + (f", seed {rec['seed']}, task {rec['task']}" if rec.get("task") else ""))
    print(f"  ee position vs recorded: mean {err.mean() * 100:.2f} cm, max {err.max() * 100:.2f} cm")
    if reward_fn is not None:
        print(f"  task success on replay: {success} (recorded: {rec.get('success')})")
    return 0
