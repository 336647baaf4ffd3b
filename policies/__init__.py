"""RL methods behind one ``Agent`` interface (``policies.base``) and ``REGISTRY``.

``REGISTRY`` maps a method name to ``(agent class, config dataclass)``, each given as an object
or as a ``"module:Class"`` string imported on use (so that importing ``policies`` imports no
method, and ``vla rl --help`` reads the configs without torch). A new method is a folder
``policies/<name>/`` and one line here.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

REGISTRY: dict[str, tuple[Any, Any]] = {
    "dsrl": ("policies.dsrl.agent:DSRLAgent", "policies.dsrl.config:DSRLConfig"),
    "residual": ("policies.residual.agent:ResidualAgent", "policies.residual.config:ResidualConfig"),
    "sarl": ("policies.sarl.agent:SARLAgent", "policies.sarl.config:SARLConfig"),
    "grpo": ("policies.grpo.agent:GRPOAgent", "policies.grpo.config:GRPOConfig"),
    "lfh": ("policies.grpo.agent:LfHAgent", "policies.grpo.config:LfHConfig"),
    "extoken": ("policies.extoken.agent:ExTokenAgent", "policies.extoken.config:ExTokenConfig"),
}
DEFAULT_METHOD = "dsrl"
"""The method of a session that names none."""


def _load(ref: Any) -> Any:
    if not isinstance(ref, str):
        return ref
    mod, _, name = ref.partition(":")
    return getattr(importlib.import_module(mod), name)


def _entry(name: str) -> tuple[Any, Any]:
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, list(REGISTRY), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown RL method {name!r} (known: {', '.join(sorted(REGISTRY))}){hint}")
    return REGISTRY[name]


def get_config_class(name: str) -> type:
    """The config dataclass of method ``name`` (imports only its config module)."""
    return _load(_entry(name)[1])


def get_method(name: str) -> tuple[type, type]:
    """-> (agent class, config dataclass) of method ``name``; a typo gets a did-you-mean."""
    agent, config = _entry(name)
    return _load(agent), _load(config)
