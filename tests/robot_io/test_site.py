import pytest

import hardware
from robot_io.site import SiteError, build_servers, load_site, parse_site, preset_names


def test_presets_load():
    assert {"sim-franka", "sim-franka-fast", "franka-lab"} <= set(preset_names())
    for name in preset_names():
        site = load_site(name)
        for d in site.devices.values():
            assert d.driver in hardware.REGISTRY, f"{name}: unknown driver {d.driver}"
        kinds = {d.name: hardware.load_driver(d.driver).kind for d in site.devices.values()}
        if site.arm is None:  # a legged cell or the keyboard rig: then no device is an arm
            assert "arm" not in kinds.values(), f"{name}: has an arm device but names no robot.arm"
        else:
            assert kinds[site.arm] == "arm", f"{name}: robot.arm {site.arm!r} is a {kinds.get(site.arm)!r}"


def test_typo_gets_did_you_mean():
    with pytest.raises(SiteError, match="(?i)did you mean 'sim-franka'"):
        load_site("sim-frank")


BASE = {"name": "t", "devices": {"arm": {"driver": "sim_franka", "command": "tcp://127.0.0.1:1"}}}


@pytest.mark.parametrize("patch, field", [
    ({"devices": {}}, "devices"),
    ({"devices": {"arm": {"driver": "sim_franka"}}}, "devices.arm.command"),
    ({"devices": {"arm": {"driver": "sim_franka", "command": "http://x"}}}, "devices.arm.command"),
    ({"devices": {"arm": {"driver": "sim_franka", "command": "tcp://127.0.0.1:1", "comand_timeout_ms": 5}}},
     "devices.arm.comand_timeout_ms"),
    ({"devices": {"arm": {"driver": "sim_franka", "command": "tcp://127.0.0.1:1", "command_timeout_ms": -5}}},
     "devices.arm.command_timeout_ms"),
    ({"devices": {"arm": {"driver": "sim_franka", "command": "tcp://127.0.0.1:1",
                          "limits": {"workspace_min": [1, 0, 0], "workspace_max": [0, 1, 1]}}}}, "devices.arm.limits"),
    ({"devices": {"arm": {"driver": "sim_franka", "command": "tcp://127.0.0.1:1", "params": {"sim": "@nope"}}}},
     "devices.arm.params.sim"),
    ({"devices": {"arm": {"driver": "sim_franka", "command": "tcp://127.0.0.1:1", "roi": [0.5, 0, 0.4, 1]}}},
     "devices.arm.roi"),
    ({"devices": {"arm": {"driver": "sim_franka", "command": "tcp://127.0.0.1:1", "roi": [0, 0, 1]}}},
     "devices.arm.roi"),
    ({"robot": {"arm": "leg"}}, "robot"),
    ({"security": {"server_key": "x"}}, "security.server_key"),
    ({"colour": "blue"}, "colour"),
])
def test_bad_site_errors_name_the_field(patch, field):
    raw = {**BASE, **patch}
    with pytest.raises(SiteError) as e:
        parse_site(raw, "/tmp/site.yaml")
    assert f"{field}:" in str(e.value) and "/tmp/site.yaml" in str(e.value)


def test_unknown_driver_did_you_mean():
    site = parse_site({"name": "t", "devices": {"arm": {"driver": "sim_frank", "command": "tcp://127.0.0.1:1"}}})
    with pytest.raises(KeyError, match="did you mean 'sim_franka'"):
        build_servers(site, hardware.load_driver)


def test_the_sim_presets_give_the_far_front_camera_a_region_of_interest():
    for name in ("sim-franka", "sim-franka-fast"):
        site = load_site(name)
        x0, y0, x1, y1 = site.devices["front"].roi
        assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1
        assert site.devices["wrist"].roi is None


def test_the_three_camera_preset_is_the_fast_preset_plus_a_side_view():
    fast, three = load_site("sim-franka-fast"), load_site("sim-franka-fast-3cam")
    assert three.cameras == (*fast.cameras, "side")
    for name in fast.devices:  # the same devices, on the same ports: the two presets are never up together
        assert three.devices[name].command == fast.devices[name].command
    side = three.devices["side"]
    assert side.params["camera"] == "side" and side.roi is not None
    assert side.command not in {d.command for d in fast.devices.values()}


def test_an_unknown_device_kind_is_refused_naming_file_device_and_known_kinds():
    made = []

    class Screen:
        kind = "hologram"

        def __init__(self, **kw):
            made.append(kw)

    site = parse_site({"name": "t", "devices": {"holo": {"driver": "holo_driver", "command": "tcp://127.0.0.1:1"}}},
                      "/tmp/site.yaml")
    with pytest.raises(SiteError) as e:
        build_servers(site, lambda name: Screen)
    msg = str(e.value)
    assert msg.startswith("/tmp/site.yaml: devices.holo.driver:") and "'hologram'" in msg
    assert "known kinds: arm, camera, keyboard, legged, screen" in msg
    assert made == []  # refused before the driver is constructed


def test_every_service_accepts_only_command_types_of_the_wire_schema():
    from robot_io.server import SERVER_TYPES, SERVICES
    from robot_io.wire import COMMAND_TYPES

    assert {"arm", "camera", "keyboard", "screen"} <= set(SERVICES)
    for kind, cls in SERVICES.items():
        assert cls.kind == kind
        assert cls.accepts and cls.accepts <= COMMAND_TYPES, kind
        assert cls.motion_types <= cls.accepts, kind
        assert not cls.accepts & SERVER_TYPES, kind
