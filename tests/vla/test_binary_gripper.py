"""`vla eval --gripper binary`: the executed gripper opening snapped shut or open (vla.envs.BinaryGripper),
after temporal ensembling, the other action columns untouched; refused where it cannot apply."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from vla.envs import BinaryGripper, TemporalEnsemble, gripper_option


class _Model:
    action_shape = (4, 7)


class _Fixed:
    """A policy stand-in returning the rows it is given, call after call."""

    model = _Model()
    exec_steps = 4

    def __init__(self, rows):
        self.rows, self.seeds = np.asarray(rows, np.float32), []

    def reset(self, seed=None):
        self.seeds.append(seed)

    def __call__(self, obs):
        return self.rows.copy()


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 8), st.just(7)),
              elements=st.floats(-2, 2, width=32, allow_nan=False)))
def test_the_opening_is_snapped_at_one_half_and_nothing_else_moves(rows):
    pol = _Fixed(rows)
    out = BinaryGripper(pol)({})
    np.testing.assert_array_equal(out[:, :6], rows[:, :6])
    np.testing.assert_array_equal(out[:, 6], np.where(rows[:, 6] >= 0.5, 1.0, 0.0))
    np.testing.assert_array_equal(pol.rows, rows)  # the wrapped policy's array is not written to


class _Chunks:
    """A whole-chunk policy whose gripper column alternates between chunks: 0.0 on even calls, 0.9 on odd."""

    model = _Model()
    exec_steps = 4

    def __init__(self):
        self.calls = 0

    def __call__(self, obs):
        g, self.calls = (0.0 if self.calls % 2 == 0 else 0.9), self.calls + 1
        rows = np.zeros((4, 7), np.float32)
        rows[:, 6] = g
        return rows


def test_the_snap_comes_after_the_ensemble_mean():
    """Two live chunks that say 0.0 and 0.9: their mean 0.45 is shut. Snapping each chunk first would give
    the mean of 0 and 1, 0.5, which is open."""
    ens = BinaryGripper(TemporalEnsemble(_Chunks(), 0.0))
    assert ens({})[0, 6] == 0.0  # one chunk: 0.0
    assert ens({})[0, 6] == 0.0  # mean(0.0, 0.9) = 0.45 -> shut
    assert ens.exec_steps == 1  # the wrapped policy's attributes show through


def test_reset_reaches_the_wrapped_policy():
    pol = _Fixed(np.zeros((4, 7)))
    wrapped = BinaryGripper(pol)
    wrapped.reset(7)
    assert pol.seeds[-1] == 7 and wrapped.exec_steps == 4 and wrapped.model is pol.model


def test_refusals_name_what_is_wrong():
    for bad in (0.0, 1.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match="threshold must lie in"):
            BinaryGripper(_Fixed(np.zeros((4, 7))), threshold=bad)
    pol = _Fixed(np.zeros((4, 2)))
    pol.model = type("M", (), {"action_shape": (4, 2)})()
    with pytest.raises(ValueError, match="this VLA's actions have 2 columns"):
        BinaryGripper(pol)
    assert gripper_option(" binary ") == "binary" and gripper_option("raw") == "raw"
    for bad in ("", "bin", "Binary", "0.5"):
        with pytest.raises(ValueError, match="--gripper"):
            gripper_option(bad)


def test_make_policy_wraps_only_for_binary():
    from vla.evaluate import make_policy

    class _M:
        action_shape = (4, 7)
        noise_shape = (4, 7)

    raw = make_policy(_M(), None, 0.01, None, "zero", "raw")
    assert isinstance(raw, TemporalEnsemble)
    snapped = make_policy(_M(), None, 0.01, None, "zero", "binary")
    assert isinstance(snapped, BinaryGripper) and isinstance(snapped.policy, TemporalEnsemble)
    with pytest.raises(ValueError, match="--gripper"):
        make_policy(_M(), None, 0.01, None, "zero", "half")


def test_vla_eval_refuses_binary_with_a_user_env(capsys):
    from vla.cli import main

    assert main(["eval", "--checkpoint", "nowhere", "--env", "tests.vla.eval_toy_env:make_env",
                 "--gripper", "binary"]) != 0
    err = capsys.readouterr().err
    assert "--gripper binary" in err and "drop --gripper" in err and "Traceback" not in err


def _ckpt(tmp_path, body):
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(body if isinstance(body, str) else __import__("json").dumps(body))
    return str(d)


def test_auto_takes_what_the_checkpoint_names_else_raw(tmp_path):
    from vla.envs import checkpoint_gripper, resolve_gripper

    binary = _ckpt(tmp_path, {"kind": "compact-flow-vla", "execution": {"gripper": "binary"}})
    assert checkpoint_gripper(binary) == "binary"
    assert resolve_gripper("auto", binary) == "binary" and resolve_gripper("raw", binary) == "raw"
    for silent in ({"kind": "x"}, {"execution": {}}, {"execution": None}, {"execution": {"gripper": None}}):
        none = _ckpt(tmp_path, silent)
        assert checkpoint_gripper(none) is None and resolve_gripper("auto", none) == "raw"
    assert resolve_gripper("auto", str(tmp_path / "missing")) == "raw"  # a hub id, a path without a config
    assert resolve_gripper("binary", None) == "binary" and resolve_gripper("auto", None) == "raw"


@pytest.mark.parametrize("body, match", [
    ({"execution": {"gripper": "half"}}, r"config.json: execution.gripper 'half'"),
    ({"execution": {"gripper": 1}}, r"execution.gripper 1"),
    ({"execution": "binary"}, r"'execution' must be a mapping"),
])
def test_a_bad_execution_field_is_refused_naming_file_and_field(tmp_path, body, match):
    from vla.envs import checkpoint_gripper

    with pytest.raises(ValueError, match=match):
        checkpoint_gripper(_ckpt(tmp_path, body))


def test_vla_eval_refuses_a_bad_gripper_before_loading(capsys):
    from vla.cli import main

    with pytest.raises(SystemExit) as e:
        main(["eval", "--checkpoint", "nowhere", "--gripper", "half"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--gripper" in err and "'half'" in err and "Traceback" not in err


def test_an_rl_session_takes_the_checkpoints_opening_and_refuses_binary_on_a_user_env(tmp_path):
    from session.config import RLConfig
    from vla.commands.rl import session_gripper

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text('{"kind": "compact-flow-vla", "execution": {"gripper": "binary"}}')
    flat = dict(out=str(tmp_path / "rl"), task="pick_red_cube")
    assert session_gripper(RLConfig.flat(checkpoint=str(run), **flat)) == "binary"  # a run dir: its model
    assert session_gripper(RLConfig.flat(checkpoint=str(run), gripper="raw", **flat)) == "raw"
    assert session_gripper(RLConfig.flat(checkpoint="lerobot/pi0", **flat)) == "raw"  # names none
    with pytest.raises(ValueError, match="an --env defines its own actions"):
        RLConfig.flat(checkpoint=str(run), out=str(tmp_path / "rl"), task="", env="tests.vla.eval_toy_env:make_env",
                      gripper="binary")
    with pytest.raises(ValueError, match="gripper 'half'"):
        RLConfig.flat(checkpoint=str(run), gripper="half", **flat)
