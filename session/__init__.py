"""The method-agnostic online RL session (``vla rl``): it runs any ``policies.base.Agent``, never
a method by name.

* ``config``: ``RLConfig`` (session fields + the method's nested config); ``flags``: command-line
  flags generated from documented config dataclasses.
* ``runner``: ``Session`` (rollout with operator interventions, replay routing, checkpoints,
  evaluation), the run directory, ``end_episode`` (the one per-episode bookkeeping) and
  ``run_session`` (in process).
* ``protocol`` / ``learner`` / ``actor``: the actor / learner split over ZMQ (one learner, one or several
  actors); ``pool``: ``vla rl --actors N``, the learner here and N actors as Ray actors.

Import from the submodules; this package imports nothing at import time.
"""
