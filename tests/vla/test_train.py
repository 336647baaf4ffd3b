"""`vla train` on a tiny dataset: run directory contents, exact resume after a crash, clear errors."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("lerobot")

from vla.data.demos import action_chunks, load_demos  # noqa: E402
from vla.models import last_checkpoint, resolve_checkpoint  # noqa: E402
from vla.train import TrainConfig, train  # noqa: E402


def cfg_for(dataset: str, out, **kw) -> TrainConfig:
    base = dict(datasets=(dataset,), out=str(out), steps=12, batch_size=8, warmup_steps=2, save_every=4,
                log_every=2, image_size=64, horizon=4, aug_views=1, seed=0, threads=1)
    base.update(kw)
    return TrainConfig(**base)


def test_load_demos_reads_every_frame_and_instruction(tiny_dataset):
    eps = load_demos([tiny_dataset], 32, progress=False)
    assert len(eps) == 4 and all(len(e) == 12 for e in eps)
    assert {e.instruction for e in eps} == {"pick up the red cube", "lift the green cube high"}
    assert eps[1].images["front"].shape == (12, 32, 32, 3) and eps[1].images["front"].dtype == np.uint8
    # frame i of episode 1 was written with a green level of 80 + 8 i (+ noise 0..19)
    g = eps[1].images["front"][:, :, :, 1].reshape(12, -1).mean(1)
    assert np.all(np.abs(g - (80 + 8 * np.arange(12) + 9.5)) < 4), g
    np.testing.assert_allclose(eps[2].action[:, 2], -0.01 + 0.001 * np.arange(12), atol=1e-6)


def test_action_chunks_pad_by_repeating_the_last_action():
    a = np.arange(5, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    chunks, pad = action_chunks(a, 3)
    assert chunks.shape == (5, 3, 2)
    np.testing.assert_array_equal(chunks[3, :, 0], [3, 4, 4])
    np.testing.assert_array_equal(pad[3], [False, False, True])


def test_load_demos_names_a_missing_camera(tiny_dataset):
    with pytest.raises(ValueError, match=r"no camera\(s\) \['side'\]"):
        load_demos([tiny_dataset], 32, cameras=["side"], progress=False)
    with pytest.raises(ValueError, match="not a LeRobot v3 dataset"):
        load_demos([os.path.dirname(tiny_dataset) + "/nothing"], 32, progress=False)


def test_train_writes_the_run_directory(tiny_dataset, tmp_path):
    s = train(cfg_for(tiny_dataset, tmp_path / "run"), progress=False)
    run = tmp_path / "run"
    assert s["steps"] == 12 and s["frames"] == 48
    for f in ("train_config.json", "loss.csv", "loss_curve.png", "model/config.json", "model/model.safetensors"):
        assert (run / f).is_file(), f
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(run / "tb"))
    assert last_checkpoint(str(run)).endswith("0000012")
    assert sorted(os.listdir(run / "checkpoints")) == ["0000004", "0000008", "0000012", "last"]
    meta = json.loads((run / "model/config.json").read_text())
    assert meta["instructions"] == ["lift the green cube high", "pick up the red cube"]
    assert resolve_checkpoint(str(run)) == str(run / "model")
    with pytest.raises(FileExistsError, match="--resume"):
        train(cfg_for(tiny_dataset, run), progress=False)


def test_resume_after_a_crash_is_exact(tiny_dataset, tmp_path, monkeypatch):
    ref = train(cfg_for(tiny_dataset, tmp_path / "ref"), progress=False)
    assert ref["steps"] == 12

    calls = {"n": 0}
    real_clip = torch.nn.utils.clip_grad_norm_

    def crashing_clip(*a, **k):
        calls["n"] += 1
        if calls["n"] == 7:  # dies during step 7: checkpoint 4 is the last complete one
            raise RuntimeError("simulated crash")
        return real_clip(*a, **k)

    cfg = cfg_for(tiny_dataset, tmp_path / "crash")
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", crashing_clip)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, progress=False)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real_clip)
    assert last_checkpoint(str(tmp_path / "crash")).endswith("0000004")
    out = train(cfg, resume=True, progress=False)
    assert out["steps"] == 12
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "ref/model/model.safetensors"))
    b = load_file(str(tmp_path / "crash/model/model.safetensors"))
    assert a.keys() == b.keys()
    diff = [k for k in a if not torch.equal(a[k], b[k])]
    assert not diff, diff[:5]
    steps = [int(r.split(",")[0]) for r in (tmp_path / "crash/loss.csv").read_text().splitlines()[1:]]
    assert steps == sorted(set(steps)) == list(range(2, 13, 2))


def test_bad_config_fields_are_named():
    with pytest.raises(ValueError, match="mode must be one of"):
        TrainConfig(datasets=("x",), out="y", mode="partial")
    with pytest.raises(ValueError, match="batch_size must be positive"):
        TrainConfig(datasets=("x",), out="y", batch_size=0)
    with pytest.raises(ValueError, match="--dataset"):
        TrainConfig(datasets=(), out="y")


def test_lora_training_runs_on_images(tiny_dataset, tmp_path):
    s = train(cfg_for(tiny_dataset, tmp_path / "lora", mode="lora", steps=3, save_every=3), progress=False)
    meta = json.loads((tmp_path / "lora/model/config.json").read_text())
    assert meta["mode"] == "lora" and meta["lora"]["rank"] == 8
    assert s["parameters"]["trainable"] < s["parameters"]["total"]
    assert dataclasses.asdict(cfg_for(tiny_dataset, "x"))["mode"] == "frozen"


def test_init_starts_from_a_checkpoint_and_refuses_another_architecture(tiny_dataset, tmp_path):
    from safetensors.torch import load_file

    train(cfg_for(tiny_dataset, tmp_path / "a", steps=4), progress=False)
    src = load_file(str(tmp_path / "a/model/model.safetensors"))
    # zero steps of training: the new run's first checkpoint is the source's weights and statistics
    init = cfg_for(tiny_dataset, tmp_path / "b", steps=1, save_every=1, lr=1e-12, init=str(tmp_path / "a"))
    train(init, progress=False)
    got = load_file(str(tmp_path / "b/model/model.safetensors"))
    for k in ("action_min", "action_max", "state_mean", "text_mean", "head.net.0.weight"):
        torch.testing.assert_close(got[k], src[k], atol=1e-6, rtol=0)
    # a fresh run from the same data starts elsewhere
    train(cfg_for(tiny_dataset, tmp_path / "c", steps=1, save_every=1, lr=1e-12, seed=1), progress=False)
    assert not torch.allclose(load_file(str(tmp_path / "c/model/model.safetensors"))["head.net.0.weight"],
                              src["head.net.0.weight"])
    with pytest.raises(ValueError, match=r"differs from this run's in \['image_size'\]"):
        train(dataclasses.replace(init, out=str(tmp_path / "d"), image_size=32), progress=False)


@pytest.mark.parametrize("balance, expected_short_share", [("frames", 0.1), ("tasks", 0.5)])
def test_balance_sets_each_tasks_share_of_a_batch(balance, expected_short_share):
    """Two instructions with 100 and 900 frames: ``frames`` draws them 1:9, ``tasks`` 1:1."""
    from vla.train import TrainData, frame_sampler

    text_idx = torch.cat([torch.zeros(100), torch.ones(900)]).long()
    data = TrainData(state=torch.zeros(1000, 2), chunks=torch.zeros(1000, 8, 2), text_idx=text_idx,
                     text_emb=torch.zeros(2, 384), instructions=["short task", "long task"], images={})
    draw = frame_sampler(data, balance, 256, torch.Generator().manual_seed(0))
    idx = torch.cat([draw() for _ in range(200)])
    share = float((text_idx[idx] == 0).float().mean())
    assert abs(share - expected_short_share) < 0.02, share
    assert idx.min() >= 0 and idx.max() < 1000


@pytest.mark.parametrize("balance", ["frames", "tasks"])
def test_opening_weight_draws_the_first_chunk_of_each_episode_more_often(balance):
    """Frames 0..7 of 40-frame episodes are 20% of the frames; at weight 5 they are 5 x 8 / (5 x 8 + 32) = 56% of
    the draws, with either balance, and a frame with two labels (``frame_of``) keeps its frame's weight."""
    from vla.train import TrainData, frame_sampler

    opening = torch.cat([torch.arange(40) < 8] * 25)  # 25 episodes of 40 frames
    frame_of = torch.cat([torch.arange(1000), torch.arange(500)])  # the first 500 frames twice (two labels)
    text_idx = torch.cat([torch.zeros(1000), torch.ones(500)]).long()
    data = TrainData(state=torch.zeros(1000, 2), chunks=torch.zeros(1000, 8, 2), text_idx=text_idx,
                     text_emb=torch.zeros(2, 384), instructions=["task", "sub-skill"], images={}, frame_of=frame_of,
                     opening=opening)
    for w, want in ((1.0, 0.2), (5.0, 40 / 72)):
        draw = frame_sampler(data, balance, 256, torch.Generator().manual_seed(0), w)
        rows = torch.cat([draw() for _ in range(200)])
        share = float(opening[frame_of[rows]].float().mean())
        assert abs(share - want) < 0.02, (w, share)
    with pytest.raises(ValueError, match="opening_weight"):
        TrainConfig(datasets=("d",), out="o", opening_weight=0)


def test_unknown_balance_is_refused():
    with pytest.raises(ValueError, match="balance"):
        TrainConfig(datasets=("d",), out="o", balance="episodes")


def test_the_action_experts_size_is_a_training_setting(tiny_dataset, tmp_path):
    """--head-hidden / --head-depth shape the flow head (bench/results/vla_sft's ablation of the head's size)."""
    from vla.models import load_vla

    train(cfg_for(tiny_dataset, tmp_path / "h", steps=1, save_every=1, head_hidden=48, head_depth=2, head_film=True),
          progress=False)
    m = load_vla(str(tmp_path / "h/model"))
    widths = [layer.out_features for layer in m.head.net if isinstance(layer, torch.nn.Linear)]
    assert widths[:-1] == [48, 48] and m.cfg.hidden == 48 and m.cfg.depth == 2 and m.cfg.head_film
    assert len(m.head.films) == 2
    with pytest.raises(ValueError, match="head_depth must be positive"):
        TrainConfig(datasets=("x",), out="y", head_depth=0)


def test_sub_skill_labelled_frames_keep_the_episodes_instruction_and_train_with_both(subskill_dataset, tmp_path):
    """A frame recorded with --label-subskills carries its sub-skill; its episode (the log) the task.
    ``both`` trains each frame with each of the two; ``episode`` / ``frame`` with one."""
    from tests.vla.conftest import LONG_TASK, SUBSKILLS
    from vla.train import frame_labels

    (e0, e1) = load_demos([subskill_dataset], 32, progress=False)
    assert e0.instruction == LONG_TASK and e0.frame_instructions == [SUBSKILLS[0]] * 6 + [SUBSKILLS[1]] * 6
    frame_of, labels = frame_labels([e0, e1], "both")
    assert len(labels) == 48 and labels.count(LONG_TASK) == 24 and labels.count(SUBSKILLS[1]) == 12
    assert sorted(frame_of.tolist()) == sorted(list(range(24)) * 2)
    for row, t in enumerate(labels):  # each row's label is its frame's episode instruction or sub-skill
        f = int(frame_of[row])
        assert t in (LONG_TASK, SUBSKILLS[(f % 12) >= 6])
    assert frame_labels([e0, e1], "episode") == (None, [LONG_TASK] * 24)
    assert frame_labels([e0, e1], "frame")[1] == [SUBSKILLS[0]] * 6 + [SUBSKILLS[1]] * 6 + [SUBSKILLS[0]] * 6 + [SUBSKILLS[1]] * 6
    out = train(cfg_for(subskill_dataset, tmp_path / "s", steps=2, save_every=2, balance="tasks"), progress=False)
    assert out["frames"] == 24 and sorted(out["instructions"]) == sorted([LONG_TASK, *SUBSKILLS])
    assert out["frames_per_instruction"] == {LONG_TASK: 24, SUBSKILLS[0]: 12, SUBSKILLS[1]: 12}


def test_paraphrases_are_drawn_uniformly_per_instruction_and_refused_when_ambiguous():
    from vla.train import TrainData, paraphrase_table, sample_text_rows

    wordings, alt = paraphrase_table(["a", "b"], {"a": ("a1", "a2"), "c": ("c1",)})
    assert wordings == ["a", "b", "a1", "a2"] and alt == [[0, 2, 3], [1]]  # "c" is not in the data: unused
    data = TrainData(state=torch.zeros(4, 2), chunks=torch.zeros(4, 2, 2), text_idx=torch.tensor([0, 0, 1, 1]),
                     text_emb=torch.zeros(4, 384), instructions=["a", "b"], images={}, wordings=wordings,
                     alt=torch.tensor([[0, 2, 3], [1, 1, 1]]), n_alt=torch.tensor([3, 1]))
    gen = torch.Generator().manual_seed(0)
    rows = torch.cat([sample_text_rows(data, torch.tensor([0, 2]), gen) for _ in range(3000)]).view(-1, 2)
    assert set(rows[:, 1].tolist()) == {1}  # "b" has no paraphrase
    share = torch.bincount(rows[:, 0], minlength=4)[[0, 2, 3]].double() / len(rows)
    assert torch.allclose(share, torch.full((3,), 1 / 3, dtype=torch.double), atol=0.03), share
    with pytest.raises(ValueError, match="another instruction"):
        paraphrase_table(["a", "b"], {"a": ("b",)})
    with pytest.raises(ValueError, match="shared between instructions"):
        paraphrase_table(["a", "b"], {"a": ("x",), "b": ("x",)})


def test_paraphrases_sim_leaves_the_held_out_wordings_out_and_a_bad_file_is_named(tmp_path, tiny_dataset):
    from hardware.sim_tasks import TASKS
    from vla.commands.train import resolve_paraphrases

    sim = dict(resolve_paraphrases("sim"))
    for t in TASKS.values():
        assert not set(t.held_out) & set(sim.get(t.instruction, ()))
    assert sim["pick up the red cube"] == ("lift the red cube off the table", "pick the red cube up")
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"pick up the red cube": "grab it"}))
    with pytest.raises(ValueError, match="'pick up the red cube' must be a list"):
        resolve_paraphrases(str(bad))
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        resolve_paraphrases(str(bad))
    with pytest.raises(FileNotFoundError, match="no such file"):
        resolve_paraphrases(str(tmp_path / "missing.json"))
    # paraphrases of instructions the data does not have: a clear error, not a silent no-op
    with pytest.raises(ValueError, match="none of its 1 instructions is in the datasets"):
        train(cfg_for(tiny_dataset, tmp_path / "p", steps=1, paraphrases=(("fold the towel", ("fold it",)),)),
              progress=False)
    out = train(cfg_for(tiny_dataset, tmp_path / "q", steps=2, save_every=2,
                        paraphrases=(("pick up the red cube", ("grab the red block",)),)), progress=False)
    assert out["paraphrases"] == {"pick up the red cube": ["grab the red block"]}
    with open(tmp_path / "q/model/config.json") as f:
        assert json.load(f)["paraphrases"] == {"pick up the red cube": ["grab the red block"]}


def test_the_checkpoint_records_dataset_paths_inside_the_working_directory_relative(tiny_dataset, tmp_path,
                                                                                     monkeypatch):
    from vla.train import _where

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "x").mkdir(parents=True)
    assert _where("data/x") == os.path.join("data", "x") and _where(str(tmp_path / "data" / "x")) == os.path.join("data", "x")
    assert _where(tiny_dataset) == os.path.abspath(tiny_dataset)  # outside: absolute
    assert _where("..") == os.path.dirname(str(tmp_path))
