"""Export trained models to ONNX for the edge runtime (``vla export``). Needs torch; the runtime
half (``deploy.runtime``) reads the files with onnxruntime alone.

What is exported (one graph per file, opset ``OPSET``):

* **The compact VLA's sampler** (``export_vla``): camera frames -> trunk -> necks -> fusion ->
  every Euler step of the flow head (unrolled) -> un-normalised action chunk. Inputs:
  ``image_<camera>`` uint8 ``[B, S, S, 3]`` (each camera already cropped and resized to the
  model's ``image_size`` S: ``deploy.runtime.preprocess`` does it exactly as training did),
  ``state`` float32 ``[B, 8]``, ``instruction`` int64 ``[B]`` and ``noise`` float32 ``[B, H, A]``
  (the sampler's initial Gaussian). Output ``actions`` float32 ``[B, H, A]`` in robot units.
* **With a DSRL agent** (``agent=``): the same graph, but the sampler's noise is the DSRL noise
  actor's choice ``w = b tanh(mean + std * eps)`` read from the VLA's embedding; the graph's
  ``noise`` input is ``eps`` ``[B, d]`` (standard normal: the agent's sampled policy; zeros: its
  mean, the deterministic policy).
* **The success classifier** (``export_classifier``): ``image_<camera>`` uint8 ``[B, S, S, 3]``
  -> ``p_success`` float32 ``[B]``.

The instruction is not encoded on the edge: MiniLM (a 90 MB transformer with a tokenizer) would
double the install and the latency for a handful of fixed prompts. The embeddings of the
instructions named at export time are a constant table inside the graph and ``instruction`` is
an index into it; the metadata lists the strings, so the runner looks them up by name (an
instruction not exported is refused with the list of those that were).

Every file carries what the runner needs in ``metadata_props`` (JSON values, see ``METADATA``):
cameras, crops, image size, state and action layout, chunk length, rows to execute per chunk,
the instructions, the normalisation statistics (also baked into the graph), the parity measured
at export. A parity check against the torch model is part of every export: the fp32 graph must
match torch within ``PARITY_ATOL`` (max abs difference over random observations and noises) or
the export fails with ``ParityError`` and writes nothing. ``quantize=True`` also writes an int8
dynamically quantised copy (``onnxruntime.quantization.quantize_dynamic``: int8 weights, int8
activations computed per call) and reports its difference, which is not held to the fp32 bound.

Only the dense layers are quantised (``QUANTIZED_OPS``: MatMul / Gemm, per output channel); the
convolutions of the vision trunk stay fp32. Measured on the round-9 compact VLA (cont6k, pick_red_cube,
50 episodes, ``bench/export_success.py``): quantising every op (ConvInteger in the trunk too) moved the
chunk by up to 0.22 (max abs, robot units), dropped success from 44/50 (fp32) to 31/50 and made a
chunk 9x slower on one thread (90.5 vs 9.7 ms: onnxruntime's CPU ConvInteger is far slower than its
fp32 Conv); dense layers only: max difference 0.012 on random frames, no slower than fp32.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

OPSET = 17
"""ONNX opset of every exported graph (LayerNormalization is native from 17; onnxruntime >= 1.17 runs it)."""
PARITY_ATOL = 1e-4
"""Max abs difference allowed between the fp32 graph and torch."""
FORMAT = 1
"""Version of the metadata layout (``deploy.runtime.onnx_policy`` refuses others)."""
STATE_LAYOUT = "ee_pos(3) m, ee_quat wxyz(4), gripper opening(1)"
ACTION_LAYOUT = "dpos(3) m, drot(3) rad axis-angle, gripper opening in [0, 1](1)"

METADATA = {
    "format": "layout version of this metadata (int)",
    "kind": "compact-flow-vla | compact-flow-vla+dsrl | success-classifier",
    "cameras": "camera names, one image_<camera> input each (list)",
    "image_size": "side S of the square uint8 frames the graph reads (int)",
    "crops": "{camera: [x0, y0, x1, y1]} region of interest cut out before the resize (fractions)",
    "state_dim / state_layout": "the robot state vector",
    "horizon / action_dim / action_layout": "the action chunk [H, A]",
    "exec_steps": "rows of each chunk to execute before asking for the next (int)",
    "instructions": "the instruction strings, in the order of the instruction input's index (list)",
    "normalization": "state_mean / state_std / action_min / action_max (baked into the graph too)",
    "noise": "what the noise input is: the sampler's initial Gaussian, or DSRL's eps",
    "threshold": "classifier: P(success) at or above which a frame is success",
    "gripper": "raw | binary: the executed gripper opening the checkpoint was measured with (robot_io.gripper); "
               "absent where the checkpoint names none",
    "parity": "max abs difference against torch measured at export",
    "quantization": "none | int8-dynamic (the dense layers: QUANTIZED_OPS; convolutions stay fp32)",
}


QUANTIZED_OPS = ("MatMul", "Gemm")
"""Ops ``--int8`` quantises (weights int8 per output channel, activations per call); convolutions stay
fp32 (see the module docstring for the measurement behind it)."""


class ParityError(ValueError):
    """The exported graph does not compute what the torch model computes."""


# -- the graphs ----------------------------------------------------------------------------------
class _VLASampler(nn.Module):
    """The compact VLA from camera frames at image_size to the un-normalised chunk (traced)."""

    def __init__(self, vla, text_table: torch.Tensor, agent=None) -> None:
        super().__init__()
        self.vla = vla
        self.cameras = list(vla.cfg.cameras)
        self.register_buffer("text_table", text_table.float().clone())
        self.agent = agent
        self.actor = agent.sac.actor if agent is not None else None
        self.encoder = agent.sac.encoder if agent is not None else None

    def embedding(self, images: list[torch.Tensor], state: torch.Tensor, instruction: torch.Tensor) -> torch.Tensor:
        fmaps = self.vla.trunk_features(dict(zip(self.cameras, images)))
        return self.vla.cond_from_features(fmaps, state, self.text_table[instruction])

    def dsrl_w(self, feat: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        # the tanh-Gaussian actor's sample: u = mean + std * eps, w = b tanh(u)  (eps = 0: its mean)
        mean, log_std = self.actor(self.encoder({"feat": feat}))
        return self.actor.action_scale * torch.tanh(mean + log_std.exp() * eps)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        n = len(self.cameras)
        images, (state, instruction, noise) = list(inputs[:n]), inputs[n:]
        cond = self.embedding(images, state, instruction)
        if self.agent is not None:
            noise = self.agent.w_to_noise(self.dsrl_w(cond, noise))
            if self.agent.cfg.variant == "action":  # the baseline: the actor's output is the normalised chunk
                return self.vla.unnormalize_actions(noise)
        return self.vla.unnormalize_actions(self.vla.head.sample(cond, noise=noise))


class _Classifier(nn.Module):
    def __init__(self, clf) -> None:
        super().__init__()
        self.clf = clf

    def forward(self, *images: torch.Tensor) -> torch.Tensor:
        fmaps = {c: self.clf.trunk(x)[1] for c, x in zip(self.clf.cameras, images)}
        return torch.sigmoid(self.clf.logits_from_features(fmaps))


# -- export, parity, metadata --------------------------------------------------------------------
def _export(module: nn.Module, example: tuple[torch.Tensor, ...], names: list[str], output: str, path: str) -> None:
    module.eval()
    with warnings.catch_warnings():  # the tracer warns about Python-side shape checks it turns into constants
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, path, dynamo=False, opset_version=OPSET, input_names=names,
                          output_names=[output], dynamic_axes={n: {0: "batch"} for n in [*names, output]},
                          do_constant_folding=True)


def _run_onnx(path: str, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return [sess.run(None, f)[0] for f in feeds]


def _set_metadata(path: str, meta: dict[str, Any]) -> None:
    import onnx

    model = onnx.load(path)
    del model.metadata_props[:]
    for k, v in meta.items():
        p = model.metadata_props.add()
        p.key, p.value = k, json.dumps(v)
    model.producer_name = "vla-stack deploy.export"
    onnx.save(model, path)


def _check_parity(name: str, ref: list[np.ndarray], out: list[np.ndarray], scale: np.ndarray | None,
                  bound: float | None) -> dict[str, float]:
    """Max abs difference (and, for actions, in the sampler's normalised units); over ``bound``: ParityError."""
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, out))
    rep = {"max_abs_diff": diff, "samples": int(sum(len(a) for a in ref))}
    if scale is not None:  # robot units -> the [-1, 1] range the sampler works in
        rep["max_abs_diff_normalized"] = max(float((np.abs(a - b) * 2 / scale).max()) for a, b in zip(ref, out))
    if not all(np.isfinite(o).all() for o in out):
        raise ParityError(f"{name}: the ONNX graph returned NaN or inf")
    if bound is not None and not diff < bound:
        raise ParityError(f"{name}: ONNX and torch differ by {diff:.3g} (max abs), more than {bound:g}; "
                          "the export was not written")
    return rep


def _quantize(src: str, dst: str) -> None:
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The quantiser logs a warning on the root logger for every tensor it leaves in float (shapes,
    # the uint8 frames, paddings): hundreds of lines of library noise per export. Errors still show.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=list(QUANTIZED_OPS))
    finally:
        root.setLevel(level)


def _finish(tmp: str, out: str, meta: dict[str, Any], feeds, ref, scale, name: str, quantize: bool) -> dict[str, Any]:
    parity = _check_parity(name, ref, _run_onnx(tmp, feeds), scale, PARITY_ATOL)
    meta = {**meta, "parity": parity, "quantization": "none"}
    _set_metadata(tmp, meta)
    os.replace(tmp, out)
    report: dict[str, Any] = {"path": out, "parity": parity, "bytes": os.path.getsize(out)}
    if quantize:  # the int8 file's metadata records its own difference from torch
        q = int8_path(out)
        try:
            _quantize(out, q + ".partial")
            parity_q = _check_parity(name + " int8", ref, _run_onnx(q + ".partial", feeds), scale, None)
            _set_metadata(q + ".partial", {**meta, "parity": parity_q, "quantization": "int8-dynamic"})
            os.replace(q + ".partial", q)
        finally:
            if os.path.exists(q + ".partial"):
                os.remove(q + ".partial")
        report["int8"] = {"path": q, "parity": parity_q, "bytes": os.path.getsize(q)}
    return report


def int8_path(path: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}.int8{ext or '.onnx'}"


def _random_observations(rng: np.random.Generator, n: int, cameras, size: int, state_mean, state_std):
    images = [rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8) for _ in cameras]
    state = (state_mean + state_std * rng.standard_normal((n, len(state_mean)))).astype(np.float32)
    return images, state


def export_vla(vla, out: str, instructions: list[str], agent=None, quantize: bool = False, samples: int = 8,
               seed: int = 0, source: str = "", gripper: str | None = None) -> dict[str, Any]:
    """Export the compact VLA's sampler (steered by ``agent``, a DSRL agent, if given) to ``out``.
    ``instructions``: the prompts the robot will be given (their MiniLM embeddings go into the
    graph). ``gripper``: the executed opening the checkpoint was measured with (``robot_io.gripper``; the
    metadata's ``gripper``, read by the edge runner's ``--gripper auto``), None to record none. Checks parity on
    ``samples`` random observations x instructions; returns a report."""
    from vla.models.compact import KIND, CompactVLA

    if not isinstance(vla, CompactVLA):
        raise ValueError(f"vla export supports the compact flow VLA ({KIND}); got {type(vla).__name__}")
    if gripper is not None:
        from robot_io.gripper import gripper_mode

        gripper = gripper_mode(gripper, "gripper")
    instructions = list(dict.fromkeys(instructions))
    if not instructions or not all(isinstance(s, str) and s for s in instructions):
        raise ValueError("instructions: name at least one non-empty instruction the robot will be given")
    if agent is not None and getattr(agent.cfg, "encoder", "vla") != "vla":
        raise ValueError(f"DSRL encoder {agent.cfg.encoder!r} cannot be exported yet: only agents that read the "
                         "VLA's embedding (--encoder vla) are")
    vla = vla.eval()
    cfg = vla.cfg
    with torch.no_grad():
        table = vla.text(instructions).float()
    wrapper = _VLASampler(vla, table, agent).eval()
    noise_shape = (agent.noise_dim,) if agent is not None else tuple(vla.noise_shape)
    cams = list(cfg.cameras)
    names = [f"image_{c}" for c in cams] + ["state", "instruction", "noise"]
    rng = np.random.default_rng(seed)
    s_mean, s_std = vla.state_mean.numpy(), vla.state_std.numpy()

    def inputs(n: int, instr: int):
        images, state = _random_observations(rng, n, cams, cfg.image_size, s_mean, s_std)
        noise = rng.standard_normal((n, *noise_shape)).astype(np.float32)
        ids = np.full(n, instr, np.int64)
        return [*images, state, ids, noise]

    example = tuple(torch.from_numpy(x) for x in inputs(2, 0))
    feeds, ref = [], []
    for i in range(len(instructions)):
        for n in (1, max(samples - 1, 1)):  # batch 1 (the robot) and a batch (the server)
            x = inputs(n, i)
            if agent is not None and n == 1:
                x[-1][:] = 0.0  # the agent's mean (deterministic policy) too
            feeds.append(dict(zip(names, x)))
            ref.append(_reference_vla(vla, agent, cams, table, x))
    # the wrapper against the model's own public path: a mistake in the wrapper must not pass parity
    with torch.no_grad():
        traced_ref = wrapper(*(torch.from_numpy(v) for v in feeds[0].values())).numpy()
    if not np.allclose(traced_ref, ref[0], atol=1e-5):
        raise ParityError("the export wrapper disagrees with the VLA's own sample_actions; not exported")
    amin, amax = vla.action_min.numpy(), vla.action_max.numpy()
    meta = {
        "format": FORMAT, "kind": "compact-flow-vla+dsrl" if agent is not None else "compact-flow-vla",
        "source": os.path.basename(os.path.normpath(source)) if source else "",
        "cameras": cams, "image_size": cfg.image_size, "crops": {c: list(b) for c, b in cfg.crop_boxes.items()},
        "state_dim": cfg.state_dim, "state_layout": STATE_LAYOUT,
        "horizon": cfg.horizon, "action_dim": cfg.action_dim, "action_layout": ACTION_LAYOUT,
        "exec_steps": int(agent.exec_steps) if agent is not None else cfg.horizon,
        "num_steps": cfg.num_steps, "instructions": instructions,
        "normalization": {"state_mean": s_mean.tolist(), "state_std": s_std.tolist(),
                          "action_min": amin.tolist(), "action_max": amax.tolist()},
        "noise": ({"shape": list(noise_shape), "what": "DSRL actor eps ~ N(0, I) (zeros: the agent's mean)",
                   "variant": agent.cfg.variant, "noise_bound": float(agent.cfg.noise_bound)} if agent is not None
                  else {"shape": list(noise_shape), "what": "the flow sampler's initial noise ~ N(0, I)"}),
        "opset": OPSET, "torch": torch.__version__, "exported_unix": int(time.time()),
    }
    if gripper is not None:
        meta["gripper"] = gripper
    tmp = out + ".partial"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    _export(wrapper, example, names, "actions", tmp)
    try:
        return _finish(tmp, out, meta, feeds, ref, amax - amin, "compact VLA" + (" + DSRL" if agent else ""),
                       quantize)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@torch.no_grad()
def _reference_vla(vla, agent, cams, table, x: list[np.ndarray]) -> np.ndarray:
    """What torch computes for the inputs ``x`` through the model's public API (sample_actions /
    the DSRL agent's act + chunk). ``x``'s frames are what the graph reads: already cropped and
    resized to image_size (by ``deploy.runtime.preprocess`` on the robot), so the model's own crop
    is skipped here -- applying it again would crop the crop (``test_edge_policy_from_raw_frames``
    checks the runtime's crop against the model's on raw frames)."""
    n = len(cams)
    images = {c: torch.from_numpy(x[i]) for i, c in enumerate(cams)}
    state, ids, noise = (torch.from_numpy(v) for v in x[n:])
    obs = {"images": images, "state": state, "instruction": ["?"] * len(state)}
    emb = table[ids]
    text = vla.text
    vla.text = lambda _strings: emb  # the table's rows, as MiniLM gave them at export
    vla.preprocess_images = lambda imgs: {c: imgs[c] for c in cams}  # instance attribute: shadows the method
    try:
        if agent is None:
            return vla.sample_actions(obs, noise=noise).numpy()
        feat = vla.embed(obs)
        mean, log_std = agent.sac.actor(agent.sac.features({"feat": feat}))
        w = agent.sac.actor.action_scale * torch.tanh(mean + log_std.exp() * noise)
        return agent.chunk(feat, w).numpy()
    finally:
        vla.text = text
        del vla.preprocess_images


def export_classifier(clf, out: str, quantize: bool = False, samples: int = 8, seed: int = 0,
                      source: str = "") -> dict[str, Any]:
    """Export a ``rewards.success_classifier.SuccessClassifier`` (frames -> P(success)) to ``out``."""
    clf = clf.eval()
    cfg = clf.cfg
    cams = list(cfg.cameras)
    names = [f"image_{c}" for c in cams]
    rng = np.random.default_rng(seed)
    feeds, ref = [], []
    for n in (1, max(samples - 1, 1)):
        x = [rng.integers(0, 256, (n, cfg.image_size, cfg.image_size, 3), dtype=np.uint8) for _ in cams]
        feeds.append(dict(zip(names, x)))
        ref.append(clf.predict_proba({c: v for c, v in zip(cams, x)}))
    meta = {"format": FORMAT, "kind": "success-classifier",
            "source": os.path.basename(os.path.normpath(source)) if source else "",
            "cameras": cams, "image_size": cfg.image_size, "crops": {}, "threshold": float(cfg.threshold),
            "config": dataclasses.asdict(cfg), "opset": OPSET, "torch": torch.__version__,
            "exported_unix": int(time.time())}
    tmp = out + ".partial"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    example = tuple(torch.from_numpy(v) for v in feeds[-1].values())
    _export(_Classifier(clf), example, names, "p_success", tmp)
    try:
        return _finish(tmp, out, meta, feeds, ref, None, "success classifier", quantize)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_dsrl_agent(vla, path: str):
    """A DSRL agent from a ``vla rl`` run directory, its ``checkpoint/`` folder or an ``agent.pt``."""
    from policies.dsrl import DSRLAgent, DSRLConfig
    from session.config import config_from_dict

    for cand in (path, os.path.join(path, "agent.pt"), os.path.join(path, "checkpoint", "agent.pt")):
        if os.path.isfile(cand):
            break
    else:
        raise FileNotFoundError(f"no DSRL agent at {path}: pass a `vla rl` run directory, its checkpoint/ "
                                "folder or an agent.pt")
    state = torch.load(cand, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or "sac" not in state or "config" not in state:
        raise ValueError(f"{cand} is not a DSRL agent checkpoint (no 'sac' / 'config' entries)")
    cfg = config_from_dict(DSRLConfig, state["config"])
    agent = DSRLAgent(vla, cfg)
    agent.load_state_dict(state)
    agent.sac.actor.eval()
    return agent
