"""The keyboard rig without hardware (driver ``emulated_keypresser``): the real host driver
(``SerialKeyPresser``) talking to an emulated microcontroller on a pty that it starts itself.

Everything but the USB wire is the real thing: the same protocol bytes, the firmware's logic,
the heartbeat timeout. ``mcu`` is the emulator (its ``pressed`` keys are what the game host
would see); a site names this driver where the real rig names ``serial_keypresser``.
"""

from __future__ import annotations

from typing import Any

from hardware.firmware import keyproto as kp
from hardware.keyboard_mcu_emulator import EmulatedMicrocontroller
from hardware.serial_keypresser import SerialKeyPresser


class EmulatedKeyPresser(SerialKeyPresser):
    def __init__(self, name: str = "keyboard", firmware_timeout_ms: int = kp.HEARTBEAT_TIMEOUT_MS,
                 **kw: Any) -> None:
        super().__init__(name, **kw)
        self.firmware_timeout_ms = int(firmware_timeout_ms)
        self.mcu: EmulatedMicrocontroller | None = None

    def _connect(self) -> None:
        self.mcu = EmulatedMicrocontroller(self.firmware_timeout_ms).start()
        self.port = self.mcu.port
        try:
            super()._connect()
        except BaseException:
            self.mcu.stop()
            raise

    def _disconnect(self) -> None:
        try:
            super()._disconnect()
        finally:
            if self.mcu is not None:
                self.mcu.stop()

    def describe(self) -> dict[str, Any]:
        d = {**super().describe(), "emulated": True}
        if self.mcu is not None and self.is_connected:
            d["mcu"] = self.mcu.stats()
        return d
