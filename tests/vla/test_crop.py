"""Per-camera regions of interest (`vla train --crop CAM=X0,Y0,X1,Y1`): the same crop in training
data and at inference, kept in the checkpoint."""

import json

import numpy as np
import pytest
import torch

from vla.models.compact import CompactVLA, CompactVLAConfig
from vla.models.encoders import crop_uint8


def test_crop_uint8_cuts_the_region_given_in_fractions():
    img = torch.arange(10 * 20 * 3, dtype=torch.int64).reshape(1, 10, 20, 3).to(torch.uint8)
    out = crop_uint8(img, (0.25, 0.5, 0.75, 1.0))
    assert tuple(out.shape) == (1, 5, 10, 3)
    assert torch.equal(out, img[:, 5:10, 5:15])
    with pytest.raises(ValueError, match="crop box"):
        crop_uint8(img, (0.5, 0.0, 0.5, 1.0))


def test_config_refuses_a_crop_of_an_unknown_camera_or_an_empty_box():
    with pytest.raises(ValueError, match="crops"):
        CompactVLAConfig(crops=(("top", 0, 0, 1, 1),), pretrained=False)
    with pytest.raises(ValueError, match="x0 < x1"):
        CompactVLAConfig(crops=(("front", 0.6, 0, 0.4, 1),), pretrained=False)


def test_the_model_crops_before_it_resizes_and_keeps_the_crop_in_its_checkpoint(tmp_path):
    cfg = CompactVLAConfig(image_size=32, hidden=32, cond_dim=32, keypoints=4, pretrained=False,
                           crops=(("front", 0.5, 0.5, 1.0, 1.0),))
    m = CompactVLA(cfg)
    img = np.zeros((1, 64, 64, 3), np.uint8)
    img[:, 32:, 32:] = 200  # only the bottom-right quarter is bright
    out = m.preprocess_images({"front": torch.from_numpy(img), "wrist": torch.from_numpy(img)})
    assert tuple(out["front"].shape) == (1, 32, 32, 3)
    assert int(out["front"].min()) == 200  # the crop is the bright quarter, scaled up
    assert 0 < float(out["wrist"].float().mean()) < 200  # the uncropped camera is the whole frame
    m.save(str(tmp_path / "ck"))
    back = CompactVLA.load(str(tmp_path / "ck"))
    assert back.cfg.crops == cfg.crops and back.cfg.crop_boxes == {"front": (0.5, 0.5, 1.0, 1.0)}


def test_vla_train_parses_crop_flags_and_names_a_bad_one():
    from vla.commands.train import _parse_crop
    from vla.train_config import TrainConfig

    assert _parse_crop("front=0.1,0.2,0.9,0.8") == ("front", 0.1, 0.2, 0.9, 0.8)
    with pytest.raises(ValueError, match="CAM=X0,Y0,X1,Y1"):
        _parse_crop("front=0.1,0.2")
    with pytest.raises(ValueError, match="crop"):
        TrainConfig(datasets=("d",), out="o", crops=(("front", 0.9, 0.0, 0.1, 1.0),))


def test_demo_loading_applies_the_same_crop(tiny_dataset):
    from vla.data.demos import load_demos

    whole = load_demos([tiny_dataset], 32, progress=False)
    cropped = load_demos([tiny_dataset], 32, progress=False, crops={"front": (0.0, 0.0, 0.5, 0.5)})
    native = load_demos([tiny_dataset], None, progress=False)
    cam = "front"
    assert whole[0].images[cam].shape[1:] == (32, 32, 3) == cropped[0].images[cam].shape[1:]
    assert not np.array_equal(whole[0].images[cam], cropped[0].images[cam])
    from vla.models.encoders import resize_uint8
    expect = resize_uint8(crop_uint8(torch.from_numpy(native[0].images[cam]), (0, 0, 0.5, 0.5)), 32).numpy()
    np.testing.assert_array_equal(cropped[0].images[cam], expect)


def test_a_finer_keypoint_map_follows_the_trunk_stride():
    from vla.models.encoders import EfficientNetTrunk

    for fine_blocks, stride, channels in ((5, 8, 40), (3, 4, 24)):
        trunk = EfficientNetTrunk(11, pretrained=False, fine_blocks=fine_blocks)
        fine, _ = trunk(torch.zeros(1, 64, 64, 3, dtype=torch.uint8))
        assert trunk.fine_stride == stride and tuple(fine.shape[1:]) == (channels, 64 // stride, 64 // stride)
    m = CompactVLA(CompactVLAConfig(image_size=64, hidden=32, cond_dim=32, keypoints=4, pretrained=False, fine_blocks=3))
    obs = {"images": {c: np.zeros((1, 64, 64, 3), np.uint8) for c in ("front", "wrist")},
           "state": np.zeros((1, 8), np.float32), "instruction": ["pick up the red cube"]}
    assert tuple(m.sample_actions(obs).shape) == (1, 8, 7)


def test_vla_train_passes_the_augmentation_flags_and_refuses_negative_ones(monkeypatch, capsys):
    import vla.train
    from vla.cli import main

    seen = {}

    def fake_train(cfg, resume=False, feature_cache=None):
        seen["cfg"], seen["feature_cache"] = cfg, feature_cache
        return {"run_dir": cfg.out, "steps": 0, "wall_s": 0.0, "episodes": 0, "frames": 0}

    monkeypatch.setattr(vla.train, "train", fake_train)
    monkeypatch.delenv("VLA_FEATURE_CACHE", raising=False)
    assert main(["train", "--dataset", "d", "--out", "o", "--shift-pad", "0", "--jitter", "0.05"]) == 0
    assert (seen["cfg"].shift_pad, seen["cfg"].jitter) == (0, 0.05) and seen["feature_cache"] is None
    # --feature-cache reaches train(), and $VLA_FEATURE_CACHE is its default
    assert main(["train", "--dataset", "d", "--out", "o", "--feature-cache", "feats"]) == 0
    assert seen["feature_cache"] == "feats"
    monkeypatch.setenv("VLA_FEATURE_CACHE", "shared")
    assert main(["train", "--dataset", "d", "--out", "o"]) == 0 and seen["feature_cache"] == "shared"
    assert main(["train", "--dataset", "d", "--out", "o", "--shift-pad", "-2"]) != 0
    assert "shift_pad" in capsys.readouterr().err


def _log(root, rows):
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "vla_episodes.jsonl").write_text("".join(json.dumps({"episode_index": i, **r}) + "\n"
                                                              for i, r in enumerate(rows)))
    return str(root)


def test_vla_train_crops_to_the_regions_of_interest_the_data_was_recorded_with(tmp_path):
    from vla.commands.train import recorded_crops

    roi = {"front": [0.2, 0.35, 0.8, 0.85]}
    a = _log(tmp_path / "a", [{"roi": roi}, {"roi": roi}])
    b = _log(tmp_path / "b", [{"roi": roi}])
    assert recorded_crops([a, b]) == (("front", 0.2, 0.35, 0.8, 0.85),)
    assert recorded_crops([_log(tmp_path / "c", [{"success": True}])]) == ()  # recorded without a roi
    other = _log(tmp_path / "d", [{"roi": {"front": [0.1, 0.3, 0.9, 0.9]}}])
    with pytest.raises(ValueError, match="different camera regions of interest.*--crop"):
        recorded_crops([a, other])
