#!/usr/bin/env python
"""Does the noise matter at a state, and does DSRL's critic know it? Monte-Carlo Q over noises vs the critic.

DSRL's actor follows the gradient of its noise critic Q^W(s, w). Round 7 (bench/results/README.md) saw
that critic's spread over noises at fixed states collapse while the success rate stayed near the base
VLA's. Two explanations predict the same curves: (a) at the states the policy visits the first chunk's
noise barely changes the outcome (nothing to learn), or (b) it does, and the critic fails to learn it.
This bench tells them apart by measuring the truth:

1. For ``--scenes`` evaluation scenes (``vla rl``'s seeds, 200000 ...) and each branch point
   ``--branch-steps`` (macro-steps into the episode), run the base VLA (w ~ N(0, I) clipped, seeded by
   the scene) up to the branch point and keep the executed chunks.
2. At the branch state draw ``--noises`` candidate noises w_1..w_K (and the run's policy's mean noise
   w_pi). For each candidate and ``--continuations`` continuation streams: reset the scene, replay the
   kept chunks (the replayed state is checked against the original: ``replay_state_error``), execute
   the candidate's chunk, then finish the episode with the base VLA's own noise. The success rate over
   the continuations estimates Q(s, w_k) for DSRL's sparse success reward (undiscounted).
3. The run's critic Q^W(s, w_k) at the same state and noises (ensemble mean; NA: also Q^A of their chunks).

Reported per branch and averaged: the true spread over noises (std and max - mean of the success
rates: what a perfect chooser of this chunk's noise gains), the critic's spread, their Spearman rank
correlation, and the true success of the policy's own noise vs the candidates' mean. With M
continuations each rate has a binomial error of up to 0.5 / sqrt(M), which alone gives the rates a
spread (and best - mean a positive bias); so each branch also gets the between-noise standard
deviation with that error taken out (``between_sd``: var of the rates - mean p (1 - p) / (M - 1)) and a
permutation test of "the noise does not matter here" (``perm_p``: the outcomes shuffled across noises,
5000 times). ``noise_matters`` counts the branches with perm_p < 0.05; the critic's rank agreement is
also averaged over those alone. ``--reanalyse`` recomputes all this from an existing JSON's outcomes.

Writes ``bench/archive/results/<name>.json`` and ``.png`` (default name ``dsrl_qtruth``).

    .venv/bin/python -m bench.archive.dsrl_qtruth --run runs/dsrl7b/dsrl-sac/seed0 --scenes 8 --noises 8 --continuations 4
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


def run_config(run: str):
    """-> the run's RLConfig; refuses a directory that is not a DSRL session this bench can read."""
    from session.config import RLConfig

    cfg_path = os.path.join(run, "rl_config.json")
    if not os.path.isfile(cfg_path):
        raise SystemExit(f"--run {run}: no rl_config.json there (not a `vla rl` run directory)")
    cfg = RLConfig.from_json(cfg_path)
    if cfg.method != "dsrl" or cfg.agent.variant not in ("sac", "na"):
        raise SystemExit(f"--run {run}: method {cfg.method!r} variant {getattr(cfg.agent, 'variant', None)!r}; this "
                         "bench reads DSRL's noise critic (variant sac or na)")
    if cfg.agent.encoder not in ("vla", "oracle"):
        raise SystemExit(f"--run {run}: encoder {cfg.agent.encoder!r}; this bench supports encoders vla and oracle")
    return cfg


def load_run(run: str, threads: int = 1, observation_space=None, cfg=None):
    """-> (RLConfig, the frozen VLA, the DSRL agent with the run's last checkpoint). ``observation_space``:
    the env's, for an agent whose encoder reads more than the VLA's features (``oracle``); ``cfg``: the
    run's ``run_config`` when the caller has read it already."""
    import torch

    from policies import get_method
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    torch.set_num_threads(threads)
    cfg = cfg or run_config(run)
    vla = load_vla(resolve_checkpoint(cfg.checkpoint))
    agent_cls, _ = get_method("dsrl")
    agent = agent_cls.build(vla, cfg.agent, seed=cfg.seed, observation_space=observation_space)
    ckpt = os.path.join(run, "checkpoint", "agent.pt")
    if not os.path.isfile(ckpt):
        ckpt = os.path.join(run, "checkpoint.old", "agent.pt")
    agent.load_state_dict(torch.load(ckpt, weights_only=False))
    return cfg, vla, agent


def measure(env, agent, scene: int, branch: int, noises: int, continuations: int, max_ticks: int) -> dict | None:
    """One branch point (module docstring, steps 1-3). None if the episode ends before it."""
    import torch

    def base_w(aobs, rng: np.random.Generator) -> torch.Tensor:  # the base VLA's noise: DSRL's warm-up draw
        return agent.act({k: aobs[k] for k in agent.obs_spec}, rng, warmup=True)

    def run_chunk(aobs, w) -> np.ndarray:
        with torch.no_grad():
            return agent.chunk(aobs["feat"], w)[0, : agent.exec_steps].numpy()

    # 1. the prefix
    obs, _ = env.reset(seed=scene)
    rng = np.random.default_rng([scene, 0])
    prefix, ticks = [], 0
    for _ in range(branch):
        aobs = agent.observe(obs)
        chunk = run_chunk(aobs, base_w(aobs, rng))[: max_ticks - ticks]
        obs, _, term, trunc, info = env.step(chunk)
        prefix.append(chunk)
        ticks += len(chunk)
        if term or trunc or ticks >= max_ticks:
            return None
    state_b = np.asarray(obs["state"], np.float64)
    aobs_b = agent.observe(obs)
    # 2. the candidates: K random noises and the policy's mean noise (last)
    crng = np.random.default_rng([scene, branch, 1])
    ws = [base_w(aobs_b, crng) for _ in range(noises)]
    with torch.no_grad():
        w_pi = agent.act({k: aobs_b[k] for k in agent.obs_spec}, crng, warmup=False, deterministic=True)
    ws.append(w_pi)
    success = np.zeros((len(ws), continuations), bool)
    replay_err = 0.0
    for c, w in enumerate(ws):
        for m in range(continuations):
            obs, _ = env.reset(seed=scene)
            t = 0
            for ch in prefix:
                obs, *_ = env.step(ch)
                t += len(ch)
            replay_err = max(replay_err, float(np.max(np.abs(np.asarray(obs["state"], np.float64) - state_b))))
            aobs = agent.observe(obs)
            chunk = run_chunk(aobs, w)[: max_ticks - t]
            srng = np.random.default_rng([scene, branch, 2, c, m])
            info, done = {}, False
            while True:
                obs, _, term, trunc, info = env.step(chunk)
                t += len(chunk)
                if term or trunc or t >= max_ticks:
                    break
                aobs = agent.observe(obs)
                chunk = run_chunk(aobs, base_w(aobs, srng))[: max_ticks - t]
            success[c, m] = bool(info.get("success", False))
    # 3. the critic at the branch state
    with torch.no_grad():
        s = agent.sac.features({k: aobs_b[k] for k in agent.obs_spec})
        W = torch.cat(ws, 0)
        s_rep = s.expand(len(ws), -1)
        qw = agent.sac.critic(s_rep, W).mean(dim=0).numpy()
        qa = None
        if agent.cfg.variant == "na":
            a = agent.chunk(aobs_b["feat"].expand(len(ws), -1), W, normalized=True)[:, : agent.exec_steps]
            qa = agent.qa(s_rep, a.reshape(len(ws), -1)).mean(dim=0).numpy()
    return analyse({"scene": scene, "branch_step": branch, "branch_tick": ticks, "replay_state_error": replay_err,
                    "success": success.astype(int).tolist(), "qw": qw.tolist(),
                    "qa": None if qa is None else qa.tolist()}, noises)


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


def plot(res: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["branches"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in rows:
        p, q = np.asarray(r["p"][:-1]), np.asarray(r["qw"][:-1])
        qn = (q - q.mean()) / (q.std() + 1e-9) if q.std() > 0 else q * 0
        a.plot(p, qn, ".", alpha=0.7)
    a.set_xlabel(f"true success rate of the noise ({res['config']['continuations']} continuations)")
    a.set_ylabel("critic Q^W, standardised per state")
    sm = res["summary"]
    a.set_title(f"per state: critic vs truth (mean Spearman {sm['spearman_qw'] or float('nan'):.2f}); the noise "
                f"matters at {sm.get('noise_matters', '?')}/{sm['branches']} states (permutation p < 0.05)", fontsize=8)
    x = np.arange(len(rows))
    a_w = 0.4
    b.bar(x - a_w / 2, [r["true_gain"] for r in rows], a_w, label="true: best noise - mean (success)")
    b.bar(x + a_w / 2, [r["policy_vs_mean"] for r in rows], a_w, label="policy's noise - mean (success)")
    b.axhline(0, color="k", lw=0.6)
    b.set_xticks(x, [f"{r['scene'] % 1000}/{r['branch_step']}" for r in rows], rotation=60, fontsize=7)
    b.set_xlabel("scene / branch macro-step")
    b.legend(fontsize=8)
    b.set_title("what choosing this chunk's noise could gain, and what the policy gains", fontsize=9)
    fig.suptitle(f"DSRL noise critic vs Monte-Carlo truth: {res['run']} ({res['config']['noises']} noises per state)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", help="a `vla rl` DSRL run directory (variant sac or na, encoder vla)")
    ap.add_argument("--reanalyse", action="store_true",
                    help="no rollouts: recompute the figures and the plot of OUT/NAME.json from its outcomes")
    ap.add_argument("--scenes", type=int, default=8, help="evaluation scenes (seeds from --seed-start)")
    ap.add_argument("--seed-start", type=int, default=200_000)
    ap.add_argument("--branch-steps", type=int, nargs="+", default=[0, 3], help="macro-steps before the branch")
    ap.add_argument("--noises", type=int, default=8, help="candidate noises per branch state (plus the policy's)")
    ap.add_argument("--continuations", type=int, default=4, help="episodes per candidate (base noise afterwards)")
    ap.add_argument("--robot", default="sim-franka-fast", help="site preset or YAML")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "archive" / "results")
    ap.add_argument("--name", default="dsrl_qtruth")
    args = ap.parse_args(argv)
    if args.reanalyse:
        path = args.out / f"{args.name}.json"
        res = json.loads(path.read_text())
        k = res["config"]["noises"]
        res["branches"] = [analyse(r, k) for r in res["branches"]]
        res["summary"] = summarise(res["branches"])
        res["reanalysed"] = _dt.datetime.now().isoformat(timespec="seconds")
        path.write_text(json.dumps(res, indent=2))
        plot(res, args.out / f"{args.name}.png")
        report(res["summary"])
        return 0
    if not args.run:
        ap.error("--run is required (or --reanalyse)")
    for k in ("scenes", "noises", "continuations"):
        if getattr(args, k) < 1:
            ap.error(f"--{k} must be >= 1")
    if args.noises < 2:
        ap.error("--noises must be >= 2 (a spread needs two)")
    os.environ.setdefault("MUJOCO_GL", "egl")
    from bench.harness.results import portable as portable_path

    run_cfg = run_config(args.run)  # refused before a bridge starts
    oracle = run_cfg.agent.encoder == "oracle"  # the critic reads the sim's privileged state
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)

    def setup(env):
        cfg, vla, agent = load_run(args.run, observation_space=env.observation_space, cfg=run_cfg)
        return cfg, agent, cfg.max_episode_ticks or env.max_ticks

    def one(env, ctx, scene, t):
        return measure(env, ctx[1], scene, t, args.noises, args.continuations, ctx[2])

    points = [(args.seed_start + i, t) for i in range(args.scenes) for t in args.branch_steps]
    rows, (cfg, agent, max_ticks) = sweep(args.robot, run_cfg.task, points, setup, one, privileged=oracle,
                                          describe=lambda r: f"true p {np.round(r['p'][:-1], 2).tolist()} "
                                          f"policy {r['policy_p']:.2f}; spearman(Q^W) {r['spearman_qw']}")
    summary = summarise(rows)
    res = {"bench": "dsrl_qtruth", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "run": portable_path(args.run), "checkpoint": portable_path(cfg.checkpoint), "task": cfg.task,
           "variant": cfg.agent.variant, "agent_updates": agent.updates,
           "config": {"scenes": args.scenes, "seed_start": args.seed_start, "branch_steps": args.branch_steps,
                      "noises": args.noises, "continuations": args.continuations, "max_ticks": max_ticks,
                      "exec_steps": agent.exec_steps, "noise_dim": agent.noise_dim},
           "summary": summary, "branches": rows, "wall_s": time.perf_counter() - t0}
    with open(args.out / f"{args.name}.json", "w") as f:
        json.dump(res, f, indent=2)
    plot(res, args.out / f"{args.name}.png")
    report(summary)
    print(f"wrote {args.out / args.name}.json and .png")
    return 0


def report(s: dict) -> None:
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    print(f"{s['branches']} branch states: the noise matters (permutation p < 0.05) at {s['noise_matters']}, "
          f"between-noise sd of success there {fmt(s['between_sd_where_it_matters'])}; critic spread std "
          f"{fmt(s['critic_std'])}; Spearman(Q^W, truth) {fmt(s['spearman_qw_where_it_matters'])} there, "
          f"{fmt(s['spearman_qw'])} over all {s['spearman_defined']} defined; policy's noise {fmt(s['policy_p'])} vs "
          f"random {fmt(s['base_p'])}; replay error {s['replay_state_error_max']:.2e}")


if __name__ == "__main__":
    sys.exit(main())
