"""SARL in the ``vla rl`` session (``policies.sarl.agent``): a corridor where only one prompt order succeeds.

A point starts at 0 on a line and must touch -1, then reach +1 (``CorridorEnv``). The stub VLA moves it by the
instruction it is given ("move left" / "move right"; anything else, the task's own "reach the far end", keeps
it still), so the base under the task prompt never succeeds, and the session's prompt policy must learn to say
"move left" first and "move right" after. The prompt library is the task's instruction and a prompts file; a
word-hash encoder stands in for MiniLM (no model load).

Checked: the greedy policy after the session succeeds where the base does not; a policy that cannot see the
state (features zeroed) cannot do it (one prompt choice per state is needed: left before the touch, right
after); the VLA's weights are unchanged; the grounding and the printed prompt sequence name the prompts; the
actor / learner split carries SARL's transitions and episode logs; a resumed session continues; a changed
library is refused on resume.
"""

from __future__ import annotations

import json
import threading
import zlib

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from policies.sarl.config import SARLConfig
from session.config import RLConfig

INSTRUCTION = "reach the far end"
PROMPTS = ["move left", "move right", "open the gripper"]


class HashEncoder:
    dim = 32

    def __call__(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i] += np.random.default_rng(zlib.crc32(w.encode())).standard_normal(self.dim)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-8)


class CorridorEnv(gym.Env):
    """pos in [-1, 1] from 0; touched = pos reached -1; success (reward 1, terminated) at pos >= 1 once touched.
    One action row moves the point by 0.125 x row; 64 ticks per episode."""

    max_ticks = 64

    def __init__(self) -> None:
        self.observation_space = spaces.Dict({"images": spaces.Dict({"front": spaces.Box(0, 255, (4, 4, 3), np.uint8)}),
                                              "state": spaces.Box(-1.0, 1.0, (2,), np.float32)})
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.pos, self.touched = 0.0, False

    def _obs(self):
        return {"images": {"front": np.zeros((4, 4, 3), np.uint8)},
                "state": np.array([self.pos, float(self.touched)], np.float32), "instruction": INSTRUCTION}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.touched = 0.0, False
        return self._obs(), {}

    def step(self, action):
        a = float(np.asarray(action, np.float32).reshape(-1)[0])
        self.pos = float(np.clip(self.pos + 0.125 * np.clip(a, -1, 1), -1, 1))
        self.touched |= self.pos <= -1 + 1e-6
        ok = self.touched and self.pos >= 1 - 1e-6
        sg = {"lifted_left": self.touched, "released": ok}
        return self._obs(), float(ok), ok, False, {"success": ok, "subgoals": sg}


def make_env():
    return CorridorEnv()


class StubVLA(torch.nn.Module):
    """embed = [pos, touched, direction of the instruction]; the chunk = that direction on every row. The first two
    columns are the summary a critic reads."""

    noise_shape = action_shape = (4, 1)
    embed_dim = 3
    embed_summary_dim = 2

    def __init__(self, blind: bool = False) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))
        self.blind = blind

    def embed(self, batch):
        state = torch.as_tensor(np.asarray(batch["state"]), dtype=torch.float32)
        d = torch.tensor([[-1.0 if "left" in t else 1.0 if "right" in t else 0.0] for t in batch["instruction"]])
        if self.blind:
            state = torch.zeros_like(state)
        return torch.cat([state, d], dim=1)

    def sample_actions_from_embedding(self, emb, noise=None, token=None, num_steps=None, normalized=False):
        return (emb[:, None, 2:3] * self.scale).expand(len(emb), 4, 1).clamp(-1, 1)  # the noise is not used

    def sample_actions(self, batch, noise=None, token=None, num_steps=None):  # the instruction handle
        return self.sample_actions_from_embedding(self.embed(batch), noise)

    def normalize_actions(self, a):
        return torch.as_tensor(a)

    def unnormalize_actions(self, a):
        return torch.as_tensor(a)


@pytest.fixture(autouse=True)
def hash_encoder(monkeypatch):
    monkeypatch.setattr("policies.sarl.library.default_encoder", lambda: HashEncoder())


@pytest.fixture
def prompts_file(tmp_path):
    p = tmp_path / "prompts.txt"
    p.write_text("# the robot's skills\n" + "\n".join(PROMPTS) + "\n")
    return str(p)


def _cfg(out, prompts: str, total_ticks: int = 3000, **kw) -> RLConfig:
    agent = SARLConfig(**{**dict(chunks_per_prompt=2, templates=False, prompts=prompts, hidden=(64, 64),
                                 warmup_steps=16, explore_decay_steps=150, temperature_start=0.5, updates_per_step=4,
                                 batch_size=32, n_step=3, gamma=0.9, tau=0.05), **kw})
    return RLConfig(checkpoint="stub", out=str(out), task="", env="tests.policies.test_sarl_session:make_env",
                    method="sarl", agent=agent, instruction=INSTRUCTION, total_ticks=total_ticks, warmup_steps=0,
                    eval_every=0, eval_episodes=3, videos=0)


def test_sarl_learns_the_prompt_order_in_a_session_and_a_blind_policy_cannot(prompts_file, tmp_path, capsys):
    from session.runner import run_session

    torch.set_num_threads(1)
    vla = StubVLA()
    before = {k: v.clone() for k, v in vla.state_dict().items()}
    s = run_session(_cfg(tmp_path / "run", prompts_file), make_env(), vla, progress=True)
    assert s["base_success_rate"] == 0.0  # the task prompt alone never moves the point
    assert s["final_success_rate"] == 1.0, s
    assert s["vla_weights_unchanged"] and all(torch.equal(before[k], v) for k, v in vla.state_dict().items())
    printed = capsys.readouterr().out
    assert "move left" in printed and "move right" in printed  # the learned sequence is printed
    seq = printed[printed.index("final evaluation"):].splitlines()[1]
    assert seq.index("move left") < seq.index("move right"), seq
    g = json.loads((tmp_path / "run/grounding.json").read_text())
    assert g["move left"]["subgoals"].get("lifted_left", 0) > 0 and g["move right"]["success_after"] > 0
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    assert all(e["sarl_steps"] and all(st["chunks"] <= 2 for st in e["sarl_steps"]) for e in eps)
    assert sum(e["success"] for e in eps[-10:]) >= 7  # training episodes succeed by the end too
    assert s["agent"]["library_size"] == 4

    blind = run_session(_cfg(tmp_path / "blind", prompts_file), make_env(), StubVLA(blind=True), progress=False)
    assert blind["final_success_rate"] == 0.0  # one prompt per (blind) state: left forever or right forever


def test_subgoal_terminator_ends_a_prompt_at_its_subgoal(prompts_file, tmp_path):
    """PRIVILEGED sub-goals: "move left" ends as soon as -1 is touched (``lifted_left`` becomes true), before its
    chunk budget."""
    from session.runner import Session

    cfg = _cfg(tmp_path / "run", prompts_file, terminator="subgoal", chunks_per_prompt=8)
    sess = Session(cfg, make_env(), StubVLA(), progress=False)
    agent = sess.agent
    left = agent.library.index("move left")
    agent.policy.act = lambda feat, greedy=False: left  # always "move left": its first step touches -1
    r = sess.run_episode(seed=0, learn=False, deterministic=True)
    steps = r["agent"]["sarl_steps"]
    assert steps[0] == {"prompt": "move left", "chunks": 2, "subgoals": ["lifted_left"], "done": True}  # 8 rows: 2 chunks
    assert all(st["chunks"] == 8 for st in steps[1:-1])  # then nothing new becomes true: the budget ends them


class CorridorTask:
    """A sim-task-like object (duck typed as ``hardware.sim_tasks.Task``): two sub-skills with instructions."""

    instruction = INSTRUCTION
    train_wordings = ()
    skills = (("left",), ("right",))

    @staticmethod
    def skill_instruction(skill):
        return f"move {skill[0]}"


def test_the_hand_written_sequence_moves_on_when_the_terminator_fires_and_retries_when_the_cap_ends_a_prompt(
        prompts_file, tmp_path):
    from session.runner import Session

    import dataclasses

    cfg = _cfg(tmp_path / "run", prompts_file, terminator="subgoal", prompt_policy="subskills", chunks_per_prompt=1)
    with pytest.raises(ValueError, match="sub-skills"):  # the session's env is no sim task: no sequence to follow
        Session(cfg, make_env(), StubVLA(), progress=False)
    sess = Session(dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, prompt_policy="learned")),
                   make_env(), StubVLA(), progress=False)
    sess.agent.cfg = cfg.agent
    sess.agent.bind(task=CorridorTask(), instruction=None)
    r = sess.run_episode(seed=0, learn=False, deterministic=True)
    prompts = [st["prompt"] for st in r["agent"]["sarl_steps"]]
    # "move left" is capped after 1 chunk without reaching -1 (retried), its sub-goal fires on the 2nd; then right
    assert prompts == ["move left", "move left"] + ["move right"] * 4 and r["success"], prompts


def test_semantic_transitions_are_assembled_from_the_chunks(prompts_file, tmp_path):
    """The learner joins one prompt's chunks into one semantic step: s at its first chunk, the summed reward,
    s' after its last; an episode's last step is terminated (success) or truncated (time limit)."""
    from session.runner import Session

    sess = Session(_cfg(tmp_path / "run", prompts_file, total_ticks=200), make_env(), StubVLA(), progress=False)
    agent = sess.agent
    seen = []
    agent.policy.observe = lambda *a: seen.append(a)  # record instead of learning
    order = iter([agent.library.index(p) for p in ["move left", "move right", "move right", "move right"]] * 10)
    agent.policy.act = lambda feat, greedy=False: next(order)
    agent.policy.steps = 10 ** 6  # past warm-up: the policy chooses
    r = sess.run_episode(seed=0)
    assert r["success"] and r["steps"] == 6  # 2 chunks left (touch), then 2 + 2 chunks right
    sess.learn()
    assert [s[1] for s in seen] == [agent.library.index(p) for p in ["move left", "move right", "move right"]]
    assert [s[2] for s in seen] == [0.0, 0.0, 1.0] and [s[4] for s in seen] == [False, False, True]
    np.testing.assert_allclose(seen[0][0], [0, 0])
    np.testing.assert_allclose(seen[0][3], [-1, 1])
    np.testing.assert_allclose(seen[1][0], [-1, 1])
    np.testing.assert_allclose(seen[1][3], [0, 1])
    # a time-limited episode: its last step is truncated once the next episode's first chunk arrives
    stay = agent.library.index(INSTRUCTION)
    agent.policy.act = lambda feat, greedy=False: stay
    sess.run_episode(seed=1)
    sess.learn()
    n = len(seen)
    sess.run_episode(seed=2)
    sess.learn()
    # 64 ticks = 16 chunks = 8 prompts of 2: 7 were complete after the episode, its 8th once the next one started
    assert [s[5] for s in seen[n - 7:n + 1]] == [False] * 7 + [True] and not any(s[4] for s in seen[n - 7:])


def test_sarl_over_the_actor_learner_split_and_resume(prompts_file, tmp_path):
    from session.actor import ActorConfig, run_actor
    from session.learner import Learner
    from session.runner import run_session

    torch.set_num_threads(1)
    cfg = _cfg(tmp_path / "run", prompts_file, total_ticks=400)
    ln = Learner(cfg, StubVLA(), bind="tcp://127.0.0.1:*", progress=False)
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(summary=ln.serve()), daemon=True)
    th.start()
    summary = run_actor(ActorConfig(learner=ln.endpoint, learner_timeout_s=20, heartbeat_s=0.1),
                        make_env=lambda c: make_env(), load_vla=lambda c: StubVLA(), progress=False)
    th.join(timeout=60)
    assert not th.is_alive()
    s = out["summary"]
    assert summary["ticks"] == s["ticks"] >= 400 and s["vla_weights_unchanged"]
    assert summary["params_version"] > 0 and s["update_rounds"] > 0  # semantic steps reached the learner's critic
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    assert eps and all(e["sarl_steps"] for e in eps)  # the actor's episode logs crossed the wire
    assert (tmp_path / "run/grounding.json").is_file()

    # resume the learner's run directory in process for 200 more ticks
    more = RLConfig.from_json(str(tmp_path / "run/rl_config.json"))
    import dataclasses

    s2 = run_session(dataclasses.replace(more, total_ticks=600), make_env(), StubVLA(), resume=True, progress=False)
    assert s2["ticks"] >= 600 and s2["episodes"] > s["episodes"]
    # another library: refused, naming the cause
    other = dataclasses.replace(more, total_ticks=800, agent=dataclasses.replace(more.agent, templates=True))
    with pytest.raises(ValueError, match="prompt library"):
        run_session(other, make_env(), StubVLA(), resume=True, progress=False)
