"""SARL in a ``vla rl`` session: ``SARLAgent`` runs the semantic MDP of ``policies.sarl`` chunk by chunk, so the
method-agnostic session (resume, actor / learner split, evaluations, operator takeovers) runs it unchanged.

The session acts one chunk per macro-step; a semantic step (one prompt) spans several. The agent keeps the
prompt between macro-steps and decides at each one whether to choose a new prompt::

    begin_episode(obs, info)           a new episode: the next macro-step chooses a prompt
    act_chunk(aobs):                   if a prompt is due: p = pi(s) (PromptPolicy over the library),
                                       s = the frozen VLA's embedding summary under the *task's* instruction
                                       chunk = VLA(obs, instruction = library[p])[:exec_steps]   (frozen)
    after_chunk(obs, info)             chunks held += 1; the prompt ends after chunks_per_prompt chunks or
                                       when the terminator fires (budget / PRIVILEGED sub-goals / classifier)

Each stored (per-chunk) transition carries ``action = [p, starts a prompt, starts an episode]``. ``update``
reads the online buffer in order, joins the chunks of one prompt into one semantic transition (s at the
prompt's first chunk, the summed reward, s' after its last chunk, terminated / truncated from the episode's
end), feeds them to ``PromptPolicy.observe`` (n-step returns) and runs ``PromptPolicy.update`` once per new
semantic step after its warm-up. A prompt's step is complete when the next prompt (or episode) starts or its
episode terminates, so the learner (in process or remote) needs nothing but the transitions the protocol
already carries.

Departures from ``SemanticEnv`` (the standalone loop, ``tests/policies/test_sarl.py``): the episode's tick
limit is the time limit (``max_semantic_steps`` is not used in a session); an operator's chunk counts toward
the prompt held when it was executed (it is flagged, and goes to the demo buffer, which SARL does not read).
The VLA's weights are never touched: its instruction is the only handle.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
from typing import Any

import numpy as np
import torch

from policies.base import Act, Agent, check_handles
from policies.common.vla_features import embed_dim, summary_dim
from policies.sarl.config import SARLConfig
from policies.sarl.library import PromptLibrary
from policies.sarl.semantic import ChunkBudget, ClassifierTerminator, PrivilegedSubgoalTerminator, SemanticStepResult

PROMPT, STARTS_PROMPT, STARTS_EPISODE = 0, 1, 2
"""Columns of a stored transition's ``action``."""


def watched_subgoals(patterns: tuple[str, ...]):
    """``(obs, info) -> {name: bool}``: ``info["subgoals"]`` restricted to names matching ``patterns``."""
    def read(obs: Any, info: dict) -> dict[str, bool]:
        sg = info.get("subgoals") or {}
        return {k: bool(v) for k, v in sg.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}

    return read


class SARLAgent(Agent):
    name = "sarl"
    HANDLES = ("instruction", "embed", "embed_dim", "sample_actions_from_embedding")

    def __init__(self, vla, cfg: SARLConfig = SARLConfig(), seed: int = 0) -> None:
        self.vla = vla
        self.cfg = cfg
        self.seed = int(seed)
        h, a = (int(x) for x in vla.action_shape)
        self.exec_steps = h if cfg.exec_steps is None else int(cfg.exec_steps)
        if self.exec_steps > h:
            raise ValueError(f"SARLConfig.exec_steps {self.exec_steps} exceeds the VLA's chunk of {h} rows")
        self.chunk_shape = (self.exec_steps, a)
        self.feat_dim = embed_dim(vla)
        self.summary_dim = summary_dim(vla, self.feat_dim)
        self.obs_spec = {"feat": ((self.summary_dim,), np.float32)}
        self.action_dim = 3  # [prompt index, starts a prompt, starts an episode]
        self.noise_shape = tuple(int(x) for x in vla.noise_shape)
        self.generator = torch.Generator().manual_seed(self.seed)  # the VLA's sampler noise in training
        self.library: PromptLibrary | None = None
        self.policy = None
        self.terminator = None
        self.updates = 0
        # the episode in progress (acting side)
        self._due = True  # the next macro-step chooses a prompt
        self._first = True  # ... and is the first of its episode
        self._prompt = -1
        self._held = 0
        self._step_log: list[dict[str, Any]] = []  # this episode's prompts: what each did
        self._last_info: dict = {}
        self._before: set[str] = set()
        # learning side: the online buffer read in order
        self._read = 0
        self._open: list[int] = []  # buffer indices of the prompt being assembled

    @classmethod
    def build(cls, vla, cfg, seed: int = 0, observation_space=None) -> "SARLAgent":
        check_handles(vla, cls.HANDLES, cls.name)
        return cls(vla, cfg, seed=seed)

    # -- the session's task ------------------------------------------------------------------------
    def bind(self, task: Any = None, instruction: str | None = None) -> None:
        """Build the prompt library for the session's task: a sim task (``hardware.sim_tasks.Task``, read by
        duck typing) gives its instruction, trained paraphrases and sub-skill instructions; ``instruction``
        (a real robot's) and ``cfg.prompts`` (a file, one prompt per line) add theirs; ``cfg.templates`` the
        templates. Also the prompt critic and the terminator."""
        from policies.sarl.critic import PromptPolicy
        from policies.sarl.library import SIM_TEMPLATES, _clean, expand_templates, subskill_prompts, task_prompts

        prompts: list[str] = task_prompts(task) if task is not None else []
        if instruction:
            prompts.append(instruction)
        if self.cfg.prompts:
            if not os.path.isfile(self.cfg.prompts):
                raise FileNotFoundError(f"SARL prompts: {self.cfg.prompts} is not a file (one prompt per line)")
            with open(self.cfg.prompts) as f:
                prompts += [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
        if self.cfg.templates:
            prompts += expand_templates(SIM_TEMPLATES)
        subskills = subskill_prompts(task) if task is not None else []
        prompts = list(dict.fromkeys(_clean(p) for p in prompts))
        if not prompts:
            raise ValueError("SARL needs candidate prompts: a sim --task, an --instruction or --prompts FILE")
        if self.cfg.prompt_policy == "subskills" and not subskills:
            raise ValueError("SARL prompt_policy 'subskills' needs a sim --task made of sub-skills: the hand-written "
                             "sequence is their instructions")
        self.library = PromptLibrary(prompts)
        self.subskills = [self.library.index(p) for p in subskills]
        self.task_instruction = _clean(task.instruction if task is not None else (instruction or prompts[0]))
        self.policy = PromptPolicy(dataclasses.replace(self.cfg, seed=self.seed), self.summary_dim,
                                   self.library.embeddings)
        self.terminator = self._terminator()

    def _terminator(self):
        t = self.cfg.terminator
        if t == "budget":
            return ChunkBudget(self.cfg.chunks_per_prompt)
        if t == "subgoal":
            return PrivilegedSubgoalTerminator(watched_subgoals(self.cfg.subgoal_watch))
        from rewards.success_classifier import SuccessClassifier  # classifier:DIR

        model = SuccessClassifier.load(t[len("classifier:"):])

        def prob(obs: dict, prompt: str) -> float:
            return float(model.predict_proba({c: np.asarray(obs["images"][c])[None] for c in model.cameras})[0])

        return ClassifierTerminator(prob, threshold=model.threshold)

    def _need_bind(self) -> None:
        if self.policy is None:
            raise RuntimeError("SARLAgent.bind(task, instruction) must run before the agent acts or learns")

    # -- acting ------------------------------------------------------------------------------------
    def observe(self, obs: dict) -> dict[str, Any]:
        """The state features (the VLA's embedding summary under the task's own instruction) and, for
        ``act_chunk`` only, the observation batch (re-embedded under the chosen prompt there)."""
        from vla.envs import VLAPolicy

        self._need_bind()
        batch = VLAPolicy.batch(obs, instruction=self.task_instruction)
        feat = self.vla.embed(batch)
        return {"feat": feat[:, : self.summary_dim].float(), "emb": feat, "batch": batch}

    def begin_episode(self, obs: dict, info: dict, learn: bool = False) -> None:
        self._due, self._first, self._prompt, self._held = True, True, -1, 0
        self._step_log, self._last_info = [], dict(info)

    def act_chunk(self, aobs: dict[str, Any], rng: np.random.Generator, warmup: bool, deterministic: bool = False,
                  generator: torch.Generator | None = None) -> Act:
        """A new prompt when one is due (greedy in evaluations: ``deterministic`` or an evaluation's own
        ``generator``; uniform in the session's warm-up; else the policy's exploration), then one chunk of the
        frozen VLA under it, from the VLA's own sampler noise."""
        self._need_bind()
        greedy = deterministic or generator is not None
        starts = self._due
        if self._due:
            feat = aobs["feat"][0].numpy()
            if self.cfg.prompt_policy == "subskills":  # the next sub-skill once the terminator said this one is done
                done = sum(1 for st in self._step_log if st.get("done"))
                self._prompt = self.subskills[min(done, len(self.subskills) - 1)]
            elif self.cfg.prompt_policy == "random" or (warmup and not greedy):
                self._prompt = int(self.policy.rng.integers(self.policy.num_prompts))
            else:
                self._prompt = self.policy.act(feat, greedy=greedy)
            self._held = 0
            self._due = False
            self.terminator.start(self.library[self._prompt], None, self._last_info)
            self._before = {k for k, v in (self._last_info.get("subgoals") or {}).items() if v}
            self._step_log.append({"prompt": self.library[self._prompt], "chunks": 0, "subgoals": []})
        prompt = self.library[self._prompt]
        batch = aobs["batch"]
        emb = aobs["emb"] if prompt == self.task_instruction else self.vla.embed({**batch, "instruction": [prompt]})
        noise = torch.randn((1, *self.noise_shape), generator=generator or self.generator)
        chunk = self.vla.sample_actions_from_embedding(emb, noise=noise, normalized=True)[0, : self.exec_steps]
        first = self._first
        self._first = False
        return Act(action=np.array([self._prompt, float(starts), float(first)], np.float32), chunk=chunk.float())

    def after_chunk(self, obs: dict, info: dict) -> None:
        """The chunk ran: count it, note the sub-goals it reached (grounding), end the prompt when its budget is
        spent or the terminator fires."""
        self._held += 1
        self._last_info = dict(info)
        log = self._step_log[-1]
        log["chunks"] = self._held
        now = {k for k, v in (info.get("subgoals") or {}).items() if v}
        log["subgoals"] += sorted(now - self._before - set(log["subgoals"]))
        fired = bool(self.terminator.stop(obs, info, self._held))
        if fired:
            log["done"] = True  # the terminator (not the chunk cap) ended it: its sub-skill is done
        if fired or self._held >= self.cfg.chunks_per_prompt:
            self._due = True

    def episode_log(self) -> dict[str, Any]:
        """This episode's prompts, in order, with the chunks each was held, the sub-goals it reached and whether the
        terminator ended it (``done``; absent: the chunk cap or the episode's end did)."""
        return {"sarl_steps": [dict(s) for s in self._step_log],
                "sarl/prompts_per_episode": float(len(self._step_log))}

    def buffers(self, intervention: bool) -> tuple[str, ...]:
        return ("online", "demo") if intervention else ("online",)

    # -- learning ----------------------------------------------------------------------------------
    def _close(self, online, end: str) -> bool:
        """The prompt of ``self._open`` is complete: one semantic transition into the policy. ``end``:
        ``next`` (another prompt follows in the episode), ``terminated`` or ``truncated``."""
        idx, self._open = self._open, []
        if not idx:
            return False
        i0, i1 = idx[0], idx[-1]
        self.policy.observe(online.obs["feat"][i0], int(online.action[i0, PROMPT]), float(online.reward[idx].sum()),
                            online.next_obs["feat"][i1], end == "terminated", end == "truncated")
        return True

    def update(self, online, demo, rng: np.random.Generator) -> dict[str, float]:
        """Assemble the semantic steps completed since the last call, then one ``PromptPolicy.update``
        (``updates_per_step`` gradient steps) per new step once the policy's warm-up is over."""
        self._need_bind()
        new_steps = 0
        n = len(online)
        if n > online.capacity:
            raise RuntimeError("SARL reads the online buffer in order: it must not wrap")
        for i in range(self._read, n):
            a = online.action[i]
            if a[STARTS_PROMPT] > 0.5 and self._open:
                new_steps += self._close(online, "truncated" if a[STARTS_EPISODE] > 0.5 else "next")
            self._open.append(i)
            if online.done[i]:
                new_steps += self._close(online, "terminated")
        self._read = n
        info: dict[str, float] = {}
        for _ in range(new_steps):
            if self.policy.ready:
                info = self.policy.update()
                self.updates += 1
        if info:
            info["charts/semantic_steps"] = float(self.policy.steps)
        return info

    # -- persistence -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self._need_bind()
        return {"policy": self.policy.state_dict(), "read": self._read, "open": list(self._open),
                "updates": self.updates, "generator": self.generator.get_state(),
                "prompts": list(self.library.prompts)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self._need_bind()
        if list(d["prompts"]) != list(self.library.prompts):
            raise ValueError("the checkpoint's SARL prompt library differs from this session's (other task, "
                             "--prompts or --templates): resume with the settings it was started with")
        self.policy.load_state_dict(d["policy"])
        self._read, self._open, self.updates = int(d["read"]), [int(i) for i in d["open"]], int(d["updates"])
        self.generator.set_state(d["generator"])

    def actor_parameters(self) -> dict[str, torch.Tensor]:
        self._need_bind()
        params = {f"q.{k}": v for k, v in self.policy.q.state_dict().items()}
        params["steps"] = torch.tensor([self.policy.steps], dtype=torch.float32)
        return params

    def load_actor_parameters(self, params: dict[str, torch.Tensor]) -> None:
        self._need_bind()
        self.policy.q.load_state_dict({k[2:]: v for k, v in params.items() if k.startswith("q.")})
        self.policy.steps = int(params["steps"].reshape(-1)[0])

    def parameter_counts(self) -> dict[str, int]:
        n = 0 if self.policy is None else sum(p.numel() for p in self.policy.q.parameters())
        return {"critics": n, "total": n}

    # -- reporting ---------------------------------------------------------------------------------
    def summarize(self, run_dir: str) -> dict[str, Any]:
        """Grounding from the run's ``episodes.jsonl`` (per prompt: times chosen, chunks, sub-goals reached,
        successes after it), written to ``RUN/grounding.json``; -> the most chosen prompts and the learned
        greedy choice in the first state of an evaluation episode (see ``report``)."""
        from policies.sarl.critic import Grounding

        path = os.path.join(run_dir, "episodes.jsonl")
        g = Grounding(self.library.prompts)
        if os.path.isfile(path):
            for line in open(path):
                if not line.strip():
                    continue
                e = json.loads(line)
                for s in e.get("sarl_steps", []):
                    if s["prompt"] in g.records:
                        g.record(SemanticStepResult(prompt=s["prompt"], obs=None, reward=0.0, terminated=False,
                                                    truncated=False, success=False, chunks=int(s["chunks"]),
                                                    ticks=int(s["chunks"]) * self.exec_steps, stopped_by="",
                                                    subgoals_reached=tuple(s["subgoals"]), info={}))
                if e.get("sarl_steps"):  # the step that ended in success is the last one
                    last = e["sarl_steps"][-1]["prompt"]
                    if e["success"] and last in g.records:
                        g.records[last].succeeded_under += 1
                g.end_episode(bool(e["success"]))
        from vla.data.atomic import atomic_write_bytes

        text = g.to_json()
        atomic_write_bytes(os.path.join(run_dir, "grounding.json"), text.encode())
        table = json.loads(text)
        return {"grounding": {p: r for p, r in list(table.items())[:8] if r["chosen"]},
                "library_size": len(self.library)}

    def report(self, per_episode: list[dict[str, Any]]) -> list[str]:
        """Lines for the terminal: the prompt sequence of each evaluation episode (greedy) and its outcome."""
        lines = []
        for e in per_episode:
            steps = e.get("sarl_steps")
            if steps is None:
                continue
            seq = " -> ".join(f"{s['prompt']} ({s['chunks']})" for s in steps)
            lines.append(f"  seed {e['seed']}: {'success' if e['success'] else 'failure'}: {seq}")
        return lines
