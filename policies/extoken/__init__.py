"""ExToken (`vla rl --method extoken`): behaviour tokens from clustered demonstrations; `prior` builds the token prior.

No paper id or code found (``shared/METHODS.md``, ExToken): a reconstruction. ``prior`` clusters the demos into
tokens 1..K (``vla tokens``) for a token-conditioned VLA pi(a | s, c) (``vla train --tokens``); ``agent`` explores
over the tokens on top of GRPO and trains the selector p(c | s) (``selector``) that picks the token at deployment.
Each choice is named on its config field (``policies/extoken/config.py``). Reconstructions (R):

* (R) The RL method that improves pi(a | s, c) is GRPO (``policies.grpo``): groups of rollouts from one scene,
  token-level PPO over the stochastic sampler's denoising steps, KL to the base; the ratio and the KL are taken
  under the rollout's own token. ``--no-learn-policy`` leaves the VLA frozen: the selector alone, a contextual bandit.
* (R) Stratified exploration: each group cycles through a random permutation of the tokens, so every token is tried
  in every scene (group_size >= K); the paper only says tokens are sampled during rollouts.
* (R) The selector is an MLP over the session's frozen VLA's ``embed(obs)`` (its input does not drift while the
  policy trains), fitted after each update on the episodes' GRPO group advantages of every decision so far (up to
  ``selector_memory``) to METHODS.md's objective, "trained on returns with entropy and a KL to the demos' token
  prior": max E_p[A] - beta KL(p(. | s) || prior). Default ``awr``: advantage-weighted regression onto
  prior(c) exp(A / beta), that objective's closed-form optimum. ``pg``: truncated-importance REINFORCE (p / q) with an
  entropy bonus (0.1) and the KL, the first reconstruction; on the crowded pick it went deterministic after one
  update and never moved again, as the p / q-weighted gradient vanishes for a dropped token
  (``policies.extoken.selector``; the weights and sizes are ours).
* (R) The prior is the config's ``--prior``, else the checkpoint's ``tokens`` block (when the VLA says where it was
  loaded from), else uniform.
* (R) Deployment: the selector's argmax on the episode's first observation (``token_unit chunk``: every macro-step's);
  ``--deploy random`` / ``null`` are the ablations.
"""
