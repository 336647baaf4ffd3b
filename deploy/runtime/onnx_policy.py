"""An exported policy run with onnxruntime on the CPU (no torch).

Input naming convention of the exported graph (what ``vla export`` writes, ``deploy/export.py``):

* ``state``            float32 [B, S]           the observation's state vector
* ``image_<camera>``   uint8   [B, S, S, 3]     the frame cropped and resized to the model's
                                                ``image_size`` (``deploy.runtime.preprocess``,
                                                the same pixels as training), one input per camera;
                       or float32 [B, 3, H, W]  RGB in [0, 1] (hand-made graphs)
* ``instruction``      int64   [B]              index into the metadata's ``instructions``
* ``noise``            float32 [B, ...]         optional: the sampler's initial noise (or DSRL's eps)

Output 0 is the action chunk ``[B, H, A]`` (a classifier: ``p_success [B]``). The file's
``metadata_props`` (JSON values) say which cameras, crops, instructions and chunk layout it
expects (``OnnxPolicy.meta``). Inputs the observation cannot fill are refused with an error
naming them, before anything runs.
"""

from __future__ import annotations

import json
import os

import cv2
import numpy as np

from deploy.runtime.preprocess import camera_input
from robot_io.gripper import gripper_mode

FORMATS = (1,)
"""Metadata layouts this runtime reads (``deploy.export.FORMAT``)."""
_KNOWN_INPUTS = ("state", "noise", "instruction")


def read_metadata(session) -> dict:
    """The exported file's metadata_props, JSON-decoded; {} for a graph without any."""
    raw = session.get_modelmeta().custom_metadata_map
    meta = {}
    for k, v in raw.items():
        try:
            meta[k] = json.loads(v)
        except json.JSONDecodeError:
            raise ValueError(f"policy metadata {k!r} is not JSON: {v[:80]!r}") from None
    if meta and meta.get("format") not in FORMATS:
        raise ValueError(f"policy metadata 'format' is {meta.get('format')!r}; this runtime reads {list(FORMATS)} "
                         "(re-export with this version of `vla export`, or update the runtime)")
    for key, typ in (("cameras", list), ("instructions", list), ("crops", dict), ("image_size", int),
                     ("exec_steps", int), ("horizon", int)):
        if key in meta and not isinstance(meta[key], typ):
            raise ValueError(f"policy metadata {key!r} must be a {typ.__name__}, got {type(meta[key]).__name__}")
    if "gripper" in meta:
        meta["gripper"] = gripper_mode(meta["gripper"], "policy metadata 'gripper'")
    return meta


class OnnxPolicy:
    def __init__(self, path: str, threads: int = 1, seed: int = 0) -> None:
        import onnxruntime as ort

        if not os.path.exists(path):
            raise FileNotFoundError(f"ONNX policy not found: {path}")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.path = path
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output = self.session.get_outputs()[0].name
        self.rng = np.random.default_rng(seed)
        unknown = [n for n in self.inputs if n not in _KNOWN_INPUTS and not n.startswith("image_")]
        if unknown:
            raise ValueError(f"{path}: cannot feed graph input(s) {unknown}; expected state, image_<camera>, "
                             "instruction, noise")
        self.meta = read_metadata(self.session)
        self.cameras = [n[len("image_"):] for n in self.inputs if n.startswith("image_")]
        self.instructions = list(self.meta.get("instructions", []))
        if "instruction" in self.inputs and not self.instructions:
            raise ValueError(f"{path}: the graph has an 'instruction' input but its metadata lists no 'instructions'")
        if self.meta.get("cameras") and sorted(self.meta["cameras"]) != sorted(self.cameras):
            raise ValueError(f"{path}: metadata 'cameras' {self.meta['cameras']} do not match the graph's image "
                             f"inputs {self.cameras}")
        self.crops = {c: tuple(b) for c, b in self.meta.get("crops", {}).items()}

    @property
    def exec_steps(self) -> int | None:
        """Rows of each chunk to execute before the next inference (metadata), None if unknown."""
        return self.meta.get("exec_steps")

    @property
    def gripper(self) -> str | None:
        """The executed gripper opening the exported checkpoint was measured with (``raw`` | ``binary``,
        ``robot_io.gripper``), None where the metadata names none."""
        return self.meta.get("gripper")

    @staticmethod
    def _static(dims, what):
        if not all(isinstance(d, int) for d in dims[1:]):
            raise ValueError(f"graph input {what} needs static non-batch dims, got {dims}")
        return dims[1:]

    def instruction_index(self, instruction: str) -> int:
        try:
            return self.instructions.index(instruction)
        except ValueError:
            raise ValueError(f"instruction {instruction!r} is not one of the exported instructions "
                             f"{self.instructions}; export the policy with it (vla export --instruction ...)") from None

    def feeds(self, obs: dict, noise: np.ndarray | None = None) -> dict[str, np.ndarray]:
        feeds = {}
        for name, spec in self.inputs.items():
            if name == "state":
                s = np.asarray(obs["state"], np.float32)
                (dim,) = self._static(spec.shape, name)
                if s.shape != (dim,):
                    raise ValueError(f"observation 'state' has shape {list(s.shape)}, the policy wants [{dim}]")
                feeds[name] = s[None]
            elif name.startswith("image_"):
                cam = name[len("image_"):]
                if cam not in obs.get("images", {}):
                    raise ValueError(f"the policy needs camera {cam!r}; observation has {sorted(obs.get('images', {}))}")
                img = obs["images"][cam]
                if spec.type == "tensor(uint8)":  # exported: [B, S, S, 3], cropped + resized as in training
                    h, w, _ = self._static(spec.shape, name)
                    feeds[name] = camera_input(img, h, self.crops.get(cam))[None]
                else:  # float [B, 3, H, W] in [0, 1]
                    c, h, w = self._static(spec.shape, name)
                    if img.shape[:2] != (h, w):
                        img = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
                    feeds[name] = (img.astype(np.float32) / 255.0).transpose(2, 0, 1)[None]
            elif name == "instruction":
                if "instruction" not in obs:
                    raise ValueError(f"the policy needs the observation's 'instruction' (one of {self.instructions})")
                feeds[name] = np.array([self.instruction_index(obs["instruction"])], np.int64)
            elif name == "noise":
                shape = self._static(spec.shape, name)
                n = self.rng.standard_normal(shape).astype(np.float32) if noise is None else np.asarray(noise, np.float32)
                if list(n.shape) != list(shape):
                    raise ValueError(f"noise has shape {list(n.shape)}, the policy wants {list(shape)}")
                feeds[name] = n[None]
        return feeds

    def __call__(self, obs: dict, noise: np.ndarray | None = None) -> np.ndarray:
        """One observation -> one action chunk [H, A] float32 (a classifier: P(success), a scalar)."""
        out = self.session.run([self.output], self.feeds(obs, noise))[0]
        return np.asarray(out[0], np.float32)
