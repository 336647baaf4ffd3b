"""RP2040 keyboard rig firmware (CircuitPython + adafruit_hid).

The board is a USB keyboard to the game host and reads the rig's serial protocol (``keyproto``,
the same file the host driver uses) on the USB data channel ``usb_cdc.data`` (enabled in
``boot.py``). Every valid frame is acked with the board's clock; keys are pressed and released on
the HID keyboard. When no valid frame arrives for ``HEARTBEAT_TIMEOUT_MS`` every key is released
(``keyproto.Controller``), so a crashed or unplugged host never leaves a key held down.

Runs on the chip as ``code.py``; tests import it with stub ``usb_hid`` / ``usb_cdc`` /
``adafruit_hid`` modules and drive :func:`main` with a fake serial port.
"""

import time

import keyproto
import usb_cdc
import usb_hid
from adafruit_hid.keyboard import Keyboard

HEARTBEAT_TIMEOUT_MS = keyproto.HEARTBEAT_TIMEOUT_MS  # release every key after this long without a valid frame
READ_CHUNK = 64  # bytes read per loop at most


def now_us():
    return time.monotonic_ns() // 1000


def make_controller(keyboard, timeout_ms=HEARTBEAT_TIMEOUT_MS):
    return keyproto.Controller(keyboard, now_us, timeout_ms)


def step(port, controller):
    """One pass of the main loop: read what arrived, apply it, ack it, release what is due."""
    waiting = port.in_waiting
    if waiting:
        data = port.read(min(waiting, READ_CHUNK))
        if data:
            acks = controller.feed(data)
            if acks:
                port.write(acks)
    controller.tick()


def main(port=None, keyboard=None, loops=None):
    """Serve forever (``loops``: stop after that many passes, for tests)."""
    if port is None:
        port = usb_cdc.data
    if port is None:
        raise RuntimeError("usb_cdc.data is off: boot.py must call usb_cdc.enable(data=True)")
    if keyboard is None:
        keyboard = Keyboard(usb_hid.devices)
    keyboard.release_all()
    port.timeout = 0
    controller = make_controller(keyboard)
    n = 0
    while loops is None or n < loops:
        step(port, controller)
        n += 1
    return controller


if __name__ == "__main__":  # CircuitPython runs code.py as __main__
    main()
