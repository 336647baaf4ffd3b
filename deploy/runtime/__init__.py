"""Edge runtime: run an exported policy on a robot at a fixed control rate. No torch."""

from deploy.runtime.onnx_policy import OnnxPolicy
from deploy.runtime.runner import run_episodes

__all__ = ["OnnxPolicy", "run_episodes"]
