#!/usr/bin/env python
"""Peers at equal budget: LeRobot's own ACT and Diffusion Policy on the compact VLA's datasets.

Run ``.venv/bin/python -m bench.sft_peers [--peer act --peer diffusion] [--task ...] [--minutes 13]
[--eval-episodes 20] [--data-dir data/sft] [--runs-dir runs/peers] [--port 6700] [--quick]``.

For each peer, one policy per task is trained with LeRobot's own training code (``lerobot-train``
with LeRobot's default hyper-parameters, on CPU) on the scripted demos ``DATA_DIR/q1_<task>``
(the datasets ``bench/vla_sft.py`` records; a missing one is recorded here the same way,
``--demos`` episodes). The wall-clock budget, ``--minutes`` per peer (default 13: the compact
VLA's measured training time), is split equally over the tasks and covers the whole
``lerobot-train`` process (start-up, data loading, training, the final checkpoint).

How the budget is enforced: lerobot-train runs in a child process (this script,
``lerobot-train-until DEADLINE -- ARGS``) that calls ``lerobot.scripts.lerobot_train.main`` after
wrapping three of its functions: after every update it times the iteration, and when one more
iteration would end past the deadline it makes the loop save a checkpoint at that step (LeRobot's
own ``save_checkpoint``, as at the end of a run) and stops. Nothing else in the training loop
changes; ``--steps`` is LeRobot's default (100000), so the learning-rate schedule is the one a
default run would follow, cut short by the clock. A child that overruns its deadline by
``max(600 s, budget)`` (a hang) is killed and the bench fails. The budget is wall clock: on a
loaded machine the peers get fewer steps, so run the bench on an otherwise idle machine; the
report gives each run's CPU seconds next to its wall clock (the share of the machine it got).

The per-task checkpoints are assembled into a router directory (``RUNS_DIR/<peer>/config.json``,
``vla.models.lerobot_peers``: each task's instruction and paraphrases go to its policy) and
rolled out with ``vla eval`` on the same seeds (100000 ...) as ``bench/vla_sft.py``, against the
bench's own sim bridge on ``--port`` ... ``--port + 9``. Output: ``OUT/sft_peers.json`` (per peer
and task: successes, episodes, rate, vla eval's Wilson 95% interval, train wall clock and steps
done; the LeRobot hyper-parameters used) and ``OUT/sft_peers.png``. ``--compare ROW`` adds that
row of ``OUT/vla_sft.json`` (the compact VLA) to the plot and the per-task differences to the
report. A peer whose run directory already holds a finished evaluation with the same settings is
read back instead of re-run, and so is a trained policy whose training settings did not change
(re-evaluating with more episodes does not retrain).

LeRobot defaults used (lerobot 0.6.1), noted in the report:

* both: batch size 8, seed 1000, ResNet18 vision backbone randomly initialised
  (``--policy.pretrained_backbone_weights null``: the ImageNet weights cannot be downloaded here);
* ACT: chunk_size 100, n_action_steps 100 (one prediction executed open loop), n_obs_steps 1,
  VAE on (kl_weight 10), AdamW lr 1e-5 (backbone 1e-5), no scheduler;
* Diffusion Policy: n_obs_steps 2 (the adapter repeats the current observation: the harness
  hands over one observation per chunk), horizon 64, n_action_steps 32, DDPM with 100 training
  timesteps, Adam lr 1e-4, cosine schedule with 500 warm-up steps.

Deviations, each a flag: ``--num-workers`` (default 0 instead of 4: on this 2-core machine four
spawned decoding workers cost a minute of start-up and compete with training; video decoding in
the training process takes 0.2-0.7 s of a 4-35 s step) and ``--dp-inference-steps`` (default 10
DDPM denoising steps at evaluation instead of 100: one 100-step chunk takes minutes on this CPU;
0 keeps LeRobot's default). ``--lerobot-arg=--policy.x=y`` passes any other override through.

``--quick`` (one task, 2 demos if the dataset is missing, a 1-minute budget -- a few updates --
2 denoising steps, 2 evaluation episodes) is the smoke test.

Diffusion Policy needs ``diffusers`` (``lerobot[diffusion]``: ``diffusers>=0.38,<0.40``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import time

from bench.harness import flags, plots
from bench.harness.results import ROOT, write_result


TASKS = ("pick_red_cube", "pick_blue_cube", "lift_green_cube")
PEERS = ("act", "diffusion")
DATA_KEY = "q1"
"""bench/vla_sft.py's full-quality scripted demos (its rows without record flags)."""
LEROBOT_MAX_STEPS = 100_000
"""lerobot-train's default --steps: the schedule a default run follows (the clock stops it first)."""
CHILD = "lerobot-train-until"
HYPER = {
    "act": ("chunk_size", "n_action_steps", "n_obs_steps", "vision_backbone", "pretrained_backbone_weights",
            "dim_model", "n_heads", "dim_feedforward", "n_encoder_layers", "n_decoder_layers", "use_vae",
            "latent_dim", "kl_weight", "dropout", "temporal_ensemble_coeff", "optimizer_lr",
            "optimizer_lr_backbone", "optimizer_weight_decay"),
    "diffusion": ("n_obs_steps", "horizon", "n_action_steps", "drop_n_last_frames", "vision_backbone",
                  "pretrained_backbone_weights", "crop_shape", "down_dims", "noise_scheduler_type",
                  "num_train_timesteps", "num_inference_steps", "prediction_type", "optimizer_lr",
                  "scheduler_name", "scheduler_warmup_steps"),
}
"""The policy config fields copied into the report."""


# -- the child: lerobot-train, stopped at a wall-clock deadline ----------------------------------
class _Deadline(Exception):
    pass


def lerobot_train_until(deadline: float, args: list[str]) -> int:
    """Run ``lerobot-train ARGS`` in this process; when one more iteration would end after
    ``deadline`` (``time.time()``), save a checkpoint at the current step and stop."""
    import lerobot.scripts.lerobot_train as lt

    state = {"stop": False, "last": None, "steps": 0}
    update_policy, should_save, update_last = lt.update_policy, lt.should_save_checkpoint, lt.update_last_checkpoint

    def timed_update_policy(*a, **k):
        start = time.time()
        out = update_policy(*a, **k)
        now = time.time()
        iteration_s = now - (state["last"] if state["last"] is not None else start)  # data + update
        state["last"], state["steps"] = now, state["steps"] + 1
        state["stop"] = now + iteration_s > deadline
        return out

    def save_at_deadline(step, save_freq, total_steps):
        return state["stop"] or should_save(step, save_freq, total_steps)

    def update_last_and_stop(checkpoint_dir):
        update_last(checkpoint_dir)
        if state["stop"]:
            raise _Deadline(checkpoint_dir)

    lt.update_policy, lt.should_save_checkpoint, lt.update_last_checkpoint = \
        timed_update_policy, save_at_deadline, update_last_and_stop
    sys.argv = ["lerobot-train", *args]
    try:
        lt.main()
    except _Deadline as e:
        print(f"sft_peers: wall-clock deadline: stopped after {state['steps']} updates, checkpoint {e}", flush=True)
    return 0


# -- the bench ---------------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    return {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _run(cmd: list[str], log: pathlib.Path) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=_env())
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed (exit {r.returncode}); see {log}")
    return time.perf_counter() - t0


def lerobot_args(peer: str, task: str, dataset: pathlib.Path, out: pathlib.Path, args) -> list[str]:
    a = [f"--dataset.repo_id=local/{dataset.name}", f"--dataset.root={dataset}", f"--policy.type={peer}",
         "--policy.device=cpu", "--policy.push_to_hub=false", "--policy.pretrained_backbone_weights=null",
         "--wandb.enable=false", f"--output_dir={out}", f"--steps={LEROBOT_MAX_STEPS}", "--save_freq=0",
         "--log_freq=1", f"--num_workers={args.num_workers}", f"--job_name={peer}_{task}"]
    if peer == "diffusion" and args.dp_inference_steps > 0:
        a.append(f"--policy.num_inference_steps={args.dp_inference_steps}")
    return a + list(args.lerobot_arg)


def train_one(peer: str, task: str, dataset: pathlib.Path, run_dir: pathlib.Path, budget_s: float, args) -> dict:
    """lerobot-train for ``budget_s`` seconds of wall clock -> {wall_s, cpu_s, steps, checkpoint}.
    A finished run with the same training settings (``<task>.train.json``) is read back."""
    out, done = run_dir / task, run_dir / f"{task}.train.json"
    settings = {"dataset": str(dataset), "budget_s": round(budget_s, 1), "num_workers": args.num_workers,
                "dp_inference_steps": args.dp_inference_steps if peer == "diffusion" else None,
                "lerobot_args": list(args.lerobot_arg)}
    if done.is_file() and (prev := json.loads(done.read_text())).get("settings") == settings \
            and (run_dir / prev["result"]["checkpoint"] / "model.safetensors").is_file():
        print(f"{peer}/{task}: reusing the trained policy of {done}")
        return prev["result"]
    if out.exists():  # an interrupted or differently configured run: its clock does not count, start again
        print(f"{peer}/{task}: removing the earlier run {out}")
        shutil.rmtree(out)
    log = run_dir / f"{task}.train.log"
    print(f"{peer}/{task}: lerobot-train for {budget_s:.0f} s ...", flush=True)
    grace = max(600.0, budget_s)  # only against a hang: a starved machine can take minutes to start python
    cpu0 = _children_cpu_s()
    t0 = time.time()
    cmd = [sys.executable, "-m", "bench.sft_peers", CHILD, f"{t0 + budget_s:.3f}", "--",
           *lerobot_args(peer, task, dataset, out, args)]
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
        try:
            rc = p.wait(timeout=budget_s + grace)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise RuntimeError(f"{peer}/{task}: lerobot-train overran its {budget_s:.0f} s budget by more than "
                               f"{grace:.0f} s and was killed; see {log}") from None
    wall = time.time() - t0
    if rc != 0:
        raise RuntimeError(f"{peer}/{task}: lerobot-train failed (exit {rc}); see {log}")
    ckpt = out / "checkpoints" / "last"
    step_file = ckpt / "training_state" / "training_step.json"
    if not step_file.is_file():
        raise RuntimeError(f"{peer}/{task}: lerobot-train ended without a checkpoint in {ckpt}; see {log}")
    steps = int(json.loads(step_file.read_text())["step"])
    result = {"wall_s": round(wall, 1), "budget_s": round(budget_s, 1), "steps": steps,
              "s_per_step": round(wall / max(steps, 1), 1),
              # CPU seconds / wall seconds: the share of the machine it got (2.0 = both cores of a quiet 2-core box)
              "cpu_s": round(_children_cpu_s() - cpu0, 1),
              "checkpoint": str((ckpt / "pretrained_model").relative_to(run_dir))}
    if wall > 1.1 * budget_s:
        print(f"{peer}/{task}: WARNING: {wall:.0f} s of wall clock for a {budget_s:.0f} s budget (a loaded machine?)")
    print(f"{peer}/{task}: {steps} steps in {wall:.0f} s ({result['cpu_s']:.0f} CPU s)", flush=True)
    done.write_text(json.dumps({"settings": settings, "result": result}, indent=2))
    return result


def _children_cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def write_router(peer: str, run_dir: pathlib.Path, trained: dict[str, dict]) -> None:
    from hardware.sim_tasks import get_task

    routes = {}
    for task, t in trained.items():
        for instr in get_task(task).instructions:  # the instruction and its paraphrases
            routes[instr] = t["checkpoint"]
    (run_dir / "config.json").write_text(json.dumps(
        {"kind": "lerobot-peer", "policy": peer, "tasks": routes, "sim_tasks": list(trained)}, indent=2))


def hyper_parameters(peer: str, run_dir: pathlib.Path, checkpoint: str) -> dict:
    ckpt = run_dir / checkpoint
    pol = json.loads((ckpt / "config.json").read_text())
    train = json.loads((ckpt / "train_config.json").read_text())
    out = {k: pol.get(k) for k in HYPER[peer]}
    if peer == "diffusion" and out["num_inference_steps"] is None:
        out["num_inference_steps"] = pol.get("num_train_timesteps")  # LeRobot's default: all of them
    out.update({"batch_size": train.get("batch_size"), "steps_cap": train.get("steps"),
                "num_workers": train.get("num_workers"), "seed": train.get("seed"),
                "grad_clip_norm": (train.get("optimizer") or {}).get("grad_clip_norm")})
    return out


def _chunk_steps(peer: str, run_dir: pathlib.Path, trained: dict) -> int:
    """The peer's own execution: ``n_action_steps`` rows of every prediction (LeRobot's rollout)."""
    return int(hyper_parameters(peer, run_dir, next(iter(trained.values()))["checkpoint"])["n_action_steps"])


def run_peer(peer: str, args, site: str) -> dict:
    vla = [sys.executable, "-m", "vla.cli"]
    data_dir, run_dir = pathlib.Path(args.data_dir), pathlib.Path(args.runs_dir) / peer
    budget_s = args.minutes * 60.0 / len(args.task)
    settings = {"minutes": args.minutes, "tasks": list(args.task), "budget_s_per_task": round(budget_s, 1),
                "eval_episodes": args.eval_episodes, "num_workers": args.num_workers,
                "dp_inference_steps": args.dp_inference_steps if peer == "diffusion" else None,
                "exec_steps": args.exec_steps, "lerobot_args": list(args.lerobot_arg)}
    done = run_dir / "bench.json"
    if done.is_file():
        prev = json.loads(done.read_text())
        if prev.get("settings") == settings:
            print(f"{peer}: reusing {done}")
            return prev
    run_dir.mkdir(parents=True, exist_ok=True)
    record_s, trained = None, {}
    for task in args.task:
        root = data_dir / f"{DATA_KEY}_{task}"
        if not (root / "meta" / "info.json").is_file():
            data_dir.mkdir(parents=True, exist_ok=True)
            record_s = (record_s or 0.0) + _run(
                [*vla, "record", "--robot", site, "--task", task, "--teleop", "scripted", "--episodes",
                 str(args.demos), "--root", str(root)], data_dir / f"{root.name}.log")
        trained[task] = train_one(peer, task, root, run_dir, budget_s, args)
    write_router(peer, run_dir, trained)
    eval_dir = run_dir / "eval"
    eval_s = _run([*vla, "eval", "--checkpoint", str(run_dir), "--robot", site, "--episodes", str(args.eval_episodes),
                   "--videos", "1", "--threads", str(args.threads), "--out", str(eval_dir),
                   *sum((["--task", t] for t in args.task), []),
                   "--exec-steps", str(args.exec_steps or _chunk_steps(peer, run_dir, trained))], run_dir / "eval.log")
    rep = json.loads((eval_dir / "eval.json").read_text())
    tasks = {}
    for name, t in rep["tasks"].items():
        k, n = int(t["successes"]), int(t["episodes"])
        tasks[name] = {"successes": k, "episodes": n, "rate": k / n, "ci95": list(t["ci95"]),  # vla eval's Wilson interval
                       "train": trained[name]}
    out = {"peer": peer, "settings": settings, "tasks": tasks,
           "mean_rate": sum(t["rate"] for t in tasks.values()) / len(tasks),
           "exec_steps": rep.get("exec_steps"),
           "hyper_parameters": hyper_parameters(peer, run_dir, next(iter(trained.values()))["checkpoint"]),
           "run_dir": run_dir.name,
           "wall_s": {"record": None if record_s is None else round(record_s, 1),
                      "train": round(sum(t["wall_s"] for t in trained.values()), 1), "eval": round(eval_s, 1)}}
    done.write_text(json.dumps(out, indent=2))
    return out


def compare(rows: list[dict], vla_report: pathlib.Path, row_name: str) -> dict:
    """The compact VLA's reference: a row of bench/vla_sft.py's report (``ROW``) or a ``vla eval``
    report (``PATH/eval.json`` or its directory), and peer - VLA per task."""
    as_path = pathlib.Path(row_name)
    if as_path.is_dir():
        as_path = as_path / "eval.json"
    if as_path.suffix == ".json" or as_path.is_file():
        if not as_path.is_file():
            raise ValueError(f"--compare {row_name!r}: no vla eval report there")
        rep = json.loads(as_path.read_text())
        if "tasks" not in rep:
            raise ValueError(f"--compare {row_name!r}: not a vla eval report (no 'tasks')")
        ref = {"row": _portable(str(as_path.parent.parent)), "wall_s": {"train": None},
               "tasks": {t: {"successes": int(v["successes"]), "episodes": int(v["episodes"]),
                             "rate": int(v["successes"]) / int(v["episodes"]), "ci95": list(v["ci95"])}
                         for t, v in rep["tasks"].items()},
               "eval": {k: rep.get(k) for k in ("exec_steps", "temporal_ensemble", "seed_start")}}
        report = _portable(str(as_path))
    else:
        rep = json.loads(vla_report.read_text())
        rows_by_name = {r["row"]: r for r in rep["rows"]}
        if row_name not in rows_by_name:
            raise ValueError(f"--compare {row_name!r}: {vla_report} has rows {sorted(rows_by_name)}, "
                             "and it is not a vla eval report")
        ref, report = rows_by_name[row_name], vla_report.name
    delta = {r["peer"]: {t: round(v["rate"] - ref["tasks"][t]["rate"], 3) for t, v in r["tasks"].items()
                         if t in ref["tasks"]} for r in rows}
    return {"row": ref["row"], "report": report, "train_wall_s": ref["wall_s"]["train"],
            "eval": ref.get("eval"),
            "tasks": {t: ref["tasks"][t] for t in rows[0]["tasks"] if t in ref["tasks"]},
            "peer_minus_vla": delta}


def _portable(arg: str) -> str:
    """An absolute path in the recorded command becomes its last two parts (no machine paths in results)."""
    return os.path.join(*pathlib.Path(arg).parts[-2:]) if os.path.isabs(arg) else arg


def plot(rows: list[dict], ref: dict | None, path: pathlib.Path, minutes: float) -> None:
    plt = plots.pyplot()
    import numpy as np

    groups = [(f"{r['peer']}\n{sum(t['train']['steps'] for t in r['tasks'].values())} steps", r["tasks"]) for r in rows]
    if ref is not None:
        groups.append((f"compact VLA\n({ref['row']})", ref["tasks"]))
    tasks = list(rows[0]["tasks"])
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(groups) * len(tasks) / 2), 4))
    w = 0.8 / len(tasks)
    x = np.arange(len(groups))
    for j, t in enumerate(tasks):
        rate = np.array([g[t]["rate"] if t in g else np.nan for _, g in groups])
        lo = np.array([g[t]["ci95"][0] if t in g else np.nan for _, g in groups])
        hi = np.array([g[t]["ci95"][1] if t in g else np.nan for _, g in groups])
        ax.bar(x + (j - (len(tasks) - 1) / 2) * w, 100 * rate, w, yerr=100 * np.stack([rate - lo, hi - rate]),
               capsize=3, label=t)
    ax.set_xticks(x, [name for name, _ in groups])
    ax.set_ylabel("success, % (95% Wilson interval)")
    ax.set_ylim(0, 100)
    ax.set_title(f"LeRobot peers, {minutes:g} min training each ({minutes / len(tasks):.1f} min per task), "
                 f"{rows[0]['settings']['eval_episodes']} eval episodes/task", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [CHILD]:
        if len(argv) < 3 or argv[2] != "--":
            raise SystemExit(f"usage: python -m bench.sft_peers {CHILD} DEADLINE -- LEROBOT_TRAIN_ARGS...")
        return lerobot_train_until(float(argv[1]), argv[3:])
    ap = flags.parser("sft_peers", __doc__, out=False)
    ap.add_argument("--peer", action="append", choices=PEERS, help=f"peers (default both: {', '.join(PEERS)})")
    ap.add_argument("--task", action="append", help=f"tasks (default {', '.join(TASKS)})")
    ap.add_argument("--minutes", type=float, default=13.0,
                    help="training wall clock per peer, split equally over the tasks (default 13)")
    ap.add_argument("--eval-episodes", type=int, default=20, help="evaluation episodes per task (default 20)")
    ap.add_argument("--demos", type=int, default=60, help="scripted demos per task when a dataset is missing (default 60)")
    ap.add_argument("--num-workers", type=int, default=0, help="lerobot-train dataloader workers (default 0)")
    ap.add_argument("--dp-inference-steps", type=int, default=10,
                    help="Diffusion Policy denoising steps at evaluation (default 10; 0: LeRobot's default, 100)")
    ap.add_argument("--exec-steps", type=int, default=None,
                    help="vla eval --exec-steps (default: the peer's n_action_steps, as LeRobot rolls it out)")
    ap.add_argument("--lerobot-arg", action="append", default=[], metavar="ARG",
                    help="extra lerobot-train argument, e.g. --lerobot-arg=--policy.n_obs_steps=1 (repeat)")
    ap.add_argument("--compare", metavar="ROW|EVAL",
                    help="the compact VLA for comparison: a row of OUT/vla_sft.json, or a vla eval report "
                         "(RUN/eval-.../eval.json or its directory)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for vla eval")
    ap.add_argument("--port", type=int, default=None,
                    help="first port of the bench's own sim bridge (default: ports leased on this machine)")
    ap.add_argument("--data-dir", default="data/sft")
    ap.add_argument("--runs-dir", default="runs/peers")
    flags.add_out(ap, type=str)
    flags.add_quick(ap, "smoke test: 1 task, 1 minute per peer, 2 demos, 2 denoising steps, 2 episodes")
    args = ap.parse_args(argv)
    args.task = args.task or (["pick_red_cube"] if args.quick else list(TASKS))
    args.data_dir, args.runs_dir = os.path.abspath(args.data_dir), os.path.abspath(args.runs_dir)
    if args.quick:
        args.demos, args.minutes, args.eval_episodes, args.dp_inference_steps = 2, 1.0, 2, 2
    if args.minutes <= 0 or args.eval_episodes <= 0 or args.num_workers < 0 or args.dp_inference_steps < 0:
        raise SystemExit("--minutes and --eval-episodes must be positive, --num-workers and --dp-inference-steps >= 0")
    from bench.harness.sites import site_copy

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    site = site_copy(str(pathlib.Path(args.data_dir) / f"site-{args.port or os.getpid()}.yaml"), args.port)
    rows = []
    for peer in args.peer or PEERS:
        r = run_peer(peer, args, site)
        rows.append(r)
        print(f"{peer:>10}: " + "  ".join(f"{t} {v['successes']}/{v['episodes']} ({v['train']['steps']} steps)"
                                          for t, v in r["tasks"].items())
              + f"   (train {r['wall_s']['train']:.0f} s, eval {r['wall_s']['eval']:.0f} s)", flush=True)
    ref = compare(rows, out / "vla_sft.json", args.compare) if args.compare else None
    report = {"bench": "sft_peers", "date": _dt.date.today().isoformat(),
              "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
              "command": "bench/sft_peers.py " + " ".join(_portable(a) for a in argv),
              "goal": "the compact VLA beats LeRobot's ACT and Diffusion Policy at equal training wall clock "
                      "on the same datasets and evaluation harness, or we say by how much it loses (issue 13)",
              "budget": f"{args.minutes:g} min of lerobot-train wall clock per peer, {args.minutes / len(args.task):.2f} "
                        "min per task (start-up, data loading, updates and the final checkpoint all count)",
              "peers": rows, "compact_vla": ref}
    write_result(out / "sft_peers.json", report, "sft_peers", argv, args.quick, indent=2)
    plot(rows, ref, out / "sft_peers.png", args.minutes)
    print(f"report: {out / 'sft_peers.json'}  plot: {out / 'sft_peers.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
