"""bench/base_eval.py's pieces: the split of the tasks over processes, the exact McNemar test."""

import pytest

from bench.base_eval import mcnemar, split_tasks


def test_the_long_tasks_are_spread_first_and_every_task_runs_once():
    tasks = ["pick_red_cube", "pick_blue_cube", "lift_green_cube", "place_cube_in_bowl", "stack_cubes"]
    groups = split_tasks(tasks, 2)
    assert sorted(t for g in groups for t in g) == sorted(tasks) and len(groups) == 2
    assert not any({"stack_cubes", "place_cube_in_bowl"} <= set(g) for g in groups)
    assert split_tasks(tasks[:1], 4) == [tasks[:1]] and split_tasks(tasks, 1) == [sorted(tasks, key=lambda t: (
        -{"stack_cubes": 3, "place_cube_in_bowl": 2}.get(t, 1), tasks.index(t)))]


@pytest.mark.parametrize("a, b, want", [
    ([1, 1, 0, 0], [1, 1, 0, 0], (0, 0, 1.0)),
    ([0] * 8, [1] * 8, (8, 0, 0.00781)),  # 2 / 2^8
    ([1, 0, 0, 1, 0], [0, 1, 1, 1, 0], (2, 1, 1.0)),
])
def test_mcnemar_counts_discordant_scenes_and_its_exact_p(a, b, want):
    first = {("t", i): bool(x) for i, x in enumerate(a)}
    second = {("t", i): bool(x) for i, x in enumerate(b)}
    second[("t", 99)] = True  # a scene only one model ran is not a pair
    r = mcnemar(first, second)
    assert (r["second_only"], r["first_only"]) == want[:2] and r["p_exact_mcnemar"] == pytest.approx(want[2], rel=1e-2)
    assert r["pairs"] == len(a)
