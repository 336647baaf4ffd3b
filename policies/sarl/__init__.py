"""SARL: reinforcement learning over a semantic MDP whose actions are language prompts to a frozen VLA
(Bhatia, Wagenmaker, Chen, Levine, arXiv 2606.31958; METHODS.md "SARL").

In a session: ``vla rl --method sarl`` (``policies.sarl.agent.SARLAgent``, in ``policies.REGISTRY``) runs the
semantic MDP chunk by chunk in the method-agnostic session (resume, actor / learner split, evaluations): the agent
holds a prompt across macro-steps and the learner joins a prompt's chunks into one semantic transition. A fixed
prompt policy (``--prompt-policy subskills`` / ``random``) runs through the same code for baselines;
``bench/sarl.py`` measures them against the task prompt and DSRL.

A frozen multi-task VLA is a prior over skills; SARL learns *which instruction to give it when*. No code
is public: what METHODS.md records of the paper is the semantic MDP (prompts as actions to a frozen
VLA, a prompt held for a number of chunks or until a sub-goal, sparse task reward, TD over semantic
steps) and the result (real WidowX ~0% under the task's own prompt -> 80% after 60-100 online episodes,
ahead of residual RL and DSRL on long horizons). Everything marked (R) below is our reconstruction.

One semantic step (``semantic.SemanticEnv.step``)::

    s   = features of the observation                       the prompt policy's state
    p   = pi(s) over the library                            critic.PromptPolicy.act: one index
    repeat up to K chunks:                                  K = SARLConfig.chunks_per_prompt
        chunk = VLA(obs, instruction = library[p]); env executes it
        stop early when the episode ends or the terminator fires
    r   = the chunks' summed (sparse, task-success) reward; s' = features of the last observation

Modules: ``config`` (``SARLConfig``, no torch), ``library`` (``PromptLibrary``, numpy), ``semantic``
(``SemanticEnv``, the terminators, ``SemanticStepResult``; numpy-free), ``critic`` (``PromptPolicy``: the
critic, its update and persistence, read top to bottom; ``Grounding``). ``policies`` never imports
``hardware``: a sim task is read by duck typing and privileged predicates are passed in as callables.

Design choices, in METHODS.md's terms:

* Semantic MDP: an action is one prompt from a fixed library, held by the *frozen* VLA (its instruction
  is the only steering handle: no noise, no token, no weights change); the reward is the env's sparse
  task reward summed over the held chunks; success terminates (no bootstrap); the env's time limit and
  ``max_semantic_steps`` truncate (bootstrap).
* (R) Candidate prompts: a fixed library per session rather than fresh VLM proposals every step: the
  task's instruction and its *trained* paraphrases (held-out wordings stay out), its sub-skill
  instructions (``Task.skill_instruction``), and templates over verbs / objects / places
  (``SIM_TEMPLATES`` x ``SIM_COLOURS``), including combinations that make no sense for the task (the
  critic learns they do not help). Free text (a VLM's or an operator's proposal) enters through
  ``PromptLibrary.snap``: the nearest library prompt by cosine similarity, so the action set, and with it
  the critic's replay, stays fixed.
* (R) Prompt representation: the frozen text embedding of the prompt, MiniLM 384-d unit-norm
  (``vla.models.encoders.TextEncoder``: the encoder the compact VLA conditions on). The encoder is
  injectable; the paper's choice is not recorded.
* (R) Critic: a discrete critic over all library prompts in one batch, Q(s, e_p) = MLP([s, e_p]) with
  LayerNorm after each hidden layer (RLPD's critic), so similar prompts start with similar values;
  twin critics; double Q-learning (the online twins' mean picks the next prompt, the target twins'
  minimum scores it); Polyak-averaged targets (``tau`` after every gradient step); MSE loss, Adam,
  gradient-norm clipping.
* (R) TD over semantic steps: n-step returns (``n_step``, default 3) with ``gamma`` *per semantic step*
  (default 0.9: a 12-step horizon), so a success credits the prompts that set it up within a few
  updates; a replay of n-step semantic transitions (state, prompt index, n-step reward, next state,
  done, gamma^k), uniform sampling, ``updates_per_step`` gradient steps per semantic step (a semantic
  step costs seconds of robot time, a gradient step milliseconds).
* Holding a prompt: up to K chunks (the paper's "fixed number of chunks") or until a terminator fires:
  ``ChunkBudget`` (a fixed budget, deployable), ``PrivilegedSubgoalTerminator`` (the paper's "until a
  sub-goal", read from simulator state: PRIVILEGED, an upper bound for sim studies) and (R)
  ``ClassifierTerminator`` (a success classifier on observations: how "until a sub-goal" runs on a real
  robot).
* (R) Exploration: ``warmup_steps`` semantic steps of uniformly random prompts, then Boltzmann
  sampling softmax(Q / T) with T decayed linearly (default) or epsilon-greedy; evaluation is greedy.
* (R) State features: whatever vector the caller gives (in a session: the frozen VLA's embedding of
  the observation at the start of the semantic step).
* Ours, not the paper's: ``Grounding`` (per prompt: times chosen, ticks and chunks used, sub-goals
  that became true under it, successes) and ``SemanticStepResult.subgoals_reached``: diagnostics of
  what each prompt makes the VLA do; they never reach the critic.

Checked in ``tests/policies/test_sarl.py``: on a synthetic semantic MDP (6 prompts, one 3-prompt order
succeeds) the policy reaches >= 90% greedy success within 150 episodes (measured: 100% for 5 seeds of each
exploration), where the same training with zeroed prompt embeddings and a random prompt choice stay below
30%.
"""

from policies.sarl.config import EXPLORATIONS, SARLConfig
from policies.sarl.library import SIM_COLOURS, SIM_TEMPLATES, PromptLibrary, expand_templates
from policies.sarl.semantic import (ChunkBudget, ClassifierTerminator, PrivilegedSubgoalTerminator, SemanticEnv,
                                    SemanticStepResult, Terminator)

__all__ = ["EXPLORATIONS", "SARLConfig", "SIM_COLOURS", "SIM_TEMPLATES", "PromptLibrary", "expand_templates",
           "ChunkBudget", "ClassifierTerminator", "PrivilegedSubgoalTerminator", "SemanticEnv", "SemanticStepResult",
           "Terminator", "PromptPolicy", "Grounding"]


def __getattr__(name: str):
    if name in ("PromptPolicy", "Grounding"):  # torch: imported on first use only
        from policies.sarl import critic

        return getattr(critic, name)
    raise AttributeError(f"module 'policies.sarl' has no attribute {name!r}")
