"""The success classifier: learns a visual success cue from few frames, does not "learn" shuffled
labels, saves / loads exactly, plugs into RobotEnv's reward hook, and reads its labels from
LeRobot datasets recorded by `vla record` (meta/vla_episodes.jsonl)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("efficientnet_lite_pytorch")
torch = pytest.importorskip("torch")

from rewards.success_classifier import (ClassifierConfig, ClassifierTrainConfig, LabelledFrames,  # noqa: E402
                                        SuccessClassifier, binary_metrics, choose_threshold, classifier_reward,
                                        frame_labels, label_frames, read_episode_outcomes, train_classifier)

SIZE = 64
RED, GREEN = (220, 30, 30), (30, 200, 40)


def _frame(rng: np.random.Generator, red: bool) -> np.ndarray:
    """A noisy two-tone tabletop; success = a red square somewhere. Failures often show a green
    square (a near-miss distractor), so "a square is there" is not the answer."""
    top, bottom = rng.integers(60, 180, 3), rng.integers(60, 180, 3)
    img = np.where(np.arange(SIZE)[:, None, None] < rng.integers(20, 44), top, bottom).astype(np.int16)
    img = np.broadcast_to(img, (SIZE, SIZE, 3)).copy() + rng.integers(-20, 21, (SIZE, SIZE, 3))
    for color, on in ((RED, red), (GREEN, rng.random() < 0.6)):
        if on:
            s = int(rng.integers(10, 15))
            y, x = rng.integers(0, SIZE - s, 2)
            img[y:y + s, x:x + s] = color
    return np.clip(img, 0, 255).astype(np.uint8)


def synthetic(episodes: int, frames: int, seed: int, last_k: int = 4) -> LabelledFrames:
    """Episodes of ``frames`` frames; every other episode succeeds, its last ``last_k`` frames show it."""
    rng = np.random.default_rng(seed)
    imgs, labels, groups = [], [], []
    for ep in range(episodes):
        y = frame_labels(frames, ep % 2 == 0, last_k, margin=0)
        imgs += [_frame(rng, bool(v)) for v in y]
        labels.append(y.astype(np.float32))
        groups.append(np.full(frames, ep))
    return LabelledFrames(images={"front": np.stack(imgs)}, labels=np.concatenate(labels), groups=np.concatenate(groups))


FAST = ClassifierTrainConfig(steps=150, batch_size=32, aug_views=1, eval_every=25, val_fraction=0.25, threads=1)


@pytest.fixture(scope="module")
def heldout() -> LabelledFrames:
    return synthetic(12, 10, seed=1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[str, dict]:
    out = str(tmp_path_factory.mktemp("succ") / "clf")
    rep = train_classifier(synthetic(20, 10, seed=0), out, ClassifierConfig(cameras=("front",), image_size=SIZE),
                           FAST, progress=False)
    return out, rep


def test_learns_the_success_cue_on_heldout_frames(trained, heldout):
    out, rep = trained
    for f in ("config.json", "model.safetensors", "report.json", "pr_curve.png"):
        assert os.path.getsize(os.path.join(out, f)) > 0, f
    assert rep["val_episodes"] >= 2 and rep["val"]["n"] == rep["val_frames"] > 0
    model = SuccessClassifier.load(out)
    p = model.predict_proba(heldout.images)
    assert p.shape == (len(heldout),) and p.dtype == np.float32 and ((p >= 0) & (p <= 1)).all()
    at_thr = binary_metrics(p, heldout.labels, model.threshold)
    assert binary_metrics(p, heldout.labels, 0.5)["accuracy"] > 0.9
    assert at_thr["accuracy"] > 0.9 and at_thr["balanced_accuracy"] > 0.85, at_thr
    assert at_thr["precision"] > 0.9, at_thr  # the threshold was chosen for precision


def test_shuffled_labels_do_not_transfer(tmp_path, heldout):
    data = synthetic(20, 10, seed=0)
    data.labels = np.random.default_rng(3).permutation(data.labels)
    train_classifier(data, str(tmp_path), ClassifierConfig(cameras=("front",), image_size=SIZE), FAST, progress=False)
    p = SuccessClassifier.load(str(tmp_path)).predict_proba(heldout.images)
    assert binary_metrics(p, heldout.labels, 0.5)["balanced_accuracy"] < 0.75


def test_two_cameras_use_the_one_that_shows_success(tmp_path):
    def two_cams(episodes, seed):
        d = synthetic(episodes, 8, seed)
        rng = np.random.default_rng(seed + 100)  # the front camera shows no success cue at all
        d.images = {"wrist": d.images["front"], "front": np.stack([_frame(rng, False) for _ in d.labels])}
        return d

    cfg = ClassifierConfig(cameras=("front", "wrist"), image_size=SIZE)
    train_classifier(two_cams(12, 0), str(tmp_path), cfg, FAST, progress=False)
    model = SuccessClassifier.load(str(tmp_path))
    assert model.cameras == ("front", "wrist")
    held = two_cams(8, 1)
    assert binary_metrics(model.predict_proba(held.images), held.labels, 0.5)["accuracy"] > 0.9
    with pytest.raises(KeyError, match="wrist"):
        model.predict_proba({"front": held.images["front"]})


def test_save_load_roundtrip_and_integrity(trained, heldout, tmp_path):
    out, rep = trained
    a = SuccessClassifier.load(out)
    b = SuccessClassifier.load(out)
    imgs = {"front": heldout.images["front"][:8]}
    np.testing.assert_array_equal(a.predict_proba(imgs), b.predict_proba(imgs))
    assert a.threshold == pytest.approx(rep["threshold"]) and a.cameras == ("front",)
    assert not any(k.startswith("trunk.") for k in a.head_state())  # the ImageNet trunk is not copied
    # a weights file that does not belong to the config is refused
    a.save(str(tmp_path / "x"))
    with open(tmp_path / "x" / "model.safetensors", "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(ValueError, match="sha256"):
        SuccessClassifier.load(str(tmp_path / "x"))
    with pytest.raises(FileNotFoundError, match="not a success classifier"):
        SuccessClassifier.load(str(tmp_path))


def test_classifier_reward_hook(trained, heldout):
    out, _ = trained
    reward_fn = classifier_reward(out)
    i_pos = int(np.flatnonzero(heldout.labels > 0)[0])
    i_neg = int(np.flatnonzero(heldout.labels == 0)[0])
    for i, want in ((i_pos, (1.0, True)), (i_neg, (0.0, False))):
        info: dict = {}
        assert reward_fn(None, {"images": {"front": heldout.images["front"][i]}}, info) == want
        assert info["success"] is want[1] and 0 <= info["success_prob"] <= 1
    always = classifier_reward(out, threshold=0.0)
    assert always(None, {"images": {"front": heldout.images["front"][i_neg]}}, {}) == (1.0, True)
    with pytest.raises(KeyError, match="wrist"):
        classifier_reward(out)(None, {"images": {"wrist": heldout.images["front"][0]}}, {})
    with pytest.raises(ValueError):
        classifier_reward(out, threshold=1.5)


def test_choose_threshold_for_precision():
    probs = np.array([0.9, 0.8, 0.7, 0.6, 0.1])
    labels = np.array([1, 0, 1, 1, 0])
    thr, met = choose_threshold(probs, labels, 0.95)  # only "p >= 0.9" is precise enough
    assert met and thr == 0.9
    m = binary_metrics(probs, labels, thr)
    assert m["precision"] == 1.0 and m["recall"] == pytest.approx(1 / 3)
    thr, met = choose_threshold(probs, labels, 0.7)  # 3 of 4 above 0.6: recall 1
    assert met and thr == 0.6
    thr, met = choose_threshold(np.array([0.9, 0.2]), np.array([0, 1]), 0.9)  # nothing reaches it
    assert not met


def test_frame_labels_and_outcomes(tmp_path):
    np.testing.assert_array_equal(frame_labels(8, True, 2, 3), [0, 0, 0, -1, -1, -1, 1, 1])
    np.testing.assert_array_equal(frame_labels(4, True, 2, 3), [-1, -1, 1, 1])
    np.testing.assert_array_equal(frame_labels(4, False, 2, 3), [0, 0, 0, 0])
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "vla_episodes.jsonl").write_text(
        '{"episode_index": 0, "success": true}\n{"episode_index": 1, "success": false}\n'
        '{"episode_index": 0, "success": false}\n{"episode_index": 2, "succ')  # a later line wins; a torn line is skipped
    assert read_episode_outcomes(str(tmp_path)) == {0: False, 1: False}
    with pytest.raises(FileNotFoundError, match="vla_episodes.jsonl"):
        read_episode_outcomes(str(tmp_path / "nope"))


@pytest.fixture(scope="module")
def success_dataset(tmp_path_factory) -> str:
    """A LeRobot v3 dataset as `vla record --keep-failures` leaves it: 5 episodes x 8 frames, the
    even ones successful (a red square in the last 3 frames), plus a 6th episode with no outcome line."""
    pytest.importorskip("lerobot")
    from vla.data import EpisodeWriter, make_features

    root = tmp_path_factory.mktemp("data") / "succ"
    rng = np.random.default_rng(0)
    w = EpisodeWriter(str(root), "local/succ", fps=10, features=make_features({"front": (SIZE, SIZE)}, 8, 7),
                      robot_type="test")
    for ep in range(6):
        for i in range(8):
            w.add_frame({"observation.images.front": _frame(rng, ep % 2 == 0 and i >= 5),
                         "observation.state": np.zeros(8, np.float32), "action": np.zeros(7, np.float32),
                         "intervention": False, "observation.capture_time": i / 10}, task="put the red square down")
        w.save_episode()
    w.close()
    with open(root / "meta" / "vla_episodes.jsonl", "w") as f:
        for ep in range(5):
            f.write(json.dumps({"episode_index": ep, "success": ep % 2 == 0, "frames": 8}) + "\n")
    return str(root)


def test_labels_from_a_recorded_dataset(success_dataset):
    data = label_frames([success_dataset], SIZE, last_k=3, margin=1, progress=False)
    # 3 successes x (8 - 1 left out) + 2 failures x 8; episode 5 has no outcome and is skipped
    assert len(data) == 3 * 7 + 2 * 8 and data.labels.sum() == 9
    assert data.images["front"].shape == (len(data), SIZE, SIZE, 3) and len(np.unique(data.groups)) == 5
    # the positives really are the red-square frames (video compression aside)
    img = data.images["front"].astype(int)
    red = (img[..., 0] > 205) & (img[..., 1] < 80) & (img[..., 2] < 80)  # the background never gets there
    np.testing.assert_array_equal(red.sum(axis=(1, 2)) > 30, data.labels > 0)


def test_cli_train_and_eval(success_dataset, tmp_path, capsys):
    from vla.cli import main

    out = str(tmp_path / "succ")
    assert main(["reward", "train", "--dataset", success_dataset, "--out", out, "--steps", "60", "--last-k", "3",
                 "--margin", "0", "--image-size", str(SIZE), "--threads", "1", "--val-fraction", "0.34"]) == 0
    text = capsys.readouterr().out
    assert "validation:" in text and "accuracy" in text
    assert os.path.isfile(os.path.join(out, "pr_curve.png"))
    assert json.load(open(os.path.join(out, "config.json")))["labels"] == {"last_k": 3, "margin": 0,
                                                                       "datasets": [success_dataset]}
    assert main(["reward", "eval", "--classifier", out, "--dataset", success_dataset, "--threads", "1"]) == 0
    m = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert m["n"] == 5 * 8 and m["accuracy"] > 0.8  # mostly frames it trained on: a sanity check, not a score
    assert main(["reward", "train", "--dataset", success_dataset, "--out", out]) == 2  # never overwrites
    assert "already holds a classifier" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["reward", "--help"], ["reward", "train", "--help"], ["reward", "eval", "--help"]])
def test_reward_help(argv, capsys):
    from vla.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "usage: vla reward" in out


def test_rl_session_wiring_uses_the_classifier_and_the_operator_reset(trained, tmp_path):
    """`vla rl --reward classifier:DIR` on a robot that is not a simulator: the env's reward is the
    classifier and its reset asks the operator; bad reward specs are refused by name."""
    from vla.commands.rl import make_sim_env
    from vla.operator_reset import OperatorResetHook
    from session.config import RLConfig

    out, _ = trained

    class RealArmClient:  # what a real arm's bridge client describes: no simulated objects
        description = {"driver": "franka", "limits": {"max_step_m": 0.02}}

        def observe(self, instruction, *a):
            return {"images": {"front": np.zeros((SIZE, SIZE, 3), np.uint8)}, "state": np.zeros(8, np.float32),
                    "instruction": instruction, "t": {"state": 0}}

    cfg = RLConfig(checkpoint="ckpt", out=str(tmp_path), task="", reward=f"classifier:{out}",
                   instruction="fold the towel", max_episode_ticks=40)
    env = make_sim_env(cfg, RealArmClient())
    assert isinstance(env.reset_fn, OperatorResetHook)
    assert env.instruction == "fold the towel" and env.max_ticks == 40
    with pytest.raises(ValueError, match="reward"):
        RLConfig(checkpoint="c", out="o", task="pick_red_cube", reward="vlm-judge")
    with pytest.raises(ValueError, match="sim task"):
        RLConfig(checkpoint="c", out="o", task="")  # reward 'task' without a task


def test_sarl_classifier_terminator_ends_a_prompt_when_the_classifier_sees_success(trained):
    """`vla rl --method sarl --terminator classifier:DIR` (the real-robot path): the prompt ends once the trained
    classifier's probability on the camera frame reaches its threshold."""
    from policies.sarl.agent import SARLAgent
    from policies.sarl.config import SARLConfig

    path, _ = trained
    agent = SARLAgent.__new__(SARLAgent)  # only the terminator is built: no VLA needed
    agent.cfg = SARLConfig(terminator=f"classifier:{path}")
    term = agent._terminator()
    rng = np.random.default_rng(5)
    frames = [_frame(rng, red) for red in [True] * 10 + [False] * 10]
    term.start("pick up the red cube", None, {})
    says = [term.stop({"images": {"front": f}}, {}, 1) for f in frames]
    model = SuccessClassifier.load(path)
    assert says == list(model.predict_proba({"front": np.stack(frames)}) >= model.threshold)  # the classifier decides
    assert sum(says[:10]) >= sum(says[10:]) + 5, says  # ... and it tells success frames from failures
