"""Where a compact VLA's pick fails: closed-loop rollouts logged tick by tick with the simulator's truth.

For each scene the VLA drives the fast sim Franka (`vla eval`'s seeds, 100000 ...) and every tick
logs the gripper's and the target cube's positions (the simulator's privileged state, read
only by this probe) and the gripper command. Per episode it reports

* the horizontal offset between the fingers' axis and the cube at the first close command
  (``first_close_dxy_m``): the scripted expert only closes within 1.2 cm;
* how many times the gripper closed (re-grasps), whether the cube was ever lifted 2 cm, and
  the smallest horizontal offset reached while below 3 cm above the cube.

Writes ``bench/archive/results/<name>.json`` (summary + every episode, no traces) and ``.png`` (first-close
offset of successful vs failed episodes).

    .venv/bin/python -m bench.archive.vla_probe --checkpoint runs/sft/crop_fine3_noshift --task pick_red_cube --exec-steps 4
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

from bench.harness.results import ROOT  # noqa: E402


def probe_episode(env, client, policy, seed: int, cube: str, names: list[str]) -> dict:
    from hardware.sim_tasks import objects_from_state

    obs, _ = env.reset(seed=seed)
    if hasattr(policy, "reset"):
        policy.reset(seed)
    ee, cb, grip = [], [], []
    ticks, success, done = 0, False, False
    while ticks < env.max_ticks and not done:
        for row in policy(obs):
            obs, reward, terminated, truncated, info = env.step(row)
            ticks += 1
            objs = objects_from_state({k: np.asarray(v) for k, v in client.last_state.arrays.items()}, names)
            ee.append(np.asarray(obs["state"][:3], float))
            cb.append(np.asarray(objs[cube][:3], float))
            grip.append(float(row[6]))
            success = bool(info.get("success", reward > 0))
            if terminated or truncated or success or ticks >= env.max_ticks:
                done = True
                break
    ee, cb, g = np.array(ee), np.array(cb), np.array(grip)
    dxy = np.linalg.norm(ee[:, :2] - cb[:, :2], axis=1)
    close = np.flatnonzero((g[1:] < 0.5) & (g[:-1] >= 0.5)) + 1
    low = ee[:, 2] - cb[:, 2] < 0.03
    return {"seed": seed, "success": success, "ticks": ticks, "closes": int(len(close)),
            "first_close_dxy_m": float(dxy[close[0]]) if len(close) else None,
            "min_dxy_low_m": float(dxy[low].min()) if low.any() else None,
            "lifted": bool((cb[:, 2] - cb[0, 2]).max() > 0.02)}


def plot(episodes: list[dict], path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    offsets = [e["first_close_dxy_m"] for e in episodes if e["first_close_dxy_m"] is not None]
    bins = np.arange(0.0, max([6.0] + [100 * x + 0.5 for x in offsets]), 0.25)
    for ok, colour, label in ((True, "tab:green", "succeeded"), (False, "tab:red", "failed")):
        x = [100 * e["first_close_dxy_m"] for e in episodes if e["success"] == ok and e["first_close_dxy_m"] is not None]
        ax.hist(x, bins=bins, alpha=0.6, color=colour, label=f"{label} ({len(x)})")
    ax.axvline(1.2, color="k", ls="--", lw=1, label="the expert closes within 1.2 cm")
    ax.set_xlabel("fingers-to-cube horizontal offset at the first close (cm)")
    ax.set_ylabel("episodes")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--checkpoint", required=True, help="a `vla train` run or checkpoint")
    ap.add_argument("--task", default="pick_red_cube", help="a pick or lift sim task (default pick_red_cube)")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--seed-start", type=int, default=100_000)
    ap.add_argument("--exec-steps", type=int, default=None, help="chunk rows per re-plan (default: temporal ensembling)")
    ap.add_argument("--port", type=int, default=6700, help="first of the 6 ports of the probe's sim bridge (default 6700)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "archive" / "results")
    ap.add_argument("--name", default="vla_probe")
    args = ap.parse_args()

    import torch
    from tqdm import tqdm

    from bench.harness.sites import site_with_ports
    from hardware.sim_tasks import get_task
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from robot_io.bridge_process import running_bridge
    from vla.envs import TemporalEnsemble, VLAPolicy, task_env
    from vla.models import load_vla
    from vla.models import resolve_checkpoint
    from bench.harness.results import portable as portable_path

    task = get_task(args.task)
    cube = next((s[1] for s in task.skills if s[0] in ("pick", "lift")), None)
    if cube is None:
        raise SystemExit(f"--task {args.task}: the probe needs a pick or lift task")
    torch.set_num_threads(args.threads)
    model = load_vla(resolve_checkpoint(args.checkpoint)).eval()
    policy = VLAPolicy(model, args.exec_steps) if args.exec_steps else TemporalEnsemble(VLAPolicy(model))
    t0 = time.perf_counter()
    episodes = []
    with tempfile.TemporaryDirectory() as tmp:
        site = load_site(site_with_ports(os.path.join(tmp, "site.yaml"), args.port))
        with running_bridge(site, os.path.join(tmp, "bridge.log")):
            client = RobotClient(site)
            try:
                names = list(client.description.get("objects", []))
                env = task_env(client, task.name)
                for i in tqdm(range(args.episodes), desc="probe", unit="ep"):
                    episodes.append(probe_episode(env, client, policy, args.seed_start + i, cube, names))
            finally:
                client.close()

    def med(xs):
        xs = [x for x in xs if x is not None]
        return float(np.median(xs)) if xs else None

    ok = [e for e in episodes if e["success"]]
    bad = [e for e in episodes if not e["success"]]
    summary = {"successes": len(ok), "episodes": len(episodes),
               "first_close_dxy_m_median": {"succeeded": med([e["first_close_dxy_m"] for e in ok]),
                                            "failed": med([e["first_close_dxy_m"] for e in bad])},
               "closes_median": {"succeeded": med([e["closes"] for e in ok]), "failed": med([e["closes"] for e in bad])}}
    out = {"bench": "vla_probe", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "checkpoint": portable_path(args.checkpoint), "task": task.name, "seed_start": args.seed_start,
           "execution": f"exec_steps {args.exec_steps}" if args.exec_steps else "temporal ensembling (m 0.01)",
           "wall_s": round(time.perf_counter() - t0, 1), "summary": summary, "episodes": episodes}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(out, indent=2) + "\n")
    plot(episodes, args.out / f"{args.name}.png", f"{out['checkpoint']} on {task.name}, {out['execution']}")
    fc = summary["first_close_dxy_m_median"]
    print(f"{task.name}: {len(ok)}/{len(episodes)} succeeded; first-close offset median "
          f"{'-' if fc['succeeded'] is None else f'{100 * fc['succeeded']:.1f} cm'} (succeeded) vs "
          f"{'-' if fc['failed'] is None else f'{100 * fc['failed']:.1f} cm'} (failed); "
          f"closes median {summary['closes_median']['succeeded']} vs {summary['closes_median']['failed']}")
    print(f"wrote {args.out / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
