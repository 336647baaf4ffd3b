"""The keyboard rig's microcontroller served over the bridge like an arm (KeyboardService +
DeviceServer), built from a site file by the device-kind registry."""

from __future__ import annotations

import time

import pytest

import hardware
from robot_io.client import CommandError
from robot_io.server import DeviceServer, KeyboardService
from robot_io.site import build_servers, parse_site
from tests.robot_io.test_validation import ask, header_pairs, pack_pairs


@pytest.fixture
def keyboard_server():
    site = parse_site({"name": "rig", "devices": {"keys": {"driver": "emulated_keypresser",
                                                            "command": "tcp://127.0.0.1:*", "command_timeout_ms": 300}}})
    (srv,) = build_servers(site, hardware.load_driver)
    assert isinstance(srv.service, KeyboardService)
    srv.start()
    yield srv, srv.service.device.mcu
    srv.stop()


def test_a_valid_press_is_applied_and_the_reply_carries_the_ack(keyboard_server, client_for):
    srv, mcu = keyboard_server
    c = client_for(srv, heartbeat_hz=20)
    r = c.request("key_press", keys=["SPACE", "LEFT_ARROW"])
    assert mcu.pressed == {"SPACE", "LEFT_ARROW"}
    assert r["pressed"] == ["LEFT_ARROW", "SPACE"] and r["held"] == 2 and r["ack_rtt_ns"] > 0
    assert isinstance(r["mcu_t_us"], int)
    c.request("key_tap", keys=["A"], hold_ms=20)
    assert "A" in mcu.pressed
    c.request("key_release", keys=["SPACE"])
    assert c.request("capture")["pressed"] == ["LEFT_ARROW"]
    c.request("key_release_all")
    assert mcu.pressed == frozenset()
    assert c.describe()["kind"] == "keyboard"


@pytest.mark.parametrize("meta, code, field", [
    ({"keys": ["SPCE"]}, "unknown_key", "keys"),
    ({"keys": []}, "bad_field", "keys"),
    ({"keys": ["A"] * 7}, "bad_field", "keys"),
    ({"keys": [1]}, "unknown_key", "keys"),
    ({"keys": "SPACE"}, "bad_field", "keys"),  # a string, not a list
    ({}, "bad_header", "keys"),  # missing
])
def test_a_malformed_press_is_refused_naming_the_field_and_presses_nothing(meta, code, field, keyboard_server,
                                                                          client_for):
    srv, mcu = keyboard_server
    c = client_for(srv)
    with pytest.raises(CommandError) as e:
        c.request("key_press", **meta)
    assert (e.value.code, e.value.field) == (code, field)
    assert mcu.pressed == frozenset() and mcu.keyboard.events == 1  # only the release_all of connect
    assert c.ping() >= 0  # still serving


def test_a_bad_tap_and_foreign_commands_are_refused_without_pressing(keyboard_server, client_for, raw_dealer):
    srv, mcu = keyboard_server
    c = client_for(srv)
    with pytest.raises(CommandError) as e:
        c.request("key_tap", keys=["A"], hold_ms=0)
    assert (e.value.code, e.value.field) == ("bad_field", "hold_ms")
    with pytest.raises(CommandError) as e:
        c.request("key_tap", keys=["A"], hold_ms=True)  # a bool is not an int on the wire
    assert e.value.field == "hold_ms"
    with pytest.raises(CommandError, match="does not accept 'ee_delta'") as e:
        c.request("ee_delta")
    assert (e.value.code, e.value.field) == ("unsupported", "type")
    sock = raw_dealer(srv.command_endpoint)  # a damaged frame: refused by the wire
    reply = ask(sock, [pack_pairs(header_pairs("key_press", arrays=(), device="keys", keys=["A"], v=2))])
    assert reply.type == "error" and reply["field"] == "v"
    assert mcu.pressed == frozenset() and mcu.keyboard.events == 1


def test_the_watchdog_releases_every_key_when_the_client_goes_quiet(keyboard_server, client_for):
    srv, mcu = keyboard_server
    c = client_for(srv)  # no heartbeat thread
    c.request("key_press", keys=["DOWN_ARROW"])
    assert mcu.pressed == {"DOWN_ARROW"}
    time.sleep(0.6)  # > command_timeout_ms (300), the driver's own heartbeats keep the microcontroller alive
    assert mcu.pressed == frozenset() and srv.stats["watchdog_trips"] == 1
    with pytest.raises(CommandError) as e:
        c.request("key_press", keys=["DOWN_ARROW"])
    assert e.value.code == "safe_state"
    c.request("reset")
    c.request("key_press", keys=["DOWN_ARROW"])
    assert mcu.pressed == {"DOWN_ARROW"}
