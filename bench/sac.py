#!/usr/bin/env python
"""SAC update throughput on CPU: ``policies.common.sac.SAC`` against a minimal CleanRL-style SAC.

The reference is written out below in one screen (CleanRL's ``sac_continuous_action.py`` update:
two separate Q MLPs, their targets, the min of the two, a tanh-Gaussian actor, auto-temperature,
Polyak updates parameter by parameter). Both run the same network sizes -- hidden 256 x 256,
batch 256, a 64-d observation feature and a 56-d action (DSRL's 8 x 7 noise chunk) -- on the same
random batches, with the same thread count (``--threads``, default 1), in RLPD's schedule: a round
is ``utd`` (20) critic updates then one actor + temperature update (ours: ``update_schedule``
``legacy``; its default ``per_step`` adds an actor and a temperature step to every critic step).

Rows: the reference with and without LayerNorm in its critics, ours with 2 critics (subset 2)
with and without LayerNorm -- the like-for-like comparisons -- and ours with the RLPD default of
10 critics. Reported: critic updates / s (as RLPD counts them) and full UTD-20 rounds / s (= env
steps / s the learner keeps up with at UTD 20). Configurations are timed interleaved, in blocks,
and the median block is reported, so a load spike from another process hits every row alike.
Also: ``ReplayBuffer`` / ``sample_mixed`` time per batch. Goal: ours (2 critics) >= 1.0 x the
reference's updates / s, with and without LayerNorm.

Writes ``bench/results/sac.json`` and ``sac.png``.

    .venv/bin/python -m bench.sac [--quick] [--out DIR] [--threads N]
"""

from __future__ import annotations

import datetime as _dt
import os
import pathlib
import platform
import sys
import textwrap
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.harness import flags, plots
from bench.harness.results import write_result


OBS_DIM, ACTION_DIM, HIDDEN, BATCH = 64, 56, (256, 256), 256
GOAL_RATIO = 1.0


# -- the reference: minimal CleanRL-style SAC (two Q MLPs, no ensemble) ---------------------------
class RefSoftQ(nn.Module):
    def __init__(self, layer_norm: bool):
        super().__init__()
        ln = (lambda: nn.LayerNorm(HIDDEN[0])) if layer_norm else nn.Identity
        self.net = nn.Sequential(nn.Linear(OBS_DIM + ACTION_DIM, HIDDEN[0]), ln(), nn.ReLU(),
                                 nn.Linear(HIDDEN[0], HIDDEN[1]), ln(), nn.ReLU(), nn.Linear(HIDDEN[1], 1))

    def forward(self, x, a):
        return self.net(torch.cat([x, a], 1))


class RefActor(nn.Module):
    LOG_STD_MIN, LOG_STD_MAX = -5, 2

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(OBS_DIM, HIDDEN[0]), nn.Linear(HIDDEN[0], HIDDEN[1])
        self.fc_mean, self.fc_logstd = nn.Linear(HIDDEN[1], ACTION_DIM), nn.Linear(HIDDEN[1], ACTION_DIM)

    def get_action(self, x):
        x = F.relu(self.fc2(F.relu(self.fc1(x))))
        mean, log_std = self.fc_mean(x), torch.tanh(self.fc_logstd(x))
        log_std = self.LOG_STD_MIN + 0.5 * (self.LOG_STD_MAX - self.LOG_STD_MIN) * (log_std + 1)
        normal = torch.distributions.Normal(mean, log_std.exp())
        x_t = normal.rsample()  # reparameterization trick (mean + std * N(0,1))
        y_t = torch.tanh(x_t)
        log_prob = normal.log_prob(x_t) - torch.log(1 - y_t.pow(2) + 1e-6)  # action scale 1
        return y_t, log_prob.sum(1, keepdim=True)


class RefSAC:
    def __init__(self, layer_norm: bool, gamma=0.99, tau=0.005, lr=3e-4):
        self.actor, self.qf1, self.qf2 = RefActor(), RefSoftQ(layer_norm), RefSoftQ(layer_norm)
        self.qf1_target, self.qf2_target = RefSoftQ(layer_norm), RefSoftQ(layer_norm)
        self.qf1_target.load_state_dict(self.qf1.state_dict())
        self.qf2_target.load_state_dict(self.qf2.state_dict())
        self.q_optimizer = torch.optim.Adam(list(self.qf1.parameters()) + list(self.qf2.parameters()), lr=lr)
        self.actor_optimizer = torch.optim.Adam(list(self.actor.parameters()), lr=lr)
        self.target_entropy = -ACTION_DIM / 2
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.a_optimizer = torch.optim.Adam([self.log_alpha], lr=lr)
        self.gamma, self.tau = gamma, tau

    def update_many(self, sample_fn, utd: int):
        for _ in range(utd):
            data = sample_fn()
            alpha = self.log_alpha.exp().item()
            with torch.no_grad():
                next_actions, next_log_pi = self.actor.get_action(data["next_obs"])
                qf1_next = self.qf1_target(data["next_obs"], next_actions)
                qf2_next = self.qf2_target(data["next_obs"], next_actions)
                min_qf_next = torch.min(qf1_next, qf2_next) - alpha * next_log_pi
                next_q = data["reward"].flatten() + (1 - data["done"].flatten()) * self.gamma * min_qf_next.view(-1)
            qf1_a = self.qf1(data["obs"], data["action"]).view(-1)
            qf2_a = self.qf2(data["obs"], data["action"]).view(-1)
            qf_loss = F.mse_loss(qf1_a, next_q) + F.mse_loss(qf2_a, next_q)
            self.q_optimizer.zero_grad()
            qf_loss.backward()
            self.q_optimizer.step()
            for net, target in ((self.qf1, self.qf1_target), (self.qf2, self.qf2_target)):
                for param, target_param in zip(net.parameters(), target.parameters()):
                    target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)
        pi, log_pi = self.actor.get_action(data["obs"])
        min_qf_pi = torch.min(self.qf1(data["obs"], pi), self.qf2(data["obs"], pi))
        actor_loss = ((alpha * log_pi) - min_qf_pi).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        with torch.no_grad():
            _, log_pi = self.actor.get_action(data["obs"])
        alpha_loss = (-self.log_alpha.exp() * (log_pi + self.target_entropy)).mean()
        self.a_optimizer.zero_grad()
        alpha_loss.backward()
        self.a_optimizer.step()
        return {"losses/qf_loss": qf_loss.item(), "losses/actor_loss": actor_loss.item()}


# -- the measurement -----------------------------------------------------------------------------
def make_sampler(seed: int, pool: int = 8192):
    g = torch.Generator().manual_seed(seed)
    data = {"obs": torch.randn(pool, OBS_DIM, generator=g), "action": torch.rand(pool, ACTION_DIM, generator=g) * 2 - 1,
            "reward": torch.randn(pool, generator=g), "next_obs": torch.randn(pool, OBS_DIM, generator=g),
            "done": (torch.rand(pool, generator=g) < 0.05).float()}

    def sample():
        i = torch.randint(0, pool, (BATCH,), generator=g)
        return {k: v[i] for k, v in data.items()}

    return sample


def make_agents() -> list[tuple[str, object]]:
    from policies.common.sac import SAC, SACConfig

    # update_schedule "legacy": utd critic steps + one actor / temperature step, the reference loop's work
    ours = lambda n, ln: SAC(OBS_DIM, ACTION_DIM, SACConfig(num_critics=n, critic_subset=2, hidden=HIDDEN,  # noqa: E731
                                                             batch_size=BATCH, critic_layer_norm=ln,
                                                             update_schedule="legacy"), seed=0)
    torch.manual_seed(0)
    return [("reference CleanRL, 2 Q MLPs", RefSAC(layer_norm=False)),
            ("ours, 2 critics", ours(2, False)),
            ("reference CleanRL + LayerNorm", RefSAC(layer_norm=True)),
            ("ours, 2 critics + LayerNorm", ours(2, True)),
            ("ours, 10 critics + LayerNorm (RLPD default)", ours(10, True))]


def measure(utd: int, rounds_per_block: int, blocks: int) -> list[dict]:
    agents = make_agents()
    samplers = [make_sampler(i) for i in range(len(agents))]
    for (_, agent), s in zip(agents, samplers):  # warm-up (allocator, first-call overheads)
        agent.update_many(s, utd)
    times = [[] for _ in agents]
    for _ in range(blocks):  # interleaved blocks: a load spike hits every row alike
        for j, ((_, agent), s) in enumerate(zip(agents, samplers)):
            t0 = time.perf_counter()
            for _ in range(rounds_per_block):
                agent.update_many(s, utd)
            times[j].append((time.perf_counter() - t0) / rounds_per_block)
    rows = []
    for (label, agent), t in zip(agents, times):
        t = np.asarray(t)
        rows.append({"label": label, "reference": label.startswith("reference"),
                     "num_critics": getattr(getattr(agent, "cfg", None), "num_critics", 2),
                     "layer_norm": "LayerNorm" in label, "utd": utd,
                     "round_s_median": float(np.median(t)), "round_s_min": float(t.min()),
                     "round_s_max": float(t.max()),
                     "rounds_per_s": float(1 / np.median(t)), "critic_updates_per_s": float(utd / np.median(t)),
                     "blocks_s": t.round(5).tolist()})
    return rows


def replay_timing(samples: int, fill: int) -> dict:
    from policies.common.replay import ReplayBuffer, sample_mixed

    rng = np.random.default_rng(0)
    out = {}
    specs = {"state 64-d": {"state": ((OBS_DIM,), np.float32)},
             "2 cams 64x64 + state 8-d": {"front": ((64, 64, 3), np.uint8), "wrist": ((64, 64, 3), np.uint8),
                                          "state": ((8,), np.float32)}}
    for name, spec in specs.items():
        bufs = [ReplayBuffer(5000, spec, ACTION_DIM) for _ in range(2)]
        for buf in bufs:
            for _ in range(fill):
                o = {k: (rng.integers(0, 255, s, dtype=np.uint8) if d == np.uint8 else rng.normal(size=s).astype(d))
                     for k, (s, d) in spec.items()}
                buf.add(o, rng.uniform(-1, 1, ACTION_DIM).astype(np.float32), 0.0, o, False)
        t = []
        for _ in range(samples):
            t0 = time.perf_counter()
            sample_mixed(bufs[0], bufs[1], BATCH, 0.5, rng)
            t.append(time.perf_counter() - t0)
        out[name] = {"sample_mixed_ms_median": float(np.median(t) * 1e3), "batch": BATCH, "held": 2 * fill}
    return out


def plot(res: dict, path: pathlib.Path) -> None:
    plt = plots.pyplot()

    rows = res["results"]
    labels = [textwrap.fill(r["label"], 18) for r in rows]
    colors = ["#999999" if r["reference"] else "#4c72b0" for r in rows]
    x = np.arange(len(rows))
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.6))
    for ax, key, ylabel in ((a, "critic_updates_per_s", "critic updates / s"),
                            (b, "rounds_per_s", f"UTD-{rows[0]['utd']} rounds / s (= env steps / s)")):
        vals = [r[key] for r in rows]
        ax.bar(x, vals, color=colors)
        lo = [r["utd"] / r["round_s_max"] if key == "critic_updates_per_s" else 1 / r["round_s_max"] for r in rows]
        hi = [r["utd"] / r["round_s_min"] if key == "critic_updates_per_s" else 1 / r["round_s_min"] for r in rows]
        ax.errorbar(x, vals, yerr=[np.subtract(vals, lo), np.subtract(hi, vals)], fmt="none", c="k", capsize=3)
        for i, v in enumerate(vals):
            ax.text(i + 0.22, v * 0.04, f"{v:.1f}", ha="center", va="bottom", fontsize=9, color="white",
                    rotation=90)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel(ylabel)
    g = res["goals"]
    a.set_title(f"ours / reference: {g['ours_vs_reference_layernorm']['measured']:.2f}x (LayerNorm), "
                f"{g['ours_vs_reference_cleanrl']['measured']:.2f}x (plain)", fontsize=9)
    b.set_title("bars: median block; whiskers: fastest / slowest block", fontsize=9)
    m = res["machine"]
    fig.suptitle(f"SAC updates on CPU, {res['config']['threads']} thread(s), batch {BATCH}, hidden {HIDDEN}, "
                 f"obs {OBS_DIM}, action {ACTION_DIM}; {m['cpu_count']} cores, load {m['loadavg_1m_start']:.1f}"
                 f" ({res['mode']})", fontsize=9)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv=None) -> int:
    ap = flags.parser("sac", __doc__, out=False)
    flags.add_quick(ap, "a few short rounds (a smoke run, not a measurement)")
    flags.add_out(ap)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, the same for every row")
    ap.add_argument("--utd", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per timed block")
    ap.add_argument("--blocks", type=int, default=8, help="timed blocks per configuration (interleaved)")
    args = ap.parse_args(argv)
    utd, rounds, blocks = (2, 1, 2) if args.quick else (args.utd, args.rounds, args.blocks)
    samples, fill = (10, 300) if args.quick else (200, 2000)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    rows = measure(utd, rounds, blocks)
    replay = replay_timing(samples, fill)
    by = {r["label"]: r for r in rows}
    ratio_ln = (by["ours, 2 critics + LayerNorm"]["critic_updates_per_s"]
                / by["reference CleanRL + LayerNorm"]["critic_updates_per_s"])
    ratio_plain = by["ours, 2 critics"]["critic_updates_per_s"] / by["reference CleanRL, 2 Q MLPs"]["critic_updates_per_s"]
    res = {"bench": "sac", "mode": "quick" if args.quick else "full", "quick": args.quick,
           "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                       "python": platform.python_version(), "loadavg_1m_start": load0,
                       "loadavg_1m_end": os.getloadavg()[0]},
           "config": {"threads": args.threads, "utd": utd, "rounds_per_block": rounds, "blocks": blocks,
                      "batch": BATCH, "hidden": list(HIDDEN), "obs_dim": OBS_DIM, "action_dim": ACTION_DIM},
           "results": rows, "replay": replay,
           "goals": {"ours_vs_reference_layernorm": {
                         "goal": f">= {GOAL_RATIO}x the reference's critic updates / s, both with LayerNorm, "
                                 "2 critics", "measured": ratio_ln, "met": bool(ratio_ln >= GOAL_RATIO)},
                     "ours_vs_reference_cleanrl": {
                         "goal": f">= {GOAL_RATIO}x the plain CleanRL reference's critic updates / s, 2 critics",
                         "measured": ratio_plain, "met": bool(ratio_plain >= GOAL_RATIO)}},
           "wall_s": None}
    res["wall_s"] = time.perf_counter() - t_start
    write_result(args.out / "sac.json", res, "sac", argv, args.quick)
    plot(res, args.out / "sac.png")
    print(f"\n{'configuration':<46} {'critic upd/s':>12} {'UTD-' + str(utd) + ' rounds/s':>16}")
    for r in rows:
        print(f"{r['label']:<46} {r['critic_updates_per_s']:12.1f} {r['rounds_per_s']:16.2f}")
    for name, v in replay.items():
        print(f"sample_mixed batch {BATCH}, {name}: {v['sample_mixed_ms_median']:.2f} ms")
    for name, g in res["goals"].items():
        print(f"goal {name}: {g['measured']:.2f}x -> {'MET' if g['met'] else 'NOT MET'}")
    print(f"wrote {args.out / 'sac.json'} and {args.out / 'sac.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
