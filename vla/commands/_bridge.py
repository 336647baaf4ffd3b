"""Moved to ``robot_io.bridge_process`` (issue 62): a re-export for the scripts under bench/ that
still import it from here. Product code and tests import ``robot_io.bridge_process``."""

from robot_io.bridge_process import (SIM_DRIVERS, BridgeExited, bridge_is_up, is_simulated,  # noqa: F401
                                     running_bridge)
