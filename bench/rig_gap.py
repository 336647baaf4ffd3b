#!/usr/bin/env python
"""The sim-to-rig gap of an agent that plays: trained in emulation, scored in emulation and through
the emulated rig, with each of the rig's failure sources switched off in turn, and the fixes.

1. **Agent** (per game and seed): a pixel policy (the Nature CNN, ``policies.dqn``) cloned from a
   PRIVILEGED RAM teacher (``policies.dqn.teacher``: it reads ball and paddle from the emulator's
   RAM; labelled as such, never scored) with DAgger rounds, all in pure emulation (``AleEnv``):
   ``policies.dqn.bc.dagger``; every round plays 5% random keys as the evaluation does (labels stay
   the teacher's, ``--collect-epsilon``) and a training-only head regresses the teacher's RAM ball and
   paddle positions from the student's hidden layer (``--aux-weight``). Each round's student is
   scored by the games it plays to collect the next round (epsilon-greedy, emulation): the budget curve.
2. **Gap**: the agent plays ``--eval-games`` games (epsilon ``--epsilon``, Nature's 5-minute cap of
   18000 frames) in emulation and through the emulated rig (``hardware.virtual_rig.VirtualRig``: the
   four-process rig's screen, camera and key path on a simulated clock, its noise the sim-rig
   camera's and the measured key path of ``bench/results/rig.json``), and through the rig with one
   failure source off at a time (``rig-no-<source>``: latency, jitter, perspective, blur_noise,
   lighting) and all of them off (``rig-clean``). A source's share of the gap is what switching it
   off wins back. ``emulation-single-frame``: emulation with the step's last frame alone instead of the
   max of its last two (the rig's camera gives one exposure per picture; with every source off the rig
   still differs from emulation in this and in the resampling through camera and rectification);
   ``emulation-filmed``: emulation's pictures and timing, each picture filmed by the rig's camera with
   every source off and rectified (the resampling alone); ``rig-timing``: the rig's timing with every
   failure source on, the camera skipped (the emulator's own single frames as shown at exposure: the
   timing alone, ``VirtualRig(film=False)``).
3. **Fixes**, each started from the emulation agent and scored on the rig the same way:
   ``dagger-rig``: DAgger rounds on the rig itself (the host's RAM labels the game's present state
   while the agent sees the camera: fine-tuning on the rig with a teacher, ``--fix-rounds``);
   ``dr``: DAgger rounds in emulation of the rig with each episode's noise drawn at random (domain
   randomisation over the same sources: latency x U(0, 2), blur / noise x U(0, 2), tilt x U(0, 1.5),
   exposure U(0.7, 1.3), flicker x U(0, 3), jitter x U(0, 3));
   ``dagger-rig-history``: ``dagger-rig`` with a delay-aware student that also reads its own last
   ``--fix-history`` actions (``DQNConfig.action_history``; widened from the emulation agent with zero
   weights, so it starts as that agent): the rig's picture is ~57 ms old, about one decision, and
   predates the last key, which the teacher's present-state label depends on;
   ``dagger-rig-cotrain``: ``dagger-rig-history`` co-trained with ``--fix-cotrain`` emulation decisions
   (the emulation agent plays them once, the teacher labels; half of every batch): the rounds hold
   5-10 thousand rig samples, the agent learnt the game from 50 thousand or more;
   ``single-frame``: DAgger rounds in ``emulation-single-frame`` (no rig, no camera: the agent re-learns
   from pictures of one exposure, as the rig gives them; as cheap as emulation);
   ``dagger-rig-ahead``: ``dagger-rig-history`` with the teacher labelling the state its key will meet
   (``VirtualRig.ram_at_key``: the present state played forward under the keys already sent to the tick
   where a key sent now lands) instead of the present state: the teacher was tuned in emulation, where a
   key acts at once, and reading the present RAM on the rig it plays below its emulation score.
4. **Teacher** (``--teacher-games``; PRIVILEGED, labels only, never the agent): the teacher's own games in
   emulation, on the rig reading the present RAM (what every fix but ``dagger-rig-ahead`` labels with) and
   on the rig reading the RAM at its key's tick. It reads no pictures, so it plays on the rig's timing
   without the camera (``rig-timing``: the same game, checked by a test).
5. **The fixes' budget curve** (``--score-rounds``): the fixes keep each round's student
   (``BCConfig.keep_rounds``) and the students of the rounds named are scored as the final one is
   (``--eval-games`` games per seed, the fixes' conditions): result against rig decisions, with full
   evaluations instead of the one or two games each round plays to collect its samples.

Scores are human-normalised, 100 * (score - random) / (human - random), with the constants of
Mnih et al. 2015 (Nature 518, Extended Data Table 2): Pong random -20.7, human 9.3; Breakout
random 1.7, human 31.8. The rig on a simulated clock was checked against the real-time rig by
``tests/hardware/test_virtual_rig.py`` (same camera renderer and calibration path).

Every trained agent and every scored condition is kept in ``--work`` (default runs/rig_gap) and
reused: a killed run continues where it stopped, and adding ``--seeds`` or ``--conditions`` runs only
what is new. Writes ``bench/results/rig_gap.json`` and ``rig_gap.png``. The full study:

    .venv/bin/python -m bench.rig_gap --games pong breakout --seeds 0 1 2 --ablation-seeds 0 --eval-games 10 \\
        --rounds 7 pong=9 --fixes dagger-rig dagger-rig-history dagger-rig-cotrain --fix-conditions rig --jobs 2
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

from bench.harness import flags  # noqa: E402
from bench.harness.results import ROOT, write_result  # noqa: E402

import numpy as np  # noqa: E402

# Mnih et al. 2015 (Nature), Extended Data Table 2: random play and the professional human tester
CONSTANTS = {"pong": {"random": -20.7, "human": 9.3}, "breakout": {"random": 1.7, "human": 31.8}}
SOURCES = ("latency", "jitter", "perspective", "blur_noise", "lighting")
CONDITIONS = ("emulation", "emulation-single-frame", "emulation-filmed", "rig", *(f"rig-no-{s}" for s in SOURCES),
              "rig-clean", "rig-timing")
FIXES = ("dagger-rig", "dr", "dagger-rig-history", "dagger-rig-cotrain", "single-frame", "dagger-rig-ahead")
HISTORY_FIXES = ("dagger-rig-history", "dagger-rig-cotrain", "dagger-rig-ahead")  # the delay-aware students
# the PRIVILEGED teacher's own games (labels only; never the agent): where it plays and which RAM it reads
TEACHER_PLAYS = (("emulation", "present"), ("rig", "present"), ("rig", "at-key"))


def human_normalised(game: str, score: float) -> float:
    c = CONSTANTS[game]
    return 100.0 * (score - c["random"]) / (c["human"] - c["random"])


def _noise(condition: str):
    from hardware.virtual_rig import RigNoise

    if condition == "rig":
        return RigNoise()
    if condition == "rig-clean":
        return RigNoise.off()
    if condition.startswith("rig-no-"):
        return RigNoise().without(condition[len("rig-no-"):])
    raise ValueError(f"unknown condition {condition!r}: there are {', '.join(CONDITIONS)}")


def make_env(game: str, condition: str, seed: int, max_steps: int):
    from policies.dqn.preprocess import AleEnv

    if condition in ("emulation", "emulation-single-frame"):
        return AleEnv(game, seed=seed, max_episode_steps=max_steps, max_pool=condition == "emulation")
    from hardware.virtual_rig import RigNoise, VirtualRig

    if condition == "emulation-filmed":
        return FilmedEmulation(game, seed, max_steps)
    if condition == "rig-timing":
        return VirtualRig(game, RigNoise(), seed=seed, max_episode_steps=max_steps, film=False)
    return VirtualRig(game, _noise(condition), seed=seed, max_episode_steps=max_steps)


def FilmedEmulation(game: str, seed: int, max_steps: int):
    """Emulation's pictures and timing (``AleEnv``: the max of the step's last two frames, the keys at
    once), each picture filmed by the rig's camera with every failure source off and rectified with
    its calibration (``VirtualRig(RigNoise.off())``'s camera and rectifier): the resampling alone."""
    import gymnasium as gym

    from hardware.virtual_rig import RigNoise, VirtualRig
    from policies.dqn.preprocess import AleEnv

    env = AleEnv(game, seed=seed, max_episode_steps=max_steps)
    rig = VirtualRig(game, RigNoise.off(), seed=seed)

    def film(obs: dict) -> dict:
        return {**obs, "images": {"screen": rig.rectifier(rig.camera.render(obs["images"]["screen"], 0.0))}}

    wrapped = gym.wrappers.TransformObservation(env, film, env.observation_space)
    wrapped.ale, wrapped.action_names = env.ale, env.action_names  # what the teacher and the agent read
    wrapped.ram_at_key = env.ram_at_key
    return wrapped


class RandomisedRig:
    """Domain randomisation: a ``VirtualRig`` whose noise is drawn afresh at every reset (the
    ranges in the module docstring); the env a DAgger round collects in."""

    def __init__(self, game: str, seed: int, max_steps: int) -> None:
        self.game, self.max_steps = game, max_steps
        self.rng = np.random.default_rng(seed)
        self.env = None
        self._draw()

    def _draw(self) -> None:
        from hardware.virtual_rig import RigNoise, VirtualRig

        u = self.rng.uniform
        base = RigNoise()
        noise = dataclasses.replace(
            base, latency_ms=base.latency_ms * u(0, 2), key_ms_median=base.key_ms_median * u(0.5, 2),
            blur_sigma=base.blur_sigma * u(0, 2), noise_std=base.noise_std * u(0, 2),
            yaw_deg=base.yaw_deg * u(0, 1.5), pitch_deg=base.pitch_deg * u(0, 1.5), roll_deg=base.roll_deg * u(0, 1.5),
            exposure=u(0.7, 1.3), flicker=base.flicker * u(0, 3), jitter_ms=base.jitter_ms * u(0, 3))
        noise = dataclasses.replace(noise, key_ms_p99=max(noise.key_ms_p99, noise.key_ms_median))
        self.env = VirtualRig(self.game, noise, seed=int(self.rng.integers(2**31)), max_episode_steps=self.max_steps)
        self.action_space, self.action_names = self.env.action_space, self.env.action_names

    @property
    def ale(self):
        return self.env.ale

    def ram_at_key(self):
        return self.env.ram_at_key()

    def reset(self, seed=None):
        self._draw()
        return self.env.reset(seed=seed)

    def step(self, a):
        return self.env.step(a)


# ------------------------------------------------------------------------------------------------
# the work directory: one agent per (game, seed, how), one score file per (agent, condition)
# ------------------------------------------------------------------------------------------------
def _write_json(obj, path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def train_agent(job: dict) -> dict:
    """Train (or find) one agent: ``how`` = emulation or one of ``FIXES``."""
    import torch

    from policies.dqn.bc import BCConfig, dagger
    from policies.dqn.dqn import DQN
    from policies.dqn.teacher import make_teacher

    torch.set_num_threads(job["threads"])
    game, seed, how, run = job["game"], job["seed"], job["how"], job["run"]
    done = os.path.join(run, "done.json")
    if os.path.isfile(done):
        with open(done) as f:
            return json.load(f)
    t0 = time.time()
    b = job["bc"]
    if how == "emulation":
        cfg = BCConfig(rounds=b["rounds"], round0_steps=b["round0_steps"], round_steps=b["round_steps"],
                       train_steps=b["train_steps"], batch_size=b["batch_size"], learning_rate=b["lr"],
                       epsilon=b.get("collect_epsilon", 0.0), aux_weight=b.get("aux_weight", 0.0), seed=seed)
        agent, rounds = dagger(lambda s: make_env(game, "emulation", s, b["episode_steps"]),
                               lambda: make_teacher(game), cfg, out=run, progress=False, log=lambda m: None)
    else:
        start = DQN.from_checkpoint(job["from"])
        cfg = BCConfig(rounds=b["fix_rounds"], round_steps=b["round_steps"], train_steps=b["train_steps"],
                       batch_size=b["batch_size"], learning_rate=b["fix_lr"],
                       epsilon=b.get("collect_epsilon", 0.0), aux_weight=b.get("aux_weight", 0.0), seed=seed + 100,
                       action_history=job.get("history", 0) if how in HISTORY_FIXES else 0,
                       cotrain_steps=job.get("cotrain", 0) if how == "dagger-rig-cotrain" else 0,
                       label_at_key=how == "dagger-rig-ahead", keep_rounds=bool(job.get("keep_rounds")))
        if how in ("dagger-rig", *HISTORY_FIXES):
            env_fn = lambda s: make_env(game, "rig", s, b["episode_steps"])  # noqa: E731
        elif how == "single-frame":
            env_fn = lambda s: make_env(game, "emulation-single-frame", s, b["episode_steps"])  # noqa: E731
        else:
            env_fn = lambda s: RandomisedRig(game, s, b["episode_steps"])  # noqa: E731
        agent, rounds = dagger(env_fn, lambda: make_teacher(game), cfg, out=run, agent=start, progress=False,
                               log=lambda m: None,
                               cotrain_env=lambda s: make_env(game, "emulation", s, b["episode_steps"]))
    out = {"game": game, "seed": seed, "how": how, "wall_s": round(time.time() - t0, 1), "rounds": rounds}
    _write_json(out, done)
    return out


def score_agent(job: dict) -> dict:
    import torch

    from policies.dqn.dqn import DQN, evaluate

    torch.set_num_threads(1)  # one picture at a time
    path = job["path"]
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    t0 = time.time()
    agent = DQN.from_checkpoint(job["run"])
    env = make_env(job["game"], job["condition"], 10_000 + job["seed"], job["max_steps"])
    ev = evaluate(agent, env, job["games"], epsilon=job["epsilon"], seed=20_000 + job["seed"])
    out = {k: job[k] for k in ("game", "seed", "agent", "condition")}
    if job.get("round") is not None:  # a fix's student after this round (the budget curve), not its last
        out["round"] = job["round"]
    out.update(scores=ev["scores"], lengths=ev["lengths"], mean=ev["mean"],
               human_normalised=human_normalised(job["game"], ev["mean"]), wall_s=round(time.time() - t0, 1))
    _write_json(out, path)
    return out


def score_teacher(job: dict) -> dict:
    """The PRIVILEGED teacher's own games (``TEACHER_PLAYS``), epsilon-greedy as the evaluation."""
    from policies.dqn.teacher import make_teacher

    path = job["path"]
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    t0 = time.time()
    game, where, ram = job["game"], job["where"], job["ram"]
    env = make_env(game, "emulation" if where == "emulation" else "rig-timing", 30_000, job["max_steps"])
    teacher, rng, scores = make_teacher(game), np.random.default_rng(40_000), []
    read = env.ram_at_key if ram == "at-key" else env.ale.getRAM
    for ep in range(job["games"]):
        env.reset(seed=50_000 + ep)
        teacher.reset()
        score = 0.0
        for _ in range(job["max_steps"]):
            a = int(teacher(read()))
            if rng.random() < job["epsilon"]:
                a = int(rng.integers(env.action_space.n))
            _, r, term, trunc, _ = env.step(a)
            score += float(r)
            if term or trunc:
                break
        scores.append(score)
    out = {"game": game, "where": where, "ram": ram, "scores": scores, "mean": float(np.mean(scores)),
           "human_normalised": human_normalised(game, float(np.mean(scores))), "wall_s": round(time.time() - t0, 1)}
    _write_json(out, path)
    return out


def parse_rounds(items: list[str]) -> tuple[int, dict[str, int]]:
    """``--rounds``: ``N`` and / or ``GAME=N`` items -> (the default count, {game: count})."""
    default, per_game = None, {}
    for it in items:
        game, _, n = it.rpartition("=")
        try:
            v = int(n)
        except ValueError:
            raise ValueError(f"--rounds: {it!r} is neither N nor GAME=N") from None
        if v < 0:
            raise ValueError(f"--rounds: {it!r} is negative")
        if not game:
            default = v
        elif game not in CONSTANTS:
            raise ValueError(f"--rounds: no game {game!r} (there are {', '.join(sorted(CONSTANTS))})")
        else:
            per_game[game] = v
    return (3 if default is None else default), per_game


def _pool_map(fn, jobs: list, n: int, desc: str, progress: bool):
    from tqdm.auto import tqdm

    if not jobs:
        return []
    if n <= 1:
        return [fn(j) for j in tqdm(jobs, desc=desc, disable=not progress)]
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(n) as pool:
        return list(tqdm(pool.imap(fn, jobs), total=len(jobs), desc=desc, disable=not progress))


# ------------------------------------------------------------------------------------------------
# summary and plot
# ------------------------------------------------------------------------------------------------
def round_curve(rows: list[dict], final: dict) -> dict:
    """The fixes' scored rounds (``--score-rounds``) and their last round (the table's own entry) ->
    {fix: {condition: [{round, human_normalised, hn_per_seed, seeds, games}, ...]}}, rounds ascending."""
    by = {}
    for s in rows:
        by.setdefault((s["agent"], s["condition"], s["round"]), []).append(s)
    out = {}
    for (agent, cond, r), ss in sorted(by.items()):
        g = ss[0]["game"]
        every = [x for s in ss for x in s["scores"]]
        out.setdefault(agent, {}).setdefault(cond, []).append(
            {"round": r, "human_normalised": human_normalised(g, float(np.mean(every))),
             "hn_per_seed": [human_normalised(g, float(np.mean(s["scores"]))) for s in ss],
             "seeds": [s["seed"] for s in ss], "games": len(every)})
    for agent, conds in out.items():
        for cond, pts in conds.items():
            last = final.get((agent, cond))
            if last is not None:
                pts.append(last)
    return out


def summarise(games, scores: list[dict], fix_rounds: int) -> dict:
    out = {}
    for g in games:
        rounds = [s for s in scores if s["game"] == g and s.get("round") is not None]
        rows = [s for s in scores if s["game"] == g and s.get("round") is None]
        by = {}
        for s in rows:
            by.setdefault((s["agent"], s["condition"]), []).append(s)
        table = {}
        for (agent, cond), ss in sorted(by.items()):
            all_scores = [x for s in ss for x in s["scores"]]
            per_seed = [human_normalised(g, float(np.mean(s["scores"]))) for s in ss]
            table[f"{agent}@{cond}"] = {
                "agent": agent, "condition": cond, "seeds": [s["seed"] for s in ss], "games": len(all_scores),
                "mean_score": float(np.mean(all_scores)),
                "human_normalised": human_normalised(g, float(np.mean(all_scores))),
                "hn_per_seed": per_seed, "hn_seed_std": float(np.std(per_seed)) if len(per_seed) > 1 else None}
        emu, rig = table.get("emulation@emulation"), table.get("emulation@rig")
        g_out = {"table": table}
        if emu and rig:
            gap = emu["human_normalised"] - rig["human_normalised"]
            g_out["gap_points"] = gap
            e = emu["human_normalised"]
            g_out["loss_percent_of_emulation"] = 100 * gap / e if e else None
            g_out["recovered_by_switching_off"] = {
                c: (table[f"emulation@{c}"]["human_normalised"] - rig["human_normalised"]) for c in CONDITIONS
                if (c.startswith("rig-no-") or c == "rig-clean") and f"emulation@{c}" in table}
            if "emulation@rig-timing" in table:  # the camera skipped, the rig's timing kept
                g_out["recovered_by_skipping_the_camera"] = (table["emulation@rig-timing"]["human_normalised"]
                                                             - rig["human_normalised"])
            single = table.get("emulation@emulation-single-frame")
            if single:  # what one exposure per picture costs without the rig's other sources
                g_out["single_frame_cost_in_emulation"] = e - single["human_normalised"]
            g_out["fixes"] = {}
            for fx in FIXES:
                t = table.get(f"{fx}@rig")
                if t is not None:
                    rec = t["human_normalised"] - rig["human_normalised"]
                    g_out["fixes"][fx] = {"rig_hn": t["human_normalised"], "recovered_points": rec,
                                          "recovered_share_of_gap": rec / gap if gap > 0 else None,
                                          "emulation_hn": (table.get(f"{fx}@emulation") or {}).get("human_normalised")}
        if rounds:
            final = {(t["agent"], t["condition"]): {"round": fix_rounds, "human_normalised": t["human_normalised"],
                                                      "hn_per_seed": t["hn_per_seed"], "seeds": t["seeds"],
                                                      "games": t["games"]}
                     for t in table.values() if t["agent"] != "emulation"}
            g_out["fix_round_curve"] = round_curve(rounds, final)
        out[g] = g_out
    return out


def plot(res: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = list(res["games"])
    fig, axes = plt.subplots(2, len(games), figsize=(6.5 * len(games), 8.0), squeeze=False,
                             gridspec_kw={"height_ratios": [1.2, 1]})
    for ax, g in zip(axes[0], games):
        t = res["games"][g]["table"]
        names, vals, errs, cols = [], [], [], []
        colour = {"emulation": "tab:blue", "rig": "tab:red"}
        for key, col in ([(f"emulation@{c}", colour.get(c, "tab:orange")) for c in CONDITIONS]
                         + [(f"{fx}@rig", "tab:green") for fx in FIXES]):
            if key in t:
                names.append(key.replace("emulation@", "").replace("@rig", " (fix) on rig")
                             + f" [{len(t[key]['seeds'])}s]")
                vals.append(t[key]["human_normalised"])
                errs.append(t[key]["hn_seed_std"] or 0.0)
                cols.append(col)
        for key, v in res.get("teacher_games", {}).get(g, {}).items():  # PRIVILEGED: labels, never the agent
            names.append(f"TEACHER* {key} [{len(v['scores'])}g]")
            vals.append(v["human_normalised"])
            errs.append(0.0)
            cols.append("tab:gray")
        ax.bar(range(len(vals)), vals, yerr=errs, color=cols, capsize=3)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(vals)), names, rotation=40, ha="right", fontsize=8)
        ax.axhline(100, color="k", ls="--", lw=1)
        ax.axhline(50, color="gray", ls=":", lw=1)
        ax.axhline(0, color="gray", lw=1)
        ax.set_ylabel("human-normalised score (%)")
        ax.set_title(f"{g}: BC+DAgger agent, emulation vs emulated rig ([Ns]: seeds; bars: seed std)\n"
                     "*: the PRIVILEGED RAM teacher's own games (labels only)", fontsize=9)
    # the budget curve: each DAgger round's student as it played that round's games (epsilon-greedy as
    # the evaluation, in emulation), against the labelled samples it was trained on
    for ax, g in zip(axes[1], games):
        def evaluated(seed, agent, condition, g=g):
            return [x["human_normalised"] for x in res["scores"]  # the last student's, not a kept round's
                    if (x["game"], x["seed"], x["agent"], x["condition"]) == (g, seed, agent, condition)
                    and x.get("round") is None]

        start = {tr["seed"]: tr["rounds"][-1]["samples"] for tr in res["training"]
                 if tr["game"] == g and tr["how"] == "emulation" and tr["rounds"]}
        x0 = float(np.mean(list(start.values()))) if start else 0.0
        for how in FIXES:  # a fix's rounds, on the rig (or its env): after the emulation agent's, mean over seeds
            runs = [tr for tr in res["training"] if tr["game"] == g and tr["how"] == how and tr["rounds"]]
            if not runs:
                continue
            n = min(len(tr["rounds"]) for tr in runs)
            pts = []
            for i in range(n):
                hn = [human_normalised(g, tr["rounds"][i]["mean_score"]) for tr in runs
                      if tr["rounds"][i]["mean_score"] is not None]
                if hn:
                    pts.append((x0 + (runs[0]["rounds"][i - 1]["samples"] if i else 0), float(np.mean(hn))))
            if pts:
                line, = ax.plot(*zip(*pts), marker=".", ls="--", label=f"{how} ({len(runs)} seeds, its env)")
                fin = [v for tr in runs for v in evaluated(tr["seed"], how, "rig")]
                if fin:
                    ax.plot([x0 + runs[0]["rounds"][n - 1]["samples"]], [np.mean(fin)], marker="*", ms=12,
                            color=line.get_color())
                curve = res["games"].get(g, {}).get("fix_round_curve", {}).get(how, {}).get("rig", [])
                curve = [c for c in curve if c["round"] <= n]
                if curve:  # --score-rounds: each kept round's student, evaluated on the rig as the last one
                    ax.errorbar([x0 + runs[0]["rounds"][c["round"] - 1]["samples"] for c in curve],
                                [c["human_normalised"] for c in curve],
                                yerr=[float(np.std(c["hn_per_seed"])) for c in curve], marker="s", ms=5, capsize=3,
                                color=line.get_color(), label=f"{how}: rounds evaluated on the rig "
                                                              f"({curve[-1]['games']} games)")
        for tr in res["training"]:
            if tr["game"] != g or not tr["rounds"] or tr["how"] != "emulation":
                continue
            pts = [(tr["rounds"][i - 1]["samples"], human_normalised(g, r["mean_score"]))
                   for i, r in enumerate(tr["rounds"]) if i > 0 and r["mean_score"] is not None]
            final = evaluated(tr["seed"], "emulation", "emulation")
            if pts:
                line, = ax.plot(*zip(*pts), marker="o", label=f"seed {tr['seed']}")
                if final:  # the final student's evaluation games, at the samples of its last round
                    ax.plot([tr["rounds"][-1]["samples"]], final, marker="*", ms=12, color=line.get_color())
        ax.axhline(50, color="gray", ls=":", lw=1)
        ax.axhline(0, color="gray", lw=1)
        ax.set_xlabel("labelled samples the student was trained on")
        ax.set_ylabel("human-normalised (%)")
        ax.set_title(f"{g}, budget: each round's student in its own games\n(solid: emulation, per seed; dashed: a "
                     "fix in its env, mean of seeds; stars / squares: evaluation on the rig)", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", framealpha=0.6)
    fig.tight_layout()
    fig.savefig(str(path) + ".tmp.png", dpi=90)
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency

    Image.open(str(path) + ".tmp.png").convert("RGB").quantize(64).save(str(path) + ".tmp.png")  # a 64-colour PNG
    os.replace(str(path) + ".tmp.png", path)


def main(argv=None) -> int:
    ap = flags.parser("rig_gap", __doc__.split("\n\n")[0], out=False, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--quick", action="store_true", help="a tiny budget, about a minute (the test)")
    ap.add_argument("--games", nargs="+", default=["pong", "breakout"], choices=sorted(CONSTANTS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="agent seeds (default 0 1 2)")
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=CONDITIONS)
    ap.add_argument("--ablation-seeds", nargs="*", type=int, default=None,
                    help="seeds whose emulation agent is also scored with each failure source off (default: every "
                         "seed); the others get emulation, emulation-single-frame and rig only")
    ap.add_argument("--fixes", nargs="*", default=list(FIXES), choices=FIXES)
    ap.add_argument("--fix-conditions", nargs="+", default=["rig", "emulation"], choices=CONDITIONS,
                    metavar="CONDITION",
                    help="where the fixes are scored, any condition (default rig emulation: emulation shows what "
                         "extra training alone did; rig-clean: what remains with every source off)")
    ap.add_argument("--eval-games", type=int, default=10, help="games per agent and condition (default 10)")
    ap.add_argument("--max-steps", type=int, default=4500,
                    help="cut a game at this many decisions (default 4500 = 18000 frames, Nature's 5 minutes)")
    ap.add_argument("--epsilon", type=float, default=0.05, help="evaluation epsilon (default 0.05, as Nature)")
    ap.add_argument("--rounds", nargs="+", default=["3"], metavar="N|GAME=N",
                    help="DAgger rounds in emulation after the teacher's (default 3); GAME=N gives one game its own "
                         "count, e.g. --rounds 7 pong=9 (the other games' agents keep their cache)")
    ap.add_argument("--round0-steps", type=int, default=15_000, help="teacher decisions in round 0 (default 15000)")
    ap.add_argument("--round-steps", type=int, default=5000, help="student decisions per DAgger round (default 5000)")
    ap.add_argument("--train-steps", type=int, default=3000, help="gradient steps after each round (default 3000)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2.5e-4, help="learning rate of the emulation agent's rounds")
    ap.add_argument("--collect-epsilon", type=float, default=0.05,
                    help="random actions while collecting every round, labels still the teacher's (default 0.05: "
                         "the evaluation's epsilon; 0: off)")
    ap.add_argument("--aux-weight", type=float, default=1.0,
                    help="weight of the training-only auxiliary loss that reads the teacher's RAM ball and paddle "
                         "positions out of the student's hidden layer (default 1; 0: off)")
    ap.add_argument("--fix-rounds", type=int, default=2, help="DAgger rounds of each fix (default 2)")
    ap.add_argument("--score-rounds", nargs="*", type=int, default=[], metavar="N",
                    help="also score each fix's student after these rounds (1 .. --fix-rounds - 1), on the fixes' "
                         "conditions: the budget curve. The fixes then keep every round's student (26 MB each); a fix "
                         "found in --work that was trained without it has no rounds to score: the run stops and "
                         "names it")
    ap.add_argument("--fix-lr", type=float, default=2.5e-4, help="learning rate of the fixes' rounds")
    ap.add_argument("--fix-history", type=int, default=2,
                    help="last actions the dagger-rig-history / -cotrain student reads beside the pictures (default 2)")
    ap.add_argument("--fix-cotrain", type=int, default=20_000,
                    help="emulation decisions dagger-rig-cotrain trains on beside the rig's (default 20000)")
    ap.add_argument("--teacher-games", type=int, default=10,
                    help="games of the PRIVILEGED teacher in emulation, on the rig reading the present RAM and on the "
                         "rig reading the RAM at its key's tick (default 10; 0: none)")
    ap.add_argument("--jobs", type=int, default=1, help="processes (one thread each; default 1)")
    ap.add_argument("--work", default=None, help="agents and scores (default runs/rig_gap; quick: a temp dir)")
    flags.add_out(ap)
    ap.add_argument("--name", default="rig_gap", help="result file name: OUT/NAME.json and .png (default rig_gap)")
    args = ap.parse_args(argv)
    if args.eval_games < 1 or args.max_steps < 1 or args.jobs < 1 or args.fix_history < 1 or args.fix_cotrain < 1:
        ap.error("--eval-games, --max-steps, --jobs, --fix-history and --fix-cotrain must be >= 1")
    if args.teacher_games < 0:
        ap.error(f"--teacher-games must be >= 0, got {args.teacher_games}")
    try:
        default_rounds, game_rounds = parse_rounds(args.rounds)
    except ValueError as e:
        ap.error(str(e))
    tmp = tempfile.TemporaryDirectory(prefix="rig-gap-")
    if args.quick:
        bc = dict(rounds=1, round0_steps=300, round_steps=150, train_steps=20, batch_size=16, lr=args.lr,
                  episode_steps=200, fix_rounds=2 if args.score_rounds else 1, fix_lr=args.fix_lr)
        args.seeds, args.eval_games, args.max_steps = args.seeds[:1], 1, 60
        args.teacher_games = min(args.teacher_games, 1)
        args.fix_cotrain = min(args.fix_cotrain, 100)
        work = args.work or tmp.name
    else:
        bc = dict(rounds=default_rounds, round0_steps=args.round0_steps, round_steps=args.round_steps,
                  train_steps=args.train_steps, batch_size=args.batch_size, lr=args.lr, episode_steps=args.max_steps,
                  fix_rounds=args.fix_rounds, fix_lr=args.fix_lr)
        work = args.work or str(ROOT / "runs" / "rig_gap")
    bad = [n for n in args.score_rounds if not 1 <= n < bc["fix_rounds"]]
    if bad:
        ap.error(f"--score-rounds {bad}: a fix's rounds run 1 .. {bc['fix_rounds']} (--fix-rounds), and its last "
                 f"round is scored anyway; name rounds 1 .. {bc['fix_rounds'] - 1}")
    if args.collect_epsilon:  # absent when 0: the agents trained before this setting keep their budget tag
        bc["collect_epsilon"] = args.collect_epsilon
    if args.aux_weight:
        bc["aux_weight"] = args.aux_weight
    threads = 1 if args.jobs > 1 else 2  # training; acting and scoring always run on one thread
    progress = not args.quick
    t0 = time.time()

    import hashlib

    def _tag(d):  # another budget, another agent
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]

    game_bc = {g: bc if args.quick or g not in game_rounds else {**bc, "rounds": game_rounds[g]} for g in args.games}
    tag = {g: _tag(b) for g, b in game_bc.items()}
    emulation_tag = {g: _tag({k: v for k, v in b.items() if not k.startswith("fix_")})  # a fix's budget: not its start
                     for g, b in game_bc.items()}

    def run_dir(g, s, how):
        t = emulation_tag[g] if how == "emulation" else tag[g]
        if how == "dagger-rig-history":  # its history length: part of its own budget, not the others'
            t = _tag({**game_bc[g], "fix_history": args.fix_history})
        if how == "dagger-rig-ahead":
            t = _tag({**game_bc[g], "fix_history": args.fix_history, "label_at_key": True})
        if how == "dagger-rig-cotrain":
            t = _tag({**game_bc[g], "fix_history": args.fix_history, "fix_cotrain": args.fix_cotrain})
        return os.path.join(work, g, f"seed{s}", f"{how}-{t}")

    base = [dict(game=g, seed=s, how="emulation", run=run_dir(g, s, "emulation"), bc=game_bc[g], threads=threads)
            for g in args.games for s in args.seeds]
    trained = _pool_map(train_agent, base, args.jobs, "emulation agents", progress)
    fixes = [dict(game=g, seed=s, how=fx, run=run_dir(g, s, fx), bc=game_bc[g], threads=threads,
                  history=args.fix_history, cotrain=args.fix_cotrain, keep_rounds=bool(args.score_rounds),
                  **{"from": run_dir(g, s, "emulation")}) for g in args.games for s in args.seeds for fx in args.fixes]
    trained += _pool_map(train_agent, fixes, args.jobs, "fixes", progress)

    jobs = []
    for g in args.games:
        for s in args.seeds:
            for agent in ("emulation", *args.fixes):
                conds = args.conditions if agent == "emulation" else args.fix_conditions
                if agent == "emulation" and args.ablation_seeds is not None and s not in args.ablation_seeds:
                    conds = [c for c in conds if c in ("emulation", "emulation-single-frame", "rig")]
                for c in conds:
                    name = f"{c}-g{args.eval_games}-m{args.max_steps}-e{args.epsilon}.json"
                    jobs.append(dict(game=g, seed=s, agent=agent, condition=c, run=run_dir(g, s, agent),
                                     games=args.eval_games, max_steps=args.max_steps, epsilon=args.epsilon,
                                     threads=threads, path=os.path.join(run_dir(g, s, agent), "scores", name)))
    # the headline first (emulation and rig of every agent), then the fixes on the rig, then the ablation:
    # a run cut short leaves the most important scores in --work
    jobs.sort(key=lambda j: (j["condition"] not in ("emulation", "rig"), j["agent"] != "emulation",
                             j["condition"] != "rig"))
    missing = []
    for j in [j for j in jobs if j["agent"] != "emulation"]:  # the budget curve: the fixes' earlier rounds, last
        for n in sorted(set(args.score_rounds)):
            run = os.path.join(j["run"], "rounds", f"{n:02d}")
            if not os.path.isfile(os.path.join(run, "model.pt")):
                missing.append(run)
                continue
            jobs.append({**j, "run": run, "round": n, "path": os.path.join(run, "scores", os.path.basename(j["path"]))})
    if missing:
        sys.exit(f"--score-rounds: no student kept at {', '.join(sorted(set(missing)))}: that fix was trained without "
                 "--score-rounds. Delete its run directory to retrain it with every round kept.")
    for j in jobs:
        os.makedirs(os.path.dirname(j["path"]), exist_ok=True)
    scores = _pool_map(score_agent, jobs, args.jobs, "scoring", progress)
    teacher_jobs = [dict(game=g, where=w, ram=ram, games=args.teacher_games, max_steps=args.max_steps,
                         epsilon=args.epsilon,
                         path=os.path.join(work, g, "teacher", f"{w}-{ram}-g{args.teacher_games}-m{args.max_steps}"
                                                               f"-e{args.epsilon}.json"))
                    for g in args.games for w, ram in TEACHER_PLAYS if args.teacher_games]
    for j in teacher_jobs:
        os.makedirs(os.path.dirname(j["path"]), exist_ok=True)
    teacher = _pool_map(score_teacher, teacher_jobs, args.jobs, "teacher's games", progress)

    from hardware.virtual_rig import RigNoise

    res = {
        "bench": "rig_gap", "mode": "quick" if args.quick else "full",
        "date": _dt.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
        "python": platform.python_version(), "jobs": args.jobs, "threads_per_job": threads,
        "constants": {**CONSTANTS, "source": "Mnih et al. 2015, Nature 518, Extended Data Table 2"},
        "teacher": "PRIVILEGED: RAM tracker (policies.dqn.teacher); labels only, never scored",
        "seeds": args.seeds, "eval_games": args.eval_games, "max_steps": args.max_steps, "epsilon": args.epsilon,
        "bc": bc, "fix_history": args.fix_history, "fix_cotrain": args.fix_cotrain, "rounds_per_game": {g: b["rounds"] for g, b in game_bc.items()},
        "budget_tag": tag,
        "emulation_budget_tag": emulation_tag, "rig_noise": dataclasses.asdict(RigNoise()),
        "training": [{k: t[k] for k in ("game", "seed", "how", "wall_s")} | {
            "rounds": [{k: r[k] for k in ("round", "player", "samples", "mean_score", "student_agrees", "loss",
                                          "accuracy")} | ({"aux_loss": r["aux_loss"]} if "aux_loss" in r else {})
                       for r in t["rounds"]]} for t in trained],
        "score_rounds": sorted(set(args.score_rounds)),
        "games": summarise(args.games, scores, bc["fix_rounds"]),
        "teacher_games": {g: {f"{t['where']}, {t['ram']} RAM": {k: t[k] for k in ("scores", "mean", "human_normalised")}
                              for t in teacher if t["game"] == g} for g in args.games},
        "scores": scores,
    }
    res["wall_s"] = round(time.time() - t0, 1)  # this call; agents and scores found in --work cost nothing here
    res["compute_s"] = round(sum(t["wall_s"] for t in trained) + sum(s["wall_s"] for s in scores)
                             + sum(t["wall_s"] for t in teacher), 1)
    args.out.mkdir(parents=True, exist_ok=True)
    write_result(args.out / f"{args.name}.json", res, "rig_gap", argv, args.quick, indent=1)
    plot(res, args.out / f"{args.name}.png")
    tmp.cleanup()
    for g, r in res["games"].items():
        t = r["table"]
        line = ", ".join(f"{k.replace('emulation@', '')} {v['human_normalised']:.0f}%" for k, v in t.items())
        print(f"{g}: {line}")
        for fx, conds in r.get("fix_round_curve", {}).items():
            for c, pts in conds.items():
                print(f"  {fx} on {c}, by round: " + ", ".join(f"{p['round']}: {p['human_normalised']:.0f}%"
                                                               for p in pts))
        if res["teacher_games"][g]:
            print(f"  teacher (PRIVILEGED): " + ", ".join(f"{k} {v['human_normalised']:.0f}%"
                                                       for k, v in res["teacher_games"][g].items()))
    print(f"wrote {args.out / (args.name + '.json')} in {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
