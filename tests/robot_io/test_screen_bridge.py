"""The rig's host screen served over the bridge (ScreenService + DeviceServer, built from a site
file by the device-kind registry): game_state on the stream, capture, seeded reset, refusals."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("ale_py")

import hardware  # noqa: E402
from robot_io.client import CommandError, StreamReader  # noqa: E402
from robot_io.server import SERVICES, ScreenService  # noqa: E402
from robot_io.site import build_servers, parse_site  # noqa: E402
from tests.robot_io.test_validation import ask, header_pairs, pack_pairs  # noqa: E402


@pytest.fixture
def screen_server():
    site = parse_site({"name": "rig", "devices": {"screen": {
        "driver": "ale_screen", "command": "tcp://127.0.0.1:*", "stream": "tcp://127.0.0.1:*",
        "params": {"game": "breakout", "noop_max": 0}}}})
    (srv,) = build_servers(site, hardware.load_driver)
    assert isinstance(srv.service, ScreenService)
    srv.start()
    yield srv, srv.service.device
    srv.stop()


def test_the_screen_kind_is_in_the_registry():
    assert SERVICES["screen"] is ScreenService
    assert hardware.load_driver("ale_screen").kind == "screen"


def test_the_stream_publishes_every_frame_with_score_lives_and_episode_end(screen_server):
    srv, screen = screen_server
    with StreamReader(srv.stream_endpoint, "record") as r:
        screen.set_keys({"SPACE"})  # serve, never move: every ball is lost and the game ends
        msgs = []
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            m = r.next(1.0)
            assert m is not None, "no game_state within 1 s"
            msgs.append(m)
            if m["episode_over"]:
                break
        time.sleep(0.1)
        t0 = r.received
        time.sleep(0.5)
        rate = (r.received - t0) / 0.5
    assert all(m.type == "game_state" and m.device == "screen" for m in msgs)
    assert msgs[0].arrays["rgb"].shape == (210, 160, 3) and msgs[0].arrays["rgb"].dtype == np.uint8
    idx = [m["index"] for m in msgs]
    assert idx == sorted(idx) and len(set(idx)) == len(idx)
    assert sum(b - a - 1 for a, b in zip(idx, idx[1:])) <= len(idx) // 20  # few if any frames skipped
    lives = [m["lives"] for m in msgs]
    assert lives[0] == 5 and lives[-1] == 0 and all(a >= b for a, b in zip(lives, lives[1:]))
    assert msgs[-1]["episode_over"] and not msgs[0]["episode_over"]
    assert msgs[-1]["keys"] == ["SPACE"] and msgs[-1]["game"] == "breakout"
    assert {m["action"] for m in msgs[:-1]} == {"FIRE"}
    assert 50 <= rate <= 65, rate  # the stream keeps up with the 60 Hz game after it ended, too


def test_capture_reset_and_describe(screen_server, client_for):
    srv, screen = screen_server
    c = client_for(srv)
    d = c.describe()
    assert d["kind"] == "screen" and d["game"] == "breakout" and d["actions"] == ["NOOP", "FIRE", "RIGHT", "LEFT"]
    r = c.request("capture")
    assert r.arrays["rgb"].shape == (210, 160, 3) and r["lives"] == 5 and r["episode_over"] is False
    a = c.request("reset", seed=5)
    b = c.request("reset", seed=5)
    np.testing.assert_array_equal(a.arrays["rgb"], b.arrays["rgb"])
    assert b["episode"] == a["episode"] + 1 and b["score"] == 0
    r = c.request("reset", task="key_flash")
    assert r["game"] == "key_flash" and r.arrays["rgb"].max() == 0
    r = c.request("reset", task="pong", seed=1)
    assert r["game"] == "pong" and c.describe()["key_map"] == {"UP_ARROW": "RIGHT", "DOWN_ARROW": "LEFT",
                                                                "SPACE": "FIRE"}


@pytest.mark.parametrize("mtype, meta, code, field", [
    ("reset", {"seed": -1}, "bad_field", "seed"),
    ("reset", {"seed": 1.5}, "bad_field", "seed"),
    ("reset", {"seed": True}, "bad_field", "seed"),
    ("reset", {"task": "breakot"}, "unknown_task", "task"),
    ("reset", {"task": 3}, "bad_field", "task"),
    ("key_press", {"keys": ["SPACE"]}, "unsupported", "type"),
    ("ee_delta", {}, "unsupported", "type"),
])
def test_malformed_or_foreign_commands_are_refused_and_the_game_goes_on(mtype, meta, code, field, screen_server,
                                                                        client_for):
    srv, screen = screen_server
    c = client_for(srv)
    resets = screen.stats()["resets"]
    with pytest.raises(CommandError) as e:
        c.request(mtype, **meta)
    assert (e.value.code, e.value.field) == (code, field)
    assert screen.stats()["resets"] == resets and screen.latest().game == "breakout"
    i = screen.latest().index
    assert screen.wait_frame(i).index > i  # still ticking
    assert c.ping() >= 0  # still serving


def test_a_damaged_frame_is_refused_by_the_wire_without_touching_the_screen(screen_server, raw_dealer):
    srv, screen = screen_server
    resets = screen.stats()["resets"]
    sock = raw_dealer(srv.command_endpoint)
    reply = ask(sock, [pack_pairs(header_pairs("reset", arrays=(), device="screen", v=2))])
    assert reply.type == "error" and reply["field"] == "v"
    reply = ask(sock, [pack_pairs(header_pairs("reset", arrays=(), device="screen", seed=3))[:-3]])
    assert reply.type == "error"
    assert screen.stats()["resets"] == resets
