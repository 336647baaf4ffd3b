"""`vla export policy | classifier` from the command line: help with examples, the training
instructions as the default, one clear line for a user's mistake."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("onnx")

from deploy.runtime import OnnxPolicy  # noqa: E402
from tests.conftest import save_tiny_vla  # noqa: E402
from vla.cli import build_parser, main  # noqa: E402


@pytest.mark.parametrize("argv", [["export", "--help"], ["export", "policy", "--help"],
                                  ["export", "classifier", "--help"]])
def test_export_help_teaches(argv, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: vla export" in out and "examples:" in out and "vla export " in out.split("examples:")[1]


def test_export_policy_cli_defaults_to_training_instructions(tmp_path, capsys):
    ckpt = save_tiny_vla(str(tmp_path / "vla"), extra={"instructions": ["pick up the red cube"],
                                                       "execution": {"gripper": "binary"}})
    out = tmp_path / "edge" / "pick.onnx"
    assert main(["export", "policy", "--checkpoint", ckpt, "--out", str(out), "--samples", "3"]) == 0
    printed = capsys.readouterr().out
    rep = json.loads(printed.strip().splitlines()[-1])
    assert rep["parity"]["max_abs_diff"] < 1e-4 and "bound 1e-4" in printed
    pol = OnnxPolicy(str(out))
    assert pol.instructions == ["pick up the red cube"] and pol.meta["source"] == "vla"
    assert pol.gripper == "binary"  # the checkpoint's execution.gripper travels to the edge
    obs = {"images": {c: np.zeros((64, 64, 3), np.uint8) for c in ("front", "wrist")},
           "state": np.zeros(8, np.float32), "instruction": "pick up the red cube"}
    chunk = pol(obs)
    assert chunk.shape == (8, 7) and np.isfinite(chunk).all()


def test_export_classifier_cli(tmp_path, capsys):
    import torch

    from rewards.classifier_config import ClassifierConfig
    from rewards.success_classifier import SuccessClassifier

    torch.manual_seed(0)
    SuccessClassifier(ClassifierConfig(cameras=("wrist",), image_size=64, pretrained=False)).save(str(tmp_path / "c"))
    out = tmp_path / "succ.onnx"
    assert main(["export", "classifier", "--classifier", str(tmp_path / "c"), "--out", str(out), "--int8"]) == 0
    assert out.is_file() and (tmp_path / "succ.int8.onnx").is_file()
    assert OnnxPolicy(str(out)).cameras == ["wrist"]


def test_export_user_errors_are_one_line(tmp_path, capsys):
    assert main(["export", "policy", "--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path / "p.onnx")]) == 2
    err = capsys.readouterr().err
    assert "vla export: error:" in err and "missing" in err and "Traceback" not in err
    ckpt = save_tiny_vla(str(tmp_path / "vla"))  # no instructions recorded
    assert main(["export", "policy", "--checkpoint", ckpt, "--out", str(tmp_path / "p.onnx")]) == 2
    assert "pass --instruction" in capsys.readouterr().err
    assert not (tmp_path / "p.onnx").exists()
