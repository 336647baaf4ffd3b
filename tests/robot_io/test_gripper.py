"""robot_io.gripper: the executed gripper opening snapped shut / open at 0.5 (numpy only, the edge runner's and
the thin client's copy of `vla eval --gripper binary`), and the mode names refused by name."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from robot_io.gripper import GRIPPER_COLUMN, gripper_mode, snap_opening


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 9), st.integers(GRIPPER_COLUMN + 1, 9)),
              elements=st.one_of(st.floats(-3, 3), st.just(float("nan")), st.just(0.5),
                                 st.just(np.nextafter(0.5, 0)))))
def test_only_the_opening_moves_and_it_lands_on_zero_or_one(rows):
    out = snap_opening(rows)
    assert out.dtype == np.float32 and out.shape == rows.shape
    others = [c for c in range(rows.shape[1]) if c != GRIPPER_COLUMN]
    np.testing.assert_array_equal(out[:, others], rows[:, others].astype(np.float32))
    g, s = rows[:, GRIPPER_COLUMN].astype(np.float32), out[:, GRIPPER_COLUMN]
    assert np.array_equal(np.isnan(s), np.isnan(g))  # NaN stays NaN: the caller's finiteness check refuses it
    ok = ~np.isnan(g)
    np.testing.assert_array_equal(s[ok], np.where(g[ok] >= 0.5, 1.0, 0.0))


def test_the_input_is_not_written_to_and_a_single_row_works():
    row = np.array([0.01, 0, 0, 0, 0, 0, 0.49], np.float32)
    out = snap_opening(row)
    assert out[6] == 0.0 and row[6] == np.float32(0.49)
    assert snap_opening([0, 0, 0, 0, 0, 0, 0.5])[6] == 1.0


@pytest.mark.parametrize("rows, match", [(np.zeros((3, 6)), "column 6"), (np.float32(0.3), "column 6")])
def test_rows_without_an_opening_column_are_refused(rows, match):
    with pytest.raises(ValueError, match=match):
        snap_opening(rows)


@pytest.mark.parametrize("bad", [0.0, 1.0, -1.0, float("nan"), float("inf")])
def test_thresholds_outside_the_open_interval_are_refused(bad):
    with pytest.raises(ValueError, match="threshold must lie in"):
        snap_opening(np.zeros((2, 7)), threshold=bad)


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.text(max_size=12), st.integers(), st.none(), st.floats()))
def test_mode_names_are_refused_unless_exact(spec):
    ok = {"raw", "binary"}
    if isinstance(spec, str) and spec.strip() in ok:
        assert gripper_mode(spec) == spec.strip()
    else:
        with pytest.raises(ValueError, match="the field") as e:
            gripper_mode(spec, "the field")
        assert "raw" in str(e.value) and "binary" in str(e.value)
    if isinstance(spec, str) and spec.strip() == "auto":
        assert gripper_mode(spec, auto=True) == "auto"
