"""Atomic file writes: a temp file next to the target, fsynced, then renamed over it.

Used by the dataset writer (``vla.data.writer``), its repair (``vla.data.integrity``) and the
episode log (``vla.data.episode_log``); importing it costs nothing beyond the standard library.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

TEMP_SUFFIX = ".tmp"


def temp_path_for(path: Path) -> Path:
    """Hidden temp name next to ``path``; never matches lerobot's ``*.parquet`` / ``*.mp4`` globs."""
    return path.with_name(f".{path.name}.{os.getpid()}{TEMP_SUFFIX}")


def fsync_path(path: Path) -> None:
    """fsync a file or directory (best effort on filesystems that refuse directory fsync)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        logger.debug("cannot open %s to fsync it: %s", path, e)
        return
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems refuse fsync on a directory; the data files were synced
        logger.debug("fsync of %s refused: %s", path, e)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file, fsync it, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def atomic_write_json(data: Any, path: Path) -> None:
    """Same output as lerobot's ``write_json`` (indent 4, utf-8), written atomically."""
    atomic_write_bytes(Path(path), json.dumps(data, indent=4, ensure_ascii=False).encode("utf-8"))
