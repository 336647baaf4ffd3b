"""SpaceMouseTeleop against a fake pyspacemouse (tests/mocks/fake_pyspacemouse.py), plus checks that
the fake matches the real package when it is installed."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import sys

import numpy as np
import pytest

from hardware.base import DeviceError, NotConnectedError
from hardware.teleop.spacemouse import SpaceMouseTeleop
from tests.mocks import fake_pyspacemouse


def _real_pyspacemouse():
    if importlib.util.find_spec("pyspacemouse") is None:
        return None
    try:
        return importlib.import_module("pyspacemouse")
    except OSError:  # installed, but the hidapi shared library is missing
        return None


REAL = _real_pyspacemouse()


@pytest.fixture
def psm():
    return fake_pyspacemouse.FakePySpaceMouse()


@pytest.fixture
def sm(psm):
    t = SpaceMouseTeleop(pyspacemouse_module=psm, step_m=0.02, step_rad=0.1, deadzone=0.2)
    t.connect()
    yield t
    t.disconnect()


def test_opens_nonblocking_in_z_up_convention_and_closes(psm):
    t = SpaceMouseTeleop(pyspacemouse_module=psm)
    with t:
        assert psm.sim.open_kwargs["nonblocking"] is True
        assert psm.sim.open_kwargs["axis_convention"] == "hid_z_up"
        assert psm.sim.device.connected
    assert not psm.sim.device.connected


def test_axes_to_robot_frame_behind_the_robot(sm, psm):
    cmd = sm.read()
    np.testing.assert_array_equal(cmd.action, [0, 0, 0, 0, 0, 0, 1])
    assert not cmd.intervening and cmd.events == frozenset()
    # cap pushed fully away and a bit right, pulled up; twisted counter-clockwise
    psm.sim.move(x=0.6, y=1.0, z=0.5, yaw=1.0)
    cmd = sm.read()  # both reports (translation, rotation) arrive in one tick
    # away -> +x, right -> -y, up -> +z; deadzone 0.2 rescales 0.6 -> 0.5, 0.5 -> 0.375
    np.testing.assert_allclose(cmd.action, [0.02, -0.01, 0.0075, 0, 0, 0.1, 1], atol=1e-6)
    assert cmd.intervening
    psm.sim.move(roll=1.0, pitch=-1.0)  # device roll (about its x) -> robot -y; pitch (about y) -> robot x
    np.testing.assert_allclose(sm.read().action[3:6], [-0.1, -0.1, 0.1], atol=1e-6)


def test_operator_facing_the_robot_flips_the_plane(psm):
    with SpaceMouseTeleop(pyspacemouse_module=psm, operator_facing_deg=180.0, deadzone=0.0) as t:
        psm.sim.move(x=1.0, y=1.0, z=-1.0, roll=1.0)
        np.testing.assert_allclose(t.read().action, [-0.01, 0.01, -0.01, 0, 0.05, 0, 1], atol=1e-6)


def test_deadzone_and_clipping(sm, psm):
    psm.sim.move(x=0.19, y=-0.1, z=0.05, roll=0.15, pitch=-0.2, yaw=0.1)  # drift at rest
    cmd = sm.read()
    np.testing.assert_array_equal(cmd.action[:6], 0.0)
    assert not cmd.intervening
    psm.sim.move(y=1.4)  # a hard push reads past 1.0
    assert sm.read().action[0] == pytest.approx(0.02)


def test_values_hold_between_reports(sm, psm):
    psm.sim.move(y=1.0)
    assert sm.read().action[0] == pytest.approx(0.02)
    assert sm.read().action[0] == pytest.approx(0.02)  # no new report: still deflected
    psm.sim.move(y=0.0)
    assert sm.read().action[0] == 0.0


def test_buttons(sm, psm):
    psm.sim.tap(0)  # pressed and released between two ticks: still a toggle
    cmd = sm.read()
    assert cmd.action[6] == 0.0 and cmd.intervening and cmd.events == frozenset()
    assert sm.read().action[6] == 0.0  # held state
    psm.sim.buttons(0)  # press and hold
    assert sm.read().action[6] == 1.0
    assert sm.read().intervening and sm.read().action[6] == 1.0  # holding does not toggle again
    psm.sim.buttons()
    psm.sim.tap(1)
    cmd = sm.read()
    assert cmd.events == {"success"} and cmd.action[6] == 1.0
    assert sm.read().events == frozenset()


def test_many_reports_in_one_tick_are_all_processed(sm, psm):
    for v in np.linspace(0.0, 1.0, 40):
        psm.sim.move(y=float(v))
    assert sm.read().action[0] == pytest.approx(0.02)  # the latest value, not a stale one
    assert not psm.sim.reports


def test_begin_episode_drops_presses_and_reopens(sm, psm):
    psm.sim.tap(0)
    sm.read()
    psm.sim.tap(1)
    sm.begin_episode(task="pick")
    cmd = sm.read()
    assert cmd.events == frozenset() and cmd.action[6] == 1.0


def test_always_intervening(psm):
    with SpaceMouseTeleop(pyspacemouse_module=psm, always_intervening=True) as t:
        assert t.read().intervening


def test_errors(psm):
    with pytest.raises(DeviceError, match="could not open"):
        SpaceMouseTeleop(pyspacemouse_module=fake_pyspacemouse.FakePySpaceMouse(connected=False)).connect()
    with pytest.raises(NotConnectedError):
        SpaceMouseTeleop(pyspacemouse_module=psm).read()
    with SpaceMouseTeleop(pyspacemouse_module=psm) as t:
        psm.sim.read_error = OSError("device disconnected")
        with pytest.raises(DeviceError, match="device disconnected"):
            t.read()
    with pytest.raises(ValueError, match="deadzone"):
        SpaceMouseTeleop(deadzone=-0.1)


def test_old_pyspacemouse_is_refused():
    class Old:  # pyspacemouse 1.x: no axis conventions
        @staticmethod
        def open(**kw):
            raise AssertionError("must not be called")

    with pytest.raises(DeviceError, match=">= 2.1"):
        SpaceMouseTeleop(pyspacemouse_module=Old()).connect()


def test_missing_pyspacemouse_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspacemouse", None)
    with pytest.raises(DeviceError, match=r"pip install 'vla-stack\[teleop\]'"):
        SpaceMouseTeleop().connect()


@pytest.mark.skipif(REAL is None, reason="pyspacemouse (with its hidapi library) not installed")
def test_fake_matches_real_pyspacemouse():
    for name in fake_pyspacemouse.API_NAMES:
        assert hasattr(REAL, name), f"pyspacemouse has no {name!r}: the fake drifted"
    assert {f.name for f in dataclasses.fields(REAL.SpaceMouseState)} >= {"t", "x", "y", "z", "roll", "pitch",
                                                                          "yaw", "buttons"}
    for member in fake_pyspacemouse.AxisConvention:
        assert REAL.AxisConvention(member.value).name == member.name
    real_open = inspect.signature(REAL.open).parameters
    fake_open = inspect.signature(fake_pyspacemouse.FakePySpaceMouse().open).parameters
    assert list(fake_open) == list(real_open)
    for method in ("read", "close"):
        assert callable(getattr(REAL.SpaceMouseDevice, method))
