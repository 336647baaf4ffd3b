"""The rig's host screen (ALE in real time): 60 Hz whatever the input, key maps, seeded resets,
the emulated microcontroller as its keyboard."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("ale_py")

from hardware.ale_screen import AleScreen, KeyMap  # noqa: E402
from hardware.base import DeviceError, NotConnectedError  # noqa: E402


def _rate(screen: AleScreen, seconds: float, during=None) -> float:
    f0 = screen.latest()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if during is not None:
            during()
        time.sleep(0.01)
    f1 = screen.latest()
    return (f1.index - f0.index) / ((f1.t_mono_ns - f0.t_mono_ns) / 1e9)


def test_the_screen_ticks_at_60_hz_with_or_without_input():
    rng = np.random.default_rng(0)
    keys = ["UP_ARROW", "DOWN_ARROW", "SPACE"]
    with AleScreen(game="pong") as s:
        idle = _rate(s, 1.0)
        busy = _rate(s, 1.0, during=lambda: s.set_keys(rng.choice(keys, size=rng.integers(0, 3), replace=False)))
        assert s.stats()["key_changes"] > 20
    assert 57 <= idle <= 61, idle
    assert 57 <= busy <= 61, busy


def test_the_game_does_not_wait_for_anyone():
    with AleScreen(game="breakout") as s:
        f0 = s.latest()
        time.sleep(0.3)  # nobody reads or presses: the game still advances
        f1 = s.latest()
    assert f1.index - f0.index >= 15 and f1.t_mono_ns > f0.t_mono_ns


@pytest.mark.parametrize("game, keys, action", [
    ("pong", [], "NOOP"),
    ("pong", ["UP_ARROW"], "RIGHT"),  # Pong's paddle goes up with ALE's RIGHT
    ("pong", ["DOWN_ARROW", "SPACE"], "LEFTFIRE"),
    ("pong", ["UP_ARROW", "DOWN_ARROW"], "NOOP"),  # opposite directions cancel
    ("pong", ["A"], "NOOP"),  # an unmapped key does nothing
    ("breakout", ["LEFT_ARROW"], "LEFT"),
    ("breakout", ["SPACE", "RIGHT_ARROW"], "RIGHTFIRE"),
    ("space_invaders", ["UP_ARROW", "LEFT_ARROW", "SPACE"], "UPLEFTFIRE"),  # the default map
])
def test_key_maps(game, keys, action):
    assert KeyMap.for_game(game).action(keys) == action


@pytest.mark.parametrize("game, actions", [("pong", ["NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE"]),
                                           ("breakout", ["NOOP", "FIRE", "RIGHT", "LEFT"])])
def test_every_minimal_action_has_keys_that_make_it(game, actions):
    km = KeyMap.for_game(game)
    for a in actions:
        assert km.action(km.keys_for(a)) == a


def test_a_bad_key_map_is_refused():
    with pytest.raises(ValueError, match="not a key"):
        KeyMap({"UPARROW": "UP"})
    with pytest.raises(ValueError, match="one of"):
        KeyMap({"UP_ARROW": "JUMP"})


def test_held_keys_become_the_action_of_the_next_ticks_and_move_the_paddle():
    with AleScreen(game="pong", seed=1) as s:
        assert s.describe()["actions"] == ["NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE"]
        s.set_keys({"DOWN_ARROW"})
        f = s.wait_frame(s.latest().index + 1)
        f = s.wait_frame(f.index)  # one full tick with the keys held
        assert f.action == "LEFT" and f.keys == {"DOWN_ARROW"}
        time.sleep(0.3)
        down = s.latest().rgb.copy()
        s.set_keys({"UP_ARROW"})
        time.sleep(0.5)
        up = s.latest()
        assert up.action == "RIGHT"
    # the player's paddle (Pong: green, right side, columns 140-143) moved up
    green = np.array([92, 186, 92])

    def paddle_row(img):
        rows = np.flatnonzero((img[34:194, 140:144] == green).all(-1).any(-1))
        return rows.mean()

    assert paddle_row(up.rgb) < paddle_row(down) - 10


def test_score_lives_and_episode_end_follow_the_game():
    with AleScreen(game="breakout", seed=0, noop_max=0) as s:
        f = s.latest()
        assert (f.lives, f.score, f.episode_over, f.episode) == (5, 0, False, 0)
        s.set_keys({"SPACE"})  # launch the ball and never move: the ball is lost, then the next one
        deadline = time.monotonic() + 20
        while not s.latest().episode_over and time.monotonic() < deadline:
            time.sleep(0.05)
        f = s.latest()
        assert f.episode_over and f.lives == 0
        time.sleep(0.1)
        assert s.latest().episode_over  # the game stays over until a reset
        f = s.reset(seed=2)
        assert (f.episode_over, f.lives, f.score, f.episode) == (False, 5, 0, 1)


def test_a_seeded_reset_starts_the_same_game():
    with AleScreen(game="pong", noop_max=30) as s:
        a = s.reset(seed=7).rgb.copy()
        b = s.reset(seed=7).rgb.copy()
        np.testing.assert_array_equal(a, b)


def test_the_key_flash_pattern_and_unknown_games():
    with AleScreen(game="pong") as s:
        f = s.reset(game="key_flash")
        assert f.game == "key_flash" and f.rgb.shape == (210, 160, 3) and f.rgb.max() == 0
        s.set_keys({"SPACE"})
        f = s.wait_frame(f.index)
        assert f.rgb.min() == 255
        with pytest.raises(DeviceError, match="Did you mean pong"):
            s.reset(game="pongg")
        assert s.reset(game="pong").game == "pong"


def test_frame_at_returns_what_was_on_the_screen_then():
    with AleScreen(game="pong") as s:
        f = s.wait_frame(s.latest().index + 5)
        assert s.frame_at(f.t_mono_ns).index == f.index
        assert s.frame_at(f.t_mono_ns - 1).index == f.index - 1
        assert s.frame_at(0) is None
    with pytest.raises(NotConnectedError):
        s.latest()


def test_the_emulated_microcontroller_is_the_screens_keyboard(tmp_path):
    from hardware.serial_keypresser import SerialKeyPresser

    link = str(tmp_path / "pico")
    with AleScreen(game="pong", keys="emulated_mcu", mcu_link=link) as s:
        d = s.describe()
        assert d["mcu_link"] == link and d["mcu_port"]
        with SerialKeyPresser(port=link) as kb:
            kb.press(["UP_ARROW"])
            f = s.wait_frame(s.latest().index + 1)
            f = s.wait_frame(f.index)
            assert f.keys == {"UP_ARROW"} and f.action == "RIGHT"
            kb.release_all()
            time.sleep(0.05)
            assert s.keys == frozenset()
    import os

    assert not os.path.lexists(link)  # the link goes with the screen
