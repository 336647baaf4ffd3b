#!/usr/bin/env python
"""Does the residual agent's critic learn anything from a session's data? An offline diagnostic (issue 32).

A residual RL session (`vla rl --method residual`) leaves its replay buffer in ``RUN/checkpoint/online.npz``: the
VLA's features of every macro-step's observation, the executed chunk, the sparse reward. This script fits the
agent's critic (``policies.common.sac.EnsembleCritic``: 10 LayerNorm MLPs, the session's widths, Adam 3e-4,
batch 256) to that fixed data in several ways and asks each fit, on episodes it never saw (a 20% split by
episode), how well Q(s, a) ranks the transitions of episodes that will succeed above those that will fail (the
ROC AUC; 0.5 = no signal), over all transitions before any success and per bin of macro-steps since the episode's
start (what the agent sees; successes end episodes early, so bins by steps to the end would compare different
moments of the task):

* ``td1``  one-step TD with the logged next action (policy evaluation of the behaviour), the target the min of 2
           random target critics (RLPD / ResFiT), Polyak 0.005: the agent's own critic target, actor removed;
* ``td3``  the same with 3-step returns (ResFiT uses 3);
* ``td1_mean`` one-step TD with the ensemble's mean as the target (no min: how much the pessimism costs);
* ``mc``   regression on the Monte-Carlo return gamma^(steps to go) x success (no bootstrapping: what these features
           can tell at all, an upper bound for the TD fits).

If ``mc`` ranks the held-out episodes and ``td1`` does not, the TD learning signal is what limits the agent; if
neither does, the features (or the data) hold no signal for the critic to find.

    .venv/bin/python -m bench.archive.residual_critic --run RUN_DIR [--steps 4000] [--name residual_critic]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import sys
import time

import numpy as np

from bench.harness.results import ROOT  # noqa: E402

VARIANTS = ("td1", "td3", "td1_mean", "mc")
BINS = ((0, 3), (4, 7), (8, 12), (13, 10_000))
"""macro-steps since the episode's start (inclusive ranges)"""


def load_session(run: str) -> dict:
    """The replay of a finished session, with each transition's episode, outcome and steps to the end."""
    d = np.load(os.path.join(run, "checkpoint", "online.npz"))
    n = len(d["reward"])
    eps = [json.loads(x) for x in open(os.path.join(run, "episodes.jsonl")) if x.strip()]
    ends = [e["step"] for e in eps]
    if not ends or ends[-1] != n:
        raise ValueError(f"{run}: the replay holds {n} transitions but episodes.jsonl ends at step "
                         f"{ends[-1] if ends else 0}: a wrapped or resumed buffer is not supported")
    episode = np.zeros(n, np.int64)
    success = np.zeros(n, bool)
    to_go = np.zeros(n, np.int64)
    since = np.zeros(n, np.int64)
    start = 0
    for i, (e, end) in enumerate(zip(eps, ends)):
        episode[start:end], success[start:end] = i, e["success"]
        to_go[start:end] = np.arange(end - start, 0, -1)
        since[start:end] = np.arange(end - start)
        start = end
    chunk = d["extras/chunk"].reshape(n, -1).astype(np.float32)
    return {"feat": d["obs/feat"].astype(np.float32), "next_feat": d["next_obs/feat"].astype(np.float32),
            "chunk": chunk, "reward": d["reward"].astype(np.float32), "done": d["done"].astype(np.float32),
            "episode": episode, "success": success, "to_go": to_go, "since": since, "episodes": len(eps)}


def mean_or_none(x: np.ndarray) -> float | None:
    return float(x.mean()) if len(x) else None


def auc(score: np.ndarray, label: np.ndarray) -> float | None:
    """ROC AUC of ``score`` for the boolean ``label`` (Mann-Whitney, ties at half); None with one class only."""
    from scipy.stats import rankdata

    pos = int(label.sum())
    neg = len(label) - pos
    if pos == 0 or neg == 0:
        return None
    ranks = rankdata(score)
    return float((ranks[label].sum() - pos * (pos + 1) / 2) / (pos * neg))


def fit(data: dict, buf, train: np.ndarray, variant: str, steps: int, gamma: float, seed: int, hidden,
        num_critics: int, progress: bool = True):
    """Fit the ensemble to the replay by ``variant`` (see the module docstring); -> the ensemble mean Q of every
    transition. The TD targets come from the agent's own code (``ReplayBuffer.n_step_returns``); the bootstrap
    action is the next logged chunk of the episode (policy evaluation of the behaviour), or at an episode cut by
    its time limit that transition's own chunk (the next one was never taken)."""
    import torch
    from tqdm import tqdm

    from policies.common.sac import EnsembleCritic

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    feat, chunk = torch.from_numpy(data["feat"]), torch.from_numpy(data["chunk"])
    next_feat = torch.from_numpy(data["next_feat"])
    critic = EnsembleCritic(feat.shape[1], chunk.shape[1], num_critics, tuple(hidden))
    target = EnsembleCritic(feat.shape[1], chunk.shape[1], num_critics, tuple(hidden))
    target.load_state_dict(critic.state_dict())
    opt = torch.optim.Adam(critic.parameters(), lr=3e-4)
    mc = torch.from_numpy((gamma ** (data["to_go"] - 1) * data["success"]).astype(np.float32))
    idx_train = np.flatnonzero(train)
    n = 3 if variant == "td3" else 1
    for _ in tqdm(range(steps), desc=variant, disable=not progress, leave=False):
        idx = rng.choice(idx_train, 256)
        i = torch.from_numpy(idx)
        with torch.no_grad():
            if variant == "mc":
                y = mc[i]
            else:
                ret, last, disc = buf.n_step_returns(idx, n, gamma)
                cont = buf.continues(last)
                a2 = chunk[np.where(cont, (last + 1) % buf.capacity, last)]
                q2 = target(next_feat[last], a2)
                if variant == "td1_mean":
                    q2 = q2.mean(0)
                else:
                    sub = torch.from_numpy(rng.choice(num_critics, 2, replace=False))
                    q2 = q2[sub].min(0).values
                done = torch.from_numpy(buf.done[last].astype(np.float32))
                y = torch.from_numpy(ret) + torch.from_numpy(disc) * (1 - done) * q2
        q = critic(feat[i], chunk[i])
        loss = ((q - y[None]) ** 2).mean(1).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(target.parameters()), list(critic.parameters()), 0.005)
    with torch.no_grad():
        return critic(feat, chunk).mean(0).numpy()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a finished `vla rl --method residual` run directory")
    ap.add_argument("--steps", type=int, default=4000, help="gradient steps per fit")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="residual_critic")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "archive" / "results")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    cfg = json.load(open(os.path.join(args.run, "rl_config.json")))
    gamma, hidden, num_critics = cfg["agent"]["gamma"], cfg["agent"]["hidden"], cfg["agent"]["num_critics"]
    from policies.common.replay import ReplayBuffer

    data = load_session(args.run)
    buf = ReplayBuffer.load(os.path.join(args.run, "checkpoint", "online.npz"))
    if buf.ptr != buf.size % buf.capacity:
        raise ValueError(f"{args.run}: the replay is not in insertion order")
    rng = np.random.default_rng(args.seed)
    held = rng.permutation(data["episodes"])[: data["episodes"] // 5]
    test = np.isin(data["episode"], held)
    pre = data["reward"] == 0  # transitions before any success: the outcome is still open
    res = {"bench": "residual_critic", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "run": {"task": cfg["task"], "method": cfg["method"], "ticks": cfg["total_ticks"],
                   "transitions": int(len(data["reward"])), "episodes": data["episodes"],
                   "success_rate": float(np.mean([data["success"][data["episode"] == e][0]
                                                  for e in range(data["episodes"])]))},
           "settings": {"steps": args.steps, "gamma": gamma, "hidden": hidden, "num_critics": num_critics,
                        "held_out_episodes": int(len(held)), "seed": args.seed},
           "bins": [f"{a}-{b}" if b < 10_000 else f">={a}" for a, b in BINS], "variants": {}}
    for v in args.variants:
        t0 = time.perf_counter()
        q = fit(data, buf, ~test, v, args.steps, gamma, args.seed, hidden, num_critics)
        row = {"auc_all": auc(q[test & pre], data["success"][test & pre]), "wall_s": time.perf_counter() - t0,
               "q_mean_success": mean_or_none(q[test & pre & data["success"]]),
               "q_mean_failure": mean_or_none(q[test & pre & ~data["success"]]), "auc_by_steps_since_start": []}
        for a, b in BINS:
            m = test & pre & (data["since"] >= a) & (data["since"] <= b)
            row["auc_by_steps_since_start"].append(auc(q[m], data["success"][m]))
        res["variants"][v] = row
        f3 = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        print(f"{v:>9}: held-out AUC {f3(row['auc_all'])}  by macro-steps since the start {res['bins']}: "
              f"{['-' if x is None else round(x, 3) for x in row['auc_by_steps_since_start']]}  "
              f"Q success {f3(row['q_mean_success'])} failure {f3(row['q_mean_failure'])}  ({row['wall_s']:.0f} s)",
              flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{args.name}.json", "w") as f:
        json.dump(res, f, indent=2)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    x = np.arange(len(BINS))
    for k, (v, row) in enumerate(res["variants"].items()):
        whole = "-" if row["auc_all"] is None else f"{row['auc_all']:.2f}"
        ax.bar(x + k * 0.2 - 0.3, [np.nan if a is None else a for a in row["auc_by_steps_since_start"]], 0.2,
               label=f"{v} (all {whole})")
    ax.axhline(0.5, color="k", lw=1, ls="--")
    ax.set_xticks(x, res["bins"])
    ax.set_xlabel("macro-steps since the episode's start")
    ax.set_ylabel("held-out AUC of Q for success")
    ax.set_ylim(0.3, 1.0)
    ax.legend(fontsize=8)
    ax.set_title(f"critic fits on a residual session's replay ({cfg['task']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out / f"{args.name}.png", dpi=110)
    print(f"wrote {args.out / (args.name + '.json')} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
