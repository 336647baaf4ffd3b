"""Pieces shared by every RL module: the replay buffer (with RLPD's symmetric sampling), SAC with a
critic ensemble (RLPD), and a small image + state encoder (DrQ / DSRL-pi0 scale).

Import from the submodules (``policies.common.replay``, ``.sac``, ``.encoders``); this package
imports nothing at import time."""
