"""bench/vla_noise_scale.py rolls the frozen VLA out with each initial-noise distribution and writes its report."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_noise_distributions_and_a_quick_run(tmp_path):
    pytest.importorskip("lerobot")
    import importlib.util  # bench/ is not a package (and its vla.py would shadow ours on sys.path)

    spec = importlib.util.spec_from_file_location("vla_noise_scale", ROOT / "bench" / "vla_noise_scale.py")
    b = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(b)

    rng = np.random.default_rng(0)
    draws = {name: np.asarray(fn(rng, (20_000, 7))) for name, (_, fn) in b.NOISES.items()}
    assert not draws["zero"].any()
    assert abs(draws["gauss0.33"].std() - 0.33) < 0.01 and abs(draws["gauss1"].std() - 1) < 0.02
    assert np.abs(draws["tanh1.5"]).max() <= 1.5 and abs(draws["tanh1.5"].std() - 0.94) < 0.03
    assert b.wilson(0, 20)[0] == 0.0 and 0.08 < b.wilson(4, 20)[0] < 0.09

    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "vla_noise_scale.py"), "--checkpoint", str(tmp_path / "ckpt"),
                        "--task", "pick_red_cube", "--noise", "zero", "gauss1", "--episodes", "1",
                        "--out", str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "vla_noise_scale.json").read_text())
    assert set(res["results"]["pick_red_cube"]) == {"zero", "gauss1"}
    for v in res["results"]["pick_red_cube"].values():
        assert v["episodes"] == 1 and v["successes"] in (0, 1)
    assert (tmp_path / "res" / "vla_noise_scale.png").stat().st_size > 5_000
