"""Roll a VLA out in the sim tasks and report success per task (``vla eval``).

For each task, ``episodes`` seeded episodes (seeds ``seed_start ...``; the recorder starts at 0,
so the default 100000 keeps evaluation scenes apart from demonstration scenes). Each episode
runs chunk after chunk (the first ``exec_steps`` rows of every chunk) until the task's success
predicate holds or its ``max_steps`` control ticks are used. Reported per task: successes / n,
the rate and its 95% Wilson interval, mean ticks of the successes. The first ``videos`` episodes
of each task are saved as MP4 (all cameras side by side, one frame per executed control tick,
played at the control rate), and a bar chart with the intervals goes to ``success.png``.

``evaluate_env`` does the same on any gymnasium env with the observation layout of DESIGN.md
(``vla eval --env package.module:make_env``); success is ``info["success"]``.

How an env is stepped (``run_episode``) is the env contract of ``vla.envs`` (``step_chunk``,
``episode_limit``), the same as ``vla rl``'s: an env that steps one action ``[A]`` gets the chunk row
by row (the episode ends at the first terminated / truncated row), an env that declares chunk
actions gets whole chunks. Videos hold one frame per executed tick: a one-action env shows every
row; ``robot_io.RobotEnv`` shows its intermediate ticks through its ``tick_callback`` hook; any
other chunk env holds the chunk's last frame for each of its ticks. The sampler's noise is seeded
per episode (``VLAPolicy``), so an evaluation repeats exactly.

``evaluate_on_workers`` (``vla eval --workers N``) runs the same episodes on N Ray actors (``EvalWorker``), each
with its own copy of the policy and its own simulator bridge on ports of its own (``vla.cluster``): an episode's
outcome depends on its seed only (the scene, and the noise of each of its chunks), so N workers give the same
per-episode outcomes as one, listed in the same order. A model that does not take the noise handle (an ONNX
graph without a noise input, a LeRobot peer) draws its own noise: its episodes do not repeat exactly, with one
worker or with many.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable

import numpy as np


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sensible at 0 / n and n / n)."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclasses.dataclass
class EpisodeResult:
    task: str
    seed: int
    success: bool
    ticks: int
    wall_s: float
    final_state: list[float] | None = None
    """The observation's ``state`` when the episode ended (the arm's pose and gripper on the sim): where it left
    the robot, so that two runs of a seed can be compared beyond success and length."""


def run_episode(env, policy: Callable[[dict], np.ndarray], seed: int, max_ticks: int,
                frames: list[np.ndarray] | None = None, task: str | None = None) -> EpisodeResult:
    """One seeded episode; ``frames`` (if given) gets one frame per executed control tick (+ the
    first observation). The env is stepped by ``vla.envs.step_chunk`` (the contract shared with
    ``vla rl``); see the module docstring for the frames."""
    from vla.envs import step_chunk, steps_chunks

    t0 = time.perf_counter()
    obs, _ = env.reset(seed=seed)
    if hasattr(policy, "reset"):  # per-episode noise seeds; a policy with memory (temporal ensembling) starts afresh
        policy.reset(seed)
    if frames is not None:
        frames.append(frame_image(obs, 0, False))
    base = getattr(env, "unwrapped", env)
    hooked = hasattr(base, "tick_callback")
    per_row = not steps_chunks(env)
    ticks, success, done = 0, False, False
    start = 0
    if hooked and frames is not None:
        def on_tick(o: dict) -> None:
            frames.append(frame_image(o, ticks + len(frames) - start + 1, False))
        base.tick_callback = on_tick
    on_row = None
    if per_row and frames is not None:
        def on_row(o: dict, i: int, r: float, info: dict) -> None:
            frames.append(frame_image(o, ticks + i + 1, bool(info.get("success", r > 0))))
    try:
        while ticks < max_ticks and not done:
            chunk = policy(obs)[: max_ticks - ticks]
            start = len(frames) if frames is not None else 0
            st = step_chunk(env, chunk, on_row=on_row, chunked=not per_row)
            obs = st.obs
            ticks += st.rows
            success = bool(st.info.get("success", st.reward > 0))
            if frames is not None and not per_row:
                held = st.rows - 1 - (len(frames) - start)  # ticks the env showed no frame of
                frames.extend([frame_image(obs, ticks - 1, success)] * max(held, 0))
                frames.append(frame_image(obs, ticks, success))
            done = st.terminated or st.truncated
    finally:
        if hooked and frames is not None:
            base.tick_callback = None
    task = task or getattr(getattr(env, "task", None), "name", "env")
    final = np.asarray(obs.get("state", ()), np.float64).ravel()
    return EpisodeResult(task=task, seed=seed, success=success, ticks=ticks, wall_s=time.perf_counter() - t0,
                         final_state=[round(float(x), 6) for x in final])


def frame_image(obs: dict, tick: int, success: bool) -> np.ndarray:
    import cv2

    imgs = [np.asarray(img) for _, img in sorted(obs["images"].items())]
    h = max(i.shape[0] for i in imgs)
    imgs = [cv2.resize(i, (int(i.shape[1] * h / i.shape[0]), h)) if i.shape[0] != h else i for i in imgs]
    f = np.ascontiguousarray(np.concatenate(imgs, axis=1))
    cv2.putText(f, f"t={tick}" + ("  SUCCESS" if success else ""), (6, 16), cv2.FONT_HERSHEY_SIMPLEX, 0.45,
                (0, 255, 0) if success else (255, 255, 255), 1, cv2.LINE_AA)
    return f


def write_video(frames: list[np.ndarray], path: str, fps: float) -> None:
    import cv2

    h, w = frames[0].shape[:2]
    tmp = path + ".tmp.mp4"
    vw = cv2.VideoWriter(tmp, cv2.VideoWriter_fourcc(*"mp4v"), max(1.0, fps), (w, h))
    if not vw.isOpened():
        raise RuntimeError(f"OpenCV could not open a video writer for {path}")
    for f in frames:
        vw.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
    vw.release()
    os.replace(tmp, path)


def summarize(results: list[EpisodeResult]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for task in dict.fromkeys(r.task for r in results):
        rs = [r for r in results if r.task == task]
        k, n = sum(r.success for r in rs), len(rs)
        lo, hi = wilson_interval(k, n)
        succ_ticks = [r.ticks for r in rs if r.success]
        out[task] = {"episodes": n, "successes": k, "success_rate": k / n, "ci95": [lo, hi],
                     "mean_ticks_success": float(np.mean(succ_ticks)) if succ_ticks else None}
    return out


def plot_success(summary: dict[str, Any], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(summary)
    rates = [summary[t]["success_rate"] * 100 for t in tasks]
    lo = [rates[i] - summary[t]["ci95"][0] * 100 for i, t in enumerate(tasks)]
    hi = [summary[t]["ci95"][1] * 100 - rates[i] for i, t in enumerate(tasks)]
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(tasks), 3.6))
    ax.bar(range(len(tasks)), rates, yerr=[lo, hi], capsize=4, color="#4c72b0")
    for i, t in enumerate(tasks):
        ax.text(i, rates[i] + 2, f"{summary[t]['successes']}/{summary[t]['episodes']}", ha="center", fontsize=8)
    ax.set_xticks(range(len(tasks)), tasks, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_ylabel("success rate (%)  [95% Wilson CI]")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=120)
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


def evaluate(model, client, tasks: list[str], episodes: int, out_dir: str, seed_start: int = 100_000,
             exec_steps: int | None = None, videos: int = 2, control_hz: float = 10.0,
             instruction: str | None = None, progress: bool = True,
             temporal_ensemble: float | None = None, token: int | None = None,
             noise: str = "sample", gripper: str = "raw") -> dict[str, Any]:
    """Roll ``model`` out on a bridge ``client`` (a sim arm): see the module docstring. ``token``: hold this
    behaviour token (ExToken; a token-conditioned VLA) in every episode; ``gripper``: ``make_policy``."""
    from vla.envs import task_env

    def envs():
        for task in tasks:
            env = task_env(client, task, control_hz=control_hz, instruction=instruction)
            yield task, env, env.max_ticks

    return _evaluate(model, envs(), len(tasks), episodes, out_dir, seed_start, exec_steps, videos, control_hz,
                     progress, temporal_ensemble, token, noise, gripper)


def evaluate_env(model, env, name: str, episodes: int, out_dir: str, max_ticks: int, seed_start: int = 100_000,
                 exec_steps: int | None = None, videos: int = 2, control_hz: float = 10.0,
                 progress: bool = True, temporal_ensemble: float | None = None,
                 token: int | None = None, noise: str = "sample") -> dict[str, Any]:
    """Roll ``model`` out on a gymnasium ``env`` (DESIGN.md's observation layout, success in
    ``info["success"]``) for ``episodes`` seeded episodes of at most ``max_ticks`` control ticks;
    reported under ``name``. Videos play at ``control_hz``."""
    return _evaluate(model, iter([(name, env, max_ticks)]), 1, episodes, out_dir, seed_start, exec_steps, videos,
                     control_hz, progress, temporal_ensemble, token, noise)


def _evaluate(model, envs, n_tasks: int, episodes: int, out_dir: str, seed_start: int, exec_steps: int | None,
              videos: int, control_hz: float, progress: bool,
              temporal_ensemble: float | None = None, token: int | None = None,
              noise: str = "sample", gripper: str = "raw") -> dict[str, Any]:
    from tqdm import tqdm

    os.makedirs(os.path.join(out_dir, "videos"), exist_ok=True)
    policy = make_policy(model, exec_steps, temporal_ensemble, token, noise, gripper)
    results: list[EpisodeResult] = []
    t0 = time.perf_counter()
    bar = tqdm(total=episodes * n_tasks, desc="eval", unit="ep", disable=not progress)
    jsonl = open(os.path.join(out_dir, "episodes.jsonl"), "w")
    try:
        for task, env, max_ticks in envs:
            for i in range(episodes):
                frames: list[np.ndarray] | None = [] if i < videos else None
                r = run_episode(env, policy, seed_start + i, max_ticks, frames, task=task)
                results.append(r)
                jsonl.write(json.dumps(dataclasses.asdict(r)) + "\n")
                jsonl.flush()
                if frames:
                    write_video(frames, os.path.join(out_dir, "videos", f"{task}_seed{r.seed}.mp4"), fps=control_hz)
                bar.update(1)
                done = [x for x in results if x.task == task]
                bar.set_postfix_str(f"{task}: {sum(x.success for x in done)}/{len(done)}")
    finally:
        bar.close()
        jsonl.close()
    summary = summarize(results)
    return {"tasks": summary, "exec_steps": policy.exec_steps, "temporal_ensemble": temporal_ensemble,
            "noise": noise, "gripper": gripper, "seed_start": seed_start,
            "episodes_per_task": episodes, "control_hz": control_hz, "timing": _timing(0.0, time.perf_counter() - t0,
                                                                                      len(results))}


def _timing(startup_s: float, episodes_s: float, n: int) -> dict[str, float]:
    """The report's timing: ``startup_s`` until the workers could take episodes (Ray, the models, the bridges, a
    warm-up call; 0 in process, where the first episode carries the model's warm-up), ``episodes_s`` the episodes'
    wall clock (videos included), their rate."""
    return {"startup_s": round(startup_s, 3), "episodes_s": round(episodes_s, 3),
            "episodes_per_s": round(n / episodes_s, 4) if episodes_s > 0 else None}


def make_policy(model, exec_steps: int | None, temporal_ensemble: float | None, token: int | None,
                noise: str = "sample", gripper: str = "raw"):
    """The evaluated policy: ACT's temporal ensembling over whole chunks (``temporal_ensemble``), or the first
    ``exec_steps`` rows of every chunk; ``token``: a behaviour token held in every episode; ``noise``: the
    sampler's starting noise (``vla.envs.noise_option``: sample, zero or mean:N); ``gripper``: ``binary`` snaps
    the executed rows' gripper opening to 0 / 1 (``vla.envs.BinaryGripper``, after the ensemble's mean)."""
    from vla.envs import BinaryGripper, TemporalEnsemble, VLAPolicy, gripper_option, noise_option

    how = noise_option(noise)
    gripper = gripper_option(gripper)
    if temporal_ensemble is not None:
        if exec_steps not in (None, 1):
            raise ValueError("--temporal-ensemble executes one row per tick: drop --exec-steps")
        policy = TemporalEnsemble(VLAPolicy(model, token=token, **how), temporal_ensemble)
    else:
        policy = VLAPolicy(model, exec_steps, token=token, **how)
    return BinaryGripper(policy) if gripper == "binary" else policy


# -- several workers (`vla eval --workers N`) ------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class WorkerJob:
    """What every evaluation worker loads and drives (`vla eval`'s flags)."""

    checkpoint: str
    """A resolved checkpoint directory or ``.onnx`` file (a path on the worker's machine)."""
    robot: str = "sim-franka-fast"
    env: str | None = None
    max_ticks: int | None = None
    control_hz: float = 10.0
    instruction: str | None = None
    exec_steps: int | None = None
    temporal_ensemble: float | None = None
    token: int | None = None
    noise: str = "sample"
    gripper: str = "raw"
    threads: int | None = None
    logs: str = ""
    """Folder of the workers' logs (bridge logs, site copies)."""


class EvalWorker:
    """One worker of ``vla eval --workers N``, a Ray actor: its own copy of the policy and its own robot (a
    simulator on ports of its own: ``vla.cluster.worker_robot``) or ``--env``; it runs the episodes it is handed,
    one call each, so each episode goes to whichever worker is free. An episode's outcome depends on its seed only
    (the scene, and the sampler's noise per chunk: ``VLAPolicy``), not on the worker or what it ran before."""

    def __init__(self, job: WorkerJob, index: int) -> None:
        import contextlib

        import torch

        from vla.models import load_vla

        torch.set_num_threads(job.threads or 1)
        self.job, self.index = job, index
        self.stack = contextlib.ExitStack()
        self.policy = make_policy(load_vla(job.checkpoint).eval(), job.exec_steps, job.temporal_ensemble, job.token,
                                  job.noise, job.gripper)
        self.envs: dict[str, tuple[Any, int]] = {}
        self.client = None
        if job.env:
            from vla.envs import episode_limit, make_user_env

            env = make_user_env(job.env)
            self.stack.callback(env.close)
            self.envs[job.env.split(":", 1)[1]] = (env, int(episode_limit(env, job.max_ticks)))
        else:
            from robot_io.robot import RobotClient
            from vla.cluster import worker_robot

            site = self.stack.enter_context(worker_robot(job.robot, job.logs, f"worker{index}"))
            self.client = RobotClient(site)
            self.stack.callback(self.client.close)

    def _env(self, task: str) -> tuple[Any, int]:
        if task not in self.envs:
            from vla.envs import task_env

            env = task_env(self.client, task, control_hz=self.job.control_hz, instruction=self.job.instruction)
            self.envs[task] = (env, env.max_ticks)
        return self.envs[task]

    def ready(self, task: str) -> int:
        """Warm up on ``task``: a reset and one call of the policy, discarded (the first call loads what the model
        loads lazily, e.g. its text encoder; the global RNG is left as it was), so that episodes run at their own
        pace. Every episode resets the env and the policy from its seed. -> this worker's pid."""
        import torch

        env, _ = self._env(task)
        obs, _ = env.reset(seed=0)
        with torch.random.fork_rng():
            self.policy(obs)
        return os.getpid()

    def episode(self, task: str, seed: int, video: bool) -> dict[str, Any]:
        """One seeded episode of ``task`` -> {"result": EpisodeResult as a dict, "video": MP4 bytes or None}."""
        import tempfile

        env, max_ticks = self._env(task)
        frames: list[np.ndarray] | None = [] if video else None
        r = run_episode(env, self.policy, seed, max_ticks, frames, task=task)
        data = None
        if frames:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "episode.mp4")
                write_video(frames, path, fps=self.job.control_hz)
                with open(path, "rb") as f:
                    data = f.read()
        return {"result": dataclasses.asdict(r), "video": data}

    def close(self) -> None:
        self.stack.close()


def evaluate_on_workers(job: WorkerJob, tasks: list[str], episodes: int, out_dir: str, workers: int,
                        exec_steps: int, seed_start: int = 100_000, videos: int = 2, ray_address: str | None = None,
                        progress: bool = True) -> dict[str, Any]:
    """``evaluate`` / ``evaluate_env`` on ``workers`` Ray actors (``EvalWorker``; a local Ray cluster, or the one at
    ``ray_address``). The episodes (task x seed) go to whichever worker is free; ``episodes.jsonl`` and the report
    list them in task and seed order, as one worker would, with the same per-episode outcomes. A worker that dies
    is dropped and its episode run by another. ``exec_steps``: the policy's (for the report)."""
    from tqdm import tqdm

    from vla.cluster import ray_cluster

    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    items = [(task, seed_start + i, i < videos) for task in tasks for i in range(episodes)]
    os.makedirs(os.path.join(out_dir, "videos"), exist_ok=True)
    results: dict[int, EpisodeResult] = {}
    written = 0
    t0 = time.perf_counter()  # the startup: Ray, the workers' models and bridges
    with ray_cluster("--workers", ray_address, num_cpus=workers) as ray, \
            open(os.path.join(out_dir, "episodes.jsonl"), "w") as jsonl, \
            tqdm(total=len(items), desc=f"eval x{workers}", unit="ep", disable=not progress) as bar:
        remote = ray.remote(num_cpus=1, max_restarts=0)(EvalWorker)
        idle = [remote.remote(job, i) for i in range(workers)]
        ray.wait([w.ready.remote(tasks[0]) for w in idle], num_returns=len(idle))  # up and warm (or failed: below)
        t1 = time.perf_counter()
        todo = list(range(len(items)))
        running: dict[Any, tuple[Any, int]] = {}  # ref -> (worker, item)
        dead: list[str] = []
        while todo or running:
            while idle and todo:
                w, k = idle.pop(0), todo.pop(0)
                running[w.episode.remote(*items[k])] = (w, k)
            if not running:
                raise RuntimeError(f"every evaluation worker died: {'; '.join(dead)}")
            done, _ = ray.wait(list(running), num_returns=1)
            w, k = running.pop(done[0])
            try:
                out = ray.get(done[0])
            except ray.exceptions.RayActorError as e:  # the worker died (or never started): another one runs it
                dead.append(str(e).strip().splitlines()[-1][:300])
                todo.insert(0, k)
                continue
            idle.append(w)
            r = EpisodeResult(**out["result"])
            results[k] = r
            if out["video"]:
                with open(os.path.join(out_dir, "videos", f"{r.task}_seed{r.seed}.mp4"), "wb") as f:
                    f.write(out["video"])
            while written in results:  # the log in task and seed order
                jsonl.write(json.dumps(dataclasses.asdict(results[written])) + "\n")
                written += 1
            jsonl.flush()
            bar.update(1)
            bar.set_postfix_str(f"{sum(x.success for x in results.values())}/{len(results)} successes")
        t2 = time.perf_counter()
        try:  # stop the workers' bridges (the bridges also exit with their worker)
            ray.get([w.close.remote() for w in idle], timeout=60)
        except ray.exceptions.RayError as e:
            print(f"eval: a worker did not close cleanly: {str(e).strip().splitlines()[-1][:200]}", flush=True)
    ordered = [results[k] for k in range(len(items))]
    return {"tasks": summarize(ordered), "exec_steps": exec_steps, "temporal_ensemble": job.temporal_ensemble,
            "noise": job.noise, "gripper": job.gripper, "seed_start": seed_start, "episodes_per_task": episodes, "control_hz": job.control_hz,
            "workers": workers, "timing": _timing(t1 - t0, t2 - t1, len(ordered))}


def format_table(summary: dict[str, Any]) -> str:
    lines = [f"{'task':<24} {'success':>9} {'rate':>6}  {'95% CI':>13}"]
    for t, s in summary.items():
        lo, hi = s["ci95"]
        lines.append(f"{t:<24} {s['successes']:>4}/{s['episodes']:<4} {100 * s['success_rate']:>5.0f}%  "
                     f"[{100 * lo:>3.0f}%, {100 * hi:>3.0f}%]")
    return "\n".join(lines)
