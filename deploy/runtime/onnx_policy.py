"""An exported policy run with onnxruntime on the CPU.

Input naming convention of the exported graph (what ``deploy`` export writes):

* ``state``            float32 [B, S]           the observation's state vector
* ``image_<camera>``   float32 [B, 3, H, W]     RGB in [0, 1], one input per camera
* ``noise``            float32 [B, H, A]        optional: the sampler's initial noise (DSRL)

Output 0 is the action chunk ``[B, H, A]``. Inputs the observation cannot fill are refused
with an error naming them, before anything runs.
"""

from __future__ import annotations

import os

import cv2
import numpy as np


class OnnxPolicy:
    def __init__(self, path: str, threads: int = 1, seed: int = 0) -> None:
        import onnxruntime as ort

        if not os.path.exists(path):
            raise FileNotFoundError(f"ONNX policy not found: {path}")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output = self.session.get_outputs()[0].name
        self.rng = np.random.default_rng(seed)
        unknown = [n for n in self.inputs if n not in ("state", "noise") and not n.startswith("image_")]
        if unknown:
            raise ValueError(f"{path}: cannot feed graph input(s) {unknown}; expected state, image_<camera>, noise")

    @staticmethod
    def _static(dims, what):
        if not all(isinstance(d, int) for d in dims[1:]):
            raise ValueError(f"graph input {what} needs static non-batch dims, got {dims}")
        return dims[1:]

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
                c, h, w = self._static(spec.shape, name)
                img = obs["images"][cam]
                if img.shape[:2] != (h, w):
                    img = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
                feeds[name] = (img.astype(np.float32) / 255.0).transpose(2, 0, 1)[None]
            elif name == "noise":
                shape = self._static(spec.shape, name)
                n = self.rng.standard_normal(shape).astype(np.float32) if noise is None else np.asarray(noise, np.float32)
                if list(n.shape) != list(shape):
                    raise ValueError(f"noise has shape {list(n.shape)}, the policy wants {list(shape)}")
                feeds[name] = n[None]
        return feeds

    def __call__(self, obs: dict, noise: np.ndarray | None = None) -> np.ndarray:
        """One observation -> one action chunk [H, A] float32."""
        out = self.session.run([self.output], self.feeds(obs, noise))[0]
        return np.asarray(out[0], np.float32)
