"""GRPO on a flow VLA and LfH's hindsight relabelling (Xu, Jiang, ..., Agrawal, Hong, arXiv 2607.09042).

No public code: a reconstruction from the paper and ``shared/METHODS.md``; each choice is named on its config field
(``policies/grpo/config.py``). Departures and reconstructions (R):

* (R) Log-probabilities of a flow VLA: the stochastic sampler's Gaussian denoising steps
  (``vla.models.flow.FlowMatchingHead.sample_stochastic``, fixed ``sigma``; RLinf's flow-SDE / flow-noise learn or
  schedule it). Each denoising step is one token of the PPO ratio; the deterministic last step carries none.
* (R) Dual-clip PPO (c = 3, verl / RLinf's default) bounds negative-advantage tokens; LfH's hindsight ratio
  pi_theta(a | o, g') / pi_old(a | o, g) is far from 1 from the start, and the plain clip leaves it unbounded there.
* (R) The KL to the reference is the k3 estimator per token, not the analytic Gaussian KL.
* (R) The H-GRPO loss is rescaled to at most c (the 85th percentile of its magnitude over the first updates), the
  authors' code's rescaling rather than the paper's min.
* (R) GRPO trains the agent's own copy of the VLA (head, policy parts or LoRA); the base checkpoint never changes.
* Departure: groups per update and the learning rate fit a 2-core CPU, not RLinf's GPU batches.
"""
