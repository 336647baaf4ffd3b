#!/usr/bin/env python
"""Does one macro-step's residual change the outcome, and does the residual agent's critic rank residuals as the
truth does? Monte-Carlo Q over residuals vs the critic, at states of the run's own policy (issue 32).

``bench/archive/residual_critic.py`` found that a residual session's critic ranks *states* by their outcome as well as a
Monte-Carlo regression does. The actor needs more: Q must rank *residuals at a state*. This bench measures that
against the truth, as ``bench/archive/dsrl_qtruth.py`` does for DSRL's noise:

1. For ``--scenes`` evaluation scenes (``vla rl``'s seeds, 200000 ...) and each branch point ``--branch-steps``
   (macro-steps into the episode), run the run's policy (its deterministic residual on the base VLA, the base's
   noise seeded by the scene) up to the branch point and keep the executed chunks.
2. At the branch state, draw the base chunk once, and as candidates ``--residuals`` random residuals, each one
   offset shared by every row of the chunk, uniform within the run's bound (a consistent push of up to
   exec_steps x bound: the kind of correction a centimetre miss needs), then zero (the base itself) and the
   policy's own residual. For every candidate and each of ``--continuations`` continuation streams (the same
   streams for every candidate): reset the scene, replay the kept chunks (the replayed state is checked:
   ``replay_state_error``), execute base + candidate, then finish the episode with the run's policy. The success
   rate over the continuations estimates Q(s, a) for the sparse success reward (undiscounted).
3. The run's critic at the same state and executed chunks (ensemble mean).

Reported per branch and averaged (``dsrl_qtruth``'s figures): the true spread of success over the random
residuals (with the binomial error taken out, and a permutation test of "the residual does not matter here"),
the critic's spread, their Spearman rank correlation, and the true success of zero and of the policy's residual.

Writes ``bench/archive/results/<name>.json`` and ``.png`` (default name ``residual_qtruth``).

    .venv/bin/python -m bench.archive.residual_qtruth --run RUN_DIR --scenes 8 --residuals 8 --continuations 4
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

from bench.harness.results import ROOT  # noqa: E402

import numpy as np  # noqa: E402

# bench/archive/dsrl_qtruth.py's figures and branch-point loop (a copy: an archived probe imports no other)


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Rank correlation (average ranks for ties); None when either side is constant."""
    from scipy.stats import spearmanr

    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


def noise_effect(success: np.ndarray, perms: int = 5000, seed: int = 0) -> tuple[float, float]:
    """success [K, M] (K noises x M continuations) -> (between-noise sd of the success rate with the binomial
    error taken out, permutation p-value of "the noise does not matter")."""
    k, m = success.shape
    p = success.mean(1)
    obs = float(p.var(ddof=1))
    within = float(np.mean(p * (1 - p) / (m - 1))) if m > 1 else 0.0
    between = max(obs - within, 0.0)
    if obs == 0.0:
        return 0.0, 1.0
    rng = np.random.default_rng(seed)
    flat = success.ravel().astype(float)
    hits = 0
    for _ in range(perms):
        rng.shuffle(flat)
        hits += flat.reshape(k, m).mean(1).var(ddof=1) >= obs - 1e-12
    return float(np.sqrt(between)), (hits + 1) / (perms + 1)


def analyse(row: dict, noises: int) -> dict:
    """The per-branch figures from its outcomes and critic values (``measure`` and ``--reanalyse``)."""
    success = np.asarray(row["success"], bool)
    p = success.mean(1)
    qw = np.asarray(row["qw"], float)
    qa = None if row.get("qa") is None else np.asarray(row["qa"], float)
    pk, qk = p[:noises], qw[:noises]
    between_sd, perm_p = noise_effect(success[:noises])
    return {**row, "p": p.tolist(), "true_std": float(pk.std()), "true_gain": float(pk.max() - pk.mean()),
            "between_sd": between_sd, "perm_p": perm_p,
            "critic_std": float(qk.std()), "critic_gain": float(qk.max() - qk.mean()),
            "spearman_qw": spearman(pk, qk), "spearman_qa": None if qa is None else spearman(pk, qa[:noises]),
            "policy_p": float(p[-1]), "policy_vs_mean": float(p[-1] - pk.mean())}


def sweep(robot: str, task: str, points: list[tuple[int, int]], setup, measure_one, describe,
          privileged: bool = False) -> tuple[list[dict], object]:
    """The branch-point loop of the Monte-Carlo truth benches (this one and ``residual_qtruth``): start the sim
    bridge of ``robot``, build ``task``'s env, ``ctx = setup(env)`` (load the run), then for every (scene, branch
    step) of ``points`` ``measure_one(env, ctx, scene, step)`` -> a row or None (the episode ended before the
    branch), echoing ``describe(row)``. -> (the rows, ctx)."""
    from tqdm import tqdm

    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from robot_io.bridge_process import running_bridge
    from vla.envs import task_env

    site = load_site(robot)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, running_bridge(site, os.path.join(tmp, "bridge.log")):
        client = RobotClient(site)
        try:
            env = task_env(client, task, privileged=privileged)
            ctx = setup(env)
            for scene, t in tqdm(points, desc="branch points", unit="state"):
                r = measure_one(env, ctx, scene, t)
                if r is not None:
                    rows.append(r)
                    tqdm.write(f"scene {scene} step {t}: {describe(r)}")
        finally:
            client.close()
    return rows, ctx


def summarise(rows: list[dict]) -> dict:
    def mean(key):
        v = [r[key] for r in rows if r[key] is not None]
        return float(np.mean(v)) if v else None

    matters = [r for r in rows if r["perm_p"] < 0.05]
    sp = [r["spearman_qw"] for r in matters if r["spearman_qw"] is not None]
    return {"branches": len(rows), "true_std": mean("true_std"), "true_gain": mean("true_gain"),
            "between_sd": mean("between_sd"), "noise_matters": len(matters),
            "between_sd_where_it_matters": float(np.mean([r["between_sd"] for r in matters])) if matters else None,
            "spearman_qw_where_it_matters": float(np.mean(sp)) if sp else None,
            "critic_std": mean("critic_std"), "critic_gain": mean("critic_gain"),
            "spearman_qw": mean("spearman_qw"), "spearman_qa": mean("spearman_qa"),
            "spearman_defined": sum(r["spearman_qw"] is not None for r in rows),
            "policy_p": mean("policy_p"), "policy_vs_mean": mean("policy_vs_mean"),
            "base_p": float(np.mean([np.mean(r["p"][:-1]) for r in rows])) if rows else None,
            "replay_state_error_max": max((r["replay_state_error"] for r in rows), default=0.0)}



def load_run(run: str, observation_space=None):
    """-> (RLConfig, the residual agent with the run's last checkpoint); refuses another method's run."""
    import torch

    from policies import get_method
    from session.config import RLConfig
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    cfg_path = os.path.join(run, "rl_config.json")
    if not os.path.isfile(cfg_path):
        raise SystemExit(f"--run {run}: no rl_config.json there (not a `vla rl` run directory)")
    cfg = RLConfig.from_json(cfg_path)
    if cfg.method != "residual" or cfg.agent.encoder != "vla":
        raise SystemExit(f"--run {run}: method {cfg.method!r}; this bench reads a residual agent with encoder vla")
    torch.set_num_threads(1)
    vla = load_vla(resolve_checkpoint(cfg.checkpoint))
    agent = get_method("residual")[0].build(vla, cfg.agent, seed=cfg.seed, observation_space=observation_space)
    agent.load_state_dict(torch.load(os.path.join(run, "checkpoint", "agent.pt"), weights_only=False))
    return cfg, agent


def measure(env, agent, scene: int, branch: int, residuals: int, continuations: int, max_ticks: int) -> dict | None:
    """One branch point (module docstring, steps 1-3). None if the episode ends before it."""
    import torch

    vla = agent.vla

    def policy_chunk(obs, gen: torch.Generator) -> np.ndarray:
        aobs = agent.observe(obs)
        act = agent.act_chunk(aobs, np.random.default_rng(0), warmup=False, deterministic=True, generator=gen)
        return vla.unnormalize_actions(act.chunk).numpy()

    # 1. the prefix, under the run's policy
    obs, _ = env.reset(seed=scene)
    gen = torch.Generator().manual_seed(scene * 1000)
    prefix, ticks = [], 0
    for _ in range(branch):
        chunk = policy_chunk(obs, gen)[: max_ticks - ticks]
        obs, _, term, trunc, info = env.step(chunk)
        prefix.append(chunk)
        ticks += len(chunk)
        if term or trunc or ticks >= max_ticks:
            return None
    state_b = np.asarray(obs["state"], np.float64)
    aobs_b = agent.observe(obs)
    base = agent.base_chunk(aobs_b["vla_feat"], torch.Generator().manual_seed(scene * 1000 + branch + 1))
    # 2. the candidates: random shared offsets, zero, the policy's residual (last)
    b, n, a = agent.cfg.residual_bound, agent.exec_steps, agent.a
    rng = np.random.default_rng([scene, branch, 1])
    deltas = [np.tile(rng.uniform(-b, b, a), n) for _ in range(residuals)] + [np.zeros(n * a)]
    with torch.no_grad():
        s = {k: aobs_b[k] for k in agent.obs_spec}
        s["base"] = base
        pi = agent.residual(s, rng, warmup=False, explore=False)[0].numpy()
    if agent.cfg.rows == "shared":
        deltas = [d[:a] for d in deltas]
    deltas.append(pi)
    D = torch.from_numpy(np.stack(deltas).astype(np.float32))
    chunks = agent.executed(base.expand(len(D), -1), D)  # [C, n A], normalised
    success = np.zeros((len(D), continuations), bool)
    replay_err = 0.0
    for c in range(len(D)):
        for m in range(continuations):
            obs, _ = env.reset(seed=scene)
            t = 0
            for ch in prefix:
                obs, *_ = env.step(ch)
                t += len(ch)
            replay_err = max(replay_err, float(np.max(np.abs(np.asarray(obs["state"], np.float64) - state_b))))
            chunk = vla.unnormalize_actions(chunks[c].reshape(n, a)).numpy()[: max_ticks - t]
            cgen = torch.Generator().manual_seed(scene * 1000 + 100 + m)  # the same streams for every candidate
            info = {}
            while True:
                obs, _, term, trunc, info = env.step(chunk)
                t += len(chunk)
                if term or trunc or t >= max_ticks:
                    break
                chunk = policy_chunk(obs, cgen)[: max_ticks - t]
            success[c, m] = bool(info.get("success", False))
    # 3. the critic at the branch state
    with torch.no_grad():
        feat = agent.encoder({k: v.expand(len(D), *v.shape[1:]) for k, v in s.items()})
        q = agent.critic(feat, chunks).mean(dim=0).numpy()
    row = analyse({"scene": scene, "branch_step": branch, "branch_tick": ticks, "replay_state_error": replay_err,
                   "success": success.astype(int).tolist(), "qw": q.tolist(), "qa": None}, residuals)
    p = np.asarray(row["p"])
    row["zero_p"], row["policy_p"] = float(p[residuals]), float(p[-1])
    row["policy_residual_rms_of_bound"] = float(np.sqrt(np.mean(pi ** 2)) / b)
    return row


def plot(res: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, k = res["branches"], res["config"]["residuals"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in rows:
        p, q = np.asarray(r["p"][:k]), np.asarray(r["qw"][:k])
        qn = (q - q.mean()) / (q.std() + 1e-9) if q.std() > 0 else q * 0
        ax1.plot(p, qn, ".", alpha=0.7)
    sm = res["summary"]
    ax1.set_xlabel(f"true success rate of the residual ({res['config']['continuations']} continuations)")
    ax1.set_ylabel("critic Q, standardised per state")
    sp = sm["spearman_qw"]
    ax1.set_title(f"per state: critic vs truth (mean Spearman {float('nan') if sp is None else sp:.2f}); the residual "
                  f"matters at {sm['noise_matters']}/{sm['branches']} states (p < 0.05)", fontsize=8)
    x = np.arange(len(rows))
    w = 0.27
    ax2.bar(x - w, [max(r["p"][:k]) for r in rows], w, label="best random residual")
    ax2.bar(x, [r["zero_p"] for r in rows], w, label="zero (the base)")
    ax2.bar(x + w, [r["policy_p"] for r in rows], w, label="the policy's residual")
    ax2.set_xticks(x, [f"{r['scene'] % 1000}/{r['branch_step']}" for r in rows], rotation=60, fontsize=7)
    ax2.set_xlabel("scene / branch macro-step")
    ax2.set_ylabel("true success rate")
    ax2.legend(fontsize=7)
    fig.suptitle(f"residual critic vs Monte-Carlo truth: {res['run']} ({k} random residuals per state)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a `vla rl --method residual` run directory (encoder vla)")
    ap.add_argument("--scenes", type=int, default=8, help="evaluation scenes (seeds from --seed-start)")
    ap.add_argument("--seed-start", type=int, default=200_000)
    ap.add_argument("--branch-steps", type=int, nargs="+", default=[0, 4], help="macro-steps before the branch")
    ap.add_argument("--residuals", type=int, default=8, help="random residuals per branch state (plus 0 and the policy's)")
    ap.add_argument("--continuations", type=int, default=4, help="episodes per candidate (the policy afterwards)")
    ap.add_argument("--robot", default="sim-franka-fast", help="site preset or YAML")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "archive" / "results")
    ap.add_argument("--name", default="residual_qtruth")
    args = ap.parse_args(argv)
    for k in ("scenes", "continuations"):
        if getattr(args, k) < 1:
            ap.error(f"--{k} must be >= 1")
    if args.residuals < 2:
        ap.error("--residuals must be >= 2 (a spread needs two)")
    os.environ.setdefault("MUJOCO_GL", "egl")
    from bench.harness.results import portable as portable_path

    cfg, agent = load_run(args.run)  # refused before a bridge starts
    t0 = time.perf_counter()
    points = [(args.seed_start + i, t) for i in range(args.scenes) for t in args.branch_steps]
    rows, max_ticks = sweep(
        args.robot, cfg.task, points, setup=lambda env: cfg.max_episode_ticks or env.max_ticks,
        measure_one=lambda env, max_ticks, scene, t: measure(env, agent, scene, t, args.residuals,
                                                             args.continuations, max_ticks),
        describe=lambda r: f"true p {np.round(r['p'][:args.residuals], 2).tolist()} zero {r['zero_p']:.2f} "
                           f"policy {r['policy_p']:.2f}; spearman(Q) {r['spearman_qw']}")
    summary = summarise(rows)
    summary["zero_p"] = float(np.mean([r["zero_p"] for r in rows])) if rows else None
    summary["random_p"] = float(np.mean([np.mean(r["p"][:args.residuals]) for r in rows])) if rows else None
    res = {"bench": "residual_qtruth", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "run": portable_path(args.run), "checkpoint": portable_path(cfg.checkpoint), "task": cfg.task,
           "agent_updates": agent.updates,
           "config": {"scenes": args.scenes, "seed_start": args.seed_start, "branch_steps": args.branch_steps,
                      "residuals": args.residuals, "continuations": args.continuations, "max_ticks": max_ticks,
                      "exec_steps": agent.exec_steps, "residual_bound": agent.cfg.residual_bound},
           "summary": summary, "branches": rows, "wall_s": time.perf_counter() - t0}
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{args.name}.json", "w") as f:
        json.dump(res, f, indent=2)
    plot(res, args.out / f"{args.name}.png")
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    print(f"{summary['branches']} branch states: the residual matters (p < 0.05) at {summary['noise_matters']}, "
          f"between-residual sd of success there {fmt(summary['between_sd_where_it_matters'])}; Spearman(Q, truth) "
          f"{fmt(summary['spearman_qw_where_it_matters'])} there, {fmt(summary['spearman_qw'])} over all; "
          f"random {fmt(summary['random_p'])}, zero {fmt(summary['zero_p'])}, policy {fmt(summary['policy_p'])}; "
          f"replay error {summary['replay_state_error_max']:.2e}")
    print(f"wrote {args.out / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
