"""bench.vla_subskills: the sub-skills of the long tasks. Moved from tests/test_bench_vla_subskills.py (issue 62;
the bench's runs stay there); e2e as it was."""

import pytest

from bench.vla_subskills import CHAIN, TASK_PROMPT, own_handover, subskills, summarize

pytestmark = pytest.mark.e2e


def test_the_sub_skills_of_the_long_tasks():
    assert subskills(["place_cube_in_bowl", "stack_cubes"]) == [
        ("place_cube_in_bowl", 0, "pick up the red cube"), ("place_cube_in_bowl", 1, "put it in the bowl"),
        ("stack_cubes", 0, "pick up the green cube"), ("stack_cubes", 1, "put it on the red cube")]
    with pytest.raises(ValueError, match="one skill"):
        subskills(["pick_red_cube"])


def _chain(seed, done, starts, success=False, ticks=300):
    return {"task": "put_all_cubes_in_bowl", "k": CHAIN, "seed": seed, "reached": True, "handover_tick": 0,
            "success": success, "ticks": ticks, "ticks_per_skill": done, "skill_start_ticks": starts}


def test_own_hand_over_counts_a_sub_skill_from_the_scenes_where_the_vla_did_the_ones_before():
    eps = [_chain(0, [30, 40, None], [0, 30, 70]),  # the second pick failed
           _chain(1, [25, None], [0, 25]),  # the first place failed
           _chain(2, [None], [0]),  # the first pick failed
           _chain(3, [20, 30, 20, 30, 20, 30], [0, 20, 50, 70, 100, 120], success=True, ticks=150)]
    own = [own_handover(eps, k) for k in range(6)]
    assert [sum(e["reached"] for e in o) for o in own] == [4, 3, 2, 1, 1, 1]
    assert [sum(e["success"] for e in o) for o in own] == [3, 2, 1, 1, 1, 1]
    assert own[2][0]["handover_tick"] == 70 and own[2][0]["ticks"] == 300 - 70  # failed: the ticks it was given
    rows = summarize(eps + [{"task": "put_all_cubes_in_bowl", "k": TASK_PROMPT, "seed": 0, "reached": True,
                             "handover_tick": 0, "success": False, "ticks": 420}],
                     subskills(["put_all_cubes_in_bowl"]), "own", task_prompt=True)
    assert [(r["k"], r["handover"], r["successes"], r["reached"]) for r in rows] == [
        (0, "own", 3, 4), (1, "own", 2, 3), (2, "own", 1, 2), (3, "own", 1, 1), (4, "own", 1, 1), (5, "own", 1, 1),
        (CHAIN, "none", 1, 4), (TASK_PROMPT, "none", 0, 1)]


def test_the_goal_reached_during_a_sub_skill_counts_it_done():
    """A place whose task goal holds before its own done predicate (the sequence stops there) is a success."""
    (e,) = own_handover([_chain(0, [30, None], [0, 30], success=True, ticks=60)], 1)
    assert e["reached"] and e["success"]
