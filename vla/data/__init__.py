"""Demonstration datasets: crash-safe LeRobot v3 recording (writer) and checks / repair (integrity).

Importing ``vla.data`` is cheap; lerobot is imported when a writer is built or a dataset checked.
"""

from vla.data.integrity import Report, check_dataset, repair_dataset
from vla.data.writer import EpisodeWriter, make_features

__all__ = ["EpisodeWriter", "Report", "check_dataset", "make_features", "repair_dataset"]
