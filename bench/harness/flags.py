"""The flags every bench shares: ``--out`` (where the result JSON and plot go), ``--quick`` (a smoke run at toy
size), ``--jobs`` (parallel sessions or workers) and ``--port0`` (fixed ports instead of leased ones)."""

from __future__ import annotations

import argparse
import pathlib

from bench.harness.results import RESULTS


def parser(name: str, doc: str | None, *, out: bool = True, quick: str | None = None,
           jobs: tuple[int, str] | None = None, port0: bool = False, **kwargs) -> argparse.ArgumentParser:
    """The parser of ``python -m bench.<name>`` (``doc``, the module's docstring, is its description) with the
    shared flags asked for: ``--out`` (:func:`add_out`), ``--quick`` (``quick`` is its help: what the smoke run
    cuts), ``--jobs`` (``jobs`` = (default, help)) and ``--port0`` (:func:`add_port0`); ``kwargs`` go to
    ``argparse.ArgumentParser`` (an ``epilog``, another ``formatter_class``)."""
    ap = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc,
                                 **{"formatter_class": argparse.RawDescriptionHelpFormatter, **kwargs})
    if out:
        add_out(ap)
    if quick is not None:
        add_quick(ap, quick)
    if jobs is not None:
        add_jobs(ap, *jobs)
    if port0:
        add_port0(ap)
    return ap


def add_out(ap: argparse.ArgumentParser, default=RESULTS, type=pathlib.Path, help: str | None = None) -> None:
    """``--out``: the folder of the result JSON and plot (default bench/results)."""
    ap.add_argument("--out", type=type, default=type(default),
                    help=help or "folder of the result JSON and plot (default bench/results)")


def add_quick(ap: argparse.ArgumentParser, help: str) -> None:
    """``--quick``: the smoke run (``help`` says what it cuts); results record it."""
    ap.add_argument("--quick", action="store_true", help=help)


def add_jobs(ap: argparse.ArgumentParser, default: int, help: str = "sessions run in parallel (one sim bridge each)"):
    """``--jobs``: sessions or workers run in parallel."""
    ap.add_argument("--jobs", type=int, default=default, help=help)


def add_port0(ap: argparse.ArgumentParser) -> None:
    """``--port0``: fixed bridge ports (port0 + 20 j ... for bridge j) instead of the default leased ones."""
    ap.add_argument("--port0", type=int, default=None,
                    help="bridge j uses the fixed ports port0 + 20 j ... (default: ports leased on this machine, "
                         "free of every other bench and worker that leases)")
