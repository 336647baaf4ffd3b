"""RP2040 keyboard rig, boot stage (CircuitPython): a USB keyboard to the game host, plus a second
USB serial channel (``usb_cdc.data``) for the protocol, so the REPL console stays free."""

import usb_cdc
import usb_hid

usb_cdc.enable(console=True, data=True)
usb_hid.enable((usb_hid.Device.KEYBOARD,))
