"""Two tiers (pyproject's markers): `make test` runs the fast tier, `-m "not e2e and not slow and not hardware"`,
and `make test-e2e` the end-to-end tier, `-m "e2e and not slow and not hardware"`. A test joins the e2e tier by a
`pytest.mark.e2e` of its own or of its module, and every bench smoke test (tests/test_bench_*.py, which runs a bench
script with --quick) joins it here, by its file name."""

import os

import pytest

# MuJoCo reads MUJOCO_GL at first import: render headless (EGL) in every test.
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name.startswith("test_bench_"):
            item.add_marker(pytest.mark.e2e)


def save_tiny_vla(path: str, extra: dict | None = None, num_tokens: int = 0) -> str:
    """An untrained compact VLA small enough for sim tests (random trunk, 64 px), saved at ``path``; with
    ``num_tokens`` behaviour tokens (ExToken) and a uniform ``tokens`` block like ``vla train --tokens`` writes."""
    import numpy as np
    import torch

    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(0)
    m = CompactVLA(CompactVLAConfig(image_size=64, hidden=64, cond_dim=64, keypoints=8, pretrained=False,
                                    num_tokens=num_tokens))
    m.set_normalization(np.zeros(8), np.ones(8), -np.full(7, 0.02), np.full(7, 0.02))
    if num_tokens:
        extra = {**(extra or {}), "tokens": {"k": num_tokens, "unit": "episode", "prior": [1 / num_tokens] * num_tokens,
                                             "file_sha256": "0" * 64}}
    m.save(path, extra=extra)
    return path
