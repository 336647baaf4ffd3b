"""The RP2040 firmware (hardware/firmware/code.py, boot.py) under stubs of its CircuitPython
libraries: it imports, presses and releases keys on a fake ``adafruit_hid`` Keyboard as frames
arrive on a fake ``usb_cdc.data`` port, acks each with its clock, and releases every key when
the heartbeats stop. Plus a check that the files keep to what CircuitPython can run."""

from __future__ import annotations

import ast
import importlib.util
import os
import runpy
import sys
import types

import pytest

from hardware.firmware import keyproto as host_kp

FIRMWARE = os.path.join(os.path.dirname(host_kp.__file__))
FILES = ("keyproto.py", "code.py", "boot.py")


class FakeKeyboard:
    """adafruit_hid.keyboard.Keyboard: Keyboard(devices), press(*codes), release(*codes), release_all()."""

    instances: list = []

    def __init__(self, devices=None):
        self.devices, self.held, self.log = devices, set(), []
        FakeKeyboard.instances.append(self)

    def press(self, *codes):
        self.held |= set(codes)
        self.log.append(("press", codes))

    def release(self, *codes):
        self.held -= set(codes)
        self.log.append(("release", codes))

    def release_all(self):
        self.held.clear()
        self.log.append(("release_all", ()))


class FakeSerial:
    """usb_cdc.Serial: in_waiting, read(n), write(b), timeout. ``stop_after``: raise _Done once the
    input is exhausted that many times (to end code.py's endless loop)."""

    def __init__(self, data=b"", stop_after=None):
        self.inbox, self.out, self.timeout = bytearray(data), bytearray(), None
        self.stop_after = stop_after

    @property
    def in_waiting(self):
        if not self.inbox and self.stop_after is not None:
            self.stop_after -= 1
            if self.stop_after < 0:
                raise _Done
        return len(self.inbox)

    def read(self, n):
        data, self.inbox[:n] = bytes(self.inbox[:n]), b""
        return data

    def write(self, b):
        self.out += b
        return len(b)


class _Done(Exception):
    pass


class FakeClock:
    def __init__(self):
        self.ns = 5_000_000_000

    def monotonic_ns(self):
        return self.ns


@pytest.fixture
def stubs(monkeypatch):
    """CircuitPython's board, usb_hid, usb_cdc, supervisor, busio and adafruit_hid, as modules."""
    calls = []
    usb_hid = types.ModuleType("usb_hid")
    usb_hid.Device = types.SimpleNamespace(KEYBOARD="KEYBOARD", MOUSE="MOUSE")
    usb_hid.devices = ["hid-keyboard"]
    usb_hid.enable = lambda devices: calls.append(("usb_hid.enable", devices))
    usb_cdc = types.ModuleType("usb_cdc")
    usb_cdc.data = FakeSerial()
    usb_cdc.console = None
    usb_cdc.enable = lambda console=True, data=False: calls.append(("usb_cdc.enable", console, data))
    hid = types.ModuleType("adafruit_hid")
    hid_keyboard = types.ModuleType("adafruit_hid.keyboard")
    hid_keyboard.Keyboard = FakeKeyboard
    hid_keycode = types.ModuleType("adafruit_hid.keycode")
    hid_keycode.Keycode = types.SimpleNamespace(**host_kp.KEYS)
    hid.keyboard, hid.keycode = hid_keyboard, hid_keycode
    mods = {"usb_hid": usb_hid, "usb_cdc": usb_cdc, "adafruit_hid": hid, "adafruit_hid.keyboard": hid_keyboard,
            "adafruit_hid.keycode": hid_keycode, "board": types.ModuleType("board"),
            "busio": types.ModuleType("busio"), "supervisor": types.ModuleType("supervisor")}
    # the firmware imports its own copy of the protocol as a top-level module, as on the chip
    spec = importlib.util.spec_from_file_location("keyproto", os.path.join(FIRMWARE, "keyproto.py"))
    mods["keyproto"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mods["keyproto"])
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    FakeKeyboard.instances = []
    return types.SimpleNamespace(calls=calls, usb_cdc=usb_cdc, keyproto=mods["keyproto"])


def load_code(clock):
    spec = importlib.util.spec_from_file_location("rp2040_code", os.path.join(FIRMWARE, "code.py"))
    fw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fw)
    fw.time = clock  # the board's clock (time.monotonic_ns)
    return fw


def frames(*packets):
    return b"".join(host_kp.encode(p) for p in packets)


def test_the_firmware_speaks_the_host_schema_byte_for_byte(stubs):
    p = host_kp.Packet(host_kp.TAP, 513, (host_kp.KEYS["SPACE"],), hold_ms=33)
    assert stubs.keyproto.encode(stubs.keyproto.Packet(host_kp.TAP, 513, (0x2C,), hold_ms=33)) == host_kp.encode(p)
    assert stubs.keyproto.KEYS == host_kp.KEYS


def test_firmware_presses_releases_and_acks_with_its_clock(stubs):
    clock = FakeClock()
    fw = load_code(clock)
    A, LEFT = host_kp.KEYS["A"], host_kp.KEYS["LEFT_ARROW"]
    port, kb = FakeSerial(frames(host_kp.Packet(host_kp.PRESS, 1, (A, LEFT)))), FakeKeyboard()
    controller = fw.main(port=port, keyboard=kb, loops=3)
    assert kb.held == {A, LEFT} and port.timeout == 0
    assert kb.log[0] == ("release_all", ())  # starts from a clean keyboard
    (ack,) = host_kp.Decoder().feed(port.out)
    assert (ack.kind, ack.acked_seq, ack.status, ack.held) == (host_kp.ACK, 1, host_kp.OK, 2)
    assert ack.t_us == (clock.ns // 1000) & 0xFFFFFFFF
    port.out.clear()
    clock.ns += 20_000_000
    port.inbox += frames(host_kp.Packet(host_kp.RELEASE, 2, (A,)), host_kp.Packet(host_kp.TAP, 3, (A,), hold_ms=10))
    for _ in range(3):
        fw.step(port, controller)
    assert kb.held == {A, LEFT} and ("release", (A,)) in kb.log
    clock.ns += 10_000_000
    fw.step(port, controller)
    assert kb.held == {LEFT}  # the tap ended after 10 ms
    acks = host_kp.Decoder().feed(port.out)
    assert [a.acked_seq for a in acks] == [2, 3] and all(a.status == host_kp.OK for a in acks)


def test_firmware_refuses_an_unknown_keycode_without_pressing(stubs):
    fw = load_code(FakeClock())
    port, kb = FakeSerial(frames(host_kp.Packet(host_kp.PRESS, 1, (0x99,)))), FakeKeyboard()
    fw.main(port=port, keyboard=kb, loops=2)
    (ack,) = host_kp.Decoder().feed(port.out)
    assert ack.status == host_kp.BAD_KEY and kb.held == set() and kb.log == [("release_all", ())]


def test_firmware_releases_every_key_when_heartbeats_stop(stubs):
    clock = FakeClock()
    fw = load_code(clock)
    SPACE = host_kp.KEYS["SPACE"]
    port, kb = FakeSerial(frames(host_kp.Packet(host_kp.PRESS, 1, (SPACE,)))), FakeKeyboard()
    controller = fw.main(port=port, keyboard=kb, loops=1)
    step_ms = fw.HEARTBEAT_TIMEOUT_MS // 2
    for seq in range(2, 8):  # heartbeats inside the timeout keep the key down
        clock.ns += step_ms * 1_000_000
        port.inbox += frames(host_kp.Packet(host_kp.HEARTBEAT, seq))
        fw.step(port, controller)
    assert kb.held == {SPACE}
    clock.ns += (fw.HEARTBEAT_TIMEOUT_MS + 1) * 1_000_000  # the host goes quiet
    fw.step(port, controller)
    assert kb.held == set() and kb.log[-1] == ("release_all", ())


def test_code_py_runs_as_main_on_usb_cdc_data_with_a_hid_keyboard(stubs):
    B = host_kp.KEYS["B"]
    stubs.usb_cdc.data = FakeSerial(frames(host_kp.Packet(host_kp.PRESS, 1, (B,))), stop_after=5)
    with pytest.raises(_Done):
        runpy.run_path(os.path.join(FIRMWARE, "code.py"), run_name="__main__")
    (kb,) = FakeKeyboard.instances
    assert kb.devices == ["hid-keyboard"] and kb.held == {B}
    assert host_kp.Decoder().feed(stubs.usb_cdc.data.out)[0].status == host_kp.OK


def test_code_py_says_what_is_wrong_without_the_data_channel(stubs):
    stubs.usb_cdc.data = None
    fw = load_code(FakeClock())
    with pytest.raises(RuntimeError, match="boot.py must call usb_cdc.enable"):
        fw.main(loops=1)


def test_boot_py_enables_the_data_channel_and_the_keyboard(stubs):
    runpy.run_path(os.path.join(FIRMWARE, "boot.py"), run_name="__main__")
    assert ("usb_cdc.enable", True, True) in stubs.calls
    assert ("usb_hid.enable", ("KEYBOARD",)) in stubs.calls


CIRCUITPY_MODULES = {"struct", "binascii", "time", "board", "busio", "usb_hid", "usb_cdc", "supervisor",
                     "keyproto", "adafruit_hid.keyboard", "adafruit_hid.keycode"}


@pytest.mark.parametrize("name", FILES)
def test_firmware_files_keep_to_what_circuitpython_runs(name):
    """No f-strings, annotations, walrus, match, dataclasses / typing / enum / abc, and only modules
    CircuitPython (or the adafruit_hid bundle, or this folder) has."""
    with open(os.path.join(FIRMWARE, name)) as f:
        tree = ast.parse(f.read(), name)
    compile(tree, name, "exec")
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        assert not isinstance(node, (ast.JoinedStr, ast.AnnAssign, ast.NamedExpr, ast.Match)), where
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
            assert node.returns is None and all(a.annotation is None for a in args), where
        if isinstance(node, ast.Import):
            assert {a.name for a in node.names} <= CIRCUITPY_MODULES, where
        if isinstance(node, ast.ImportFrom):
            assert node.module in CIRCUITPY_MODULES and node.level == 0, where
