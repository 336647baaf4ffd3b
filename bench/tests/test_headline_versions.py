"""The headline names the version of a committed checkpoint a row was measured on, once its weights were replaced
(issue 64), and its table of versions is the checkpoint's `git log`."""

import os
import pathlib
import subprocess

import pytest

from bench.harness.headline import SHIPPED_VERSIONS, checkpoint_label

ROOT = pathlib.Path(__file__).resolve().parents[2]


def weight_commits(checkpoint: str) -> list[tuple[str, str]]:
    """(UTC author time, short hash) of each commit that wrote ``checkpoint``'s weights, newest first."""
    r = subprocess.run(["git", "log", "--date=format-local:%Y-%m-%dT%H:%M:%S", "--format=%ad %h", "--abbrev=7",
                        "--", f"{checkpoint}/model.safetensors"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "TZ": "UTC"}, timeout=60)
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    return [tuple(line.split()) for line in r.stdout.splitlines()]


@pytest.mark.parametrize("checkpoint", sorted(SHIPPED_VERSIONS))
def test_the_versions_are_the_checkpoints_git_log(checkpoint):
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
    if shallow == "true":
        pytest.skip("a shallow clone lacks the checkpoint's history")
    commits = weight_commits(checkpoint)
    assert commits == [(when, commit) for when, _, commit in SHIPPED_VERSIONS[checkpoint]], (
        f"{checkpoint}'s weights were written by {commits}: add the new version (and the round that made it) to "
        "bench/harness/headline.py's SHIPPED_VERSIONS")


def test_a_row_names_the_replaced_version_it_was_measured_on():
    old = {"provenance": {"date": "2026-12-03T23:34:43+00:00"}}
    assert checkpoint_label("vla/checkpoints/base", old) == \
        "`vla/checkpoints/base` as of round 14 (81bb2ea; replaced by round 23)"
    assert checkpoint_label("vla/checkpoints/base", {"date": "2026-12-06T12:00:00"}) == "`vla/checkpoints/base`"
    assert checkpoint_label("runs/x", old) == "`runs/x`"  # not a committed checkpoint: nothing to say
    assert checkpoint_label("vla/checkpoints/base", {}) == "`vla/checkpoints/base`"  # undated: no claim
    assert "before round 14" in checkpoint_label("vla/checkpoints/base", {"date": "2026-12-01T00:00:00"})
