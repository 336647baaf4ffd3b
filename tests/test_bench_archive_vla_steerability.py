"""bench/archive/vla_steerability.py (an archived probe, run as ``python -m bench.archive.vla_steerability``): a
quick run on the sim, its bridges on a free port block (the probe takes fixed ports, --port0). pass@k and the noise
streams are tested in bench/tests/test_archive_vla_steerability.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.net import free_port_block

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_writes_every_outcome_and_the_plot(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.archive.vla_steerability", "--checkpoint", str(tmp_path / "ckpt"),
                        "--task", "pick_red_cube", "--scenes", "2", "--streams", "2", "--jobs", "2", "--port0", str(free_port_block(40)),
                        "--noise", "tanh1.5", "--out", str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads((tmp_path / "res" / "vla_steerability.json").read_text())
    assert out["noise"] == "tanh1.5"
    res = out["results"]["pick_red_cube"]
    assert res["episodes"] == 4 and set(res["outcomes"]) == {"200000", "200001"}
    assert all(len(v) == 2 and set(v) <= {0, 1} for v in res["outcomes"].values())
    assert res["pass_at_1"] == pytest.approx(sum(map(sum, res["outcomes"].values())) / 4)
    assert len(res["pass_at_k"]) == 2 and res["pass_at_k"][1] >= res["pass_at_k"][0]
    assert (tmp_path / "res" / "vla_steerability.png").stat().st_size > 5_000
    assert not list((tmp_path / "res").glob("*.log"))
