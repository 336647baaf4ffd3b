"""The online RL session (``vla rl``): any ``policies.base.Agent`` steers a frozen VLA.

In-process mode (``--role local``: actor and learner in one process; what simulation wants for
speed) is ``run_session``. The distributed mode (``--role learner`` / ``--role actor``, in
``session.learner`` / ``session.actor``) runs the same ``Session`` code on two machines: the actor's
``run_episode`` hands transitions to a ``sink`` that streams them to the learner, and the learner
calls ``store`` / ``learn`` / ``save`` / ``load`` and writes the run directory with ``RunLog`` and
``write_summary``. All three count, log, evaluate and checkpoint a finished episode with
``end_episode``. One episode at a time:

    reset (sim: the task's scene from the episode seed; a real robot: the operator's reset)
    every macro-step: aobs <- agent.observe(obs); chunk, action <- agent.act_chunk(aobs) (through
      the VLA's steering handles); an operator may take over (their chunk is executed instead and
      flagged as an intervention); step the env; store the transition in the buffers the agent
      names (``agent.buffers``: online, demo); learn (after warm-up)
    after each episode: TensorBoard scalars, progress bar; every ``eval_every`` episodes a
      evaluation on fixed seeds (``eval_policy``: the agent's policy sampled with a generator
      seeded by the episode, or its mean); every ``checkpoint_every`` episodes a checkpoint.

Run directory::

    RUN/rl_config.json, RUN/episodes.jsonl (one line per episode), RUN/evals.jsonl
    RUN/checkpoint/{agent.pt, online.npz, demo.npz, state.json, rng.pt}   (replaced atomically)
    RUN/learning_curve.png, RUN/summary.json, RUN/tb/, RUN/videos/
    RUN/snapshots/agent_<ticks>.pt   (with --snapshot-every: copies of the agent as it learned)

A checkpoint is taken at episode boundaries (an episode cannot be resumed half-way: the scene
moved on), so ``--resume`` after a kill continues from the last finished episode with exactly
the step count, replay contents, optimiser and RNG states it had then.

The VLA's weights are hashed before and after the session; ``summary.json`` records both (they
must be equal: the VLA is frozen).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from typing import Any, Callable

import numpy as np
import torch

from session.config import RLConfig
from vla.data.atomic import atomic_write_bytes
from vla.envs import VLAPolicy, episode_noise, step_chunk
from vla.operator_reset import OperatorStop

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
    """The state of one RL session (agent, replay buffers, counters, RNG) and its rollout.

    ``run_episode`` rolls the VLA + agent out and hands every transition to ``record``, which by
    default learns in-process (store, count, update). The distributed roles (``session.actor``,
    ``session.learner``) reuse it: the actor passes ``sink`` (transitions go to the learner instead; no replay buffers
    are allocated) and ``guard`` (called before every macro-step, before the robot moves: it
    raises when the learner is gone); the learner has no env and calls ``store`` / ``learn`` /
    ``save`` / ``load`` itself. ``seed``: the agent's and the session's RNG seed (default ``cfg.seed``; each of
    several actors draws its exploration from a stream of its own).
    """

    def __init__(self, cfg: RLConfig, env, vla, operator: Operator | None = None, progress: bool = True,
                 sink: Callable[[dict, int, bool, dict], None] | None = None,
                 guard: Callable[[], None] | None = None, seed: int | None = None) -> None:
        from policies import get_method
        from policies.common.replay import STEP_EXTRAS, ReplayBuffer
        from vla.models.modes import freeze

        self.cfg, self.env, self.operator, self.progress = cfg, env, operator, progress
        self.sink, self.guard = sink, guard
        replay = sink is None
        self.vla = freeze(vla)
        self.digest_before = weights_digest(self.vla)
        agent_cls, _ = get_method(cfg.method)
        seed = cfg.seed if seed is None else int(seed)  # one of several actors: a stream of its own
        self.agent = agent_cls.build(self.vla, cfg.agent, seed=seed,
                                     observation_space=getattr(env, "observation_space", None))
        task = None
        if cfg.task:
            from hardware.sim_tasks import get_task

            task = get_task(cfg.task)
        self.agent.bind(task=task, instruction=cfg.instruction)
        self.base_noise = getattr(cfg.agent, "base_noise", "sample")
        """The base evaluation's sampler noise: the VLA's own per-episode draw (``sample``, as `vla eval` draws
        it), or none for an agent whose config acts on the noise-free chunk (``base_noise = "zero"``): the base
        it is compared with is then the one it acts on."""
        from vla.envs import episode_limit, steps_chunks

        # the env contract shared with `vla eval` (vla.envs); a learner has no env, its actor has the limit
        self.max_ticks = episode_limit(env, cfg.max_episode_ticks)
        self.chunked = steps_chunks(env) if env is not None else True
        spec = self.agent.obs_spec  # what one stored observation holds
        # the executed chunk, the ticks it took and whether a time limit ended the episode there (the value
        # target's per-tick discount and time-limit handling: policies.common.sac_config.ValueTargetConfig)
        extras = {"chunk": (tuple(self.agent.chunk_shape), np.float32), **STEP_EXTRAS}
        cap = cfg.total_ticks + 16
        self.online = ReplayBuffer(cap, spec, self.agent.action_dim, extras) if replay else None
        self.demo = ReplayBuffer(cap, spec, self.agent.action_dim, extras) if replay else None
        self.rng = np.random.default_rng(seed)
        self.step = self.ticks = self.episode = 0
        self.on_update: Callable[[dict[str, float], int], None] | None = None
        """Called with every update's diagnostics and the session's ticks (``RunLog.update``: TensorBoard)."""
        self.ckpt_dir = os.path.join(cfg.out, "checkpoint")
        self.extra_state: dict[str, Any] = {}
        """More counters for ``state.json`` (the learner's per-actor ones), saved and loaded with the checkpoint."""
        self.safety = None
        """``--safety workspace``: the blend every executed chunk goes through (``session.safety``)."""
        if cfg.safety == "workspace" and env is not None:  # a learner has no env: the actor applies it
            from session.safety import WorkspaceGuard

            self.safety = WorkspaceGuard(env, cfg.workspace_box, cfg.workspace_sharpness)

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
        every = self.cfg.snapshot_every  # a new multiple of snapshot_every ticks passed: keep this agent too
        snap = bool(every) and self.ticks // every > int(self.extra_state.get("snapshot_mark", 0))
        if snap:
            self.extra_state["snapshot_mark"] = self.ticks // every
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump({**self.extra_state, "step": self.step, "ticks": self.ticks, "episode": self.episode,
                       "time": time.time()}, f)
        old = self.ckpt_dir + ".old"
        shutil.rmtree(old, ignore_errors=True)
        if os.path.isdir(self.ckpt_dir):
            os.replace(self.ckpt_dir, old)
        os.replace(tmp, self.ckpt_dir)
        shutil.rmtree(old, ignore_errors=True)
        if snap:  # RUN/snapshots/agent_<ticks>.pt, written atomically (a kill leaves no half file)
            d = os.path.join(self.cfg.out, "snapshots")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(self.ckpt_dir, "agent.pt"), "rb") as f:
                atomic_write_bytes(os.path.join(d, f"agent_{self.ticks:07d}.pt"), f.read())

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
        self.extra_state = {k: v for k, v in s.items() if k not in ("step", "ticks", "episode", "time")}
        # drop log lines written after the checkpoint (the episodes that will be re-run)
        for name in ("episodes.jsonl", "evals.jsonl"):
            p = os.path.join(self.cfg.out, name)
            if os.path.isfile(p):
                with open(p) as f:
                    keep = [ln for ln in f if ln.strip() and json.loads(ln)["episode"] < self.episode]
                with open(p + ".tmp", "w") as f:
                    f.writelines(keep)
                os.replace(p + ".tmp", p)

    def add_demos(self) -> dict[str, Any] | None:
        """A new session's ``cfg.demos`` into the demo buffer (``agent.demo_transitions``); writes
        ``RUN/demos.json``. -> its report (None without demos). A resumed session has them in its
        checkpoint already."""
        if not self.cfg.demos:
            return None
        from policies.common.replay import ReplayBuffer
        from vla.data.writer import atomic_write_json

        instruction = self.cfg.instruction
        if instruction is None:
            if not self.cfg.task:
                raise ValueError("demos are matched by instruction: give --instruction (or a sim --task)")
            from hardware.sim_tasks import get_task

            instruction = get_task(self.cfg.task).instruction
        trs, report = self.agent.demo_transitions(self.cfg.demos, instruction, progress=self.progress)
        old = self.demo
        self.demo = ReplayBuffer(old.capacity + len(trs), old.obs_spec, old.action_dim,
                                 {k: v for k, v in old.extras_spec.items() if k != "intervention"})
        for tr in trs:
            self.demo.add(**tr)
        atomic_write_json(report, os.path.join(self.cfg.out, "demos.json"))
        print(f"demos: {report['transitions']} transitions from {report['episodes']} episodes "
              f"({report['successes']} successful) in the demo buffer"
              + (f"; {report['skipped_other_instruction']} episode(s) of another instruction skipped"
                 if report["skipped_other_instruction"] else ""), flush=True)
        return report

    # -- learning (in-process and learner) ------------------------------------------------------
    def store(self, tr: dict[str, Any]) -> None:
        """One transition into the replay buffers the agent names (checked there; nothing is written
        on error)."""
        for name in self.agent.buffers(bool(tr["intervention"])):
            getattr(self, name).add(**tr)

    def learn(self) -> dict[str, float]:
        """One update round of the agent once warm-up is over ({} before)."""
        if self.step >= self.cfg.warmup_steps and len(self.online) >= 2:
            info = self.agent.update(self.online, self.demo, self.rng)
            if self.on_update is not None:
                self.on_update(info, self.ticks)
            return info
        return {}

    def record(self, tr: dict[str, Any], ticks: int, episode_end: bool, episode_info: dict[str, Any]) -> dict[str, float]:
        """A transition the rollout produced (``ticks`` control ticks executed): stored and learned
        from in-process, or handed to ``sink`` with ``episode_end`` and ``episode_info`` (seed,
        success, ticks, steps, return, interventions so far); then counted. -> the update's losses
        ({} if none)."""
        if self.sink is not None:
            self.sink(tr, ticks, episode_end, episode_info)
        else:
            self.store(tr)
        self.step += 1
        self.ticks += ticks
        return self.learn() if self.sink is None else {}

    # -- one episode -----------------------------------------------------------------------------
    def run_episode(self, seed: int, learn: bool = True, deterministic: bool = False, base: bool = False,
                    frames: list | None = None, generator: torch.Generator | None = None) -> dict[str, Any]:
        """One episode. ``learn``: store transitions and update; ``base``: the plain VLA (its own
        sampled noise, seeded by the episode); ``deterministic``: the policy's mean action;
        ``generator``: draws the policy's noise instead of the agent's own (evaluations, so that they
        leave the training RNG streams alone)."""
        if base and learn:
            raise ValueError("base episodes evaluate the plain VLA; they cannot also learn")
        agent, vla = self.agent, self.vla
        exec_steps = agent.chunk_shape[0]
        view = (lambda o: vla.embed(VLAPolicy.batch(o))) if base else agent.observe
        obs, info0 = self.env.reset(seed=seed)
        if not base:
            agent.begin_episode(obs, dict(info0 or {}), learn=learn)
        with torch.no_grad():
            aobs = view(obs)
        ticks = steps = interventions = guard_rows = 0
        guard_lambda_sum = guard_lambda_max = 0.0
        success, ret, info = False, 0.0, {}
        last: dict[str, float] = {}
        while ticks < self.max_ticks:
            if self.guard is not None:
                self.guard()
            action = None
            if base:  # the plain VLA with its own sampled noise (as `vla eval` draws it), or none (base_noise)
                noise = torch.zeros(1, *vla.noise_shape) if self.base_noise == "zero" else \
                    episode_noise(vla.noise_shape, seed, steps)
                with torch.no_grad():
                    chunk_n = vla.sample_actions_from_embedding(aobs, noise=noise, normalized=True)[0, :exec_steps]
            else:
                warm = learn and self.step < self.cfg.warmup_steps
                act = agent.act_chunk(aobs, self.rng, warmup=warm, deterministic=deterministic, generator=generator)
                action, chunk_n = act.action, act.chunk
            # one sampler run per macro-step: robot units from the normalised chunk
            chunk = vla.unnormalize_actions(chunk_n)[: self.max_ticks - ticks].numpy()
            flagged = replaced = False
            if self.operator is not None and learn:
                op = self.operator(obs, {"episode": self.episode, "step_in_episode": steps, "ticks_in_episode": ticks})
                if op is not None:
                    chunk, flagged, replaced = np.asarray(op, np.float32)[: self.max_ticks - ticks], True, True
            if self.safety is not None:  # the safety layer sees what is about to be executed, whoever chose it
                chunk, lam = self.safety(obs, chunk)
                guard_rows += len(lam)
                guard_lambda_sum += float(lam.sum())
                guard_lambda_max = max(guard_lambda_max, float(lam.max()))
                replaced = True
            if replaced:  # the stored chunk is the executed one, in the normalised units, padded to exec_steps
                padded = np.concatenate([chunk, np.repeat(chunk[-1:], exec_steps - len(chunk), 0)]) \
                    if len(chunk) < exec_steps else chunk[:exec_steps]
                chunk_n = vla.clip_normalized_actions(vla.normalize_actions(torch.from_numpy(padded)))
            st = step_chunk(self.env, chunk, chunked=self.chunked)  # a one-action env: row by row
            obs2, r, term, trunc, info = st.obs, st.reward, st.terminated, st.truncated, st.info
            ticks += st.rows
            steps += 1
            ret += r
            success = bool(info.get("success", r > 0))
            if frames is not None:
                from vla.evaluate import frame_image

                frames.append(frame_image(obs2, ticks, success))
            if not base:
                agent.after_chunk(obs2, info)
            with torch.no_grad():
                aobs2 = view(obs2)
            if learn:
                spec = agent.obs_spec
                tr = dict(obs={k: aobs[k][0].numpy() for k in spec}, action=np.asarray(action, np.float32),
                          reward=float(r), next_obs={k: aobs2[k][0].numpy() for k in spec}, done=bool(term),
                          chunk=chunk_n.numpy().astype(np.float32), intervention=flagged)
                interventions += int(flagged)
                end = bool(term or trunc or ticks >= self.max_ticks)
                tr.update(rows=np.asarray(st.rows, np.int32), truncated=bool(end and not term))
                losses = self.record(tr, st.rows, end, {"seed": int(seed), "success": success, "ticks": ticks,
                                                           "steps": steps, "return": float(ret),
                                                           "interventions": interventions,
                                                           **({"agent": agent.episode_log()} if end else {})})
                if losses:
                    last = losses
            obs, aobs = obs2, aobs2
            if term or trunc:
                break
        if learn and self.sink is None:  # an episode-level update (on-policy methods)
            losses = agent.end_episode({"success": success, "ticks": ticks, "steps": steps, "return": ret})
            if losses:
                last = losses
                if self.on_update is not None:
                    self.on_update(losses, self.ticks)
        out = {"success": success, "ticks": ticks, "steps": steps, "return": ret, "interventions": interventions,
               "losses": last, "agent": {} if base else agent.episode_log()}
        if self.safety is not None:  # how much the layer took over: mean and largest lambda of the rows
            out["safety"] = {"lambda_mean": guard_lambda_sum / max(guard_rows, 1), "lambda_max": guard_lambda_max}
        return out

    def evaluate(self, n: int, seed_start: int, base: bool = False, videos: int = 0) -> dict[str, Any]:
        frames_all = []
        res = []
        mean = self.cfg.eval_policy == "mean"
        for i in range(n):
            frames: list | None = [] if i < videos else None
            gen = None if mean else torch.Generator().manual_seed(seed_start + i)
            res.append(self.run_episode(seed_start + i, learn=False, deterministic=mean, base=base, frames=frames,
                                        generator=gen))
            if frames:
                frames_all.append((seed_start + i, frames))
        k = sum(r["success"] for r in res)
        out = {"episodes": n, "successes": k, "success_rate": k / n, "frames": frames_all, "max_episode_ticks": self.max_ticks,
               "per_episode": [{"seed": seed_start + i, "success": bool(r["success"]), "ticks": int(r["ticks"]),
                                **r.get("agent", {})} for i, r in enumerate(res)]}
        if self.safety is not None:
            out["safety_lambda_mean"] = float(np.mean([r["safety"]["lambda_mean"] for r in res]))
        return out


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
                label="evaluation")
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


# -- the run directory, shared by the in-process session and the learner ---------------------------
def start_run(cfg: RLConfig, resume: bool) -> None:
    """Threads, the run directory (a new session refuses to overwrite one), its config, the seeds."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    os.makedirs(cfg.out, exist_ok=True)
    if not resume:
        if os.path.isdir(os.path.join(cfg.out, "checkpoint")):
            raise FileExistsError(f"{cfg.out} already holds an RL session: pass --resume, or choose another --out")
        cfg.to_json(os.path.join(cfg.out, "rl_config.json"))
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)


def read_base_eval(sess: Session, resume: bool) -> dict[str, Any] | None:
    """``RUN/base_eval.json`` if it evaluated this VLA (weights hash) on this session's evaluation
    seeds and episode count, else None (a file left by another VLA or other settings is ignored,
    with a message). A resumed run also takes a file written before those fields existed."""
    path = os.path.join(sess.cfg.out, "base_eval.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        base = json.load(f)
    want = {"vla_sha256": sess.digest_before, "episodes": sess.cfg.eval_episodes, "seed_start": sess.cfg.eval_seed_start}
    if sess.env is not None and "max_episode_ticks" in base:  # a learner has no env: its actor knows the limit
        want["max_episode_ticks"] = sess.max_ticks
    if resume and "vla_sha256" not in base:
        return base
    differ = [k for k, v in want.items() if base.get(k) != v]
    if base.get("base_noise", "sample") != sess.base_noise:  # files written before the field: sampled noise
        differ.append("base_noise")
    if differ:
        print(f"{path} was taken with other {', '.join(differ)}; evaluating the base VLA again", flush=True)
        return None
    return base


def write_base_eval(sess: Session, result: dict[str, Any]) -> dict[str, Any]:
    """Write ``RUN/base_eval.json`` (atomically) with what it evaluated: the counts, the seeds, the
    episode limit, the VLA's hash and each episode's seed / success / ticks (comparable with
    ``vla eval --env``'s episodes.jsonl at the same seeds and limit). -> what was written."""
    base = {k: result[k] for k in ("episodes", "successes", "success_rate")}
    from vla.data.writer import atomic_write_json

    base.update(seed_start=sess.cfg.eval_seed_start, max_episode_ticks=int(result.get("max_episode_ticks", sess.max_ticks)),
                vla_sha256=sess.digest_before, base_noise=sess.base_noise, per_episode=result.get("per_episode", []))
    atomic_write_json(base, os.path.join(sess.cfg.out, "base_eval.json"))
    return base


def open_session(sess: Session, resume: bool) -> None:
    """Resumed: load the last checkpoint into ``sess`` and say where the session continues (its demo
    buffer already holds any demos). New: put ``cfg.demos`` into the demo buffer."""
    if not resume:
        sess.add_demos()
        return
    sess.load()
    print(f"resumed {sess.cfg.out} at episode {sess.episode}, step {sess.step}, {sess.ticks} ticks "
          f"({len(sess.online)} online / {len(sess.demo)} demo transitions)", flush=True)


def episode_seed(cfg: RLConfig, episode: int, per_scene: int = 1) -> int:
    """Training scenes apart from the recorder's seeds (0 ...) and the evaluation seeds (eval_seed_start ...);
    ``per_scene`` consecutive episodes share one scene (``Agent.episodes_per_scene``: an on-policy method's groups)."""
    return 1_000_000 * (cfg.seed + 1) + episode // max(int(per_scene), 1)


def actor_episode(episode: int, slot: int, actors: int, per_scene: int = 1) -> int:
    """The session episode that actor ``slot`` of ``actors`` plays as its own ``episode``-th: actor i takes the
    scenes (groups of ``per_scene`` episodes) i, i + N, i + 2N, ..., so no two actors share a scene and their
    seeds (``episode_seed`` of this) are disjoint. One actor: ``episode`` itself."""
    p = max(int(per_scene), 1)
    return ((episode // p) * actors + slot) * p + episode % p


class RunLog:
    """``episodes.jsonl``, ``evals.jsonl`` and the TensorBoard scalars of a run directory: every
    update's losses and diagnostics (``update``, wired to ``Session.on_update``) at the session's
    tick count, and per episode the success and length; ``episodes.jsonl`` also holds each
    episode's last update."""

    def __init__(self, out: str, ticks: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.out = out
        self.t0 = time.perf_counter()
        self.tb = SummaryWriter(os.path.join(out, "tb"), purge_step=ticks or None)

    def episode(self, episode: int, seed: int, r: dict[str, Any], total_ticks: int, step: int,
                update_rounds: int | None = None) -> dict[str, Any]:
        """Log one finished episode (``r``: success, ticks, return, interventions, losses, and ``actor``: the actor
        that played it, in a session with several; ``update_rounds``: the agent's update rounds so far).
        ``wall_s``: seconds since this process opened the log (the session's rate: ``bench/rl_throughput.py``)."""
        losses = r.get("losses", {})
        rec = {"episode": episode, "seed": seed, "success": r["success"], "ticks": r["ticks"], "return": r["return"],
               "interventions": r["interventions"], "total_ticks": total_ticks, "step": step,
               "wall_s": round(time.perf_counter() - self.t0, 3), **({"actor": r["actor"]} if "actor" in r else {}),
               **({} if update_rounds is None else {"update_rounds": int(update_rounds)}), **losses,
               **r.get("agent", {})}
        if "safety" in r:
            rec["safety"] = r["safety"]
            self.tb.add_scalar("safety/lambda_mean", r["safety"]["lambda_mean"], total_ticks)
        _append_jsonl(os.path.join(self.out, "episodes.jsonl"), rec)
        self.tb.add_scalar("train/success", float(r["success"]), total_ticks)
        self.tb.add_scalar("train/episode_ticks", r["ticks"], total_ticks)
        for k, v in r.get("agent", {}).items():  # the agent's numbers per episode (Agent.episode_log)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.tb.add_scalar(k, v, total_ticks)
        return rec

    def update(self, info: dict[str, float], total_ticks: int) -> None:
        """Log one update's losses and diagnostics (``losses/...``, ``diag/...``) to TensorBoard."""
        for k, v in info.items():
            self.tb.add_scalar(k, v, total_ticks)

    def evaluation(self, episode: int, total_ticks: int, ev: dict[str, Any]) -> None:
        """Log an evaluation taken after ``episode``."""
        _append_jsonl(os.path.join(self.out, "evals.jsonl"), {
            "episode": episode, "total_ticks": total_ticks, "success_rate": ev["success_rate"],
            "successes": ev["successes"], "episodes": ev["episodes"],
            **({"safety_lambda_mean": ev["safety_lambda_mean"]} if "safety_lambda_mean" in ev else {})})
        self.tb.add_scalar("eval/success_rate", ev["success_rate"], total_ticks)

    def close(self) -> None:
        self.tb.close()


def _append_jsonl(path: str, rec: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def update_diagnostics(run_dir: str) -> dict[str, dict[str, float]]:
    """The agent's diagnostics (``diag/...``) at the first and the last episode that updated, from
    ``episodes.jsonl`` (so a resumed run reports its whole session): e.g. whether the policy's entropy
    moved and whether its critic ranks the noises. {} before any update."""
    path = os.path.join(run_dir, "episodes.jsonl")
    rows = [json.loads(x) for x in open(path) if x.strip()] if os.path.isfile(path) else []
    rows = [{k: v for k, v in r.items() if k.startswith("diag/")} for r in rows]
    rows = [r for r in rows if r]
    return {"first": rows[0], "last": rows[-1]} if rows else {}


def write_summary(sess: Session, base_rate: float | None, final: dict[str, Any] | None, wall_s: float,
                  **extra: Any) -> dict[str, Any]:
    """``learning_curve.png`` and ``summary.json`` (with the frozen VLA's hashes before / after)."""
    plot_learning_curve(sess.cfg.out, os.path.join(sess.cfg.out, "learning_curve.png"), base_rate)
    digest_after = weights_digest(sess.vla)
    summary = {"run_dir": os.path.abspath(sess.cfg.out), "episodes": sess.episode, "steps": sess.step,
               "ticks": sess.ticks, "base_success_rate": base_rate,
               "final_success_rate": None if final is None else final["success_rate"],
               "eval_episodes": sess.cfg.eval_episodes, "wall_s_this_process": wall_s,
               "online_transitions": len(sess.online), "demo_transitions": len(sess.demo),
               "agent_parameters": sess.agent.parameter_counts(),
               "vla_weights_sha256_before": sess.digest_before, "vla_weights_sha256_after": digest_after,
               "vla_weights_unchanged": sess.digest_before == digest_after,
               "updates": sess.cfg.updates, "update_rounds": sess.agent.updates,
               "update_diagnostics": update_diagnostics(sess.cfg.out),
               "safety": None if sess.safety is None else sess.safety.describe(),
               "gripper": executed_gripper(sess.env),
               **({"agent": a} if (a := sess.agent.summarize(sess.cfg.out)) else {}), **extra}
    # atomically: a kill while it is written leaves the previous summary (or none), never half of one
    atomic_write_bytes(os.path.join(sess.cfg.out, "summary.json"), json.dumps(summary, indent=2).encode())
    return summary


def executed_gripper(env) -> str | None:
    """The arm's executed gripper opening (``robot_io.env.RobotEnv.gripper``: raw | binary); None for an env that
    is not the arm's (an --env's own ``gripper`` attribute, if any, is not ours to report)."""
    from robot_io.env import RobotEnv

    inner = getattr(env, "unwrapped", env)
    return inner.gripper if isinstance(inner, RobotEnv) else None


def end_episode(sess: Session, seed: int, r: dict[str, Any], log: RunLog | None = None,
                report_eval: Callable[[int, int, dict[str, Any]], None] | None = None,
                save: Callable[[], None] | None = None) -> bool:
    """The bookkeeping of one finished episode, the same in the in-process session, the learner
    and the actor: count it, log it (``log``: the run directory's logs, where this process keeps
    them), evaluate every ``eval_every`` episodes (``report_eval(episode, total_ticks, result)``:
    where this process runs evaluations: the in-process session and the actor), checkpoint every
    ``checkpoint_every`` episodes (``save``: where this process keeps checkpoints). ``r``: the
    episode's success, ticks, return, interventions, losses. -> whether a checkpoint was taken."""
    cfg = sess.cfg
    episode = sess.episode
    sess.episode += 1
    if log is not None:
        log.episode(episode, seed, r, sess.ticks, sess.step, update_rounds=sess.agent.updates)
    if report_eval is not None and cfg.eval_every and sess.episode % cfg.eval_every == 0:
        report_eval(episode, sess.ticks, sess.evaluate(cfg.eval_episodes, cfg.eval_seed_start))
    if save is not None and sess.episode % cfg.checkpoint_every == 0:
        save()
        return True
    return False


def run_session(cfg: RLConfig, env, vla, resume: bool = False, operator: Operator | None = None,
                progress: bool = True) -> dict[str, Any]:
    """The in-process session (``vla rl``, role ``local``): act, learn, log, checkpoint; then the
    final evaluation, videos, learning curve and ``summary.json``."""
    from tqdm import tqdm

    from vla.evaluate import write_video

    if cfg.actors:
        raise ValueError(f"actors {cfg.actors}: the session's actors run as Ray actors (session.pool.run_pool; "
                         "`vla rl --actors N`), not in this process")
    if cfg.updates != "lockstep":
        raise ValueError(f"updates {cfg.updates!r} runs the learner in its own process: start the session with "
                         "`vla rl --role learner ...` and its actor with `vla rl --role actor --learner ENDPOINT` "
                         "(an in-process session updates in lockstep)")
    start_run(cfg, resume)
    sess = Session(cfg, env, vla, operator=operator, progress=progress)
    open_session(sess, resume)
    base = read_base_eval(sess, resume)
    if base is None:
        base = write_base_eval(sess, sess.evaluate(cfg.eval_episodes, cfg.eval_seed_start, base=True))
    log = RunLog(cfg.out, sess.ticks)
    sess.on_update = log.update
    bar = tqdm(total=cfg.total_ticks, initial=min(sess.ticks, cfg.total_ticks), desc=cfg.label,
               unit="tick", disable=not progress)
    t0 = time.perf_counter()
    ticks0 = sess.ticks
    recent: list[bool] = []
    try:
        while sess.ticks < cfg.total_ticks and not (cfg.total_episodes and sess.episode >= cfg.total_episodes):
            ep_seed = episode_seed(cfg, sess.episode, sess.agent.episodes_per_scene)
            r = sess.run_episode(ep_seed)
            end_episode(sess, ep_seed, r, log=log, report_eval=log.evaluation, save=sess.save)
            recent = (recent + [r["success"]])[-20:]
            bar.n = min(sess.ticks, cfg.total_ticks)
            rate = (sess.ticks - ticks0) / max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix(ep=sess.episode, succ=f"{np.mean(recent):.0%}", tps=f"{rate:.1f}")  # also redraws
    except OperatorStop:  # raised by env.reset before an episode moved anything
        sess.save()
        raise
    finally:
        bar.close()
        log.close()
    sess.save()
    final = sess.evaluate(cfg.eval_episodes, cfg.eval_seed_start, videos=cfg.videos)
    os.makedirs(os.path.join(cfg.out, "videos"), exist_ok=True)
    for seed, frames in final.pop("frames"):
        write_video(frames, os.path.join(cfg.out, "videos", f"eval_seed{seed}.mp4"), fps=10.0 / sess.agent.chunk_shape[0])
    from vla.data.writer import atomic_write_json

    # every evaluation episode of the final policy (seed, success, ticks and what the agent logs, e.g. its token)
    atomic_write_json(final, os.path.join(cfg.out, "final_eval.json"))  # its frames were popped above
    lines = sess.agent.report(final["per_episode"])
    if lines and progress:
        print("final evaluation:\n" + "\n".join(lines), flush=True)
    return write_summary(sess, base["success_rate"], final, time.perf_counter() - t0)
