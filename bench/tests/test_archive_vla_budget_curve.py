"""bench.archive.vla_budget_curve: success against steps and demos from a round file. Moved from
tests/test_bench_vla_budget_curve.py (issue 62); e2e as it was."""

import json

import pytest

pytestmark = pytest.mark.e2e


def _run(name, steps, demos, red, para=()):
    return {"run": name, "total_steps": steps, "demos_per_task": demos, "train_config": {"paraphrases": list(para)},
            "evals": {"trained wording": {"tasks": {"pick_red_cube": {"successes": red, "episodes": 20}}}}}


def test_runs_are_placed_on_the_axis_they_differ_on_and_the_plot_is_written(tmp_path):
    from bench.archive.vla_budget_curve import main, points

    rnd = {"round": 99, "runs": [_run("a", 6000, 60, 9), _run("more_steps", 12000, 60, 11),
                                 _run("more_demos", 6000, 120, 8), _run("ablation", 6000, 60, 13, para=[["x", ["y"]]])]}
    pts = points(rnd)
    assert [r["run"] for r in pts["steps"]] == ["a", "more_steps"]  # the ablation changes more than the budget
    assert [r["run"] for r in pts["demos"]] == ["a", "more_demos"]
    assert pts["steps"][1]["tasks"] == {"pick_red_cube": [11, 20]}
    path = tmp_path / "round99.json"
    path.write_text(json.dumps(rnd))
    assert main(["--round", str(path)]) == 0
    assert (tmp_path / "round99_budget.png").stat().st_size > 5_000
