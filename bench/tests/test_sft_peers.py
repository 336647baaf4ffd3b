"""bench/sft_peers.py's comparison of the peers with a vla eval report or a bench row."""

import json

import pytest

from bench import sft_peers


def test_compare_reads_a_vla_eval_report_or_a_bench_row(tmp_path):
    peers = [{"peer": "act", "tasks": {"pick_red_cube": {"rate": 0.25}, "pick_blue_cube": {"rate": 0.5}}}]
    ev = tmp_path / "runs" / "my_vla" / "evalte"
    ev.mkdir(parents=True)
    (ev / "eval.json").write_text(json.dumps({"exec_steps": 1, "temporal_ensemble": 0.01, "seed_start": 100000, "tasks": {
        "pick_red_cube": {"episodes": 20, "successes": 16, "ci95": [0.58, 0.92]},
        "pick_blue_cube": {"episodes": 20, "successes": 10, "ci95": [0.3, 0.7]}}}))
    ref = sft_peers.compare(peers, tmp_path / "absent.json", str(ev))  # the directory or the file
    assert ref["row"] == "runs/my_vla" and ref["tasks"]["pick_red_cube"]["rate"] == 0.8
    assert ref["peer_minus_vla"] == {"act": {"pick_red_cube": -0.55, "pick_blue_cube": 0.0}}
    assert ref["eval"]["temporal_ensemble"] == 0.01
    assert sft_peers.compare(peers, tmp_path / "absent.json", str(ev / "eval.json"))["tasks"] == ref["tasks"]
    bench = tmp_path / "vla_sft.json"
    bench.write_text(json.dumps({"rows": [{"row": "r1", "wall_s": {"train": 600.0}, "tasks": {
        "pick_red_cube": {"rate": 0.5, "successes": 10, "episodes": 20, "ci95": [0.3, 0.7]}}}]}))
    r = sft_peers.compare(peers, bench, "r1")
    assert r["train_wall_s"] == 600.0 and r["peer_minus_vla"] == {"act": {"pick_red_cube": -0.25}}
    with pytest.raises(ValueError, match="has rows"):
        sft_peers.compare(peers, bench, "r2")
    with pytest.raises(ValueError, match="no vla eval report"):
        sft_peers.compare(peers, bench, str(tmp_path / "nowhere" / "eval.json"))
