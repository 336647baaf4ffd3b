"""`vla --help` and every subcommand's --help explain themselves; user errors are one clear line."""

import subprocess
import sys

import pytest

from vla.cli import COMMANDS, build_parser, main


def _help(argv):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 0


def test_top_level_help_lists_every_subcommand(capsys):
    _help(["--help"])
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out
    assert "examples:" in out


@pytest.mark.parametrize("argv", [["bridge", "--help"], ["bridge", "serve", "--help"], ["bridge", "ping", "--help"],
                                  ["bridge", "devices", "--help"], ["bridge", "keys", "--help"], ["demo", "--help"],
                                  ["record", "--help"], ["replay", "--help"], ["dataset", "--help"],
                                  ["dataset", "check", "--help"], ["dataset", "repair", "--help"],
                                  ["dataset", "view", "--help"]])
def test_subcommand_help(argv, capsys):
    _help(argv)
    out = capsys.readouterr().out
    assert len(out.splitlines()) > 5 and "usage: vla" in out
    if "--site" in out:
        assert "preset" in out  # tells what a site is


def test_bad_site_is_one_clear_line(capsys):
    assert main(["bridge", "devices", "--site", "sim-frankaa"]) == 2
    err = capsys.readouterr().err
    assert "error: unknown site 'sim-frankaa'" in err and "Traceback" not in err


def test_devices_lists_the_preset(capsys):
    assert main(["bridge", "devices", "--site", "sim-franka"]) == 0
    out = capsys.readouterr().out
    assert "arm" in out and "sim_franka" in out and "tcp://127.0.0.1:5550" in out


def test_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "vla.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "bridge" in r.stdout
