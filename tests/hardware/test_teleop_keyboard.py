"""KeyboardTeleop through a real pseudo-terminal: the teleop reads the pty's slave side as its
terminal, the test types on the master side. Plus end-to-end runs of ``--demo`` in a pty
subprocess (always) and in tmux (when installed)."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import subprocess
import sys
import termios
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from hardware.base import DeviceError, NotConnectedError
from hardware.teleop.keyboard import KeyboardTeleop, decode_keys

REPO = Path(__file__).resolve().parents[2]
STEP_M, STEP_RAD = 0.01, 0.05
UP, DOWN, RIGHT, LEFT = b"\x1b[A", b"\x1b[B", b"\x1b[C", b"\x1b[D"
PGUP, PGDN = b"\x1b[5~", b"\x1b[6~"


@pytest.fixture
def term():
    master, slave = pty.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


@pytest.fixture
def kb(term):
    master, slave = term
    k = KeyboardTeleop(stream=slave, esc_timeout_s=0.02)
    k.connect()
    yield k
    k.disconnect()


def type_and_read(kb: KeyboardTeleop, master: int, data: bytes):
    os.write(master, data)
    time.sleep(0.02)  # let the pty line discipline pass the bytes on
    return kb.read()


def expected(dx=0.0, dy=0.0, dz=0.0, yaw=0.0, grip=1.0) -> np.ndarray:
    return np.array([dx, dy, dz, 0, 0, yaw, grip], np.float32)


# --------------------------------------------------------------------------------- actions


@pytest.mark.parametrize("keys, want", [
    (b"w", expected(dx=STEP_M)), (b"s", expected(dx=-STEP_M)),
    (b"a", expected(dy=STEP_M)), (b"d", expected(dy=-STEP_M)),
    (b"r", expected(dz=STEP_M)), (b"f", expected(dz=-STEP_M)),
    (b"q", expected(yaw=-STEP_RAD)), (b"e", expected(yaw=STEP_RAD)),
    (UP, expected(dx=STEP_M)), (DOWN, expected(dx=-STEP_M)),
    (LEFT, expected(dy=STEP_M)), (RIGHT, expected(dy=-STEP_M)),
    (PGUP, expected(dz=STEP_M)), (PGDN, expected(dz=-STEP_M)),
    (b"\x1bOA", expected(dx=STEP_M)),  # application cursor mode arrow
    (b"\x1b[1;2A", expected(dx=STEP_M)),  # shift+Up still moves
    (b"W", expected(dx=STEP_M)),  # Caps Lock
    (b"wa", expected(dx=STEP_M, dy=STEP_M)),
    (b"ws", expected()),  # opposite keys cancel
])
def test_motion_keys(kb, term, keys, want):
    cmd = type_and_read(kb, term[0], keys)
    np.testing.assert_allclose(cmd.action, want, atol=1e-7)
    assert cmd.action.dtype == np.float32 and cmd.action.shape == (7,)
    assert cmd.events == frozenset()
    assert cmd.intervening  # a motion key was pressed (even when the presses cancel)


def test_idle_tick_is_zero_and_not_intervening(kb, term):
    cmd = kb.read()
    np.testing.assert_array_equal(cmd.action, expected())
    assert not cmd.intervening and cmd.events == frozenset()


def test_autorepeat_accumulates_but_clips_to_one_step(kb, term):
    cmd = type_and_read(kb, term[0], b"w" * 7 + UP * 3 + b"d" * 2)  # a held key's autorepeat burst
    np.testing.assert_allclose(cmd.action, expected(dx=STEP_M, dy=-STEP_M), atol=1e-7)
    cmd = type_and_read(kb, term[0], b"ssw")  # sum -1: one step back
    np.testing.assert_allclose(cmd.action, expected(dx=-STEP_M), atol=1e-7)
    assert not kb.read().intervening  # the presses were consumed


def test_gripper_toggle_persists(kb, term):
    assert kb.read().action[6] == 1.0
    cmd = type_and_read(kb, term[0], b" ")
    assert cmd.action[6] == 0.0 and cmd.intervening
    assert kb.read().action[6] == 0.0 and not kb.read().intervening  # stays closed
    assert type_and_read(kb, term[0], b" ").action[6] == 1.0
    assert type_and_read(kb, term[0], b"  ").action[6] == 1.0  # two toggles in one tick


@pytest.mark.parametrize("keys, event", [
    (b"\r", "success"), (b"\n", "success"),
    (b"\x7f", "failure"), (b"\x08", "failure"), (b"x", "failure"),
    (b"z", "rerecord"),
    (b"\x03", "stop"), (b"\x1b", "stop"),
])
def test_event_keys(kb, term, keys, event):
    cmd = type_and_read(kb, term[0], keys)
    assert cmd.events == frozenset({event})
    assert not cmd.intervening
    np.testing.assert_array_equal(cmd.action[:6], 0.0)
    assert kb.read().events == frozenset()  # an event is reported once


def test_ctrl_c_does_not_raise_sigint(kb, term):
    # with ISIG on, \x03 typed on the pty would send SIGINT to its foreground process group
    assert not termios.tcgetattr(term[1])[3] & termios.ISIG
    assert type_and_read(kb, term[0], b"\x03").events == {"stop"}


def test_esc_then_key_and_sequence_split_across_writes(kb, term):
    cmd = type_and_read(kb, term[0], b"\x1bw")
    assert cmd.events == {"stop"} and cmd.action[0] == pytest.approx(STEP_M)
    # an arrow sequence whose tail arrives a little later is still one Up key
    os.write(term[0], b"\x1b")
    os.write(term[0], b"[A")
    time.sleep(0.02)
    cmd = kb.read()
    assert cmd.events == frozenset() and cmd.action[0] == pytest.approx(STEP_M)


def test_speed_keys_scale_steps(term):
    master, slave = term
    with KeyboardTeleop(stream=slave, step_m=0.02, step_rad=0.1, speed_range=(0.5, 2.0)) as k:
        assert type_and_read(k, master, b"+w").action[0] == pytest.approx(0.04)
        assert type_and_read(k, master, b"+++w").action[0] == pytest.approx(0.04)  # capped at 2x
        assert type_and_read(k, master, b"----e").action[5] == pytest.approx(0.05)  # floored at 0.5x
        assert not type_and_read(k, master, b"=").intervening


def test_always_intervening(term):
    with KeyboardTeleop(stream=term[1], always_intervening=True) as k:
        assert k.read().intervening


def test_begin_episode_discards_typed_keys_and_reopens_gripper(kb, term):
    type_and_read(kb, term[0], b" ")
    os.write(term[0], b"\rw")
    time.sleep(0.02)
    kb.begin_episode(task="pick")
    cmd = kb.read()
    assert cmd.events == frozenset() and cmd.action[0] == 0.0 and cmd.action[6] == 1.0


def test_terminal_hangup_is_stop():
    master, slave = pty.openpty()
    k = KeyboardTeleop(stream=slave)
    k.connect()
    try:
        os.close(master)  # the terminal goes away (ssh hung up): the slave reads EIO
        assert k.read().events == {"stop"}
        assert k.read().events == frozenset()  # reported once; reads keep working
    finally:
        k.disconnect()
        os.close(slave)


# --------------------------------------------------------------------------------- terminal mode


def test_tty_mode_set_on_connect_and_restored_on_disconnect(term):
    master, slave = term
    before = termios.tcgetattr(slave)
    assert before[3] & termios.ECHO and before[3] & termios.ICANON
    k = KeyboardTeleop(stream=slave)
    k.connect()
    during = termios.tcgetattr(slave)
    assert not during[3] & (termios.ECHO | termios.ICANON | termios.ISIG)
    assert during[1] == before[1]  # output processing kept: prints still end lines properly
    k.disconnect()
    assert termios.tcgetattr(slave) == before
    k.disconnect()  # idempotent


def test_tty_mode_restored_when_the_body_raises(term):
    before = termios.tcgetattr(term[1])
    with pytest.raises(RuntimeError, match="boom"):
        with KeyboardTeleop(stream=term[1]):
            raise RuntimeError("boom")
    assert termios.tcgetattr(term[1]) == before


def test_unread_keys_do_not_leak_to_the_shell_after_disconnect(term):
    master, slave = term
    k = KeyboardTeleop(stream=slave)
    k.connect()
    os.write(master, b"rm -rf x\r")
    time.sleep(0.02)
    k.disconnect()
    assert select.select([slave], [], [], 0.05)[0] == []


def test_not_a_tty_is_refused(monkeypatch):
    r, w = os.pipe()
    try:
        with open(r, closefd=False) as fake_stdin:
            monkeypatch.setattr(sys, "stdin", fake_stdin)
            with pytest.raises(DeviceError, match="not a tty"):
                KeyboardTeleop().connect()
    finally:
        os.close(r)
        os.close(w)


def test_explicit_pipe_stream_is_allowed_and_eof_is_stop():
    r, w = os.pipe()
    try:
        with KeyboardTeleop(stream=r) as k:
            os.write(w, b"d")
            assert k.read().action[1] == pytest.approx(-STEP_M)
            os.close(w)
            w = -1
            assert k.read().events == {"stop"}
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_not_connected_and_bad_config():
    with pytest.raises(NotConnectedError):
        KeyboardTeleop(stream=0).read()
    with pytest.raises(ValueError, match="step_m"):
        KeyboardTeleop(step_m=0)
    with pytest.raises(ValueError, match="speed_range"):
        KeyboardTeleop(speed_range=(2.0, 4.0))
    assert "Esc or Ctrl-C" in KeyboardTeleop().help_text()


def test_decode_keys_keeps_incomplete_sequences():
    assert decode_keys(b"w\x1b[") == (["w"], b"\x1b[")
    assert decode_keys(b"w\x1b[", flush=True) == (["w", "esc", "["], b"")
    assert decode_keys(b"\x1b[15~\x1b[Z")[0] == ["unknown", "unknown"]  # F5, shift-tab: ignored


# --------------------------------------------------------------------------------- end to end

DEMO = [sys.executable, "-m", "hardware.teleop.keyboard", "--demo", "--hz", "20", "--ticks", "400"]
LINE = re.compile(r"tick=(\d+) action=(\S+) events=(\S+) intervening=(\d)")


def parse(text: str) -> list[tuple[np.ndarray, str, bool]]:
    return [(np.array(m[2].split(","), float), m[3], m[4] == "1") for m in LINE.finditer(text)]


def read_until(fd: int, needle: bytes, timeout: float = 10.0) -> bytes:
    out, deadline = b"", time.monotonic() + timeout
    while needle not in out and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.05)[0]:
            try:
                out += os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
    return out


def test_demo_in_a_pty_subprocess():
    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    proc = subprocess.Popen(DEMO, stdin=slave, stdout=slave, stderr=slave, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    try:
        out = read_until(master, b"ready")
        assert b"ready" in out, out.decode(errors="replace")
        for keys in (b"w", UP, b"e", b" ", b"\r", b"z", b"\x03"):
            os.write(master, keys)
            time.sleep(0.12)  # > 2 ticks at 20 Hz: one key per tick
        out += read_until(master, b"bye", timeout=5.0)
        assert proc.wait(timeout=5) == 0
        text = out.decode(errors="replace")
        ticks = parse(text)
        assert [t[1] for t in ticks] == ["-"] * 4 + ["success", "rerecord", "stop"], text
        np.testing.assert_allclose(ticks[0][0], expected(dx=STEP_M), atol=1e-4)
        np.testing.assert_allclose(ticks[1][0], expected(dx=STEP_M), atol=1e-4)
        np.testing.assert_allclose(ticks[2][0], expected(yaw=STEP_RAD), atol=1e-4)
        np.testing.assert_allclose(ticks[3][0], expected(grip=0.0), atol=1e-4)
        assert all(t[2] for t in ticks[:4]) and not any(t[2] for t in ticks[4:])
        assert "^C" not in text and "KeyboardInterrupt" not in text  # no echo, no SIGINT
        assert termios.tcgetattr(slave) == before  # the child restored the terminal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)


def test_demo_refuses_without_a_terminal():
    proc = subprocess.run(DEMO, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=20)
    assert proc.returncode == 2 and "not a tty" in proc.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_demo_in_tmux():
    sock = f"teleop-test-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    cmd = " ".join(DEMO) + "; echo exit=$?; sleep 30"
    subprocess.run(tmux + ["new-session", "-d", "-s", "t", "-x", "200", "-y", "60", "-c", str(REPO),
                           "-e", f"PYTHONPATH={REPO}", cmd], check=True, timeout=10)

    def pane() -> str:
        return subprocess.run(tmux + ["capture-pane", "-p", "-J", "-S", "-", "-t", "t"],
                              capture_output=True, text=True, timeout=10).stdout

    def wait_for(text: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in (screen := pane()):
                return screen
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never appeared in the tmux pane:\n{pane()}")

    try:
        wait_for("ready")
        for key in ("a", "PageUp", "Space", "BSpace", "Escape"):  # tmux key names
            subprocess.run(tmux + ["send-keys", "-t", "t", key], check=True, timeout=10)
            time.sleep(0.15)
        screen = wait_for("exit=0")
        ticks = parse(screen)
        assert [t[1] for t in ticks] == ["-", "-", "-", "failure", "stop"], screen
        np.testing.assert_allclose(ticks[0][0], expected(dy=STEP_M), atol=1e-4)
        np.testing.assert_allclose(ticks[1][0], expected(dz=STEP_M), atol=1e-4)
        np.testing.assert_allclose(ticks[2][0], expected(grip=0.0), atol=1e-4)
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True, timeout=10)
