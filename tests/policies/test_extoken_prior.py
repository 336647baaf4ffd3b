"""ExToken's behaviour prior (policies/extoken/prior.py, `vla tokens`): planted modes are recovered, every
frame gets a token, the file round-trips, and a malformed or mismatched file is refused by field."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from policies.extoken.prior import (Demo, PriorConfig, build_prior, load_prior, plot_prior, token_meta,
                                    write_prior)

ROOT = "/data/pick"


def planted(n_eps: int = 40, difference: float = 0.03, seed: int = 0) -> list[Demo]:
    """Episodes whose opening turns the gripper +drz ("ccw") or -drz ("cw"), alternately, over random
    x / y moves; ``difference`` 0 removes the planted modes (the labels stay)."""
    rng = np.random.default_rng(seed)
    out = []
    for ep in range(n_eps):
        t = int(rng.integers(14, 40))  # some shorter than the 24-tick opening: padded with the last action
        a = np.zeros((t, 7), np.float32)
        a[:, :2] = rng.normal(0, 0.01, (t, 2))
        a[:, 2] = rng.normal(0, 0.002, t)
        mode = ep % 2
        a[:, 5] = (difference if mode == 0 else -difference) + rng.normal(0, 0.005, t)
        a[:, 6] = 1.0
        out.append(Demo(ROOT, ep, a, rng.normal(size=(t, 8)).astype(np.float32),
                        {"episode_index": ep, "expert_mode": ("ccw", "cw")[mode], "success": bool(ep % 3)}))
    return out


def test_episode_clustering_recovers_planted_modes_and_fails_without_them():
    demos = planted()
    p = build_prior(demos, PriorConfig(k=2, purity_field="expert_mode"))
    assert p["purity"]["purity"] == 1.0 and p["purity"]["counted"] == 40
    assert sorted(p["cluster_sizes"]) == [20, 20]
    eps = p["datasets"][0]["episodes"]
    by_mode = {m: {e["token"] for e, d in zip(eps, demos) if d.row["expert_mode"] == m} for m in ("ccw", "cw")}
    assert len(by_mode["ccw"]) == len(by_mode["cw"]) == 1 and by_mode["ccw"] != by_mode["cw"]
    frames = np.array([len(d.action) for d in demos])
    tok = np.array([e["token"] for e in eps])
    np.testing.assert_allclose(p["prior"], [frames[tok == t].sum() / frames.sum() for t in (1, 2)])
    # the same episodes without the planted difference: the clusters no longer follow the labels
    flat = build_prior(planted(difference=0.0), PriorConfig(k=2, purity_field="expert_mode"))
    assert flat["purity"]["purity"] < 0.8, flat["purity"]


def test_chunk_unit_labels_every_frame():
    demos = planted(n_eps=10)
    p = build_prior(demos, PriorConfig(k=3, unit="chunk", horizon=4, state_weight=0.5))
    assert p["unit"] == "chunk" and p["feature"]["dims"] == 4 * 7 + 8
    for d, e in zip(demos, p["datasets"][0]["episodes"]):
        assert len(e["tokens"]) == e["frames"] == len(d.action)
        assert set(e["tokens"]) <= {1, 2, 3} and "token" not in e
    assert sum(p["cluster_sizes"]) == sum(p["frames_per_token"]) == sum(len(d.action) for d in demos)
    assert all(s > 0 for s in p["cluster_sizes"])
    with pytest.raises(ValueError, match="state_weight is for the chunk unit"):
        PriorConfig(unit="episode", state_weight=1.0)


def test_the_file_round_trips_and_maps_frames(tmp_path):
    demos = planted()
    p = build_prior(demos, PriorConfig(k=2, purity_field="success"))
    write_prior(p, tmp_path / "tokens.json")
    plot_prior(p, demos, tmp_path / "tokens.png")
    assert (tmp_path / "tokens.png").stat().st_size > 10_000
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]  # no temp file left behind
    prior = load_prior(tmp_path / "tokens.json")
    assert prior.k == 2 and prior.unit == "episode" and prior.prior.shape == (2,)
    ep7 = p["datasets"][0]["episodes"][7]
    assert prior.token_of(ROOT, 7, 0) == prior.token_of(ROOT, 7, ep7["frames"] - 1) == ep7["token"]
    got = prior.frame_tokens([(d.dataset, d.episode_index, d.action) for d in demos[:3]])
    assert len(got) == sum(len(d.action) for d in demos[:3])
    with pytest.raises(ValueError, match="no tokens for episode 40 of dataset /data/pick"):
        prior.token_of(ROOT, 40, 0)
    with pytest.raises(ValueError, match="no tokens for dataset /data/place"):
        prior.token_of("/data/place", 0, 0)
    with pytest.raises(ValueError, match="frame 99 of episode 7"):
        prior.token_of(ROOT, 7, 99)
    changed = demos[2].action.copy()
    changed[0, 0] += 0.1
    with pytest.raises(ValueError, match="episode 2 of dataset /data/pick has .* other actions"):
        prior.frame_tokens([(ROOT, 2, changed)])
    assert p["purity"]["field"] == "success" and set(p["purity"]["values"]) == {"true", "false"}


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(k="two"), "'k'"),
    (lambda d: d.update(format="something else"), "'format'"),
    (lambda d: d.update(unit="frame"), "'unit'"),
    (lambda d: d.update(prior=[1.0]), "'prior'"),
    (lambda d: d.update(prior=[0.7, 0.7]), "'prior'"),
    (lambda d: d["datasets"][0]["episodes"][1].update(token=3), r"'datasets\[0\].episodes\[1\].token'"),
    (lambda d: d["datasets"][0]["episodes"][1].pop("frames"), r"'datasets\[0\].episodes\[1\].frames'"),
    (lambda d: d["datasets"][0]["episodes"][2].update(episode_index=1), r"'datasets\[0\].episodes\[2\].episode_index'"),
    (lambda d: d.update(unit="chunk"), r"'datasets\[0\].episodes\[0\].tokens'"),  # says chunk, holds per-episode tokens
    (lambda d: d.pop("datasets"), "'datasets'"),
])
def test_a_malformed_file_names_the_field(tmp_path, edit, field):
    p = build_prior(planted(n_eps=6), PriorConfig(k=2))
    edit(p)
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(p))
    with pytest.raises(ValueError, match=f"field {field}"):
        load_prior(path)


def test_not_json_and_no_file_are_clear(tmp_path):
    (tmp_path / "t.json").write_text("{ k: 2")
    with pytest.raises(ValueError, match="not JSON"):
        load_prior(tmp_path / "t.json")
    with pytest.raises(FileNotFoundError, match="vla tokens"):
        load_prior(tmp_path / "none.json")


def test_too_many_tokens_for_the_data_is_refused():
    with pytest.raises(ValueError, match="k=7 behaviour tokens from 6 units"):
        build_prior(planted(n_eps=6), PriorConfig(k=7))


def test_token_meta_reads_a_checkpoint_block(tmp_path):
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "plain"))
    assert token_meta(str(tmp_path / "plain")) is None
    cfg = json.loads((tmp_path / "plain/config.json").read_text())
    cfg["config"]["num_tokens"] = 2
    cfg["tokens"] = {"k": 2, "unit": "episode", "prior": [0.5, 0.5], "file_sha256": "ab"}
    os.makedirs(tmp_path / "tok")
    (tmp_path / "tok/config.json").write_text(json.dumps(cfg))
    assert token_meta(str(tmp_path / "tok"))["prior"] == [0.5, 0.5]
    cfg["tokens"]["prior"] = [1.0]
    (tmp_path / "tok/config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="field 'tokens.prior'"):
        token_meta(str(tmp_path / "tok"))


def _write_dataset(root: str, n_eps: int = 12) -> list[Demo]:
    """A camera-less LeRobot dataset of planted episodes with an episode log, through EpisodeWriter."""
    from vla.data import EpisodeWriter, make_features

    demos = planted(n_eps=n_eps, seed=1)
    w = EpisodeWriter(root, "local/planted", fps=10, features=make_features({}, 8, 7), robot_type="test",
                      episode_log=True)
    for d in demos:
        for i in range(len(d.action)):
            w.add_frame({"observation.state": d.state[i], "action": d.action[i], "intervention": False,
                         "observation.capture_time": i / 10}, task="pick up the red cube")
        w.save_episode(outcome_row={"success": d.row["success"], "expert_mode": d.row["expert_mode"]})
    w.close()
    return demos


def test_vla_tokens_on_a_recorded_dataset(tmp_path, capsys):
    pytest.importorskip("lerobot")
    from vla.cli import main

    root = str(tmp_path / "planted")
    demos = _write_dataset(root)
    out = tmp_path / "runs" / "tokens.json"
    assert main(["tokens", "--dataset", root, "--k", "2", "--out", str(out), "--purity-field", "expert_mode"]) == 0
    text = capsys.readouterr().out
    assert "purity vs expert_mode: 1.000 over 12 episodes" in text and "token" in text
    assert (tmp_path / "runs" / "tokens.png").is_file()
    prior = load_prior(out)
    tok = {d.row["expert_mode"]: prior.token_of(root, d.episode_index, len(d.action) - 1) for d in demos}
    assert sorted(tok.values()) == [1, 2]
    assert all(prior.token_of(root, d.episode_index, 0) == tok[d.row["expert_mode"]] for d in demos)
    assert prior.meta["inputs_sha256"] and prior.meta["feature"]["ticks"] == 24


def test_vla_tokens_help_teaches_its_use(capsys):
    from vla.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["tokens", "--help"])
    out = capsys.readouterr().out
    assert "ExToken" in out and "vla tokens --dataset" in out and "--purity-field" in out
