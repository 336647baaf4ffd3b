"""``RLConfig``: the settings of an online RL session (``vla rl``): the session's own fields and,
nested under ``agent``, the config dataclass of the method (``policies.REGISTRY[method]``).
No torch here."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from policies import DEFAULT_METHOD

EVAL_POLICIES = ("sample", "mean")
SAFETY_LAYERS = ("none", "workspace")
UPDATE_MODES = ("lockstep", "async")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    checkpoint: str
    """The VLA to steer: a checkpoint directory (the compact VLA, or a LeRobot pi0 / pi05 / SmolVLA policy) or a
    `vla train` run directory. Its files are never modified (a method that tunes the VLA trains its own copy)."""
    out: str
    """Run directory (new)."""
    task: str
    """Sim task (hardware.sim_tasks) whose success predicate is the reward; "" on a real robot or with --env."""
    method: str = DEFAULT_METHOD
    """The RL method (a name in policies.REGISTRY); its settings are the method's flags."""
    agent: Any = None
    """The method's config (its dataclass in policies.REGISTRY; None: its defaults)."""
    env: str = ""
    """package.module:make_env: a gymnasium env (observation images / state / instruction, info["success"]) to
    train on instead of a sim task on the robot bridge; its reward is the reward. It steps one action [A] (each
    chunk is stepped row by row, up to the first terminated / truncated row) unless it declares chunk actions
    (an action_space [H, A] or chunk_actions = True)."""
    robot: str = dataclasses.field(default="sim-franka-fast", metadata={"help_default": "sim-franka-fast; actor: the learner's"})
    """Site preset or YAML."""
    total_ticks: int = 10_000
    """Budget of environment steps (control ticks; a chunk of 8 executed rows = 8 ticks); 0: no training, only the
    base VLA's and the agent's evaluations (e.g. an agent with a fixed policy)."""
    total_episodes: int = 0
    """Also stop after this many training episodes (0: no limit; in-process sessions): a budget of rollouts, as
    an on-policy method counts it, where a tick budget would give a policy that succeeds sooner more episodes."""
    max_episode_ticks: int | None = None
    """Episode length in control ticks (default: the sim task's max_steps, or the env's own limit: its max_ticks,
    TimeLimit or spec.max_episode_steps; else 200). An env that truncates itself earlier ends the episode there."""
    warmup_steps: int = 100
    """Macro-steps of the method's warm-up behaviour (e.g. the base VLA's own noise) before learning starts."""
    updates: str = dataclasses.field(default="lockstep", metadata={"choices": UPDATE_MODES})
    """When the learner updates. ``lockstep``: one update round per macro-step, in arrival order (a resumed
    session continues exactly; the session runs no faster than the updates). ``async`` (split sessions,
    --role learner / actor; SERL's learner): the learner stores transitions as they arrive and runs update
    rounds whenever it is free, never more than lockstep would (one per macro-step after warm-up); the
    robot acts at its own rate and the summary reports the rounds the learner afforded."""
    actors: int = 0
    """Actor processes, started as Ray actors (a local Ray cluster, or the one at --ray-address), each driving
    a robot of its own (a copy of the simulated --robot on ports of its own, or its --actor-robots site) and
    streaming transitions to the learner in this process, which pushes the policy's parameters to all of them.
    Actor i of N plays the training scenes of session episodes i, i + N, i + 2N, ... (disjoint seeds). An actor
    that dies is dropped and the others go on. 0: act and learn in this process (one robot)."""
    actor_robots: tuple[str, ...] = dataclasses.field(default=(), metadata={"metavar": "SITE"})
    """--actors on real robots: each actor's site preset or YAML (repeat the flag, one per actor, each robot its
    own); default: copies of a simulated --robot, each on free ports of its own."""
    eval_policy: str = dataclasses.field(default="sample", metadata={"choices": EVAL_POLICIES})
    """Evaluations: ``sample`` draws the agent's action from its policy (seeded by the evaluation episode, as
    the base VLA's N(0, I) is), ``mean`` takes its mean (the deterministic action)."""
    eval_every: int = 10
    """Episodes between evaluations (0: none)."""
    eval_episodes: int = 10
    """Episodes per evaluation (on fixed seeds)."""
    eval_seed_start: int = 200_000
    """First evaluation seed."""
    checkpoint_every: int = 1
    """Episodes between checkpoints (agent, replay buffers, counters, RNG states)."""
    snapshot_every: int = 0
    """Ticks between kept copies of the agent (``RUN/snapshots/agent_<ticks>.pt``, taken with the first checkpoint
    past each multiple), so that ``bench/critic_truth.py`` can score a session's critic as it learned; 0: none
    (the checkpoint keeps only the newest agent)."""
    seed: int = 0
    """Seed of the agent, the replay sampling and the training episodes' scenes."""
    threads: int | None = 1
    """torch threads (None: torch's default)."""
    videos: int = 1
    """Evaluation episodes saved as MP4 at the final evaluation."""
    reward: str = dataclasses.field(default="task", metadata={"metavar": "SOURCE"})
    """Reward source: ``task`` (the sim task's success predicate, or --env's reward) or ``classifier:DIR`` (a
    success classifier from ``vla reward train``: the reward on a real robot, where the operator resets the scene
    between episodes)."""
    shaping: str = dataclasses.field(default="", metadata={"metavar": "DIR"})
    """A potential fitted from "closer to done" judgements (``rewards.shaping``: ``fit_potential`` +
    ``save_potential`` DIR): every step's reward becomes r + gamma Phi(s') - Phi(s), Phi read from the observation's
    robot ``state``, so any method's critic trains on the shaped reward (the optimal policy is unchanged); success
    is still read from the raw reward (or the task's own ``success``)."""
    instruction: str | None = None
    """Real robot or --env: the instruction given to the VLA (a sim task brings its own)."""
    demos: tuple[str, ...] = dataclasses.field(default=(), metadata={"metavar": "DATASET"})
    """LeRobot datasets (recorded with ``vla record``; repeatable) whose episodes with the session's instruction
    enter the demo buffer before the first episode (for methods that learn from demos, e.g. an action-space
    critic sampled 50 / 50 with online transitions)."""
    reset_timeout_s: float = dataclasses.field(default=300.0, metadata={"flag": "--reset-timeout"})
    """Real robot: seconds the operator has to reset the scene and press Enter before the session pauses (its
    last checkpoint stays; ``--resume`` continues)."""
    safety: str = dataclasses.field(default="none", metadata={"choices": SAFETY_LAYERS})
    """A safety layer under every executed chunk (any method, evaluations, an operator's chunk): ``workspace``
    blends each row's end-effector displacement with a move back toward the centre of a box, AutoSafe's blend,
    certified to keep the commanded end effector inside (session.safety; the arm's action layout only)."""
    gripper: str = dataclasses.field(default="auto", metadata={"choices": ("auto", "raw", "binary")})
    """The executed gripper opening of every chunk on the arm (robot_io.gripper; the agent's own, the base's in its
    evaluations, an operator's): ``raw`` as chosen, ``binary`` snapped shut / open at 0.5 by the env as a robot's
    gripper controller would, ``auto`` what the checkpoint's config.json names under ``execution.gripper`` (the
    shipped base: binary), else raw. What the agent learns from is its own chunk, before the snap. An --env
    defines its own actions: auto is raw there, binary refused."""
    workspace_box: tuple[float, ...] = ()
    """--safety workspace: the box, low x y z then high x y z in metres (the robot base frame); default: the
    site's limits box. The blend grows toward the faces: leave the task room inside it."""
    workspace_sharpness: float | None = None
    """--safety workspace: the blend's sharpness p (larger: the agent keeps more control away from the faces);
    default and maximum: the certified bound for the arm's max step in this box."""

    def __post_init__(self) -> None:
        from policies import get_config_class

        cls = get_config_class(self.method)  # a typo: ValueError with a did-you-mean
        agent = self.agent
        if agent is None:
            agent = cls()
        elif isinstance(agent, dict):
            agent = config_from_dict(cls, agent)
        if not isinstance(agent, cls):
            raise ValueError(f"agent must be a {cls.__name__} for method {self.method!r}, got {type(agent).__name__}")
        object.__setattr__(self, "agent", agent)
        object.__setattr__(self, "demos", tuple(self.demos))
        for f in ("eval_episodes", "checkpoint_every"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive, got {getattr(self, f)}")
        if self.total_ticks < 0:
            raise ValueError(f"total_ticks must be >= 0 (0: evaluate only), got {self.total_ticks}")
        if self.actors < 0:
            raise ValueError(f"actors must be >= 0 (0: act in this process), got {self.actors}")
        object.__setattr__(self, "actor_robots", tuple(self.actor_robots))
        if self.actor_robots and len(self.actor_robots) != self.actors:
            raise ValueError(f"actor_robots names {len(self.actor_robots)} site(s) for {self.actors} actor(s): give one "
                             "site per actor")
        from robot_io.gripper import gripper_mode

        gripper_mode(self.gripper, "gripper", auto=True)
        if self.gripper == "binary" and self.env:
            raise ValueError("gripper binary snaps the opening of the arm's ee_delta action (column 6); an --env "
                             "defines its own actions: drop --gripper")
        if self.snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0 (0: no snapshots), got {self.snapshot_every}")
        if self.eval_every < 0 or self.warmup_steps < 0:
            raise ValueError("eval_every and warmup_steps must be >= 0")
        if self.reward != "task" and not self.reward.startswith("classifier:"):
            raise ValueError(f"reward must be 'task' or 'classifier:DIR', got {self.reward!r}")
        if self.reward == "task" and not self.task and not self.env:
            raise ValueError("reward 'task' needs a sim task or an --env (a real robot takes reward 'classifier:DIR')")
        if self.env and ":" not in self.env:
            raise ValueError(f"env must look like package.module:make_env, got {self.env!r}")
        if self.eval_policy not in EVAL_POLICIES:
            raise ValueError(f"eval_policy must be 'sample' or 'mean', got {self.eval_policy!r}")
        if self.updates not in UPDATE_MODES:
            raise ValueError(f"updates must be one of {', '.join(UPDATE_MODES)}, got {self.updates!r}")
        if self.reset_timeout_s <= 0:
            raise ValueError(f"reset_timeout_s must be positive, got {self.reset_timeout_s}")
        if self.safety not in SAFETY_LAYERS:
            raise ValueError(f"safety must be one of {', '.join(SAFETY_LAYERS)}, got {self.safety!r}")
        object.__setattr__(self, "workspace_box", tuple(float(v) for v in self.workspace_box))
        if self.workspace_box and len(self.workspace_box) != 6:
            raise ValueError(f"workspace_box takes 6 numbers (low x y z, high x y z), got {len(self.workspace_box)}")
        if (self.workspace_box or self.workspace_sharpness is not None) and self.safety != "workspace":
            raise ValueError("workspace_box / workspace_sharpness configure --safety workspace, which is not on")
        if self.workspace_sharpness is not None and not self.workspace_sharpness > 0:
            raise ValueError(f"workspace_sharpness must be positive, got {self.workspace_sharpness}")
        check = getattr(agent, "check_session", None)
        if check is not None:
            check(self)

    @property
    def label(self) -> str:
        """The method as progress bars and summaries name it (the config's ``label`` where it has one)."""
        return str(getattr(self.agent, "label", self.method))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str) -> None:
        with open(path + ".tmp", "w") as f:
            json.dump(self.to_dict(), f, indent=2)
        os.replace(path + ".tmp", path)

    @classmethod
    def from_json(cls, path: str) -> "RLConfig":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_dict(cls, d: dict) -> "RLConfig":
        """From ``to_dict`` output that went through JSON or msgpack (lists for tuples). A flat
        dict (the layout before the method's settings were nested, or ``flat``'s keywords) is
        taken too: keys that are no session field go to the method's config."""
        from policies import get_config_class

        known = {f.name for f in dataclasses.fields(cls)}
        d = dict(d)
        method = d.get("method", DEFAULT_METHOD)
        mcls = get_config_class(method)
        rest = {k: d.pop(k) for k in list(d) if k not in known}
        agent = d.get("agent")
        if isinstance(agent, dict):
            agent = config_from_dict(mcls, agent)
        if rest:
            agent = replace_flat(agent if agent is not None else mcls(), rest, f"RLConfig (method {method!r})")
        d["agent"] = agent
        if "demos" in d:
            d["demos"] = tuple(d["demos"])
        return cls(**d)

    @classmethod
    def flat(cls, **kw: Any) -> "RLConfig":
        """Session and method settings in one namespace, as on the command line:
        ``RLConfig.flat(checkpoint=..., out=..., task=..., some_method_field=1)``."""
        return cls.from_dict(kw)


# -- nested config dataclasses <-> flat names ------------------------------------------------------
def flat_fields(cls: type, prefix: str = "") -> dict[str, tuple[str, dataclasses.Field, type]]:
    """{flat name: (dotted path, field, owning class)} of a config dataclass, nested dataclass fields
    (those whose default is a dataclass instance) flattened into their own field names."""
    out: dict[str, tuple[str, dataclasses.Field, type]] = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default):
            for name, (path, ff, owner) in flat_fields(type(f.default), prefix + f.name + ".").items():
                if name in out:
                    raise TypeError(f"{cls.__name__}: flat name {name!r} is used twice")
                out[name] = (path, ff, owner)
        else:
            if f.name in out:
                raise TypeError(f"{cls.__name__}: flat name {f.name!r} is used twice")
            out[f.name] = (prefix + f.name, f, cls)
    return out


def replace_flat(cfg: Any, values: dict[str, Any], what: str = "") -> Any:
    """``cfg`` with flat-named ``values`` replaced (nested dataclasses rebuilt); ValueError naming
    unknown names."""
    names = flat_fields(type(cfg))
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"{what or type(cfg).__name__} has no field(s) {unknown}")
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for k, v in values.items():
        head, _, tail = names[k][0].partition(".")
        if tail:  # a field of the nested dataclass ``head``: its flat name is ``k`` there too
            nested.setdefault(head, {})[k] = v
        else:
            top[head] = _coerce(getattr(cfg, head), v)
    for head, sub in nested.items():
        top[head] = replace_flat(getattr(cfg, head), sub, what)
    return dataclasses.replace(cfg, **top)


def config_from_dict(cls: type, d: dict[str, Any]) -> Any:
    """A (possibly nested) config dataclass from ``dataclasses.asdict`` output after JSON / msgpack."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
    kw = {}
    for k, v in d.items():
        default = fields[k].default
        if dataclasses.is_dataclass(default) and isinstance(v, dict):
            v = config_from_dict(type(default), v)
        kw[k] = _coerce(default, v)
    return cls(**kw)


def _coerce(default: Any, v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v
