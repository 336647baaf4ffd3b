"""SARL's core without a simulator: the prompt library, the terminators, the semantic MDP and the prompt
policy (critic, exploration, n-step TD, persistence, grounding).

The learning test is a synthetic semantic MDP over a chunk-level env: six prompts, of which only the
order "open the drawer" -> "pick up the red cube" -> "put it in the drawer" completes the task (sparse
reward 1 at the end). The right prompt for the current stage makes progress with probability 0.8 per
chunk and completes its stage after two such chunks; a wrong prompt undoes the stage's progress. The
prompt policy observes a one-hot of the stage. A prompt is held for up to K = 3 chunks, ended early by a
privileged sub-goal terminator when its stage completes. SARL must reach >= 90% greedy success within a
fixed budget of episodes; the same training with every prompt embedding zeroed (the critic cannot tell
the prompts apart) must not, and neither does a uniformly random prompt choice.
"""

from __future__ import annotations

import dataclasses
import json
import time
import zlib

import numpy as np
import pytest
import torch

from policies.sarl import (ChunkBudget, ClassifierTerminator, Grounding, PrivilegedSubgoalTerminator, PromptLibrary,
                           PromptPolicy, SARLConfig, SemanticEnv)
from policies.sarl.critic import NStepReturns

torch.set_num_threads(1)

PROMPTS = ("open the drawer", "pick up the red cube", "put it in the drawer", "pick up the blue cube",
           "close the drawer", "push the red cube")
SOLUTION = (0, 1, 2)  # library indices, in the order that completes the task
STAGES = len(SOLUTION)
K = 3  # chunks per prompt
MAX_STEPS = 8  # semantic steps per episode
TRAIN_EPISODES = 150
EVAL_EPISODES = 50
CFG = SARLConfig(chunks_per_prompt=K, max_semantic_steps=MAX_STEPS, gamma=0.9, n_step=3, lr=1e-3, batch_size=64,
                 hidden=(64, 64), tau=0.05, exploration="boltzmann", temperature_start=0.5, temperature_end=0.02,
                 explore_decay_steps=600, replay_capacity=5000, updates_per_step=2, warmup_steps=40, seed=0)


class HashEncoder:
    """A deterministic stand-in for the MiniLM encoder: each word is a fixed random vector (seeded by
    its CRC32), a text the normalised sum of its words' vectors, so texts sharing words are near."""

    dim = 64

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace(",", " ").split():
                out[i] += np.random.default_rng(zlib.crc32(w.encode())).standard_normal(self.dim)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-8)


class StagedChunkEnv:
    """The chunk-level env behind the synthetic semantic MDP (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.stage, self.progress = 0, 0

    def obs(self) -> np.ndarray:
        return np.eye(STAGES + 1, dtype=np.float32)[self.stage]

    def info(self) -> dict:
        return {"subgoals": {f"stage_{k + 1}": self.stage > k for k in range(STAGES)},
                "success": self.stage == STAGES, "ticks": 5}

    def reset(self) -> tuple[np.ndarray, dict]:
        self.stage, self.progress = 0, 0
        return self.obs(), self.info()

    def step_chunk(self, prompt: str) -> tuple[np.ndarray, float, bool, bool, dict]:
        if prompt == PROMPTS[SOLUTION[self.stage]]:
            self.progress += int(self.rng.random() < 0.8)
            if self.progress == 2:
                self.stage, self.progress = self.stage + 1, 0
        else:
            self.progress = 0
        done = self.stage == STAGES
        return self.obs(), float(done), done, False, self.info()


def make_env(seed: int) -> SemanticEnv:
    env = StagedChunkEnv(seed)
    return SemanticEnv(env.reset, env.step_chunk, PrivilegedSubgoalTerminator(), max_chunks=K, max_steps=MAX_STEPS)


def run_episode(policy: PromptPolicy | None, senv: SemanticEnv, library: PromptLibrary, rng: np.random.Generator,
                greedy: bool, grounding: Grounding | None = None) -> bool:
    """One episode; ``policy`` None picks prompts uniformly. Training (not greedy): observe + update."""
    obs, _ = senv.reset()
    while True:
        p = int(rng.integers(len(library))) if policy is None else policy.act(obs, greedy=greedy)
        res = senv.step(library[p])
        if not greedy:
            policy.observe(obs, p, res.reward, res.obs, res.terminated, res.truncated)
            if policy.ready:
                policy.update()
        if grounding is not None:
            grounding.record(res)
        obs = res.obs
        if res.done:
            if grounding is not None:
                grounding.end_episode(res.success)
            return res.success


def success_rate(policy: PromptPolicy | None, library: PromptLibrary, seed: int = 123) -> float:
    senv, rng = make_env(seed), np.random.default_rng(seed)
    return float(np.mean([run_episode(policy, senv, library, rng, greedy=True) for _ in range(EVAL_EPISODES)]))


def train(embeddings: np.ndarray, library: PromptLibrary, grounding: Grounding | None = None,
          cfg: SARLConfig = CFG) -> PromptPolicy:
    policy = PromptPolicy(cfg, state_dim=STAGES + 1, prompt_embeddings=embeddings)
    senv = make_env(cfg.seed)
    for _ in range(TRAIN_EPISODES):
        run_episode(policy, senv, library, np.random.default_rng(0), greedy=False, grounding=grounding)
    return policy


@pytest.fixture(scope="module")
def library() -> PromptLibrary:
    return PromptLibrary.from_prompts(PROMPTS, encoder=HashEncoder())


@pytest.fixture(scope="module")
def trained(library: PromptLibrary) -> tuple[PromptPolicy, Grounding, float]:
    grounding = Grounding(library.prompts)
    t0 = time.process_time()
    policy = train(library.embeddings, library, grounding)
    return policy, grounding, time.process_time() - t0


# -- learning ------------------------------------------------------------------------------------------
def test_sarl_finds_the_prompt_sequence(trained, library: PromptLibrary) -> None:
    policy, grounding, cpu_s = trained
    rate = success_rate(policy, library)
    assert rate >= 0.9, f"greedy success {rate:.2f} after {TRAIN_EPISODES} episodes ({cpu_s:.1f} CPU s)"
    # the greedy policy gives the solution's prompt at every stage
    for stage, p in enumerate(SOLUTION):
        assert policy.act(np.eye(STAGES + 1, dtype=np.float32)[stage], greedy=True) == p


def test_epsilon_greedy_exploration_also_finds_it(library: PromptLibrary) -> None:
    policy = train(library.embeddings, library, cfg=dataclasses.replace(CFG, exploration="epsilon", seed=1))
    assert success_rate(policy, library) >= 0.9


def test_exploration_schedule_and_warmup(library: PromptLibrary) -> None:
    policy = PromptPolicy(CFG, STAGES + 1, library.embeddings)
    with pytest.raises(RuntimeError, match="warm-up"):
        policy.update()
    s = np.eye(STAGES + 1, dtype=np.float32)[0]
    picks = {policy.act(s) for _ in range(200)}  # warm-up: uniform over the library
    assert picks == set(range(len(library)))
    policy.steps = CFG.warmup_steps
    assert policy.exploration() == pytest.approx(CFG.temperature_start)
    policy.steps = CFG.warmup_steps + CFG.explore_decay_steps // 2
    assert policy.exploration() == pytest.approx((CFG.temperature_start + CFG.temperature_end) / 2)
    policy.steps = 10**6
    assert policy.exploration() == pytest.approx(CFG.temperature_end)
    with pytest.raises(ValueError, match="outside the library"):
        policy.observe(s, len(library), 0.0, s, False, False)
    with pytest.raises(ValueError, match="state features"):
        policy.act(np.zeros(2, np.float32))


def test_control_without_prompt_embeddings_fails(library: PromptLibrary) -> None:
    # the same training, with the critic blind to which prompt it scores: it cannot prefer the right one
    blind = train(np.zeros_like(library.embeddings), library)
    assert success_rate(blind, library) <= 0.3
    assert success_rate(None, library) <= 0.3  # and a uniformly random prompt choice is far from the bar


def test_grounding_records_what_each_prompt_did(trained, library: PromptLibrary) -> None:
    _, grounding, _ = trained
    g = json.loads(grounding.to_json())
    assert sum(r["chosen"] for r in g.values()) > TRAIN_EPISODES
    assert set(g[PROMPTS[0]]["subgoals"]) == {"stage_1"}  # opening the drawer grounds stage 1 only
    assert g[PROMPTS[2]]["succeeded_under"] > 0 and g[PROMPTS[3]]["subgoals"] == {}
    assert g[PROMPTS[0]]["mean_ticks"] == pytest.approx(5 * g[PROMPTS[0]]["mean_chunks"])
    assert json.loads(Grounding.from_json(grounding.to_json()).to_json()) == g


def test_save_load_round_trip(trained, library: PromptLibrary, tmp_path) -> None:
    policy, _, _ = trained
    path = tmp_path / "sarl.pt"
    policy.save(path)
    assert not (tmp_path / "sarl.pt.tmp").exists()
    fresh = PromptPolicy(dataclasses.replace(CFG, seed=7), STAGES + 1, library.embeddings)
    states = np.eye(STAGES + 1, dtype=np.float32)
    assert not np.allclose(fresh.q_values(states[0]), policy.q_values(states[0]))
    fresh.load(path)
    for s in states:
        np.testing.assert_array_equal(fresh.q_values(s), policy.q_values(s))
    assert (fresh.steps, fresh.updates, len(fresh.replay)) == (policy.steps, policy.updates, len(policy.replay))
    assert fresh.act(states[1]) == policy.act(states[1])  # same sampling generator state
    other = PromptLibrary.from_prompts(PROMPTS[:5], encoder=HashEncoder())
    with pytest.raises(ValueError, match="prompt library"):
        PromptPolicy(CFG, STAGES + 1, other.embeddings).load(path)


def test_n_step_returns() -> None:
    s = [np.full(2, i, np.float32) for i in range(5)]
    ns = NStepReturns(n=2, gamma=0.5)
    assert ns.push(s[0], 0, 0.0, s[1], False, False) == []
    (tr,) = ns.push(s[1], 1, 1.0, s[2], False, False)
    assert tr[1:3] == (0, 0.5) and tr[3] is s[2] and tr[4:] == (False, 0.25)
    out = ns.push(s[2], 2, 2.0, s[3], True, False)  # terminal: both pending transitions leave, done
    assert [(p, r, d, g) for _, p, r, _, d, g in out] == [(1, 2.0, True, 0.25), (2, 2.0, True, 0.5)]
    assert ns.push(s[0], 0, 1.0, s[1], False, False) == []
    out = ns.push(s[1], 3, 0.0, s[2], False, True)  # truncated: both leave not done, bootstrapping from s[2]
    assert [(p, r, d, g) for _, p, r, _, d, g in out] == [(0, 1.0, False, 0.25), (3, 0.0, False, 0.5)]
    assert all(nxt is s[2] for _, _, _, nxt, _, _ in out) and not ns.pending


# -- the library -----------------------------------------------------------------------------------------
def test_snap_maps_a_paraphrase_to_its_prompt(library: PromptLibrary) -> None:
    prompt, sim = library.snap("please pick up the red cube now")
    assert prompt == "pick up the red cube" and 0.5 < sim < 1.0
    assert library.snap("open the drawer") == ("open the drawer", pytest.approx(1.0))
    assert library.index("  pick up the  blue cube ") == 3
    with pytest.raises(KeyError, match="closest is 'close the drawer'"):
        library.index("close the drawer please")


def test_library_errors_are_clear() -> None:
    enc = HashEncoder()
    with pytest.raises(ValueError, match="empty"):
        PromptLibrary.from_prompts([], encoder=enc)
    with pytest.raises(ValueError, match=r"\['open the drawer'\] more than once"):
        PromptLibrary.from_prompts(["open the drawer", "open  the drawer"], encoder=enc)
    with pytest.raises(ValueError, match="empty"):
        PromptLibrary.from_prompts(["open the drawer", "  "], encoder=enc)

    class Liar:  # declares 32 dims, returns 64
        dim = 32

        def __call__(self, texts: list[str]) -> np.ndarray:
            return enc(texts)

    with pytest.raises(ValueError, match="dimension mismatch: the encoder declares dim=32"):
        PromptLibrary.from_prompts(["open the drawer"], encoder=Liar())
    lib = PromptLibrary.from_prompts(["open the drawer"], encoder=enc)
    lib.encoder = lambda texts: np.ones((len(texts), 16), np.float32)  # an encoder swapped after building
    with pytest.raises(ValueError, match="dimension mismatch"):
        lib.snap("open the drawer")


def test_library_from_a_sim_task() -> None:
    from hardware.sim_tasks import get_task  # the test reads a real task; policies/ itself never imports hardware

    task = get_task("stack_cubes")
    lib = PromptLibrary.from_sim_task(task, encoder=HashEncoder())
    assert lib.prompts[:4] == ("stack the green cube on the red cube", "put the green block on top of the red block",
                               "pick up the green cube", "put it on the red cube")
    assert "place the green cube onto the red cube" not in lib  # a held-out wording stays out
    assert "put it in the bowl" in lib and "push the blue cube to the pink marker" in lib
    # 2 wordings + 2 sub-skills + 13 expanded templates, of which the 2 sub-skill prompts are repeats
    assert len(set(lib.prompts)) == len(lib) == 2 + 2 + 13 - 2
    assert lib.embeddings.shape == (len(lib), HashEncoder.dim)
    assert PromptLibrary.from_sim_task(task, encoder=HashEncoder(), paraphrases=False).prompts[1] == \
        "pick up the green cube"
    with pytest.raises(ValueError, match="unknown slot"):
        PromptLibrary.from_sim_task(task, encoder=HashEncoder(), templates=["put it in the {place}"])


# -- terminators and the semantic step -------------------------------------------------------------------
class Counter:
    """A chunk env whose state is the number of chunks executed; sub-goal ``three`` holds from chunk 3."""

    def __init__(self, end_at: int = 100) -> None:
        self.n, self.end_at = 0, end_at

    def reset(self) -> tuple[int, dict]:
        self.n = 0
        return 0, {"subgoals": {"three": False}}

    def step_chunk(self, prompt: str) -> tuple[int, float, bool, bool, dict]:
        self.n += 1
        done = self.n >= self.end_at
        return self.n, float(done), done, False, {"subgoals": {"three": self.n >= 3}, "success": done}


def test_chunk_budget_stops_at_k() -> None:
    env = Counter()
    senv = SemanticEnv(env.reset, env.step_chunk, ChunkBudget(4), max_chunks=10, max_steps=3, ticks_per_chunk=7)
    senv.reset()
    res = senv.step("anything")
    assert (res.chunks, res.ticks, res.obs, res.stopped_by, res.done) == (4, 28, 4, "terminator", False)
    assert res.subgoals_reached == ("three",) and not res.success
    senv.step("anything")
    res = senv.step("anything")
    assert res.truncated and not res.terminated and res.obs == 12  # the semantic time limit
    with pytest.raises(RuntimeError, match="reset"):
        senv.step("anything")
    assert not ChunkBudget.privileged
    with pytest.raises(ValueError, match="k must be >= 1"):
        ChunkBudget(0)


def test_subgoal_terminator_stops_when_the_predicate_becomes_true() -> None:
    env = Counter()
    term = PrivilegedSubgoalTerminator()
    assert term.privileged and "PRIVILEGED" in PrivilegedSubgoalTerminator.__doc__
    senv = SemanticEnv(env.reset, env.step_chunk, term, max_chunks=10, max_steps=5)
    senv.reset()
    res = senv.step("go")
    assert (res.chunks, res.stopped_by, res.subgoals_reached) == (3, "terminator", ("three",))
    res = senv.step("go")  # "three" already held when this prompt began: only the budget K ends it
    assert (res.chunks, res.stopped_by, res.subgoals_reached) == (10, "budget", ())
    # a custom predicate (e.g. hardware.sim_tasks.skill_done of the prompted sub-skill), watched by name
    env2 = Counter()
    term2 = PrivilegedSubgoalTerminator(lambda obs, info: {"five": obs >= 5, "two": obs >= 2}, watch=["five"])
    senv2 = SemanticEnv(env2.reset, env2.step_chunk, term2, max_chunks=10, max_steps=5)
    senv2.reset()
    assert senv2.step("go").chunks == 5


def test_classifier_terminator_and_episode_end() -> None:
    env = Counter(end_at=5)
    seen = []

    def classifier(obs: int, prompt: str) -> float:
        seen.append(prompt)
        return 0.9 if obs >= 2 else 0.1

    senv = SemanticEnv(env.reset, env.step_chunk, ClassifierTerminator(classifier), max_chunks=10, max_steps=5)
    senv.reset()
    res = senv.step("lift it")
    assert (res.chunks, res.stopped_by) == (2, "terminator") and set(seen) == {"lift it"}
    res = senv.step("lift it")  # the classifier fires after the first chunk now, unless min_chunks holds it
    assert res.chunks == 1
    senv2 = SemanticEnv(env.reset, env.step_chunk, ClassifierTerminator(classifier, min_chunks=10), max_chunks=10,
                        max_steps=5)
    senv2.reset()
    res = senv2.step("lift it")
    assert (res.chunks, res.stopped_by, res.terminated, res.success, res.reward) == (5, "episode", True, True, 1.0)


# -- config -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("chunks_per_prompt", 0), ("gamma", 1.5), ("n_step", 0), ("tau", 0.0),
                                         ("exploration", "softmax"), ("hidden", ()), ("warmup_steps", -1),
                                         ("batch_size", 10**6), ("temperature_end", 0.0), ("epsilon_start", 2.0)])
def test_config_errors_name_the_field(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        SARLConfig(**{field: value})
