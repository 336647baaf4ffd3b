"""Online RL session on a robot (``vla rl``): an RL module steers a frozen VLA.

In-process mode (actor and learner in one process; what simulation wants for speed). One
episode at a time:

    reset (sim: the task's scene from the episode seed; a real robot: the operator's reset)
    every macro-step: features <- VLA.embed(obs); w <- agent; chunk <- VLA(w); an operator may
      take over (their chunk is executed instead and flagged as an intervention); step the env;
      store the transition in the online buffer (interventions also in the demo buffer);
      learn (after warm-up)
    after each episode: TensorBoard scalars, progress bar; every ``eval_every`` episodes a
      deterministic evaluation on fixed seeds; every ``checkpoint_every`` episodes a checkpoint.

Run directory::

    RUN/rl_config.json, RUN/episodes.jsonl (one line per episode), RUN/evals.jsonl
    RUN/checkpoint/{agent.pt, online.npz, demo.npz, state.json, rng.pt}   (replaced atomically)
    RUN/learning_curve.png, RUN/summary.json, RUN/tb/, RUN/videos/

A checkpoint is taken at episode boundaries (an episode cannot be resumed half-way: the scene
moved on), so ``--resume`` after a kill continues from the last finished episode with exactly
the step count, replay contents, optimiser and RNG states it had then.

The VLA's weights are hashed before and after the session; ``summary.json`` records both (they
must be equal: the VLA is frozen).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
from typing import Any, Callable

import numpy as np
import torch

from vla.envs import VLAPolicy
from vla.rl_config import RLConfig

Operator = Callable[[dict, dict], "np.ndarray | None"]
"""``operator(obs, context) -> chunk [n, A] in robot units, or None``: a human (or scripted)
operator taking over. ``context`` has episode, step_in_episode, ticks_in_episode."""


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Session:
    def __init__(self, cfg: RLConfig, env, vla, operator: Operator | None = None, progress: bool = True) -> None:
        from policies.common.replay import ReplayBuffer
        from policies.common.sac import SACConfig
        from policies.dsrl import DSRLAgent, DSRLConfig
        from vla.models.modes import freeze

        self.cfg, self.env, self.operator, self.progress = cfg, env, operator, progress
        self.vla = freeze(vla)
        self.digest_before = weights_digest(self.vla)
        sac = SACConfig(utd=cfg.utd, batch_size=cfg.batch_size, num_critics=cfg.num_critics, hidden=cfg.hidden,
                        gamma=cfg.gamma, init_temperature=cfg.init_temperature, backup_entropy=cfg.backup_entropy)
        self.agent = DSRLAgent(self.vla, DSRLConfig(variant=cfg.variant, noise_bound=cfg.noise_bound,
                                                    noise_dims=cfg.noise_dims, exec_steps=cfg.exec_steps,
                                                    warmup_steps=cfg.warmup_steps, distill_steps=cfg.distill_steps,
                                                    sac=sac), seed=cfg.seed)
        self.max_ticks = cfg.max_episode_ticks or getattr(env, "max_ticks", None) or 100
        spec = {"feat": ((self.agent.feat_dim,), np.float32)}
        extras = {"chunk": ((self.agent.exec_steps, self.agent.a), np.float32)}
        cap = cfg.total_ticks + 16
        self.online = ReplayBuffer(cap, spec, self.agent.noise_dim, extras)
        self.demo = ReplayBuffer(cap, spec, self.agent.noise_dim, extras)
        self.rng = np.random.default_rng(cfg.seed)
        self.step = self.ticks = self.episode = 0
        self.ckpt_dir = os.path.join(cfg.out, "checkpoint")

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self) -> None:
        tmp = self.ckpt_dir + ".partial"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        torch.save(self.agent.state_dict(), os.path.join(tmp, "agent.pt"))
        self.online.save(os.path.join(tmp, "online.npz"))
        self.demo.save(os.path.join(tmp, "demo.npz"))
        torch.save({"np": self.rng.bit_generator.state, "torch": torch.get_rng_state(), "python": random.getstate()},
                   os.path.join(tmp, "rng.pt"))
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump({"step": self.step, "ticks": self.ticks, "episode": self.episode, "time": time.time()}, f)
        old = self.ckpt_dir + ".old"
        shutil.rmtree(old, ignore_errors=True)
        if os.path.isdir(self.ckpt_dir):
            os.replace(self.ckpt_dir, old)
        os.replace(tmp, self.ckpt_dir)
        shutil.rmtree(old, ignore_errors=True)

    def load(self) -> None:
        from policies.common.replay import ReplayBuffer

        d = self.ckpt_dir if os.path.isdir(self.ckpt_dir) else self.ckpt_dir + ".old"
        if not os.path.isfile(os.path.join(d, "state.json")):
            raise FileNotFoundError(f"{self.cfg.out}: no checkpoint to resume from")
        self.agent.load_state_dict(torch.load(os.path.join(d, "agent.pt"), weights_only=False))
        self.online = ReplayBuffer.load(os.path.join(d, "online.npz"))
        self.demo = ReplayBuffer.load(os.path.join(d, "demo.npz"))
        r = torch.load(os.path.join(d, "rng.pt"), weights_only=False)
        self.rng.bit_generator.state = r["np"]
        torch.set_rng_state(r["torch"])
        random.setstate(r["python"])
        with open(os.path.join(d, "state.json")) as f:
            s = json.load(f)
        self.step, self.ticks, self.episode = int(s["step"]), int(s["ticks"]), int(s["episode"])
        # drop log lines written after the checkpoint (the episodes that will be re-run)
        for name in ("episodes.jsonl", "evals.jsonl"):
            p = os.path.join(self.cfg.out, name)
            if os.path.isfile(p):
                with open(p) as f:
                    keep = [ln for ln in f if ln.strip() and json.loads(ln)["episode"] < self.episode]
                with open(p + ".tmp", "w") as f:
                    f.writelines(keep)
                os.replace(p + ".tmp", p)

    # -- one episode -----------------------------------------------------------------------------
    def run_episode(self, seed: int, learn: bool = True, deterministic: bool = False, base: bool = False,
                    frames: list | None = None) -> dict[str, Any]:
        """One episode. ``learn``: store transitions and update; ``base``: the plain VLA (w ~ N(0, I))."""
        if base and learn:
            raise ValueError("base episodes evaluate the plain VLA; they cannot also learn")
        agent = self.agent
        obs, _ = self.env.reset(seed=seed)
        feat = agent.embed(VLAPolicy.batch(obs))
        ticks = steps = interventions = 0
        success, ret, info = False, 0.0, {}
        last: dict[str, float] = {}
        while ticks < self.max_ticks:
            if base:  # the plain VLA with its own sampled noise, whatever the agent's variant
                w = None
                noise = torch.randn(1, *self.vla.noise_shape, generator=torch.Generator().manual_seed(seed * 1000 + steps))
                chunk_n = self.vla.sample_actions_from_embedding(feat, noise=noise, normalized=True)[0, : agent.exec_steps]
            else:
                warm = learn and self.step < agent.cfg.warmup_steps
                w = agent.act(feat, self.rng, warmup=warm, deterministic=deterministic)
                chunk_n = agent.chunk(feat, w, normalized=True)[0, : agent.exec_steps]
            # one sampler run per macro-step: robot units from the normalised chunk
            chunk = self.vla.unnormalize_actions(chunk_n)[: self.max_ticks - ticks].numpy()
            flagged = False
            if self.operator is not None and learn:
                op = self.operator(obs, {"episode": self.episode, "step_in_episode": steps, "ticks_in_episode": ticks})
                if op is not None:
                    op = np.asarray(op, np.float32)[: self.max_ticks - ticks]
                    chunk, flagged = op, True
                    padded = np.concatenate([op, np.repeat(op[-1:], agent.exec_steps - len(op), 0)]) \
                        if len(op) < agent.exec_steps else op[: agent.exec_steps]
                    chunk_n = self.vla.normalize_actions(torch.from_numpy(padded)).clamp(-1, 1)
            obs2, r, term, trunc, info = self.env.step(chunk)
            ticks += len(chunk)
            steps += 1
            ret += r
            success = bool(info.get("success", r > 0))
            if frames is not None:
                from vla.evaluate import frame_image

                frames.append(frame_image(obs2, ticks, success))
            feat2 = agent.embed(VLAPolicy.batch(obs2))
            if learn:
                tr = dict(obs={"feat": feat[0].numpy()}, action=w[0].numpy().astype(np.float32), reward=float(r),
                          next_obs={"feat": feat2[0].numpy()}, done=bool(term),
                          chunk=chunk_n.numpy().astype(np.float32), intervention=flagged)
                if not flagged or agent.cfg.variant != "sac":
                    # DSRL-SAC's critic lives in noise space: an operator's chunk has no noise behind
                    # it, so for that variant interventions go to the demo buffer only
                    self.online.add(**tr)
                if flagged:
                    self.demo.add(**tr)
                    interventions += 1
                self.step += 1
                self.ticks += len(chunk)
                if self.step >= agent.cfg.warmup_steps and len(self.online) >= 2:
                    last = agent.update(self.online, self.demo, self.rng)
            obs, feat = obs2, feat2
            if term or trunc:
                break
        return {"success": success, "ticks": ticks, "steps": steps, "return": ret, "interventions": interventions,
                "losses": last}

    def evaluate(self, n: int, seed_start: int, base: bool = False, videos: int = 0) -> dict[str, Any]:
        frames_all = []
        res = []
        for i in range(n):
            frames: list | None = [] if i < videos else None
            res.append(self.run_episode(seed_start + i, learn=False, deterministic=True, base=base, frames=frames))
            if frames:
                frames_all.append((seed_start + i, frames))
        k = sum(r["success"] for r in res)
        return {"episodes": n, "successes": k, "success_rate": k / n, "frames": frames_all}


def plot_learning_curve(run_dir: str, path: str, base_rate: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = [json.loads(x) for x in open(os.path.join(run_dir, "episodes.jsonl"))] \
        if os.path.isfile(os.path.join(run_dir, "episodes.jsonl")) else []
    evs = [json.loads(x) for x in open(os.path.join(run_dir, "evals.jsonl"))] \
        if os.path.isfile(os.path.join(run_dir, "evals.jsonl")) else []
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    if eps:
        t = np.array([e["total_ticks"] for e in eps])
        s = np.array([e["success"] for e in eps], float)
        k = min(10, len(s))
        ax.plot(t, np.convolve(s, np.ones(k) / k, mode="full")[: len(s)] * 100, lw=1, alpha=0.6,
                label=f"training episodes (moving avg {k})")
    if evs:
        ax.plot([e["total_ticks"] for e in evs], [e["success_rate"] * 100 for e in evs], "o-", lw=2,
                label="deterministic eval")
    if base_rate is not None:
        ax.axhline(base_rate * 100, color="gray", ls="--", label=f"base VLA {base_rate * 100:.0f}%")
    ax.set_xlabel("environment steps (control ticks)")
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(-3, 103)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(os.path.basename(os.path.normpath(run_dir)))
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=120)
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


def run_session(cfg: RLConfig, env, vla, resume: bool = False, operator: Operator | None = None,
                progress: bool = True) -> dict[str, Any]:
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from vla.evaluate import write_video

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    os.makedirs(cfg.out, exist_ok=True)
    cfg_path = os.path.join(cfg.out, "rl_config.json")
    if not resume:
        if os.path.isdir(os.path.join(cfg.out, "checkpoint")):
            raise FileExistsError(f"{cfg.out} already holds an RL session: pass --resume, or choose another --out")
        cfg.to_json(cfg_path)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    sess = Session(cfg, env, vla, operator=operator, progress=progress)
    base_path = os.path.join(cfg.out, "base_eval.json")
    if resume:
        sess.load()
        print(f"resumed {cfg.out} at episode {sess.episode}, step {sess.step}, {sess.ticks} ticks "
              f"({len(sess.online)} online / {len(sess.demo)} demo transitions)", flush=True)
    if os.path.isfile(base_path):
        with open(base_path) as f:
            base = json.load(f)
    else:
        base = {k: v for k, v in sess.evaluate(cfg.eval_episodes, cfg.eval_seed_start, base=True).items() if k != "frames"}
        with open(base_path, "w") as f:
            json.dump(base, f)
    tb = SummaryWriter(os.path.join(cfg.out, "tb"), purge_step=sess.ticks or None)
    bar = tqdm(total=cfg.total_ticks, initial=min(sess.ticks, cfg.total_ticks), desc=f"{cfg.method}-{cfg.variant}",
               unit="tick", disable=not progress)
    t0 = time.perf_counter()
    ticks0 = sess.ticks
    recent: list[bool] = []
    try:
        while sess.ticks < cfg.total_ticks:
            # scenes apart from the recorder's seeds (0 ...) and the evaluation seeds (eval_seed_start ...)
            ep_seed = 1_000_000 * (cfg.seed + 1) + sess.episode
            r = sess.run_episode(ep_seed)
            sess.episode += 1
            recent = (recent + [r["success"]])[-20:]
            rec = {"episode": sess.episode - 1, "seed": ep_seed, "success": r["success"], "ticks": r["ticks"],
                   "return": r["return"], "interventions": r["interventions"], "total_ticks": sess.ticks,
                   "step": sess.step, **{k: v for k, v in r["losses"].items()}}
            with open(os.path.join(cfg.out, "episodes.jsonl"), "a") as f:
                f.write(json.dumps(rec) + "\n")
            tb.add_scalar("train/success", float(r["success"]), sess.ticks)
            tb.add_scalar("train/episode_ticks", r["ticks"], sess.ticks)
            for k, v in r["losses"].items():
                tb.add_scalar(k, v, sess.ticks)
            if cfg.eval_every and sess.episode % cfg.eval_every == 0:
                ev = sess.evaluate(cfg.eval_episodes, cfg.eval_seed_start)
                with open(os.path.join(cfg.out, "evals.jsonl"), "a") as f:
                    f.write(json.dumps({"episode": sess.episode - 1, "total_ticks": sess.ticks,
                                        "success_rate": ev["success_rate"], "successes": ev["successes"],
                                        "episodes": ev["episodes"]}) + "\n")
                tb.add_scalar("eval/success_rate", ev["success_rate"], sess.ticks)
            if sess.episode % cfg.checkpoint_every == 0:
                sess.save()
            bar.n = min(sess.ticks, cfg.total_ticks)
            rate = (sess.ticks - ticks0) / max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix(ep=sess.episode, succ=f"{np.mean(recent):.0%}", tps=f"{rate:.1f}")  # also redraws
    finally:
        bar.close()
        tb.close()
    sess.save()
    final = sess.evaluate(cfg.eval_episodes, cfg.eval_seed_start, videos=cfg.videos)
    os.makedirs(os.path.join(cfg.out, "videos"), exist_ok=True)
    for seed, frames in final.pop("frames"):
        write_video(frames, os.path.join(cfg.out, "videos", f"eval_seed{seed}.mp4"), fps=10.0 / sess.agent.exec_steps)
    plot_learning_curve(cfg.out, os.path.join(cfg.out, "learning_curve.png"), base["success_rate"])
    digest_after = weights_digest(sess.vla)
    summary = {"run_dir": os.path.abspath(cfg.out), "episodes": sess.episode, "steps": sess.step, "ticks": sess.ticks,
               "base_success_rate": base["success_rate"], "final_success_rate": final["success_rate"],
               "eval_episodes": cfg.eval_episodes, "wall_s_this_process": time.perf_counter() - t0,
               "online_transitions": len(sess.online), "demo_transitions": len(sess.demo),
               "vla_weights_sha256_before": sess.digest_before, "vla_weights_sha256_after": digest_after,
               "vla_weights_unchanged": sess.digest_before == digest_after}
    with open(os.path.join(cfg.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary
