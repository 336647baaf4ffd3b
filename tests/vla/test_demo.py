"""`vla demo` end to end: a bridge process, scripted motion over it, outputs in a run directory."""

import json
import os
import re

import pytest

from vla.cli import main


@pytest.mark.e2e  # `vla demo`: a bridge process driven over the wire
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


@pytest.mark.e2e  # the whole slice through the real subcommands
def test_slice_smoke_runs_record_train_and_dsrl_with_demos(tmp_path, capsys):
    """`vla demo --slice --smoke`: every stage of the slice at toy size, through the real subcommands."""
    import pytest

    pytest.importorskip("lerobot")
    assert main(["demo", "--slice", "--smoke", "--out", str(tmp_path)]) == 0
    (run,) = list(tmp_path.iterdir())
    assert len(os.listdir(run / "data" / "pick_red_cube" / "data")) >= 1  # the recorded LeRobot dataset
    assert os.path.isfile(run / "vla" / "loss_curve.png")
    s = json.load(open(run / "dsrl" / "summary.json"))
    assert s["ticks"] >= 48 and s["vla_weights_unchanged"]
    demos = json.load(open(run / "dsrl" / "demos.json"))
    assert demos["episodes"] == 2 and demos["transitions"] == s["demo_transitions"] > 0
    cap = capsys.readouterr()
    out = cap.out
    assert "base VLA" in out and "DSRL-NA, " in out and str(run) in out
    # the project's own lines and bars only: no third-party progress bar (datasets' "Map: 0%| ...")
    lines = [ln.strip() for ln in re.split(r"[\r\n]", cap.out + cap.err) if ln.strip()]
    foreign = [ln for ln in lines if re.match(r"(Map|Filter|Generating|Loading|Saving|Casting|Resolving)\b", ln)]
    assert not foreign, foreign[:3]


def test_slice_verdict_pairs_the_scenes_and_says_plainly_when_rl_did_not_lift():
    """The slice's closing line: paired on the same seeds; a lift needs more scenes only RL solved than only the
    base did (exact sign test), else it says 'no lift'."""
    import pytest

    from vla.commands.demo import paired_counts, verdict

    base = [{"seed": s, "success": s % 2 == 0} for s in range(20)]
    same = [dict(e) for e in base]
    assert paired_counts(base, same) == (10, 10, 0, 0)
    assert verdict(20, 10, 10, 0, 0).startswith("no lift")
    better = [{"seed": s, "success": s % 2 == 0 or s < 15} for s in range(20)]
    k = paired_counts(base, better)
    assert k == (10, 17, 7, 0)
    assert verdict(20, *k[:2], *k[2:]).startswith("RL lifted the base")
    swapped = [{"seed": s, "success": not e["success"]} for s, e in enumerate(base)]  # 10 vs 10, all discordant
    assert verdict(20, *paired_counts(base, swapped)).startswith("no lift")
    worse = [{"seed": s, "success": s % 2 == 0 and s > 6} for s in range(20)]  # 6 vs 10: 4 only the base, 0 only RL
    assert verdict(20, *paired_counts(base, worse)).startswith("no lift")  # p = 0.0625: not shown worse
    much_worse = [{"seed": s, "success": s % 2 == 0 and s > 12} for s in range(20)]  # 3 vs 10: 7 only the base
    assert verdict(20, *paired_counts(base, much_worse)).startswith("RL made it worse")
    with pytest.raises(ValueError, match="different scenes"):
        paired_counts(base, [{"seed": 99, "success": True}])
