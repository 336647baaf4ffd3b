"""bench/archive/sim_grip.py (an archived probe, run as ``python -m bench.archive.sim_grip``): whether the simulated Panda holds a lifted cube, per contact setting (quick variant)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sim_grip_quick_writes_both_settings_and_the_firm_one_holds(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.archive.sim_grip", "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads((tmp_path / "sim_grip.json").read_text())
    assert out["scenes"] == 2 and out["hold_ticks"] == 40
    soft, firm = (out["settings"][k] for k in sorted(out["settings"], key=lambda k: out["settings"][k]["impratio"]))
    assert (soft["cone"], firm["cone"]) == ("pyramidal", "elliptic")
    for s in (soft, firm):
        for row in s["openings"].values():
            assert row["scenes"] == 2 and len(row["mean_slide_mm"]) == 40
    # shut: the firm grip keeps the cube within 2 mm over 4 s, where MuJoCo's default lets it creep further
    assert firm["openings"]["0.0"]["slide_at_end_mm"]["max"] < 2.0
    assert soft["openings"]["0.0"]["slide_at_end_mm"]["mean"] > firm["openings"]["0.0"]["slide_at_end_mm"]["mean"] + 2.0
    assert (tmp_path / "sim_grip.png").stat().st_size > 5_000


def test_bad_openings_are_refused_by_name(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.archive.sim_grip", "--openings", "1.5", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--openings must lie in [0, 1]" in r.stderr and "Traceback" not in r.stderr
