"""Microcontroller code. Everything here must also run on CircuitPython (see ``keyproto``):
``code.py`` and ``boot.py`` are the RP2040 keyboard's firmware, ``keyproto.py`` the serial protocol
they share with the host driver and the emulated microcontroller. Copy ``boot.py``, ``code.py``
and ``keyproto.py`` to the CIRCUITPY drive, with ``adafruit_hid`` in its ``lib/``."""
