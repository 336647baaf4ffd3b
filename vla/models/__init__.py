"""VLA backbones behind one interface (``vla.models.base.VLA``).

``BACKBONES`` maps a checkpoint kind to the module and class that load it (imported on use, so
``import vla.models`` stays light); ``load_vla(path)`` reads ``config.json`` and dispatches:
the compact flow VLA writes ``{"kind": "compact-flow-vla"}``, LeRobot policies write
``{"type": "pi0" | "pi05" | "smolvla"}``, a router over LeRobot ACT / Diffusion Policy peers
(evaluation-only baselines, ``vla.models.lerobot_peers``) writes ``{"kind": "lerobot-peer"}``.
A ``.onnx`` file written by ``vla export policy`` loads as ``vla.models.onnx_vla.OnnxVLA`` (its
sampler only, for ``vla eval``). ``resolve_checkpoint(path)`` turns a run directory into the
checkpoint directory it holds (what every command taking ``--vla`` / ``--checkpoint`` does first).
"""

from __future__ import annotations

import importlib
import json
import os

BACKBONES: dict[str, tuple[str, str]] = {
    "compact-flow-vla": ("vla.models.compact", "CompactVLA"),
    "pi0": ("vla.models.lerobot_adapters", "LeRobotVLA"),
    "pi05": ("vla.models.lerobot_adapters", "LeRobotVLA"),
    "smolvla": ("vla.models.lerobot_adapters", "LeRobotVLA"),
    "lerobot-peer": ("vla.models.lerobot_peers", "LeRobotPeer"),
    "onnx": ("vla.models.onnx_vla", "OnnxVLA"),
}


def checkpoint_kind(path: str) -> str:
    if str(path).endswith(".onnx"):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such ONNX file")
        return "onnx"
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        raise FileNotFoundError(f"{path}: no config.json, not a VLA checkpoint directory")
    with open(cfg) as f:
        meta = json.load(f)
    kind = meta.get("kind") or meta.get("type")
    if kind not in BACKBONES:
        raise ValueError(f"{cfg}: unknown VLA kind {kind!r}; known: {sorted(BACKBONES)}")
    return kind


def last_checkpoint(run_dir: str) -> str | None:
    """The checkpoint ``checkpoints/last`` of a training run names (``vla.train.save_checkpoint`` writes
    both), or None."""
    p = os.path.join(run_dir, "checkpoints", "last")
    if not os.path.isfile(p):
        return None
    with open(p) as f:
        d = os.path.join(run_dir, "checkpoints", f.read().strip())
    return d if os.path.isdir(d) else None


def resolve_checkpoint(path: str) -> str:
    """A checkpoint directory (with config.json), or a run directory (-> its final model or its
    last checkpoint)."""
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    for cand in (os.path.join(path, "model"), last_checkpoint(path)):
        if cand and os.path.isfile(os.path.join(cand, "config.json")):
            return cand
    raise FileNotFoundError(f"{path} is neither a checkpoint directory (config.json + model.safetensors) nor a "
                            "run directory with one")


def load_vla(path: str):
    """Load any supported VLA checkpoint directory, or an exported ``.onnx`` policy (eval mode, CPU)."""
    kind = checkpoint_kind(path)
    module, cls = BACKBONES[kind]
    klass = getattr(importlib.import_module(module), cls)
    model = klass.load(path) if kind == "compact-flow-vla" else klass.from_checkpoint(path, kind=kind)
    try:  # where it came from: a method reads the checkpoint's own metadata (ExToken's token prior)
        model.checkpoint_dir = os.path.abspath(path)
    except AttributeError:  # a backbone that refuses new attributes
        pass
    return model
