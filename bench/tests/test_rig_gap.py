"""bench.rig_gap's emulation-filmed condition. Moved from tests/test_bench_rig_gap.py (issue 62; the bench's runs stay
there); e2e as it was."""

import numpy as np
import pytest

pytestmark = pytest.mark.e2e


def test_filmed_emulation_is_emulation_through_the_clean_camera():
    """emulation-filmed: the same game as emulation (rewards, lives, the emulator's frames), each picture
    filmed by the rig's camera with every source off and rectified: close to the emulator's picture but
    not the same array."""
    from bench.rig_gap import make_env
    from policies.dqn.preprocess import grey_resize

    plain, filmed = make_env("breakout", "emulation", 1, 50), make_env("breakout", "emulation-filmed", 1, 50)
    (a, _), (b, _) = plain.reset(seed=3), filmed.reset(seed=3)
    for i in range(40):
        a, ra, ta, *_ = plain.step(i % 4)
        b, rb, tb, *_ = filmed.step(i % 4)
        assert (ra, ta) == (rb, tb) and np.array_equal(plain.ale.getScreenRGB(), filmed.ale.getScreenRGB())
        pa, pb = a["images"]["screen"], b["images"]["screen"]
        assert pb.shape == pa.shape == (210, 160, 3) and not np.array_equal(pa, pb)
        assert np.abs(grey_resize(pa).astype(int) - grey_resize(pb).astype(int)).mean() < 2.0
