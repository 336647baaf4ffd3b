"""Safety layers for online RL on hardware: AutoSafe (``policies.safety.autosafe``: a SAC actor blended
with a certified safe controller by a learned, margin-dependent weight) and the hard Simplex filter it
is compared with; ``policies.safety.cartpole``, their test bed (a continuous-force cart-pole, its LQR
and ellipsoidal safe set); ``policies.safety.workspace``, AutoSafe on the arm (a workspace-box spec and a
row-by-row guard for any agent's action chunk); SafeExplorer (``policies.safety.safeexplorer``: PPO with a
deterministic recovery outside a safe region) and its cheap MuJoCo body ``policies.safety.balance``.
Import from the submodules; this package imports nothing at import time."""
