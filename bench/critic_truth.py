"""Do the critics rank actions as Monte-Carlo truth does, at the states that decide the outcome? (issue 61)

One bench for every critic-based method (DSRL-NA's Q^A and Q^W, the residual agent's Q). Two steps:

1. ``truth`` (the expensive one, shared by every critic of the same base, task and execution):
   * the base VLA (``--checkpoint``, its own sampled noise, as ``vla eval --noise sample``; the checkpoint's
     gripper execution) plays ``--scenes`` evaluation scenes; each rollout's **decision states** are found by
     the simulator's predicates (PRIVILEGED: read off the sim's object poses, which no real robot has): the
     state before the macro-step that first commands a close, the one that first commands a release, and the
     one in which each of the task's sub-goals is first reached (``hardware.sim_tasks.Task.subgoals``: the
     grasp, the cube over its target, the first contact on it, the release); plus ``--random-states`` random
     states of the rollout (labelled ``random``);
   * at each, K candidate actions of ``--exec-steps`` rows: ``--noises`` chunks the VLA denoises from noises
     w ~ N(0, I) clipped to +-``--noise-bound`` (DSRL's actions) and ``--residuals`` chunks base + delta, the
     noise-free base chunk plus one offset per action dim shared by the rows, uniform in +-``--residual-bound``
     (the residual agent's), and delta = 0;
   * for each candidate, ``--continuations`` rollouts from the state: reset the scene, replay the prefix (the
     replayed state is checked: ``replay_state_error``), execute the candidate, finish with the base VLA (its
     noise drawn from streams shared by all candidates of the state: common random numbers). Recorded: success
     and the macro-steps to the episode's end.
2. ``score``: each ``--run NAME=RUN_DIR`` (a `vla rl` session of method dsrl variant na or residual, encoder vla,
   the same exec_steps; ``--snapshot-every`` keeps its agent as it learns) is loaded at every snapshot and its
   final checkpoint; its critic is evaluated at the same states and candidates. ``--fit NAME=RUN_DIR`` is the
   separating probe: a fresh critic of the run's widths fitted to the run's replay by regression on Monte-Carlo
   returns (no bootstrapping), scored the same way. The session's TD critic ranking worse than this fit points
   at the target; neither ranking points at the features or the data.

Figures, per checkpoint:
* ``median_spearman``: the median over decision states whose true success spread across candidates
  (max - min of the per-candidate success rates) is >= ``--min-spread`` of the per-state Spearman correlation
  between the critic and the true success rate (``spearman_random``: the same at the random states);
* ``calibration_error``: the mean |Q - G| over states and candidates, G the Monte-Carlo return *in the run's own
  target units* (its reward offset c, discount per macro-step or per tick, the episode ending at success or at
  the time limit: G = gamma^(L-1) [success] - c (1 - gamma^L) / (1 - gamma) over the L macro-steps left); a
  target that bootstraps through the time limit estimates an infinite-horizon value, so its error against the
  episode's return is the bias the time limit hides. ``calibration_error_rel`` divides it by the target's range at
  the state (success at once against failure to the limit), so settings of different units compare;
* ``split_half_spearman``: the truth against itself (two halves of the continuations), the ceiling that the
  Monte-Carlo noise leaves any critic.

Writes ``bench/results/<name>.json`` (``summary[task][method][setting]``: ``median_spearman`` and
``calibration_error`` of the last checkpoint, and per checkpoint) and a PNG beside it; the truth is kept in
``<name>_truth.json`` so that new runs are scored without new rollouts (``--truth FILE``).

    python -m bench.critic_truth --checkpoint vla/checkpoints/base --task stack_cubes --scenes 6 --jobs 2 \\
        --run legacy=runs/ct/legacy --run chosen=runs/ct/chosen
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np

from bench.harness.results import provenance as harness_provenance

ROOT = pathlib.Path(__file__).resolve().parents[1]
GRIPPER_THRESHOLD = 0.5  # robot units, robot_io.gripper's snap point (policies.common.decisions)


# -- step 1: the truth -----------------------------------------------------------------------------------------
def _objects(priv: np.ndarray, names: list[str]) -> tuple[dict, np.ndarray, float]:
    """The privileged vector (vla.oracle_env) -> ({name: Pose7}, ee position, gripper opening)."""
    n = len(names)
    rel, quat = priv[: 3 * n].reshape(n, 3), priv[3 * n: 7 * n].reshape(n, 4)
    ee, grip = priv[7 * n: 7 * n + 3].astype(np.float64), float(priv[7 * n + 3])
    return {nm: np.concatenate([rel[i] + ee, quat[i]]) for i, nm in enumerate(names)}, ee, grip


def decision_steps(task, names: list[str], privs: list[np.ndarray], grips: list[np.ndarray],
                   rng: np.random.Generator, random_states: int) -> dict[int, list[str]]:
    """{macro-step j: labels}: j is the state before the macro-step in which the event happened. ``privs``: the
    privileged vector after each macro-step (index 0: after the reset); ``grips``: each executed chunk's opening
    commands (robot units)."""
    out: dict[int, list[str]] = {}
    closed = False
    for j, g in enumerate(grips):
        shut = g < GRIPPER_THRESHOLD
        if not closed and shut.any():
            out.setdefault(j, []).append("close")
            closed = True
        elif closed and (~shut).any() and "release" not in sum(out.values(), []):
            out.setdefault(j, []).append("release")
    reached: set[str] = set()
    for j in range(len(grips)):
        objs, ee, grip = _objects(privs[j + 1], names)
        for k, v in task.subgoals(objs, ee, grip).items():
            if v and k not in reached:
                reached.add(k)
                out.setdefault(j, []).append(f"subgoal:{k}")
    taken = set(out)
    free = [j for j in range(len(grips)) if j not in taken]
    for j in rng.choice(free, size=min(random_states, len(free)), replace=False) if free else []:
        out.setdefault(int(j), []).append("random")
    return dict(sorted(out.items()))


def _exit_with_parent(parent: int) -> None:
    """A pool worker ends when the bench that started it does (killed, not only finished), and with it its bridge
    (started with --exit-with-parent): nothing keeps simulating for a run that is gone."""
    import threading

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _worker(job: dict) -> list[dict]:
    """One worker: its own sim bridge on leased ports; the base rollouts of its scenes, then every decision
    state's candidates and continuations."""
    import torch
    from tqdm import tqdm

    from hardware.sim_tasks import get_task
    from robot_io.client import BridgeTimeout
    from robot_io.ports import PortLease
    from robot_io.robot import RobotClient
    from robot_io.site import load_site, relocate_site, site_ports
    from robot_io.bridge_process import running_bridge
    from vla.envs import VLAPolicy, episode_noise, resolve_gripper, task_env
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    torch.set_num_threads(1)
    if job.get("parent"):
        _exit_with_parent(job["parent"])
    ckpt = resolve_checkpoint(job["checkpoint"])
    vla = load_vla(ckpt).eval()
    gripper = resolve_gripper("auto", ckpt)
    task = get_task(job["task"])
    E, H = job["exec_steps"], None
    rows: list[dict] = []
    base_site = load_site(job["robot"])
    with tempfile.TemporaryDirectory() as tmp, PortLease(len(site_ports(base_site))) as lease:
        site = relocate_site(base_site, lease.ports, os.path.join(tmp, "site.yaml"))
        lease.release()
        with running_bridge(site, os.path.join(tmp, "bridge.log"), start="always"):
            client = RobotClient(site)
            try:
                env = task_env(client, job["task"], privileged=True, gripper=gripper)
                names = list(client.description["objects"])
                max_ticks = min(env.max_ticks, job["max_ticks"] or env.max_ticks)

                def feat_of(obs):
                    with torch.no_grad():
                        return vla.embed(VLAPolicy.batch(obs))

                def chunk_of(feat, noise):
                    with torch.no_grad():
                        return vla.sample_actions_from_embedding(feat, noise=noise, normalized=True)[0, :E]

                def play(seed: int, prefix: list[np.ndarray], first, stream, tries: int = 3) -> tuple[bool, int, float]:
                    """``play_once``, again from the reset when the bridge did not answer in time (a loaded machine;
                    the rollout is deterministic given its noise, so a retry measures the same thing)."""
                    for attempt in range(tries):
                        try:
                            return play_once(seed, prefix, first, stream)
                        except BridgeTimeout as e:
                            if attempt == tries - 1:
                                raise
                            tqdm.write(f"[{job['worker']}] scene {seed}: bridge timeout ({e}); the rollout again")

                def play_once(seed: int, prefix: list[np.ndarray], first, stream) -> tuple[bool, int, float]:
                    """Reset, replay ``prefix`` (robot units), execute ``first`` (normalised), then the base VLA with
                    noise from ``stream(k)`` to the end. -> (success, macro-steps after the prefix, replay error)."""
                    obs, _ = env.reset(seed=seed)
                    t = 0
                    for ch in prefix:
                        obs, *_ = env.step(ch)
                        t += len(ch)
                    err = float(np.max(np.abs(np.asarray(obs["privileged"], np.float64) - ref_priv)))
                    steps, info, k = 0, {}, 0
                    chunk_n = first
                    while t < max_ticks:
                        if chunk_n is None:
                            chunk_n = chunk_of(feat_of(obs), stream(k))
                            k += 1
                        ch = vla.unnormalize_actions(chunk_n).numpy()[: max_ticks - t]
                        obs, _, term, trunc, info = env.step(ch)
                        t += len(ch)
                        steps += 1
                        chunk_n = None
                        if term or trunc:
                            break
                    return bool(info.get("success", False)), steps, err

                for scene in job["scenes"]:
                    # the base rollout: its chunks, privileged states and gripper commands
                    obs, _ = env.reset(seed=scene)
                    prefix, privs, grips, feats, t = [], [np.asarray(obs["privileged"], np.float64)], [], [], 0
                    obs_at = [obs]
                    info, j = {}, 0
                    while t < max_ticks:
                        f = feat_of(obs)
                        feats.append(f)
                        ch = vla.unnormalize_actions(chunk_of(f, episode_noise(vla.noise_shape, scene, j))).numpy()
                        ch = ch[: max_ticks - t]
                        obs, _, term, trunc, info = env.step(ch)
                        prefix.append(ch)
                        grips.append(ch[:, -1].copy())
                        privs.append(np.asarray(obs["privileged"], np.float64))
                        obs_at.append(obs)
                        t += len(ch)
                        j += 1
                        if term or trunc:
                            break
                    base_success = bool(info.get("success", False))
                    steps = decision_steps(task, names, privs, grips, np.random.default_rng([scene, 7]),
                                           job["random_states"])
                    if job["base_success_only"] and not base_success:
                        tqdm.write(f"[{job['worker']}] scene {scene}: skipped (--base-success-only)")
                        continue
                    if job["labels"]:  # only the events asked for (--labels)
                        steps = {j: ls for j, ls in steps.items() if any(x in job["labels"] for x in ls)}
                    if job["states"]:  # only the states asked for (--states SCENE:STEP)
                        steps = {j: ls for j, ls in steps.items() if (scene, j) in job["states"]}
                    tqdm.write(f"[{job['worker']}] scene {scene}: base {'success' if base_success else 'failure'} in "
                               f"{len(prefix)} macro-steps; decision states {steps}")
                    for j, labels in steps.items():
                        if time.monotonic() > job["deadline"]:
                            tqdm.write(f"[{job['worker']}] budget reached: stop before scene {scene} step {j}")
                            return rows
                        ref_priv = privs[j]
                        feat = feats[j]
                        rng = np.random.default_rng([scene, j, 1])
                        H, A = (int(x) for x in vla.noise_shape)
                        ws = np.clip(rng.standard_normal((job["noises"], H * A)), -job["noise_bound"],
                                     job["noise_bound"]).astype(np.float32)
                        cands = [chunk_of(feat, torch.from_numpy(w).reshape(1, H, A)) for w in ws]
                        base0 = chunk_of(feat, torch.zeros(1, H, A))
                        deltas = rng.uniform(-job["residual_bound"], job["residual_bound"],
                                             (job["residuals"], base0.shape[-1])).astype(np.float32)
                        deltas = np.concatenate([np.zeros((1, base0.shape[-1]), np.float32), deltas])
                        for d in deltas:
                            cands.append(vla.clip_normalized_actions(base0 + torch.from_numpy(d)[None]))
                        kinds = ["noise"] * len(ws) + ["residual"] * len(deltas)
                        success = np.zeros((len(cands), job["continuations"]), bool)
                        left = np.zeros_like(success, dtype=np.int32)
                        m0 = job["continuation_offset"]
                        err = 0.0
                        for c, cand in enumerate(tqdm(cands, desc=f"[{job['worker']}] {scene}/{j}", leave=False)):
                            for m in range(m0, m0 + job["continuations"]):
                                def stream(k, m=m):  # shared by the candidates of this state (common random numbers)
                                    return episode_noise(vla.noise_shape, scene * 7919 + j * 131 + m, k)
                                success[c, m - m0], left[c, m - m0], e = play(scene, prefix[:j], cand, stream)
                                err = max(err, e)
                        rows.append(row := {"scene": int(scene), "step": int(j), "tick": int(sum(len(c) for c in prefix[:j])),
                                     "labels": labels, "base_success": base_success, "replay_state_error": err,
                                     "feat": feat[0].numpy().round(6).tolist(), "noises": ws.tolist(),
                                     "kinds": kinds, "chunks": torch.stack(cands).numpy().round(6).tolist(),
                                     "success": success.astype(int).tolist(), "steps_left": left.tolist(),
                                     "max_macro_steps": int(-(-(max_ticks - sum(len(c) for c in prefix[:j])) // E))})
                        with open(job["part"], "a") as f:  # kept as it is measured: a crash loses one state at most
                            f.write(json.dumps(row) + "\n")
                            f.flush()
                            os.fsync(f.fileno())
                        p = success.mean(1)
                        tqdm.write(f"[{job['worker']}] scene {scene} step {j} {labels}: success by candidate "
                                   f"{np.round(p, 2).tolist()} (spread {np.ptp(p):.2f}); replay error {err:.1e}")
            finally:
                client.close()
    return rows


def build_truth(args, parts_dir: pathlib.Path) -> dict:
    """Every worker appends each finished state to ``parts_dir/worker<i>.jsonl``; the truth is what they hold at the
    end, also when a worker died (its error is reported, the others' states are kept)."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    for old in parts_dir.glob("worker*.jsonl"):
        old.unlink()
    scenes = [args.seed_start + i for i in range(args.scenes)]
    if args.states:
        scenes = sorted({sc for sc, _ in args.states})
    deadline = time.monotonic() + args.budget_s
    jobs = [{"worker": w, "scenes": scenes[w:: args.jobs], "checkpoint": args.checkpoint, "task": args.task,
             "robot": args.robot, "exec_steps": args.exec_steps, "noises": args.noises, "residuals": args.residuals,
             "noise_bound": args.noise_bound, "residual_bound": args.residual_bound,
             "continuations": args.continuations, "random_states": args.random_states, "deadline": deadline,
             "max_ticks": args.max_ticks, "labels": args.labels, "base_success_only": args.base_success_only,
             "states": args.states, "continuation_offset": args.continuation_offset, "parent": os.getpid(),
             "part": str(parts_dir / f"worker{w}.jsonl")}
            for w in range(args.jobs)]
    t0 = time.perf_counter()
    errors = []
    if args.jobs == 1:
        try:
            _worker({**jobs[0], "parent": None})  # in this process: nothing to watch
        except Exception as e:  # noqa: BLE001 (reported; the states measured so far are kept)
            errors.append(f"worker 0: {type(e).__name__}: {e}")
    else:
        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as ex:
            futures = [ex.submit(_worker, j) for j in jobs]
            for w, fut in enumerate(futures):
                try:
                    fut.result()
                except Exception as e:  # noqa: BLE001 (reported; the states measured so far are kept)
                    errors.append(f"worker {w}: {type(e).__name__}: {e}")
    for e in errors:
        print(f"truth: {e}; its finished states are kept", file=sys.stderr)
    rows = [json.loads(ln) for p in sorted(parts_dir.glob("worker*.jsonl")) for ln in p.read_text().splitlines()
            if ln.strip()]
    states = sorted(rows, key=lambda r: (r["scene"], r["step"]))
    return {"checkpoint": portable(args.checkpoint), "task": args.task, "exec_steps": args.exec_steps,
            "config": {k: getattr(args, k) for k in ("scenes", "seed_start", "noises", "residuals", "noise_bound",
                                                     "residual_bound", "continuations", "random_states", "robot",
                                                     "max_ticks", "labels", "base_success_only",
                                                     "states", "continuation_offset")},
            "states": states, "wall_s": time.perf_counter() - t0, "worker_errors": errors}


def merge_truths(paths: list[pathlib.Path]) -> dict:
    """Truth files of one base, task and execution, their states pooled (refused when they differ)."""
    parts = [json.loads(p.read_text()) for p in paths]
    first = parts[0]
    for p, t in zip(paths[1:], parts[1:]):
        for k in ("checkpoint", "task", "exec_steps"):
            if t[k] != first[k]:
                raise SystemExit(f"--truth {p}: {k} {t[k]!r}, the first file's is {first[k]!r}")
    by_key: dict = {}
    streams: dict = {}  # (scene, step) -> the continuation streams measured so far
    for p, t in zip(paths, parts):
        m0 = t["config"].get("continuation_offset") or 0
        for st in t["states"]:
            key = (st["scene"], st["step"])
            mine = set(range(m0, m0 + np.asarray(st["success"]).shape[1]))
            if key not in by_key:
                by_key[key], streams[key] = dict(st), mine
                continue
            if streams[key] & mine:
                raise SystemExit(f"--truth {p}: scene {key[0]} step {key[1]} again with continuation streams an "
                                 "earlier file measured (pool files made with different --continuation-offset)")
            streams[key] |= mine
            have = by_key[key]  # the same state measured again (--states ... --continuation-offset): pool the rollouts
            # the base's own rollout of a scene is not bit-reproducible across processes (rendering), so a state
            # measured again is pooled only when it is the same state: the same VLA features and candidates
            if np.asarray(have["chunks"]).shape != np.asarray(st["chunks"]).shape or not (
                    np.allclose(have["chunks"], st["chunks"], atol=1e-5) and np.allclose(have["feat"], st["feat"],
                                                                                          atol=1e-5)):
                raise SystemExit(f"--truth {p}: scene {key[0]} step {key[1]} has other features or candidates than "
                                 "an earlier file's: the base's rollout went elsewhere, not the same state")
            have["success"] = np.concatenate([have["success"], st["success"]], axis=1).tolist()
            have["steps_left"] = np.concatenate([have["steps_left"], st["steps_left"]], axis=1).tolist()
            have["replay_state_error"] = max(have["replay_state_error"], st["replay_state_error"])
    states = list(by_key.values())
    return {**first, "states": sorted(states, key=lambda r: (r["scene"], r["step"])),
            "wall_s": sum(t["wall_s"] for t in parts)}


# -- step 2: the critics ---------------------------------------------------------------------------------------
def target_units(run_cfg) -> dict:
    """A run's value target: gamma per macro-step or per tick, reward offset, time-limit handling."""
    agent = run_cfg.agent
    if run_cfg.method == "dsrl":
        gamma, value = agent.sac.gamma, agent.sac.value
    else:
        gamma, value = agent.gamma, agent.value
    return {"gamma": gamma, "gamma_per_tick": value.gamma_per_tick, "reward_offset": value.reward_offset,
            "time_limit": value.time_limit, "target_ensemble": value.target_ensemble,
            "n_step": getattr(agent.sac, "n_step", 1) if run_cfg.method == "dsrl" else agent.n_step}


def mc_return(success: np.ndarray, steps: np.ndarray, u: dict, exec_steps: int) -> np.ndarray:
    """Monte-Carlo returns in a target's units: gamma^(L-1) [success] - c (1 - gamma^L) / (1 - gamma) over the L
    macro-steps the continuation took (the episode ends at success or at the time limit)."""
    g = u["gamma"] if u["gamma_per_tick"] is None else u["gamma_per_tick"] ** exec_steps
    L = steps.astype(np.float64)
    cost = u["reward_offset"] * (L if g == 1.0 else (1 - g ** L) / (1 - g))
    return g ** (L - 1) * success - cost


def return_range(max_steps: int, u: dict, exec_steps: int) -> float:
    """The target's range at a state: success at once against failure through all ``max_steps`` left."""
    best = mc_return(np.array([1.0]), np.array([1]), u, exec_steps)[0]
    worst = mc_return(np.array([0.0]), np.array([max(max_steps, 1)]), u, exec_steps)[0]
    return float(best - worst)


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    from scipy.stats import spearmanr

    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


def candidate_effect(success: np.ndarray, perms: int = 2000, seed: int = 0) -> tuple[float, float]:
    """success [K, M] (K candidates x M continuations) -> (the between-candidate sd of the success rate with the
    binomial error taken out, the permutation p-value of "the candidate does not matter here": the outcomes shuffled
    across candidates). A spread of rates alone is not evidence: with M = 6 two candidates of equal truth differ by
    0.33 or more about half the time."""
    k, m = success.shape
    p = success.mean(1)
    obs = float(p.var(ddof=1))
    within = float(np.mean(p * (1 - p) / (m - 1))) if m > 1 else 0.0
    if obs == 0.0:
        return 0.0, 1.0
    rng = np.random.default_rng(seed)
    flat = success.ravel().astype(float)
    hits = 0
    for _ in range(perms):
        rng.shuffle(flat)
        hits += flat.reshape(k, m).mean(1).var(ddof=1) >= obs - 1e-12
    return float(np.sqrt(max(obs - within, 0.0))), (hits + 1) / (perms + 1)


def checkpoints(run: str) -> list[tuple[int, str]]:
    """(ticks, agent.pt) of a run's snapshots and its final checkpoint."""
    out = []
    snap = pathlib.Path(run) / "snapshots"
    for p in sorted(snap.glob("agent_*.pt")) if snap.is_dir() else []:
        out.append((int(p.stem.split("_")[1]), str(p)))
    for d in ("checkpoint", "checkpoint.old"):
        state, agent = pathlib.Path(run) / d / "state.json", pathlib.Path(run) / d / "agent.pt"
        if state.is_file() and agent.is_file():
            ticks = int(json.loads(state.read_text())["ticks"])
            if not out or ticks > out[-1][0]:
                out.append((ticks, str(agent)))
            break
    return out


def critic_values(agent, method: str, state: dict):
    """-> (Q over all candidates: DSRL-NA's Q^A / the residual critic, ensemble mean; DSRL's Q^W over the noise
    candidates or None)."""
    import torch

    feat = torch.tensor(state["feat"], dtype=torch.float32)[None]
    chunks = torch.tensor(state["chunks"], dtype=torch.float32)
    K = len(chunks)
    with torch.no_grad():
        if method == "dsrl":
            s = agent.sac.features({"feat": feat}).expand(K, -1)
            qa = agent.qa(s, chunks.reshape(K, -1)).mean(0).numpy()
            ws = torch.tensor(state["noises"], dtype=torch.float32)
            qw = agent.sac.critic(s[: len(ws)], ws).mean(0).numpy()
            return qa, qw
        s = agent.encoder({"feat": feat}).expand(K, -1)
        return agent.critic(s, chunks.reshape(K, -1)).mean(0).numpy(), None


def fitted_values(critic):
    """``values(state) -> (Q per candidate, None)`` of an offline-fitted critic (``Q(features, chunk)``, the mean
    over its ensemble), in the form :func:`score_states` reads."""
    import torch

    def values(st):
        f = torch.tensor(st["feat"], dtype=torch.float32)[None]
        c = torch.tensor(st["chunks"], dtype=torch.float32)
        with torch.no_grad():
            return critic(f.expand(len(c), -1), c.reshape(len(c), -1)).mean(0).numpy(), None

    return values


def score_states(values, truth: dict, effects: list, u: dict, E: int) -> list[dict]:
    """One critic (``values(state) -> (Q over the candidates, Q^W over the noise candidates or None)``) against
    the truth at every state: Spearman with the true success rate, calibration against the Monte-Carlo return in
    the target's units ``u``."""
    per_state = []
    for st, (between_sd, perm_p) in zip(truth["states"], effects):
        succ, left = np.asarray(st["success"], float), np.asarray(st["steps_left"])
        p = succ.mean(1)
        G = mc_return(succ, left, u, E).mean(1)
        q, qw = values(st)
        nk = st["kinds"].count("noise")
        half = succ.shape[1] // 2
        per_state.append({
            "scene": st["scene"], "step": st["step"], "labels": st["labels"], "spread": float(np.ptp(p)),
            "between_sd": between_sd, "perm_p": perm_p,
            "spearman": spearman(q, p), "spearman_qw": None if qw is None else spearman(qw, p[:nk]),
            "split_half": spearman(succ[:, :half].mean(1), succ[:, half:].mean(1)) if half else None,
            "calibration_error": float(np.mean(np.abs(q - G))),
            "calibration_error_rel": float(np.mean(np.abs(q - G)) / return_range(st["max_macro_steps"], u, E)),
            "q_mean": float(q.mean()), "q_spread": float(np.ptp(q)), "truth_mean": float(G.mean()),
            "q": np.round(q, 5).tolist(), "p": np.round(p, 4).tolist()})
    return per_state


def score_run(name: str, run: str, truth: dict, min_spread: float) -> dict:
    import torch

    from policies import get_method
    from session.config import RLConfig
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    cfg_path = os.path.join(run, "rl_config.json")
    if not os.path.isfile(cfg_path):
        raise SystemExit(f"--run {name}={run}: no rl_config.json there (not a `vla rl` run directory)")
    cfg = RLConfig.from_json(cfg_path)
    method = cfg.method
    if method not in ("dsrl", "residual") or (method == "dsrl" and cfg.agent.variant != "na"):
        raise SystemExit(f"--run {name}={run}: method {method!r}; this bench reads DSRL-NA's and the residual "
                         "agent's critics")
    if cfg.agent.encoder != "vla":
        raise SystemExit(f"--run {name}={run}: encoder {cfg.agent.encoder!r}; the truth stores the VLA's features only "
                         "(encoder vla)")
    if cfg.task != truth["task"]:
        raise SystemExit(f"--run {name}={run}: task {cfg.task!r}, the truth's is {truth['task']!r}")
    vla = load_vla(resolve_checkpoint(cfg.checkpoint))
    agent = get_method(method)[0].build(vla, cfg.agent, seed=cfg.seed)
    if agent.exec_steps != truth["exec_steps"]:
        raise SystemExit(f"--run {name}={run}: exec_steps {agent.exec_steps}, the truth's candidates have "
                         f"{truth['exec_steps']} rows")
    u = target_units(cfg)
    E = truth["exec_steps"]
    label = "dsrl-na" if method == "dsrl" else "residual"
    effects = [candidate_effect(np.asarray(st["success"], float)) for st in truth["states"]]
    points = []
    for ticks, path in checkpoints(run):
        agent.load_state_dict(torch.load(path, weights_only=False))
        per_state = score_states(lambda st: critic_values(agent, method, st), truth, effects, u, E)
        points.append({"ticks": ticks, **aggregate(per_state, min_spread), "states": per_state})
        print(f"  {name} ({label}) at {ticks} ticks: median Spearman {fmt(points[-1]['median_spearman'])} at "
              f"{points[-1]['decision_states_used']} decision states, calibration error "
              f"{fmt(points[-1]['calibration_error'])} ({fmt(points[-1]['calibration_error_rel'])} of the range)")
    return {"name": name, "run": portable(run), "method": label, "target": u, "checkpoints": points}


def load_replay(run: str) -> dict:
    """A session's online replay (``RUN/checkpoint/online.npz``, in insertion order) with each transition's
    episode, outcome and macro-steps to the episode's end (from ``RUN/episodes.jsonl``); an episode the session
    stopped in the middle of is dropped."""
    path = os.path.join(run, "checkpoint", "online.npz")
    if not os.path.isfile(path):
        raise SystemExit(f"--fit {run}: no replay at {path}")
    d = np.load(path)
    n = len(d["reward"])
    eps = [json.loads(x) for x in open(os.path.join(run, "episodes.jsonl")) if x.strip()]
    ends = [e["step"] for e in eps]
    if not ends or ends[-1] > n:
        raise SystemExit(f"--fit {run}: the replay holds {n} transitions, episodes.jsonl ends at step "
                         f"{ends[-1] if ends else 0}: a wrapped buffer is not supported")
    m = ends[-1]
    episode, success, to_go = np.zeros(m, np.int64), np.zeros(m, bool), np.zeros(m, np.int64)
    start = 0
    for i, (e, end) in enumerate(zip(eps, ends)):
        episode[start:end], success[start:end] = i, e["success"]
        to_go[start:end] = np.arange(end - start, 0, -1)
        start = end
    return {"feat": d["obs/feat"][:m].astype(np.float32),
            "chunk": d["extras/chunk"][:m].reshape(m, -1).astype(np.float32),
            "episode": episode, "success": success, "to_go": to_go, "episodes": len(eps)}


FIT_TARGETS = {
    # name: the value target of an offline fit (target_units' keys); "mc" regresses on the Monte-Carlo return
    "mc": {"gamma": 0.99, "gamma_per_tick": 0.995, "reward_offset": 0.0, "time_limit": "terminal",
           "target_ensemble": None, "n_step": None},
    "legacy": {"gamma": 0.99, "gamma_per_tick": None, "reward_offset": 0.0, "time_limit": "bootstrap",
               "target_ensemble": "min_subset", "n_step": 1},  # the pre-issue-61 target
    "terminal": {"gamma": 0.99, "gamma_per_tick": None, "reward_offset": 0.0, "time_limit": "terminal",
                 "target_ensemble": "min_subset", "n_step": 1},  # the time limit alone
    "offset": {"gamma": 0.99, "gamma_per_tick": None, "reward_offset": 1.0, "time_limit": "terminal",
               "target_ensemble": "min_subset", "n_step": 1},  # DSRL's Robomimic reward r - 1, ended at the limit
    "mean": {"gamma": 0.99, "gamma_per_tick": None, "reward_offset": 0.0, "time_limit": "bootstrap",
             "target_ensemble": "mean", "n_step": 1},  # the ensemble reduction alone
    "chosen": {"gamma": 0.99, "gamma_per_tick": 0.995, "reward_offset": 0.0, "time_limit": "terminal",
               "target_ensemble": "mean", "n_step": 3},  # the issue-61 default
}


def fit_probe(name: str, run: str, truth: dict, min_spread: float, steps: int, targets: list[str],
              seed: int = 0) -> list[dict]:
    """The separating probe: fresh critic ensembles of the run's widths, on the VLA's features and the executed
    chunk (no encoder), fitted offline to the run's replay (80% of its episodes), one per value target of
    ``targets`` (``FIT_TARGETS``): ``mc`` regresses on each transition's Monte-Carlo return (no bootstrapping, no
    time-limit question); the others are TD fits evaluating the behaviour (SARSA: the next logged chunk as the
    bootstrap action; Polyak 0.005 target critics, the session's optimiser). Every fit sees the same data, seed
    and steps, so they differ only by their target; each is scored at the truth's states like a checkpoint. If
    ``mc`` ranks the candidates where the TD fits do not, the target limits the critic; if ``mc`` does not
    either, the features and this data do not hold the ranking."""
    import torch
    from tqdm import tqdm

    from policies.common.replay import ReplayBuffer
    from policies.common.sac import EnsembleCritic
    from session.config import RLConfig

    torch.set_num_threads(1)  # the fit is small; more threads only fight the machine's other jobs
    cfg = RLConfig.from_json(os.path.join(run, "rl_config.json"))
    if cfg.task != truth["task"]:
        raise SystemExit(f"--fit {name}={run}: task {cfg.task!r}, the truth's is {truth['task']!r}")
    E = truth["exec_steps"]
    sac = cfg.agent.sac if cfg.method == "dsrl" else cfg.agent
    data = load_replay(run)
    want = np.asarray(truth["states"][0]["chunks"][0]).size
    if data["chunk"].shape[1] != want:
        raise SystemExit(f"--fit {name}={run}: the replay's chunks hold {data['chunk'].shape[1]} values, the truth's "
                         f"candidates {want} ({E} rows): another exec_steps?")
    buf = ReplayBuffer.load(os.path.join(run, "checkpoint", "online.npz"))
    if buf.ptr != buf.size % buf.capacity:
        raise SystemExit(f"--fit {name}={run}: the replay wrapped (not in insertion order)")
    rng0 = np.random.default_rng(seed)
    held = rng0.permutation(data["episodes"])[: max(1, data["episodes"] // 5)]
    test = np.isin(data["episode"], held)
    train_idx = np.flatnonzero(~test)
    feat, chunk = torch.from_numpy(data["feat"]), torch.from_numpy(data["chunk"])
    next_feat = torch.from_numpy(buf.next_obs["feat"][: len(feat)].astype(np.float32))
    effects = [candidate_effect(np.asarray(st["success"], float)) for st in truth["states"]]
    ticks = int(json.loads((pathlib.Path(run) / "checkpoint" / "state.json").read_text())["ticks"])
    label = ("dsrl-na" if cfg.method == "dsrl" else "residual") + " offline fit"
    out = []
    for tname in targets:
        u = FIT_TARGETS[tname]
        rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        critic = EnsembleCritic(feat.shape[1], chunk.shape[1], sac.num_critics, tuple(sac.hidden))
        target = EnsembleCritic(feat.shape[1], chunk.shape[1], sac.num_critics, tuple(sac.hidden))
        target.load_state_dict(critic.state_dict())
        target.requires_grad_(False)
        opt = torch.optim.Adam(critic.parameters(), lr=3e-4)
        y_mc = torch.from_numpy(mc_return(data["success"].astype(float), data["to_go"], u, E).astype(np.float32))
        if u["n_step"] is not None:
            per_tick = u["gamma_per_tick"] is not None
            g = u["gamma_per_tick"] if per_tick else u["gamma"]
            ends = buf._ends(u["time_limit"])
        t0 = time.perf_counter()
        for _ in tqdm(range(steps), desc=f"fit {name} {tname}", leave=False):
            idx = rng.choice(train_idx, 256)
            i = torch.from_numpy(idx)
            with torch.no_grad():
                if u["n_step"] is None:
                    y = y_mc[i]
                else:
                    ret, last, disc = buf.n_step_returns(idx, u["n_step"], g, per_tick=per_tick,
                                                         reward_offset=u["reward_offset"], time_limit=u["time_limit"])
                    nxt = np.where(buf.continues(last), last + 1, last)  # the next logged chunk (SARSA)
                    q2 = ensemble_value(target, next_feat[last], chunk[nxt], u["target_ensemble"],
                                        sac.critic_subset, gen)
                    done = torch.from_numpy(ends[last].astype(np.float32))
                    y = torch.from_numpy(ret) + torch.from_numpy(disc) * (1 - done) * q2
            loss = ((critic(feat[i], chunk[i]) - y[None]) ** 2).mean(1).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                torch._foreach_lerp_(list(target.parameters()), list(critic.parameters()), 0.005)
        with torch.no_grad():
            q_all = critic(feat, chunk).mean(0).numpy()
        y_np = y_mc.numpy()
        fit = {"target": tname, "steps": steps, "wall_s": round(time.perf_counter() - t0, 1),
               "transitions": int(len(feat)), "episodes": data["episodes"], "held_out_episodes": int(len(held)),
               "success_rate": float(np.mean([data["success"][data["episode"] == e][0]
                                              for e in range(data["episodes"])])),
               "held_out_mae_mc": float(np.mean(np.abs(q_all[test] - y_np[test]))),
               "held_out_mae_constant": float(np.mean(np.abs(y_np[~test].mean() - y_np[test]))),
               "held_out_auc_success": auc(q_all[test], data["success"][test])}

        per_state = score_states(fitted_values(critic), truth, effects, u, E)
        point = {"ticks": ticks, **aggregate(per_state, min_spread), "fit": fit, "states": per_state}
        print(f"  {name} offline fit '{tname}' ({fit['transitions']} transitions, {fit['wall_s']:.0f} s): median "
              f"Spearman {fmt(point['median_spearman'])} at {point['decision_states_used']} decision states, where "
              f"it matters {fmt(point['median_spearman_where_it_matters'])}; held-out |Q - MC| "
              f"{fit['held_out_mae_mc']:.3f} "
              f"(a constant: {fit['held_out_mae_constant']:.3f}), AUC for success {fmt(fit['held_out_auc_success'])}",
              flush=True)
        out.append({"name": f"{name}:{tname}", "run": portable(run), "method": label, "target": u,
                    "checkpoints": [point]})
    return out


def fit_curve(name: str, runs: list[str], truth: dict, min_spread: float, steps: int, fractions: list[float],
              seed: int = 0) -> list[dict]:
    """The data budget of the Monte-Carlo fit: the replays of ``runs`` pooled (same task, base and execution; their
    behaviours differ, so the return each one regresses on is its own episode's), 20% of the episodes held out,
    and a fresh critic (the first run's widths) fitted on the first ``fraction`` of the remaining episodes (a fixed
    random order, so each budget holds the smaller ones), each scored at the truth's states. Read: does ranking at
    the decision states improve with data, and from how many transitions."""
    import torch
    from tqdm import tqdm

    from policies.common.sac import EnsembleCritic
    from session.config import RLConfig

    torch.set_num_threads(1)
    E = truth["exec_steps"]
    u = FIT_TARGETS["mc"]
    feats, chunks, ys, eps, succ = [], [], [], [], []
    n_eps = 0
    for run in runs:
        cfg = RLConfig.from_json(os.path.join(run, "rl_config.json"))
        if cfg.task != truth["task"]:
            raise SystemExit(f"--fit-curve {name}: {run} has task {cfg.task!r}, the truth's is {truth['task']!r}")
        d = load_replay(run)
        feats.append(d["feat"])
        chunks.append(d["chunk"])
        ys.append(mc_return(d["success"].astype(float), d["to_go"], u, E).astype(np.float32))
        eps.append(d["episode"] + n_eps)
        succ.append(d["success"])
        n_eps += d["episodes"]
    first = RLConfig.from_json(os.path.join(runs[0], "rl_config.json"))
    sac = first.agent.sac if first.method == "dsrl" else first.agent
    feat, chunk, y = (torch.from_numpy(np.concatenate(x)) for x in (feats, chunks, ys))
    episode, success = np.concatenate(eps), np.concatenate(succ)
    if chunk.shape[1] != np.asarray(truth["states"][0]["chunks"][0]).size:
        raise SystemExit(f"--fit-curve {name}: the replays' chunks do not match the truth's candidates")
    order = np.random.default_rng(seed).permutation(n_eps)
    held = order[: max(1, n_eps // 5)]
    train_order = order[len(held):]
    test = np.isin(episode, held)
    effects = [candidate_effect(np.asarray(st["success"], float)) for st in truth["states"]]
    out = []
    for frac in fractions:
        keep = train_order[: max(1, int(round(frac * len(train_order))))]
        train_idx = np.flatnonzero(np.isin(episode, keep))
        rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        critic = EnsembleCritic(feat.shape[1], chunk.shape[1], sac.num_critics, tuple(sac.hidden))
        opt = torch.optim.Adam(critic.parameters(), lr=3e-4)
        t0 = time.perf_counter()
        for _ in tqdm(range(steps), desc=f"fit-curve {name} {frac:g}", leave=False):
            i = torch.from_numpy(rng.choice(train_idx, 256))
            loss = ((critic(feat[i], chunk[i]) - y[i][None]) ** 2).mean(1).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            q_test = critic(feat[test], chunk[test]).mean(0).numpy()
        y_np = y.numpy()
        fit = {"target": "mc", "steps": steps, "wall_s": round(time.perf_counter() - t0, 1), "runs": len(runs),
               "transitions": int(len(train_idx)), "episodes": int(len(keep)), "held_out_episodes": int(len(held)),
               "held_out_mae_mc": float(np.mean(np.abs(q_test - y_np[test]))),
               "held_out_mae_constant": float(np.mean(np.abs(y_np[train_idx].mean() - y_np[test]))),
               "held_out_auc_success": auc(q_test, success[test])}

        per_state = score_states(fitted_values(critic), truth, effects, u, E)
        point = {"ticks": None, **aggregate(per_state, min_spread), "fit": fit, "states": per_state}
        print(f"  {name} pooled Monte-Carlo fit on {fit['transitions']} transitions ({fit['episodes']} episodes of "
              f"{len(runs)} runs): median Spearman {fmt(point['median_spearman'])}, where it matters "
              f"{fmt(point['median_spearman_where_it_matters'])}; held-out |Q - MC| {fit['held_out_mae_mc']:.3f} "
              f"(a constant: {fit['held_out_mae_constant']:.3f}), AUC for success {fmt(fit['held_out_auc_success'])}",
              flush=True)
        out.append({"name": f"{name}@{fit['transitions']}", "run": [portable(r) for r in runs],
                    "method": "pooled offline fit", "target": u, "checkpoints": [point]})
    return out


def fit_truth_loso(truth: dict, min_spread: float, steps: int, num_critics: int = 10,
                   hidden: tuple[int, ...] = (256, 256), seed: int = 0) -> list[dict]:
    """Data that varies the action where it matters: a critic (the sessions' widths) fitted to the truth's own
    candidates -- (VLA features, chunk) -> Monte-Carlo success rate, 8 chunks x their continuations at each decision
    state -- leaving one scene out at a time and scored at the left-out scene's states. If this ranks where the
    sessions' replays did not, what they lack is action contrast at the decision states; if it does not, these
    inputs do not carry the chunk's effect there (or a few scenes are too few to learn it from)."""
    import torch
    from tqdm import tqdm

    from policies.common.sac import EnsembleCritic

    torch.set_num_threads(1)
    E = truth["exec_steps"]
    u = FIT_TARGETS["mc"]
    states = truth["states"]
    effects = [candidate_effect(np.asarray(st["success"], float)) for st in states]
    scenes = sorted({st["scene"] for st in states})
    if len(scenes) < 2:
        raise SystemExit(f"--fit-truth leaves one scene out at a time: the truth holds {len(scenes)} scene(s), it needs 2")
    q_of: dict = {}
    t0 = time.perf_counter()
    for scene in tqdm(scenes, desc="leave one scene out", leave=False):
        train = [st for st in states if st["scene"] != scene]
        f = np.concatenate([np.repeat(np.asarray(st["feat"], np.float32)[None], len(st["chunks"]), 0) for st in train])
        c = np.concatenate([np.asarray(st["chunks"], np.float32).reshape(len(st["chunks"]), -1) for st in train])
        y = np.concatenate([np.asarray(st["success"], float).mean(1) for st in train]).astype(np.float32)
        f, c, y = map(torch.from_numpy, (f, c, y))
        rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        critic = EnsembleCritic(f.shape[1], c.shape[1], num_critics, hidden)
        opt = torch.optim.Adam(critic.parameters(), lr=3e-4)
        for _ in range(steps):
            i = torch.from_numpy(rng.choice(len(y), min(256, len(y))))
            loss = ((critic(f[i], c[i]) - y[i][None]) ** 2).mean(1).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        for k, st in enumerate(states):
            if st["scene"] == scene:
                fs = torch.tensor(st["feat"], dtype=torch.float32)[None]
                cs = torch.tensor(st["chunks"], dtype=torch.float32)
                with torch.no_grad():
                    q_of[k] = critic(fs.expand(len(cs), -1), cs.reshape(len(cs), -1)).mean(0).numpy()
    keyed = {id(st): k for k, st in enumerate(states)}
    per_state = score_states(lambda st: (q_of[keyed[id(st)]], None), truth, effects, u, E)
    point = {"ticks": None, **aggregate(per_state, min_spread),
             "fit": {"target": "mc success rate", "steps": steps, "scenes": len(scenes), "samples_per_fit":
                     int(sum(len(st["chunks"]) for st in states) * (len(scenes) - 1) / len(scenes)),
                     "wall_s": round(time.perf_counter() - t0, 1)},
             "states": per_state}
    print(f"  truth leave-one-scene-out fit ({len(scenes)} scenes): median Spearman {fmt(point['median_spearman'])}, "
          f"where it matters {fmt(point['median_spearman_where_it_matters'])}", flush=True)
    return [{"name": "truth-loso", "run": None, "method": "truth offline fit", "target": u, "checkpoints": [point]}]


def ensemble_value(critic, s, a, mode: str, subset: int, gen) -> "torch.Tensor":
    """The target ensemble's value reduced as ``policies.common.sac.ensemble_target`` does."""
    import torch

    if mode == "min_subset":
        members = torch.randperm(critic.num_critics, generator=gen)[:subset]
        return critic(s, a, members=members).min(dim=0).values
    q = critic(s, a)
    return q.mean(0) if mode == "mean" else q.mean(0) - q.std(0)


def auc(score: np.ndarray, label: np.ndarray) -> float | None:
    """ROC AUC of ``score`` for the boolean ``label`` (Mann-Whitney, ties at half); None with one class only."""
    from scipy.stats import rankdata

    pos, neg = int(label.sum()), int(len(label) - label.sum())
    if pos == 0 or neg == 0:
        return None
    return float((rankdata(score)[label].sum() - pos * (pos + 1) / 2) / (pos * neg))


def aggregate(per_state: list[dict], min_spread: float) -> dict:
    def med(rows, key):
        v = [r[key] for r in rows if r[key] is not None]
        return float(np.median(v)) if v else None

    decisive = [r for r in per_state if "random" not in r["labels"] and r["spread"] >= min_spread]
    rand = [r for r in per_state if r["labels"] == ["random"] and r["spread"] >= min_spread]
    matters = [r for r in per_state if "random" not in r["labels"] and r["perm_p"] < 0.05]
    return {"median_spearman": med(decisive, "spearman"), "median_spearman_qw": med(decisive, "spearman_qw"),
            "states_where_the_candidate_matters": len(matters),
            "median_spearman_where_it_matters": med(matters, "spearman"),
            "median_between_sd": med(decisive, "between_sd"),
            "spearman_random": med(rand, "spearman"), "split_half_spearman": med(decisive, "split_half"),
            "decision_states_used": len(decisive), "random_states_used": len(rand),
            "calibration_error": float(np.mean([r["calibration_error"] for r in per_state])),
            "calibration_error_rel": float(np.mean([r["calibration_error_rel"] for r in per_state])),
            **null_median(decisive, "median_spearman"), **null_median(matters, "median_spearman_where_it_matters")}


def null_median(rows: list[dict], key: str, draws: int = 2000, seed: int = 0) -> dict:
    """What a critic that ranks at random scores: the 2.5 / 97.5 percentiles of the median Spearman over ``rows``
    when each state's critic values are shuffled (the truth's own ties kept), and the one-sided p of the observed
    median (a critic that ranks better than chance). Empty when the rows do not hold their values."""
    rows = [r for r in rows if r.get("q") is not None and r["spearman"] is not None]
    if not rows:
        return {}
    from scipy.stats import rankdata

    rng = np.random.default_rng(seed)
    sims = np.empty((draws, len(rows)))
    for j, r in enumerate(rows):
        p = rankdata(r["p"])
        q = rankdata(r["q"])
        perm = rng.permuted(np.tile(q, (draws, 1)), axis=1)
        pc, qc = p - p.mean(), perm - perm.mean(1, keepdims=True)
        sims[:, j] = (qc @ pc) / np.sqrt((qc ** 2).sum(1) * (pc ** 2).sum() + 1e-12)
    med = np.median(sims, axis=1)
    obs = float(np.median([r["spearman"] for r in rows]))
    return {f"{key}_null95": [float(np.percentile(med, 2.5)), float(np.percentile(med, 97.5))],
            f"{key}_p_better_than_chance": float((1 + (med >= obs).sum()) / (1 + draws))}


def fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def portable(path: str) -> str:
    """A path as committed results may hold it: relative to the repo, or from its last ``runs`` folder on."""
    p = pathlib.Path(path).resolve()
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        parts = p.parts
        i = max((k for k, x in enumerate(parts) if x == "runs"), default=len(parts) - 1)
        return str(pathlib.Path(*parts[i:]))


def plot(res: dict, path: pathlib.Path) -> None:
    """Sessions' critics against their ticks (with a random critic's 95% band), the offline fits by value target,
    and the Monte-Carlo fit against its data (or the sessions' calibration when no --fit-curve ran)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def val(c, k):
        return np.nan if c.get(k) is None else c[k]

    sessions = [r for r in res["runs"] if "fit" not in r["method"]]
    offline = [r for r in res["runs"] if r["method"].endswith("offline fit") and not r["method"].startswith("pooled")]
    pooled = [r for r in res["runs"] if r["method"] == "pooled offline fit"]
    panels = [p for p in (sessions, offline) if p] + ([pooled or sessions] if pooled or sessions else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
    axes = list(axes[0])
    null = next((c.get("median_spearman_null95") for r in res["runs"] for c in r["checkpoints"]
                 if c.get("median_spearman_null95")), None)
    ceiling = next((c["split_half_spearman"] for r in res["runs"] for c in r["checkpoints"]
                    if c.get("split_half_spearman") is not None), None)

    def guides(ax):
        if null:
            ax.axhspan(*null, color="0.85", zorder=0, label="a random critic (95%)")
        if ceiling is not None:
            ax.axhline(ceiling, color="k", ls=":", lw=1, label="truth vs itself (split half)")
        ax.axhline(0.5, color="g", ls="--", lw=0.8, label="goal 0.5")
        ax.set_ylabel("median Spearman(critic, MC success)")

    k = 0
    if sessions:
        ax = axes[k]
        k += 1
        for r in sessions:
            ax.plot([c["ticks"] for c in r["checkpoints"]], [val(c, "median_spearman") for c in r["checkpoints"]],
                    "o-", label=f"{r['method']} {r['name']}")
        guides(ax)
        ax.set_xlabel("session ticks")
        ax.set_title(f"session critics, decision states with a true spread >= {res['config']['min_spread']}",
                     fontsize=8)
        ax.legend(fontsize=6)
    if offline:
        ax = axes[k]
        k += 1
        x = np.arange(len(offline))
        ax.bar(x - 0.2, [val(r["checkpoints"][0], "median_spearman") for r in offline], 0.4,
               label="all decision states")
        ax.bar(x + 0.2, [val(r["checkpoints"][0], "median_spearman_where_it_matters") for r in offline], 0.4,
               label="where the candidate matters")
        guides(ax)
        ax.set_xticks(x, [r["name"] for r in offline], rotation=60, ha="right", fontsize=6)
        ax.set_title("offline fits: a replay by value target (truth-loso: the truth's own candidates)", fontsize=8)
        ax.legend(fontsize=6)
    ax = axes[k] if k < len(axes) else None
    if ax is None:
        pass
    elif pooled:
        ax.plot([r["checkpoints"][0]["fit"]["transitions"] for r in pooled],
                [val(r["checkpoints"][0], "median_spearman") for r in pooled], "o-", label="all decision states")
        ax.plot([r["checkpoints"][0]["fit"]["transitions"] for r in pooled],
                [val(r["checkpoints"][0], "median_spearman_where_it_matters") for r in pooled], "s--",
                label="where the candidate matters")
        guides(ax)
        ax.set_xlabel("training transitions (pooled replays)")
        ax.set_title("Monte-Carlo fit against its data", fontsize=8)
    else:
        for r in sessions:
            ax.plot([c["ticks"] for c in r["checkpoints"]], [c["calibration_error_rel"] for c in r["checkpoints"]],
                    "o-", label=f"{r['method']} {r['name']}")
        ax.set_xlabel("session ticks")
        ax.set_ylabel("|Q - MC return| / target range")
        ax.set_title("calibration in each target's own units", fontsize=8)
    if ax is not None:
        ax.legend(fontsize=6)
    fig.suptitle(f"critic vs Monte-Carlo truth: {res['task']}, {len(res['truth_states'])} states from "
                 f"{res['checkpoint']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def provenance(argv: list[str], quick: bool) -> dict:
    """The harness's provenance block (bench/harness/results.py), at the result's top level as before."""
    return harness_provenance("critic_truth", argv, quick)


def scene_step(text: str) -> tuple[int, int]:
    scene, sep, step = text.partition(":")
    if not sep or not scene.isdigit() or not step.isdigit():
        raise argparse.ArgumentTypeError(f"want SCENE:STEP (two integers), got {text!r}")
    return int(scene), int(step)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m bench.critic_truth", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="vla/checkpoints/base", help="the frozen base VLA of the truth")
    ap.add_argument("--task", default="stack_cubes", help="sim task")
    ap.add_argument("--truth", type=pathlib.Path, nargs="+",
                    help="score against these truth files (their states pooled) instead of new rollouts")
    ap.add_argument("--labels", nargs="+", default=None, metavar="LABEL",
                    help="keep only decision states with one of these labels (close, release, random, "
                         "subgoal:NAME); default all")
    ap.add_argument("--run", action="append", default=[], metavar="NAME=RUN_DIR",
                    help="a `vla rl` session to score, named by its setting (repeat)")
    ap.add_argument("--fit", action="append", default=[], metavar="NAME=RUN_DIR",
                    help="the separating probe: a fresh critic fitted to RUN_DIR's replay by Monte-Carlo regression "
                         "in the run's target units, scored like a checkpoint (repeat)")
    ap.add_argument("--fit-steps", type=int, default=4000, help="gradient steps of each --fit")
    ap.add_argument("--fit-curve", action="append", default=[], metavar="NAME=RUN_DIR,RUN_DIR,...",
                    help="the Monte-Carlo fit's data budget: these runs' replays pooled, fitted on --fit-fractions of "
                         "their episodes, each scored (repeat)")
    ap.add_argument("--fit-truth", action="store_true",
                    help="also fit a critic to the truth's own candidates, leaving one scene out at a time (data that "
                         "varies the action at the decision states), scored at the left-out scene")
    ap.add_argument("--fit-fractions", type=float, nargs="+", default=[0.25, 0.5, 1.0],
                    help="the shares of the pooled training episodes of each --fit-curve budget")
    ap.add_argument("--fit-targets", nargs="+", default=["mc", "legacy", "chosen"], choices=list(FIT_TARGETS),
                    help="the value targets each --fit run is fitted with (FIT_TARGETS: mc = Monte-Carlo regression; "
                         "legacy = the pre-issue-61 target; terminal, offset, mean = one change each; chosen = today's "
                         "default)")
    ap.add_argument("--scenes", type=int, default=6, help="evaluation scenes whose base rollouts give the states")
    ap.add_argument("--seed-start", type=int, default=200_000)
    ap.add_argument("--exec-steps", type=int, default=4, help="rows of each candidate (the sessions' exec_steps)")
    ap.add_argument("--noises", type=int, default=6, help="noise candidates per state (DSRL's actions)")
    ap.add_argument("--residuals", type=int, default=5, help="random residual candidates per state (and delta = 0)")
    ap.add_argument("--noise-bound", type=float, default=1.5)
    ap.add_argument("--residual-bound", type=float, default=0.1)
    ap.add_argument("--continuations", type=int, default=6, help="rollouts per candidate")
    ap.add_argument("--states", nargs="+", default=None, metavar="SCENE:STEP", type=scene_step,
                    help="only these decision states (scene seed : macro-step, as a truth file names them), e.g. more "
                         "continuations where the candidate matters; --truth pools files that measured the same state "
                         "(refused where the base's rollout, not bit-reproducible across processes, went elsewhere)")
    ap.add_argument("--continuation-offset", type=int, default=0,
                    help="first continuation's noise stream: a second file for the same states takes new streams")
    ap.add_argument("--random-states", type=int, default=1, help="random (non-decision) states per scene")
    ap.add_argument("--base-success-only", action="store_true",
                    help="take states only from scenes the base solved with its own noise (where the decisions are "
                         "in play; a selection the result names)")
    ap.add_argument("--min-spread", type=float, default=0.2,
                    help="decision states count where the true success spread across candidates is at least this")
    ap.add_argument("--budget-s", type=float, default=3600, help="stop adding states after this long")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes, each with its own sim bridge")
    ap.add_argument("--robot", default="sim-franka-fast", help="site preset of the simulated arm")
    ap.add_argument("--max-ticks", type=int, default=None,
                    help="episode limit (default the task's; a shorter one only for smoke runs)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 scene, 2 + 1 candidates, 2 continuations")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    ap.add_argument("--name", default="critic_truth")
    args = ap.parse_args(argv)
    if args.quick:
        args.scenes, args.noises, args.residuals, args.continuations, args.random_states = 1, 2, 1, 2, 0
    for k in ("scenes", "continuations", "jobs", "exec_steps"):
        if getattr(args, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    curves = []
    for spec in args.fit_curve:
        name, sep, paths = spec.partition("=")
        dirs = [d for d in paths.split(",") if d]
        if not sep or not name or not dirs:
            ap.error(f"--fit-curve wants NAME=RUN_DIR,RUN_DIR,..., got {spec!r}")
        for d in dirs:
            if not os.path.isdir(d):
                ap.error(f"--fit-curve {spec}: no such directory {d!r}")
        curves.append((name, dirs))
    if any(not 0 < f <= 1 for f in args.fit_fractions):
        ap.error("--fit-fractions must lie in (0, 1]")
    runs, fits = [], []
    for flag, specs, into in (("--run", args.run, runs), ("--fit", args.fit, fits)):
        for spec in specs:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                ap.error(f"{flag} wants NAME=RUN_DIR, got {spec!r}")
            if not os.path.isdir(path):
                ap.error(f"{flag} {spec}: no such directory")
            into.append((name, path))
    os.environ.setdefault("MUJOCO_GL", "egl")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    truth_path = args.out / f"{args.name}_truth.json"
    if args.truth:
        truth = merge_truths(args.truth)
        truth_path = args.truth[0]
    else:
        truth = build_truth(args, args.out / f"{args.name}_truth.parts")
        truth["provenance"] = provenance(argv, args.quick)
        tmp = truth_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(truth))
        os.replace(tmp, truth_path)
        shutil.rmtree(args.out / f"{args.name}_truth.parts", ignore_errors=True)
        print(f"truth: {len(truth['states'])} states in {truth['wall_s']:.0f} s -> {truth_path}")
    scored = [score_run(n, p, truth, args.min_spread) for n, p in runs]
    for n, p in fits:
        scored += fit_probe(n, p, truth, args.min_spread, args.fit_steps, args.fit_targets)
    for n, ps in curves:
        scored += fit_curve(n, ps, truth, args.min_spread, args.fit_steps, args.fit_fractions)
    if args.fit_truth:
        scored += fit_truth_loso(truth, args.min_spread, args.fit_steps)
    summary: dict = {truth["task"]: {}}
    for r in scored:
        last = r["checkpoints"][-1] if r["checkpoints"] else {}
        summary[truth["task"]].setdefault(r["method"], {})[r["name"]] = {
            "median_spearman": last.get("median_spearman"), "calibration_error": last.get("calibration_error"),
            "calibration_error_rel": last.get("calibration_error_rel"), "ticks": last.get("ticks"),
            "by_checkpoint": [{k: c[k] for k in c if k != "states"} for c in r["checkpoints"]]}
    truth_states = [{k: st[k] for k in ("scene", "step", "tick", "labels", "base_success", "replay_state_error")}
                    | {"p": np.asarray(st["success"], float).mean(1).round(3).tolist(),
                       "spread": float(np.ptp(np.asarray(st["success"], float).mean(1)))} for st in truth["states"]]
    res = {**provenance(argv, args.quick), "checkpoint": portable(truth["checkpoint"]), "task": truth["task"],
           "truth_file": [portable(str(p)) for p in (args.truth or [truth_path])], "config": {**truth["config"], "min_spread": args.min_spread,
                                                               "exec_steps": truth["exec_steps"]},
           "summary": summary, "truth_states": truth_states, "runs": scored,
           "wall_s": time.perf_counter() - t0}
    with open(args.out / f"{args.name}.json", "w") as f:
        json.dump(res, f, indent=2)
    plot(res, args.out / f"{args.name}.png")
    spread = [s["spread"] for s in truth_states if "random" not in s["labels"]]
    print(f"{len(truth_states)} states ({len(spread)} decision states; {sum(x >= args.min_spread for x in spread)} with a "
          f"true spread >= {args.min_spread}); wrote {args.out / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
