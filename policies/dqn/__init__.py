"""Nature-DQN for the keyboard rig (Atari through a camera and a USB keyboard).

Not in ``policies.REGISTRY``: the ``Agent`` interface is built around a VLA (it acts through the
VLA's steering handles and executes continuous action chunks in the VLA's normalised units),
while DQN owns its whole network and picks one of a few discrete key sets. So DQN is its own
module with its own training loop, run by ``bench/rig_gap.py`` and ``vla rig agent``:

* ``policies.dqn.config``: ``DQNConfig`` (frozen dataclass, documented fields; no torch);
* ``policies.dqn.preprocess``: frame preprocessing (rectify, grey, resize 84 x 84, stack 4) and
  ``AleEnv``, a gymnasium env straight on ale-py (pure emulation, fast, action repeat);
* ``policies.dqn.dqn``: the Nature CNN, the replay buffer, the update, the training loop with
  checkpoint / resume, and evaluation (CleanRL's ``dqn_atari.py`` layout);
* ``policies.dqn.teacher``: PRIVILEGED RAM trackers for Pong and Breakout (labels only);
* ``policies.dqn.bc``: behaviour cloning of the same CNN from a teacher, with DAgger rounds, in
  emulation or on the rig (``hardware.virtual_rig``).
"""
