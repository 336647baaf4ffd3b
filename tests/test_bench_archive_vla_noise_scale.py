"""bench/archive/vla_noise_scale.py (an archived probe, run as ``python -m bench.archive.vla_noise_scale``) rolls
the frozen VLA out with each initial-noise distribution and writes its report; its bridge on leased ports. The
distributions themselves are tested in bench/tests/test_archive_vla_noise_scale.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_noise_scale_quick_run(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    from robot_io.ports import PortLease
    from robot_io.site import load_site, relocate_site, site_ports

    base = load_site("sim-franka-fast")
    with PortLease(len(site_ports(base))) as lease:  # a bridge of the probe's own (the suite may run others)
        site = relocate_site(base, lease.ports, str(tmp_path / "site.yaml")).path
    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.archive.vla_noise_scale", "--checkpoint", str(tmp_path / "ckpt"),
                        "--task", "pick_red_cube", "--noise", "zero", "gauss1", "--episodes", "1", "--robot", site,
                        "--out", str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "vla_noise_scale.json").read_text())
    assert set(res["results"]["pick_red_cube"]) == {"zero", "gauss1"}
    for v in res["results"]["pick_red_cube"].values():
        assert v["episodes"] == 1 and v["successes"] in (0, 1)
    assert (tmp_path / "res" / "vla_noise_scale.png").stat().st_size > 5_000
