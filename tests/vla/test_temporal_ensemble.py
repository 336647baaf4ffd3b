"""ACT-style temporal ensembling (`vla eval --temporal-ensemble M`): one row per tick, the weighted
mean of every live chunk's prediction for that tick; the memory starts afresh each episode."""

import numpy as np
import pytest

from vla.envs import TemporalEnsemble


class _Model:
    action_shape = (4, 2)


class _Chunks:
    """A whole-chunk VLAPolicy stand-in: call k returns rows ``[100 k + j, -(100 k + j)]``, j = 0..3."""

    exec_steps = 4
    model = _Model()

    def __init__(self):
        self.calls = 0

    def __call__(self, obs):
        k, self.calls = self.calls, self.calls + 1
        v = 100.0 * k + np.arange(4)
        return np.stack([v, -v], 1).astype(np.float32)


@pytest.mark.parametrize("m", [0.0, 0.01, 1.0])
def test_each_tick_executes_the_weighted_mean_of_the_live_chunks(m):
    pol = _Chunks()
    ens = TemporalEnsemble(pol, m)
    for t in range(9):
        row = ens({})
        assert row.shape == (1, 2)
        starts = list(range(max(0, t - 3), t + 1))  # chunks queried at these ticks still cover tick t
        preds = np.array([100.0 * k + (t - k) for k in starts])  # chunk k's row for tick t, oldest first
        w = np.exp(-m * np.arange(len(preds)))
        np.testing.assert_allclose(row[0], [w @ preds / w.sum(), -(w @ preds) / w.sum()], rtol=1e-6)
    assert pol.calls == 9  # re-planned every tick


@pytest.mark.parametrize("window", [1, 2, 3, 4, 9])
def test_a_window_averages_only_the_newest_predictions_of_each_tick(window):
    pol = _Chunks()
    ens = TemporalEnsemble(pol, 0.01, window=window)
    for t in range(9):
        row = ens({})
        starts = list(range(max(0, t - 3), t + 1))[-window:]  # the newest `window` chunks covering tick t
        preds = np.array([100.0 * k + (t - k) for k in starts])
        w = np.exp(-0.01 * np.arange(len(preds)))
        np.testing.assert_allclose(row[0], [w @ preds / w.sum(), -(w @ preds) / w.sum()], rtol=1e-6)
    if window == 1:  # the newest chunk's first row alone: re-planning every tick, no averaging
        np.testing.assert_allclose(row[0], [800.0, -800.0])


def test_reset_forgets_the_last_episode():
    ens = TemporalEnsemble(_Chunks(), 0.0)
    for _ in range(5):
        ens({})
    ens.reset(1)
    np.testing.assert_allclose(ens({})[0], [500.0, -500.0])  # only the new chunk counts


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="m must be >= 0"):
        TemporalEnsemble(_Chunks(), -1.0)
    for bad in (0, -2, 1.5, True, "3"):
        with pytest.raises(ValueError, match="window must be a whole number"):
            TemporalEnsemble(_Chunks(), 0.01, window=bad)
    pol = _Chunks()
    pol.exec_steps = 2
    with pytest.raises(ValueError, match="whole chunk"):
        TemporalEnsemble(pol, 0.01)
