"""Every current result file (bench/results, not the archive) says where it came from: a ``provenance`` block
(bench, argv, commit, dirty, UTC date, machine, quick) with no machine path in it -- and the check fails on a file
without one."""

import datetime as dt
import json
import re

import pytest

from bench.harness.results import PROVENANCE_KEYS, RESULTS, provenance_of, write_result

FILES = sorted(p for p in RESULTS.rglob("*.json"))


def problems(res) -> list[str]:
    """What is wrong with a result's provenance ([] when nothing)."""
    prov = provenance_of(res)
    if prov is None:
        have = sorted(k for k in PROVENANCE_KEYS if k in (res.get("provenance") or res))
        return [f"no provenance block (of {', '.join(PROVENANCE_KEYS)} it has {have or 'none'})"]
    out = []
    if not (isinstance(prov["bench"], str) and prov["bench"]):
        out.append(f"bench {prov['bench']!r}")
    argv = prov["argv"]
    if not (isinstance(argv, list) and argv and all(isinstance(w, str) for w in argv)):
        out.append(f"argv {argv!r} is not a command line")
    else:
        machine_paths = [w for w in argv if re.search(r"(^|=)/(home|tmp|root|Users|work|mnt|var)/", w)]
        if machine_paths:
            out.append(f"argv holds machine paths {machine_paths}")
    if not (isinstance(prov["commit"], str) and re.fullmatch(r"[0-9a-f]{40}", prov["commit"])):
        out.append(f"commit {prov['commit']!r} is not a git commit")
    if prov["dirty"] not in (True, False, None):
        out.append(f"dirty {prov['dirty']!r}")
    try:
        when = dt.datetime.fromisoformat(str(prov["date"]))
        if when.utcoffset() != dt.timedelta(0):
            out.append(f"date {prov['date']!r} is not UTC")
    except ValueError:
        out.append(f"date {prov['date']!r} is not an ISO date and time")
    if not isinstance(prov["quick"], bool):
        out.append(f"quick {prov['quick']!r}")
    return out


def test_there_are_current_results_to_check():
    assert len(FILES) >= 50, FILES


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(RESULTS)) for p in FILES])
def test_every_current_result_has_provenance(path):
    assert problems(json.loads(path.read_text())) == [], path


def test_the_check_fails_on_a_file_without_provenance_and_passes_what_write_result_writes(tmp_path):
    """The negative twin: the same check on a result without provenance, with a machine path in its command, or with
    a local date fails; what ``write_result`` writes passes."""
    assert problems({"bench": "x", "date": "2026-12-01"})[0].startswith("no provenance block")
    path = write_result(tmp_path / "r.json", {"summary": 1}, "vla", ["--quick", "--out", str(tmp_path)], quick=True)
    res = json.loads(path.read_text())
    assert problems(res) == [] and res["summary"] == 1
    prov = res["provenance"]
    assert prov["argv"][:4] == ["python", "-m", "bench.vla", "--quick"] and str(tmp_path) not in path.read_text()
    assert prov["quick"] is True and prov["dirty"] in (True, False)
    bad = {**res, "provenance": {**prov, "argv": ["python", "-m", "bench.vla", "--out", "/home/me/res"]}}
    assert "machine paths" in problems(bad)[0]
    local = {**res, "provenance": {**prov, "date": "2026-12-01T10:00:00"}}
    assert problems(local) == ["date '2026-12-01T10:00:00' is not UTC"]
    nocommit = {**res, "provenance": {k: v for k, v in prov.items() if k != "commit"}}
    assert problems(nocommit)[0].startswith("no provenance block")
