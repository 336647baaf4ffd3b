"""``vla rl --actors N``: the learner in this process, N actors as Ray actors (``ActorProcess``), on a local Ray
cluster or the one at ``--ray-address`` (``vla.cluster``).

Each actor is the split session's actor (``session.actor.Actor``) in a Ray worker process of its own, with a
robot of its own: a copy of the simulated site on loopback ports it leases on its machine, served by a bridge it
starts (``vla.cluster.worker_robot``), or its real robot's site (``--actor-robots``); or the user's ``--env``. It
connects to the learner over the split session's ZMQ link as lane ``i`` (``ActorConfig.slot``), streams its
transitions and takes the parameters the learner pushes to every actor. The wire, the lanes, the seeds (actor i
plays session episodes i, i + N, ...), who evaluates and what happens when an actor dies: ``session.protocol``.

This module watches the Ray actors: one whose process dies (killed, out of memory, its node lost) or whose
``run`` fails is dropped from the session (``Learner.drop_actor``) and the others go on; when every actor is gone
the session stops at its last checkpoint (``vla rl --resume RUN`` continues it with N new actors). Nothing here
names a method.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from typing import Any, Callable

from session.actor import ActorConfig
from session.config import RLConfig


class ActorProcess:
    """One actor of ``vla rl --actors N`` (wrapped as a Ray actor by ``run_pool``). ``make_env(cfg, client)``
    builds the session's env on the robot's bridge client (``client`` None with ``--env``); ``robot``: the site
    of this actor's robot (None with ``--env``); ``logs``: the folder of its log, its bridge's log and site copy."""

    def __init__(self, cfg: ActorConfig, robot: str | None, logs: str, make_env: Callable[..., Any]) -> None:
        self.cfg, self.robot, self.logs, self.make_env = cfg, robot, logs, make_env

    def pid(self) -> int:
        return os.getpid()

    def run(self) -> dict[str, Any]:
        """Connect, build the robot and the VLA, act until the session ends. -> the actor's summary."""
        from vla.cluster import worker_log

        name = f"actor{self.cfg.slot}"
        with open(worker_log(self.logs, f"{name}.log"), "a", buffering=1) as log, \
                contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            try:
                return self._run(name)
            except BaseException:
                traceback.print_exc()  # into this actor's log; Ray hands the error to the learner's process
                raise

    def _run(self, name: str) -> dict[str, Any]:
        from robot_io.robot import RobotClient
        from session.actor import Actor
        from vla.cluster import worker_robot
        from vla.models import load_vla, resolve_checkpoint

        actor = Actor(self.cfg)
        try:
            print(f"actor {actor.actor_id} (lane {self.cfg.slot}, pid {os.getpid()}): waiting for the learner at "
                  f"{self.cfg.learner}", flush=True)
            cfg = actor.connect()
            vla = load_vla(resolve_checkpoint(cfg.checkpoint))
            if cfg.env:  # the user's env in this process: no robot, no bridge
                actor.prepare(vla, self.make_env(cfg, None), progress=False)
                return actor.run(progress=False)
            with worker_robot(self.robot, self.logs, name) as site:
                client = RobotClient(site)
                return actor.run_on_robot(vla, client, lambda: self.make_env(cfg, client), progress=False)
        finally:
            actor.close()


def _reason(e: BaseException) -> str:
    """One line for a Ray error: the last line of the remote traceback (the exception itself)."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(e).__name__)[:300]


def _endpoint(ray, bound: str, remote: bool) -> str:
    """The learner's endpoint as the actors reach it: the bound one, or with this node's address for a socket
    bound on every interface. Loopback on a cluster of several machines is refused (the actors could not reach
    it)."""
    host = bound.split("://", 1)[1].rpartition(":")[0]
    if host in ("0.0.0.0", "*", "[::]"):
        return bound.replace(f"//{host}:", f"//{ray.util.get_node_ip_address()}:")
    if remote and host in ("127.0.0.1", "localhost"):
        me = ray.util.get_node_ip_address()
        others = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")} - {me})
        if others:
            raise ValueError(f"--ray-address: the cluster has other machines ({', '.join(others[:3])}) whose actors "
                             "cannot reach a learner on loopback: give --bind tcp://*:PORT with --keys DIR (or "
                             "--insecure on a trusted network)")
    return bound


def check_pool(cfg: RLConfig) -> list[str | None]:
    """Refuse (ValueError naming the flag) a pool that cannot run: no Ray, no actors, a real robot shared by
    every actor. -> each actor's robot site (None with --env)."""
    from vla.cluster import require_ray

    n = cfg.actors
    if n < 1:
        raise ValueError(f"a pool of actors needs --actors >= 1, got {n}")
    require_ray("--actors")
    if cfg.env:
        return [None] * n
    if cfg.actor_robots:
        return list(cfg.actor_robots)
    from robot_io.bridge_process import is_simulated
    from robot_io.site import load_site

    site = load_site(cfg.robot)
    if not is_simulated(site):
        raise ValueError(f"--actors {n}: --robot {cfg.robot} is a real robot, which one actor drives; give each "
                         "actor its own with --actor-robots SITE (once per actor)")
    return [cfg.robot] * n


def run_pool(cfg: RLConfig, vla, make_env: Callable[..., Any], resume: bool = False, ray_address: str | None = None,
             bind: str | None = None, keys=None, insecure: bool = False, progress: bool = True,
             learner_timeout_s: float = 30.0, on_start: Callable[[list, Any], None] | None = None) -> dict[str, Any]:
    """The session with ``cfg.actors`` actors as Ray actors and its learner here, until it ends. -> the
    learner's summary, with each actor's own (``actor_summaries``: None for one that was dropped).
    ``bind``: the learner's endpoint (default: a free loopback port; on a cluster of several machines
    ``tcp://*:PORT`` with ``keys``). ``on_start(handles, learner)``: called once the Ray actors are started (tests)."""
    from session.learner import Learner
    from session.protocol import RemoteRLError
    from vla.cluster import log_dir, ray_cluster

    robots = check_pool(cfg)
    n = cfg.actors
    with ray_cluster("--actors", ray_address, num_cpus=n) as ray:
        learner = Learner(cfg, vla, bind=bind or "tcp://127.0.0.1:*", resume=resume, keys=keys, insecure=insecure,
                          progress=progress)
        try:
            endpoint = _endpoint(ray, learner.endpoint, remote=bool(ray_address))
            logs = log_dir(os.path.join(cfg.out, "actors"), local=not ray_address)
            remote = ray.remote(num_cpus=1, max_restarts=0)(ActorProcess)
            handles = [remote.remote(ActorConfig(learner=endpoint, slot=i, keys=keys,
                                                 learner_timeout_s=learner_timeout_s), robots[i], logs, make_env)
                       for i in range(n)]
            running = {h.run.remote(): i for i, h in enumerate(handles)}
            summaries: dict[int, Any] = {}

            def watch() -> None:  # every turn of the learner: which actors ended, and how
                done, _ = ray.wait(list(running), num_returns=len(running), timeout=0)
                for ref in done:
                    i = running.pop(ref)
                    try:
                        summaries[i] = ray.get(ref)
                    except ray.exceptions.RayError as e:
                        summaries[i] = None
                        learner.drop_actor(i, _reason(e))

            if on_start is not None:
                on_start(handles, learner)
            summary = learner.serve(watch=watch, announce=(
                f"learner listening on {learner.endpoint} (session {cfg.out}, step {learner.sess.step}) for {n} "
                f"actors on Ray{' at ' + ray_address if ray_address else ''}; their logs: {logs}"))
        except BaseException:
            learner.close()
            raise
        if summary is None:
            raise RemoteRLError(f"the session stopped before its end; `vla rl --resume {cfg.out}` continues it")
        deadline = time.monotonic() + 30  # the actors exit once they heard the end
        while running and time.monotonic() < deadline:
            watch()
            time.sleep(0.1)
        for ref, i in running.items():
            print(f"actor {i} did not exit after the session's end; stopping it", file=sys.stderr, flush=True)
            ray.kill(handles[i])
    return {**summary, "actor_summaries": [summaries.get(i) for i in range(n)]}
