"""`vla train --tokens` (ExToken): every frame is trained with its behaviour token from `vla tokens`, the null
token keeps training through token dropout, the checkpoint records the prior, uncovered data is refused."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

pytest.importorskip("lerobot")

from policies.extoken.prior import load_prior, token_meta  # noqa: E402
from vla.cli import main  # noqa: E402
from vla.train import TrainConfig, train  # noqa: E402


def cfg_for(dataset: str, out, tokens: str, **kw) -> TrainConfig:
    base = dict(datasets=(dataset,), out=str(out), steps=4, batch_size=8, warmup_steps=2, save_every=2,
                log_every=2, image_size=64, horizon=4, aug_views=0, seed=0, threads=1, tokens=tokens, num_tokens=2)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def tokens_file(tiny_dataset, tmp_path_factory) -> str:
    """`vla tokens` on the tiny dataset (4 episodes, K=2); it must not decode a single video frame."""
    import lerobot.datasets.video_utils as vu

    def no_decode(*a, **k):
        raise AssertionError("vla tokens decoded video")

    out = str(tmp_path_factory.mktemp("tok") / "tokens.json")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vu, "decode_video_frames", no_decode)
        assert main(["tokens", "--dataset", tiny_dataset, "--k", "2", "--chunks", "1", "--horizon", "4",
                     "--out", out]) == 0
    return out


def spy_token_grads(monkeypatch) -> dict:
    """Records each step's batch tokens and the per-row gradient norm of the head's token embedding."""
    from vla.models.compact import CompactVLA

    seen: dict = {"tokens": [], "grads": []}
    real_loss, real_clip = CompactVLA.loss, torch.nn.utils.clip_grad_norm_

    def loss(self, batch):
        seen["model"] = self
        seen["tokens"].append(batch["token"].clone())
        return real_loss(self, batch)

    def clip(params, *a, **k):  # called right after backward
        seen["grads"].append(seen["model"].head.token_emb.weight.grad.norm(dim=1).clone())
        return real_clip(params, *a, **k)

    monkeypatch.setattr(CompactVLA, "loss", loss)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    return seen


def test_train_feeds_each_frame_its_token_and_records_the_prior(tiny_dataset, tokens_file, tmp_path, monkeypatch):
    seen = spy_token_grads(monkeypatch)
    s = train(cfg_for(tiny_dataset, tmp_path / "run", tokens_file, token_dropout=0.0), progress=False)
    assert s["tokens"]["k"] == 2 and sum(s["tokens"]["frames_per_token"]) == 48
    toks = torch.cat(seen["tokens"])
    assert len(seen["tokens"]) == 4 and set(toks.tolist()) <= {1, 2}
    grads = torch.stack(seen["grads"]).sum(0)  # [K + 1]
    used = sorted(set(toks.tolist()))
    assert (grads[used] > 0).all() and grads[0] == 0, grads  # no dropout: the null token gets no gradient
    prior = load_prior(tokens_file)
    meta = token_meta(str(tmp_path / "run"))
    assert meta == {"k": 2, "unit": "episode", "prior": prior.prior.tolist(), "file_sha256": prior.file_sha256}
    assert token_meta(str(tmp_path / "run" / "checkpoints" / "0000002"))["k"] == 2
    assert json.loads((tmp_path / "run/model/config.json").read_text())["config"]["num_tokens"] == 2


def test_token_dropout_one_trains_only_the_null_token(tiny_dataset, tokens_file, tmp_path, monkeypatch):
    seen = spy_token_grads(monkeypatch)
    train(cfg_for(tiny_dataset, tmp_path / "run", tokens_file, token_dropout=1.0), progress=False)
    assert all((t == 0).all() for t in seen["tokens"])
    grads = torch.stack(seen["grads"])
    assert (grads[:, 0] > 0).all() and (grads[:, 1:] == 0).all(), grads


def test_a_token_file_that_misses_an_episode_or_the_dataset_is_refused(tiny_dataset, tokens_file, tmp_path):
    d = json.loads(open(tokens_file).read())
    d["datasets"][0]["episodes"] = [e for e in d["datasets"][0]["episodes"] if e["episode_index"] != 3]
    (tmp_path / "partial.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=f"no tokens for episode 3 of dataset {tiny_dataset}"):
        train(cfg_for(tiny_dataset, tmp_path / "a", str(tmp_path / "partial.json")), progress=False)
    d["datasets"][0].update(path="/elsewhere/other", name="other")
    (tmp_path / "other.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=f"no tokens for dataset {tiny_dataset}"):
        train(cfg_for(tiny_dataset, tmp_path / "b", str(tmp_path / "other.json")), progress=False)
    with pytest.raises(ValueError, match="K=2 tokens but the model has num_tokens=3"):
        train(cfg_for(tiny_dataset, tmp_path / "c", tokens_file, num_tokens=3), progress=False)
    assert not os.path.exists(tmp_path / "a" / "features_cache.pt")  # refused before any frame was decoded


def test_cli_sets_num_tokens_and_refuses_a_conflicting_one(tiny_dataset, tokens_file, tmp_path, capsys):
    argv = ["train", "--dataset", tiny_dataset, "--tokens", tokens_file, "--steps", "1", "--batch-size", "4",
            "--image-size", "64", "--horizon", "4", "--aug-views", "0", "--threads", "1"]
    assert main(argv + ["--out", str(tmp_path / "x"), "--num-tokens", "3"]) == 2
    assert "K=2 behaviour tokens but the model would have 3 (--num-tokens)" in capsys.readouterr().err
    assert main(["train", "--dataset", tiny_dataset, "--out", str(tmp_path / "y"), "--token-dropout", "0.5"]) == 2
    assert "--token-dropout is for --tokens" in capsys.readouterr().err
    assert main(argv + ["--out", str(tmp_path / "z"), "--token-dropout", "0.5"]) == 0
    cfg = TrainConfig.from_json(str(tmp_path / "z" / "train_config.json"))
    assert (cfg.num_tokens, cfg.tokens, cfg.token_dropout) == (2, tokens_file, 0.5)


def test_resume_rebuilds_the_tokens_and_reuses_the_feature_cache(tiny_dataset, tokens_file, tmp_path, monkeypatch):
    ref = tmp_path / "ref"
    train(cfg_for(tiny_dataset, ref, tokens_file), progress=False)

    run = tmp_path / "crash"
    cfg = cfg_for(tiny_dataset, run, tokens_file)
    calls = {"n": 0}
    real_clip = torch.nn.utils.clip_grad_norm_

    def crashing_clip(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # dies during step 3: checkpoint 2 is the last complete one
            raise RuntimeError("simulated crash")
        return real_clip(*a, **k)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", crashing_clip)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, progress=False)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real_clip)
    cache = run / "features_cache.pt"
    before = cache.stat().st_mtime_ns
    assert main(["train", "--resume", str(run)]) == 0
    assert cache.stat().st_mtime_ns == before  # tokens change no image: the cached features are reused
    from safetensors.torch import load_file

    a, b = load_file(str(ref / "model/model.safetensors")), load_file(str(run / "model/model.safetensors"))
    assert [k for k in a if not torch.equal(a[k], b[k])] == []  # exact, token dropout included

    # a token file that changed under a run is refused on resume
    d = json.loads(open(tokens_file).read())
    d["seed"] = 99
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(d))
    again = dataclasses.replace(cfg, tokens=str(moved))
    (run / "train_config.json").write_text(json.dumps(dataclasses.asdict(again)))
    with pytest.raises(ValueError, match="changed since the run started"):
        train(again, resume=True, progress=False)
