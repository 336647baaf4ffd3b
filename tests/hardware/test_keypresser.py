"""The keyboard rig's host driver (SerialKeyPresser over pyserial) against the emulated
microcontroller on a pty: commands acked with the microcontroller's clock, heartbeats holding
keys, refusals and timeouts as typed errors, and every key released when the host process dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import hardware
from hardware.base import NotConnectedError
from hardware.emulated_keypresser import EmulatedKeyPresser
from hardware.firmware import keyproto as kp
from hardware.keyboard_mcu_emulator import EmulatedMicrocontroller
from hardware.serial_keypresser import KeyPresserError, KeyRefused, SerialKeyPresser

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_for(cond, timeout_s=2.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.002)
    return cond()


def test_the_emulated_driver_is_registered_as_a_keyboard():
    cls = hardware.load_driver("emulated_keypresser")
    assert cls is EmulatedKeyPresser and cls.kind == "keyboard"
    assert hardware.load_driver("serial_keypresser") is SerialKeyPresser


def test_press_release_tap_release_all_through_the_emulated_microcontroller():
    with EmulatedKeyPresser() as keys:
        t0 = time.monotonic_ns() // 1000
        ack = keys.press(["LEFT_ARROW", "SPACE"])
        assert keys.mcu.pressed == keys.pressed == {"LEFT_ARROW", "SPACE"} and ack.held == 2
        # the ack carries the microcontroller's clock (the same machine's monotonic clock here)
        assert 0 <= (ack.mcu_t_us - t0) % 2**32 < 2_000_000 and 0 < ack.rtt_ns < 1e9
        ack2 = keys.release("SPACE")
        assert keys.mcu.pressed == {"LEFT_ARROW"} and ack2.seq > ack.seq and ack2.mcu_t_us >= ack.mcu_t_us
        keys.tap("A", hold_ms=40)
        assert keys.mcu.pressed == {"LEFT_ARROW", "A"}
        assert wait_for(lambda: keys.mcu.pressed == {"LEFT_ARROW"}, 1.0)  # released by the microcontroller
        keys.release_all()
        assert keys.mcu.pressed == keys.pressed == frozenset()
        lat = keys.latency()
        assert lat["count"] >= 5 and lat["p50_ms"] < 100
        stats = keys.stats()
        assert stats["ack_timeouts"] == stats["refused"] == stats["rx_crc"] == 0
    assert keys.mcu.pressed == frozenset()


def test_heartbeats_hold_keys_past_the_firmware_timeout():
    with EmulatedKeyPresser() as keys:
        keys.press("UP_ARROW")
        time.sleep(3 * kp.HEARTBEAT_TIMEOUT_MS / 1000)
        assert keys.mcu.pressed == {"UP_ARROW"} and keys.mcu.controller.stats["timeouts"] == 0


def test_refusals_and_bad_keys_are_typed_errors_and_press_nothing():
    with EmulatedKeyPresser() as keys:
        with pytest.raises(ValueError, match="did you mean 'SPACE'"):
            keys.press("SPCE")
        with pytest.raises(ValueError, match="hold_ms"):
            keys.tap("A", hold_ms=0)
        keys.press(["A", "B", "C", "D", "E", "F"])
        with pytest.raises(KeyRefused, match="too_many") as e:  # the microcontroller's own limit
            keys.press("G")
        assert e.value.status == "too_many" and keys.mcu.pressed == set("ABCDEF") and "G" not in keys.pressed


def test_no_microcontroller_is_a_typed_error_naming_the_port():
    keys = SerialKeyPresser(port="loop://", ack_timeout_s=0.05)  # only our own frames come back
    with pytest.raises(KeyPresserError, match="no microcontroller answering on 'loop://'"):
        keys.connect()
    assert not keys.is_connected
    with pytest.raises(NotConnectedError):
        keys.press("A")
    with pytest.raises(KeyPresserError, match="cannot open serial port"):
        SerialKeyPresser(port="/dev/does-not-exist").connect()


HOST = """
import sys, time
from hardware.serial_keypresser import SerialKeyPresser
keys = SerialKeyPresser(port=sys.argv[1])
keys.connect()
keys.press(["SPACE", "RIGHT_ARROW"])
print("pressed", flush=True)
time.sleep(60)
"""


def test_the_microcontroller_releases_every_key_when_the_host_process_dies():
    timeout_s = kp.HEARTBEAT_TIMEOUT_MS / 1000
    with EmulatedMicrocontroller() as mcu:
        host = subprocess.Popen([sys.executable, "-c", HOST, mcu.port], cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            assert host.stdout.readline().strip() == "pressed"
            assert mcu.pressed == {"SPACE", "RIGHT_ARROW"}
            time.sleep(2 * timeout_s)  # the host's heartbeats hold the keys down
            assert mcu.pressed == {"SPACE", "RIGHT_ARROW"}
            os.kill(host.pid, signal.SIGKILL)
            t_kill = time.monotonic()
            assert wait_for(lambda: not mcu.pressed, 5.0)
            released_after = time.monotonic() - t_kill
        finally:
            host.kill()
            host.wait()
        assert released_after <= 2 * timeout_s, f"keys released {released_after * 1000:.0f} ms after the host died"
        assert mcu.controller.stats["timeouts"] == 1
