"""`vla train`'s trunk-feature cache (frozen mode): each dataset's features are keyed by content (its frames, the
trunk, the augmentation settings and seed), reused beside other datasets with ``--feature-cache DIR``, and the run
directory's cache is not reused for other frames."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("lerobot")

from tests.vla.test_train import cfg_for  # noqa: E402


def _model_and_data(datasets, tmp_path, **kw):
    from vla.models.compact import CompactVLA, CompactVLAConfig
    from vla.models.encoders import TextEncoder
    from vla.train import build_data

    cfg = cfg_for(datasets[0], tmp_path / "run", **kw)
    cfg = type(cfg)(**{**cfg.__dict__, "datasets": tuple(datasets)})
    data, _, cams = build_data(cfg, TextEncoder(), progress=False)
    torch.manual_seed(0)  # the same trunk in every call of a test
    model = CompactVLA(CompactVLAConfig(cameras=tuple(cams), image_size=64, horizon=4, state_dim=8, action_dim=7,
                                        pretrained=False))
    calls = []
    trunk_forward = model.trunk.forward
    model.trunk.forward = lambda x: (calls.append(len(x)), trunk_forward(x))[1]
    return model, data, cfg, calls


def test_each_datasets_features_are_reused_beside_other_datasets(tiny_dataset, dagger_dataset, tmp_path):
    from vla.train import cache_features

    shared = str(tmp_path / "cache")
    model, both, cfg, calls = _model_and_data([tiny_dataset, dagger_dataset], tmp_path)
    f_both = cache_features(model, both, cfg, None, shared=shared)
    assert sum(calls) == 2 * 2 * 72 and len(os.listdir(shared)) == 2  # 2 views x 2 cameras x 72 frames; a file each
    model2, one, cfg2, calls2 = _model_and_data([dagger_dataset], tmp_path)
    f_one = cache_features(model2, one, cfg2, None, shared=shared)
    assert calls2 == []  # found, not computed
    for k, v in f_one.items():
        assert torch.equal(v, f_both[k][:, 48:])  # the dagger dataset's frames follow tiny's 48
    # computed alone, the dataset's features (augmented views included) are the same as beside another
    model3, one3, cfg3, calls3 = _model_and_data([dagger_dataset], tmp_path)
    f_alone = cache_features(model3, one3, cfg3, None, shared=str(tmp_path / "other"))
    assert sum(calls3) == 2 * 2 * 24 and all(torch.equal(v, f_one[k]) for k, v in f_alone.items())
    # another seed, another augmentation: its own file
    model4, one4, cfg4, calls4 = _model_and_data([dagger_dataset], tmp_path, seed=1)
    cache_features(model4, one4, cfg4, None, shared=shared)
    assert sum(calls4) == 2 * 2 * 24 and len(os.listdir(shared)) == 3


def test_the_run_directory_cache_is_not_reused_for_other_frames(tiny_dataset, tmp_path):
    from vla.train import cache_features

    path = str(tmp_path / "features_cache.pt")
    model, data, cfg, calls = _model_and_data([tiny_dataset], tmp_path)
    first = cache_features(model, data, cfg, path)
    assert first["front"].abs().sum() > 0
    n = sum(calls)
    cache_features(model, data, cfg, path)
    assert sum(calls) == n  # resume: reused
    data.images["front"][5] = 255 - data.images["front"][5]  # same number of frames, one frame differs
    second = cache_features(model, data, cfg, path)
    assert sum(calls) == 2 * n and not torch.equal(second["front"], first["front"])
