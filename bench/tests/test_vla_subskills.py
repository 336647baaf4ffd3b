"""bench.vla_subskills: the sub-skills of the long tasks. Moved from tests/test_bench_vla_subskills.py (issue 62;
the bench's runs stay there); e2e as it was."""

import pytest

from bench.vla_subskills import subskills

pytestmark = pytest.mark.e2e


def test_the_sub_skills_of_the_long_tasks():
    assert subskills(["place_cube_in_bowl", "stack_cubes"]) == [
        ("place_cube_in_bowl", 0, "pick up the red cube"), ("place_cube_in_bowl", 1, "put it in the bowl"),
        ("stack_cubes", 0, "pick up the green cube"), ("stack_cubes", 1, "put it on the red cube")]
    with pytest.raises(ValueError, match="one skill"):
        subskills(["pick_red_cube"])
