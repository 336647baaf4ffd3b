"""The recovery files a dataset being recorded keeps beside lerobot's, shared by the writer
(``vla.data.writer``, which makes them) and its check / repair (``vla.data.integrity``, which reads
them): paths under ``<root>/.recovery/`` and the lock held while recording. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

LOCK_PATH = ".recovery/lock"
"""Held (flock) by the process recording into the dataset; ``repair_dataset`` refuses to touch
a locked dataset. The kernel drops the lock when its process dies, SIGKILL included."""

BACKUP_INFO_PATH = ".recovery/info.json"
"""Copy of the last committed ``meta/info.json``, used by ``repair_dataset`` when info.json is
unreadable. Lives outside ``meta/`` so lerobot never reads it."""

CREATE_DIR_PREFIX = ".recovery/create-"
"""A new dataset's ``info.json`` is written by lerobot into ``<root>/.recovery/create-<pid>/`` and
renamed into ``meta/`` (the moment the dataset exists); a kill before that leaves only files
``repair_dataset`` recognises as an unfinished creation."""


class DatasetLock:
    """Exclusive, non-blocking ``flock`` on ``root/.recovery/lock``."""

    def __init__(self, root: Path) -> None:
        self._path = Path(root) / LOCK_PATH
        self._fd: int | None = None

    def acquire(self) -> bool:
        import fcntl

        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
