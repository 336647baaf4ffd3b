"""Residual off-policy RL over a frozen VLA (ResFiT / Policy Decorator): ``vla rl --method residual``.

``ResidualAgent`` (``policies.residual.agent``) adds a bounded, learned correction to each executed row of
the VLA's chunk; ``ResidualConfig`` (``policies.residual.config``) holds its settings. Import the submodules
(the config has no torch)."""
