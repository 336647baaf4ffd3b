"""GamepadTeleop against a fake pygame (tests/mocks/fake_pygame.py), plus a check that the fake's
names exist on the real pygame when it is installed."""

from __future__ import annotations

import functools
import importlib.util
import sys

import numpy as np
import pytest

from hardware.base import DeviceError, NotConnectedError
from hardware.teleop.gamepad import LAYOUTS, GamepadLayout, GamepadTeleop
from tests.mocks import fake_pygame

LX, LY, LT, RX, RY, RT = 0, 1, 2, 3, 4, 5
A, B, X, Y, START = 0, 1, 2, 3, 7


@pytest.fixture
def pg():
    return fake_pygame.FakePygame()


@pytest.fixture
def pad(pg):
    t = GamepadTeleop(pygame_module=pg, step_m=0.02, step_rad=0.1, deadzone=0.2)
    t.connect()
    yield t
    t.disconnect()


def test_connect_inits_and_disconnect_quits(pg):
    t = GamepadTeleop(pygame_module=pg)
    with t:
        assert pg.sim.display_init and pg.sim.joystick_init and pg.sim.open_joysticks == {0}
        assert t.read().action[6] == 1.0
    assert not pg.sim.display_init and not pg.sim.joystick_init and not pg.sim.open_joysticks


def test_sticks_map_to_motion_with_deadzone(pad, pg):
    cmd = pad.read()
    np.testing.assert_array_equal(cmd.action, [0, 0, 0, 0, 0, 0, 1])
    assert not cmd.intervening and cmd.events == frozenset()

    pg.sim.set_axis(LY, -1.0)  # left stick fully up
    pg.sim.set_axis(LX, -0.6)  # and halfway-ish left
    pg.sim.set_axis(RY, 1.0)  # right stick down
    pg.sim.set_axis(RX, 0.1)  # inside the deadzone
    cmd = pad.read()
    np.testing.assert_allclose(cmd.action, [0.02, 0.02 * 0.5, -0.02, 0, 0, 0, 1], atol=1e-6)
    assert cmd.intervening

    pg.sim.set_axis(RX, -1.0)
    for a in (LX, LY, RY):
        pg.sim.set_axis(a, 0.15)  # drift inside the deadzone
    cmd = pad.read()
    np.testing.assert_allclose(cmd.action, [0, 0, 0, 0, 0, -0.1, 1], atol=1e-6)
    pg.sim.set_axis(RX, 0.0)
    assert not pad.read().intervening


def test_triggers_and_a_set_the_gripper(pad, pg):
    pg.sim.set_axis(RT, 0.9)  # right trigger squeezed: close
    cmd = pad.read()
    assert cmd.action[6] == 0.0 and cmd.intervening
    pg.sim.set_axis(RT, -1.0)
    cmd = pad.read()
    assert cmd.action[6] == 0.0 and not cmd.intervening  # stays closed once released
    pg.sim.set_axis(LT, 1.0)
    assert pad.read().action[6] == 1.0
    pg.sim.set_axis(LT, 0.0)  # SDL reports 0 before a trigger's first motion: not pressed
    assert not pad.read().intervening
    pg.sim.tap(A)
    cmd = pad.read()
    assert cmd.action[6] == 0.0 and cmd.intervening
    pg.sim.tap(A)
    assert pad.read().action[6] == 1.0


@pytest.mark.parametrize("button, event", [(Y, "success"), (B, "failure"), (X, "rerecord"), (START, "stop")])
def test_buttons_are_events(pad, pg, button, event):
    pg.sim.tap(button)  # pressed and released between two ticks: still counted
    cmd = pad.read()
    assert cmd.events == {event} and not cmd.intervening
    assert pad.read().events == frozenset()


def test_other_pads_and_non_joystick_events_are_left_alone():
    pg2 = fake_pygame.FakePygame(pads=2)
    with GamepadTeleop(pygame_module=pg2, index=1) as t:
        pg2.sim.tap(Y, pad=0)
        pg2.sim.queue.append(fake_pygame.Event(256))  # QUIT of a window elsewhere in the process
        assert t.read().events == frozenset()
        assert [e.type for e in pg2.sim.queue] == [256]
        pg2.sim.tap(Y, pad=1)
        assert t.read().events == {"success"}


def test_unplugged_pad_raises(pad, pg):
    pg.sim.unplug()
    with pytest.raises(DeviceError, match="unplugged"):
        pad.read()


def test_begin_episode_drops_queued_presses_and_reopens(pad, pg):
    pg.sim.set_axis(RT, 1.0)
    pad.read()
    pg.sim.set_axis(RT, -1.0)
    pg.sim.tap(Y)
    pad.begin_episode(task="pick")
    cmd = pad.read()
    assert cmd.events == frozenset() and cmd.action[6] == 1.0


def test_always_intervening(pg):
    with GamepadTeleop(pygame_module=pg, always_intervening=True) as t:
        assert t.read().intervening


def test_windows_layout(pg):
    with GamepadTeleop(pygame_module=pg, layout="xbox_windows") as t:
        pg.sim.set_axis(2, 1.0)  # right stick x on Windows
        assert t.read().action[5] == pytest.approx(0.05)
    assert LAYOUTS["xbox"] == GamepadLayout()


def test_connect_errors(pg):
    with pytest.raises(DeviceError, match="no gamepad found"):
        GamepadTeleop(pygame_module=fake_pygame.FakePygame(pads=0)).connect()
    with pytest.raises(DeviceError, match="out of range"):
        GamepadTeleop(pygame_module=pg, index=3).connect()
    assert not pg.sim.display_init  # cleaned up after the failed connect
    small = fake_pygame.FakePygame()
    small.sim.pads[0] = fake_pygame.FakePad(0, name="tiny pad", num_axes=2, num_buttons=4)
    with pytest.raises(DeviceError, match="tiny pad"):
        GamepadTeleop(pygame_module=small).connect()
    with pytest.raises(NotConnectedError):
        GamepadTeleop(pygame_module=pg).read()
    with pytest.raises(ValueError, match="known"):
        GamepadTeleop(layout="ps5")
    with pytest.raises(ValueError, match="deadzone"):
        GamepadTeleop(deadzone=1.0)


def test_missing_pygame_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "pygame", None)  # makes `import pygame` raise ImportError
    with pytest.raises(DeviceError, match=r"pip install 'vla-stack\[teleop\]'"):
        GamepadTeleop().connect()


def test_pygame_errors_become_device_errors(pad, pg):
    pg.sim.open_joysticks.clear()  # the real pygame raises pygame.error on a dead joystick
    with pytest.raises(DeviceError, match="pygame failed"):
        pad.read()


@pytest.mark.skipif(importlib.util.find_spec("pygame") is None, reason="pygame not installed")
def test_fake_names_exist_on_real_pygame():
    import pygame

    fake = fake_pygame.FakePygame()
    for name in fake_pygame.api_names(fake):
        real = functools.reduce(getattr, name.split("."), pygame)  # AttributeError names the drift
        if name.startswith("JOY"):
            assert getattr(fake, name) == real, name


@pytest.mark.skipif(importlib.util.find_spec("pygame") is None, reason="pygame not installed")
def test_real_pygame_headless_without_a_pad():
    # the dummy video driver initialises on a machine with no display; no pad -> a clear error
    with pytest.raises(DeviceError, match="no gamepad found"):
        GamepadTeleop().connect()
