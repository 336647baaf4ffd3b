"""``AutoSafeConfig``: the settings of the AutoSafe layer (``policies.safety.autosafe``), torch-free."""

from __future__ import annotations

import dataclasses

from policies.common.sac_config import SACConfig


@dataclasses.dataclass(frozen=True)
class AutoSafeConfig:
    sharpness_init: float = 1.0
    """Initial sharpness p(s) of the blend (the head's bias; its weights start near 0). p -> 0 gives the
    linear blend lambda = 1 - Delta; a large p hands control to the learner everywhere but near the boundary."""
    sharpness_eps: float = 1e-3
    """p = p_max tanh((softplus(head) + eps) / p_max): eps keeps p > 0."""
    sharpness_max: float = 2.0
    """p_max, a smooth cap on p. A large p lets the learner act with almost full authority a little inside
    the boundary, and a single step of full force can then cross it: the cap is part of the certificate
    and depends on the system (cart-pole, ``policies.safety.cartpole``: a uniform random actor stays in the
    safe set with p <= 2, not with p = 10)."""
    blend_floor: float = 1e-6
    """The log-prob uses log max(1 - lambda, blend_floor): at the boundary (lambda = 1) the blended policy
    is a point mass on a_safe and its density is infinite; this bounds the entropy term there."""
    sac: SACConfig = SACConfig(num_critics=2, critic_subset=2, utd=1, update_schedule="per_step")
    """The SAC under the layer (critic, temperature and update unchanged; CleanRL's 2 critics, UTD 1)."""

    def __post_init__(self) -> None:
        if not self.sharpness_eps > 0:
            raise ValueError(f"sharpness_eps must be > 0 (p must stay positive), got {self.sharpness_eps}")
        if not self.sharpness_max > self.sharpness_eps:
            raise ValueError(f"sharpness_max ({self.sharpness_max}) must exceed sharpness_eps ({self.sharpness_eps})")
        if not self.sharpness_eps < self.sharpness_init < self.sharpness_max:
            raise ValueError(f"sharpness_init ({self.sharpness_init}) must lie strictly between sharpness_eps "
                             f"({self.sharpness_eps}) and sharpness_max ({self.sharpness_max})")
        if not 0 < self.blend_floor < 1:
            raise ValueError(f"blend_floor must be in (0, 1), got {self.blend_floor}")
