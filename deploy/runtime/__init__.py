"""Edge runtime: run an exported policy on a robot at a fixed control rate. No torch.

The runtime works on one core: numpy's BLAS (the frame resize is two small matrix products) is
kept to one thread unless the user set it, because a multi-threaded BLAS on a busy or small CPU
makes that resize about 10x slower at the median (measured: 7.8 ms -> 69 ms for 224 -> 96 px on a
loaded 2-core machine). It only takes effect when numpy is not yet imported (``vla-edge``,
``python -m deploy.runtime``).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS only: torch's threads (OMP_*) are left alone

from deploy.runtime.onnx_policy import OnnxPolicy  # noqa: E402
from deploy.runtime.runner import run_episodes  # noqa: E402

__all__ = ["OnnxPolicy", "run_episodes"]
