"""Result files with provenance: every bench writes its JSON through :func:`write_result`, which adds a
``provenance`` block (which bench, its command line, the git commit and whether the tree was dirty, the UTC
date, the machine, quick or not). Paths in results are :func:`portable`: relative to the repository, or cut
from their last ``runs`` folder on -- no machine paths in committed files."""

from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import platform
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
"""Where the current results live (``--out``'s default)."""
PROVENANCE_KEYS = ("bench", "argv", "commit", "dirty", "date", "machine", "quick")


def portable(path):
    """``path`` as committed results may hold it: relative to the repository when inside it, else from its last
    ``runs`` folder on (the last part when there is none). None and relative paths without ``..`` pass unchanged."""
    if path is None:
        return None
    path = str(path)
    if not os.path.isabs(path) and ".." not in pathlib.Path(path).parts:
        return path
    p = pathlib.Path(path).resolve()
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        parts = p.parts
        i = max((k for k, x in enumerate(parts) if x == "runs"), default=len(parts) - 1)
        return str(pathlib.Path(*parts[i:]))


def _portable_arg(a: str) -> str:
    """A command-line word with its absolute path (alone, or after ``NAME=``) made :func:`portable`."""
    name, sep, path = a.partition("=")
    if sep and os.path.isabs(path):
        return f"{name}={portable(path)}"
    return portable(a) if os.path.isabs(a) else a


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(bench: str, argv: list[str] | None = None, quick: bool = False) -> dict:
    """Where a result came from: ``bench`` (its name), ``argv`` (the command, paths made portable), ``commit`` and
    ``dirty`` (tracked files changed; None without git), ``date`` (UTC, ISO, seconds), ``machine`` and ``quick``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"bench": bench, "argv": ["python", "-m", f"bench.{bench}", *map(_portable_arg, map(str, argv))],
            "commit": _git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "quick": bool(quick)}


def write_result(path, res: dict, bench: str, argv: list[str] | None = None, quick: bool = False, indent: int = 2,
                 default=None) -> pathlib.Path:
    """Write ``res`` to ``path`` as JSON (``indent``, ``default`` as ``json.dumps``'s; folders made; atomically: a
    reader never sees half a file) with a ``provenance`` block (:func:`provenance`) after its own keys. -> the
    path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**res, "provenance": provenance(bench, argv, quick)}, indent=indent, default=default)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
    return path


def provenance_of(res: dict) -> dict | None:
    """A result's provenance: its ``provenance`` block, or (``bench/critic_truth.py``'s form) the same keys at its
    top level. None when neither holds every key of :data:`PROVENANCE_KEYS`."""
    block = res.get("provenance") if isinstance(res, dict) else None
    if isinstance(block, dict) and all(k in block for k in PROVENANCE_KEYS):
        return block
    if isinstance(res, dict) and all(k in res for k in PROVENANCE_KEYS):
        return {k: res[k] for k in PROVENANCE_KEYS}
    return None
