"""Shared fixtures for the hardware tests."""

import pytest


@pytest.fixture(scope="module")
def sim():
    """One fast simulated Panda per test module (no real-time pacing), connected and torn down with the module."""
    from hardware.sim_franka import SimFranka

    s = SimFranka(realtime=False, seed=0)
    s.connect()
    yield s
    s.disconnect()
