"""`vla demo` end to end: a bridge process, scripted motion over it, outputs in a run directory."""

import json
import os

from vla.cli import main


def test_demo_writes_frames_plot_and_summary(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--frame-every", "20"]) == 0
    (run,) = list(tmp_path.iterdir())
    summary = json.load(open(run / "summary.json"))
    assert summary["steps"] > 20
    assert summary["final_tracking_error_m"] < 0.02  # the arm reached the last waypoint over the bridge
    assert summary["loop"]["achieved_hz"] > 9.0
    assert os.path.getsize(run / "ee_tracking.png") > 10_000
    frames = os.listdir(run / "frames")
    assert any(f.endswith("_front.png") for f in frames) and any(f.endswith("_wrist.png") for f in frames)
    assert str(run) in capsys.readouterr().out
