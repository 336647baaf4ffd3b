"""bench/vla_confusion.py's pieces: each episode's outcome, the named cube, wordings, pushes and releases, the
plot title."""

import json

import numpy as np
import pytest


def _ep(success=False, grasped=None, moved=None, near=None):
    return {"success": success, "first_grasped": grasped, "first_moved": moved, "close_nearest": near}


@pytest.mark.parametrize("ep, outcome", [
    (_ep(success=True, grasped="red_cube"), "success"),
    (_ep(grasped="blue_cube", moved="blue_cube", near="blue_cube"), "wrong object"),
    (_ep(moved="green_cube"), "wrong object"),                      # pushed another cube
    (_ep(near="green_cube"), "wrong object"),                       # closed beside another cube
    (_ep(grasped="red_cube", moved="red_cube", near="red_cube"), "right object, skill not completed"),
    (_ep(near="red_cube"), "right object, grasp missed"),
    (_ep(), "nothing"),
])
def test_each_episode_gets_one_outcome(ep, outcome):
    from bench.vla_confusion import classify

    assert classify(ep, "red_cube") == outcome


def test_the_named_cube_is_the_first_skills():
    from bench.vla_confusion import named_cube

    from hardware.sim_tasks import get_task

    assert [named_cube(get_task(t)) for t in ("pick_blue_cube", "place_cube_in_bowl", "stack_cubes",
                                              "push_block_to_marker")] == ["blue_cube", "red_cube", "green_cube",
                                                                           "blue_cube"]


def test_wordings_cycle_through_the_paraphrases_or_the_held_out_ones():
    from bench.vla_confusion import episode_wording

    from hardware.sim_tasks import get_task

    place = get_task("place_cube_in_bowl")
    assert [episode_wording(place, i, "paraphrases") for i in range(4)] == [*place.paraphrases, place.paraphrases[0]]
    assert {episode_wording(place, i, "held-out") for i in range(5)} == {"move the red cube into the yellow bowl"}
    assert episode_wording(place, 3, "instruction") is None  # the task's own
    assert episode_wording(place, 3, "instruction", "put it there") == "put it there"


def test_a_push_that_moved_the_named_cube_began_the_right_skill():
    from bench.vla_confusion import classify

    pushed = _ep(moved="blue_cube", near="blue_cube")
    assert classify(pushed, "blue_cube", grasps=False) == "right object, skill not completed"
    assert classify(pushed, "blue_cube") == "right object, grasp missed"  # a pick that only nudged it
    assert classify(_ep(moved="red_cube"), "blue_cube", grasps=False) == "wrong object"
    # nothing moved: a push's shut fingers "closed" at its first tick wherever they were, which names no cube
    assert classify(_ep(near="blue_cube"), "blue_cube", grasps=False) == "nothing"
    assert classify(_ep(near="green_cube"), "blue_cube", grasps=False) == "nothing"


def test_from_json_classifies_an_earlier_result_again(tmp_path):
    from bench.vla_confusion import main, summarize

    eps = [dict(_ep(moved="blue_cube", near="blue_cube"), task="push_block_to_marker", named="blue_cube", seed=1, achieved={},
                instruction="push the blue cube to the pink marker", outcome="right object, grasp missed")]
    old = {"checkpoint": "runs/x", "episodes_per_task": 1, "wording": "instruction",
           **summarize(eps, ["push_block_to_marker"]), "episodes": eps}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(old))
    assert main(["--from-json", str(path)]) == 0
    new = json.loads(path.read_text())
    assert new["episodes"][0]["outcome"] == "right object, skill not completed"
    assert new["tasks"]["push_block_to_marker"]["outcomes"]["right object, skill not completed"] == 1
    assert new["tasks"]["push_block_to_marker"]["push_moved_the_cube"] is None  # a file without the poses
    assert (tmp_path / "r.png").stat().st_size > 5_000


def test_where_a_push_moved_the_cube_relative_to_the_marker():
    """Over generated pushes: the cube moved by ``m`` at angle ``a`` from the marker's direction -> towards
    (|a| < 60 degrees), away (|a| > 120), sideways between, not moved under 2 cm; the summary counts them per task."""
    from bench.vla_confusion import PUSH_DIRECTIONS, push_direction, push_progress, summarize

    rng = np.random.default_rng(0)
    eps, want = [], []
    for seed in range(200):
        c0, heading = rng.uniform(0.3, 0.6, 2), rng.uniform(-np.pi, np.pi)
        g = c0 + rng.uniform(0.1, 0.2) * np.array([np.cos(heading), np.sin(heading)])
        a, m = rng.uniform(-np.pi, np.pi), rng.choice([0.005, 0.015, 0.05, 0.1])
        c1 = c0 + m * np.array([np.cos(heading + a), np.sin(heading + a)])
        ep = dict(_ep(moved="blue_cube"), task="push_block_to_marker", named="blue_cube", seed=seed, achieved={},
                  instruction="push", outcome="right object, skill not completed",
                  xy_start={"blue_cube": c0.tolist(), "target": g.tolist()},
                  xy_end={"blue_cube": c1.tolist(), "target": g.tolist()})
        p = push_progress(ep, "blue_cube")
        assert p["moved_m"] == pytest.approx(m, abs=1e-3)
        assert p["cos_to_goal"] == pytest.approx(np.cos(a), abs=2e-3)
        assert p["dist_start_m"] == pytest.approx(np.linalg.norm(g - c0), abs=1e-3)
        deg = abs(np.degrees(a))
        if m < 0.02:
            expect = "not moved"
        elif min(abs(deg - 60), abs(deg - 120)) < 0.5:
            continue  # on a boundary: rounding decides
        else:
            expect = "towards the marker" if deg < 60 else "away from it" if deg > 120 else "sideways"
        assert push_direction(p) == expect, (deg, m)
        eps.append(ep)
        want.append(expect)
    counts = summarize(eps, ["push_block_to_marker"])["tasks"]["push_block_to_marker"]["push_moved_the_cube"]
    assert counts == {d: want.count(d) for d in PUSH_DIRECTIONS} and sum(counts.values()) == len(eps)
    assert push_progress({"seed": 1}, "blue_cube") is None and push_direction(None) is None


def test_where_a_push_came_down_in_the_push_frame():
    """Over generated scenes and touchdowns: the point where the tcp first came down, given in world x / y, is read
    back in cm along the cube -> marker line and across it; the summary counts those within 2 cm of the expert's start
    point and takes the median of the successes only."""
    from bench.vla_confusion import expert_push_start_cm, push_touchdown, touchdown_summary

    rng = np.random.default_rng(1)
    ref = np.asarray(expert_push_start_cm())
    points, ok, want_within = [], [], 0
    for seed in range(200):
        c0, heading = rng.uniform(0.3, 0.6, 2), rng.uniform(-np.pi, np.pi)
        d = np.array([np.cos(heading), np.sin(heading)])
        g = c0 + rng.uniform(0.1, 0.2) * d
        along, across = rng.uniform(-10, 10), rng.uniform(-8, 8)
        xy = c0 + (along * d + across * np.array([-d[1], d[0]])) / 100
        ep = {"xy_start": {"blue_cube": c0.tolist(), "target": g.tolist()},
              "touchdown": {"tick": 5, "xy": xy.tolist()}}
        p = push_touchdown(ep, "blue_cube")
        assert p == pytest.approx([along, across], abs=0.011)
        points.append(p)
        ok.append(seed % 3 == 0)
        want_within += np.linalg.norm(np.asarray(p) - ref) <= 2.0
    points.append(push_touchdown({"xy_start": {"blue_cube": [0.5, 0], "target": [0.6, 0]}, "touchdown": None},
                                 "blue_cube"))  # never came down
    ok.append(False)
    s = touchdown_summary(points, ok)
    assert s["came_down"] == 200 and s["off_expert_start_cm"][-1] is None and s["within_2cm"] == want_within
    dists = [np.linalg.norm(np.asarray(p) - ref) for p in points[:200]]
    assert s["median_off_cm"] == pytest.approx(np.median(dists), abs=0.01)
    assert s["median_off_cm_successes"] == pytest.approx(np.median(dists[::3]), abs=0.01)
    assert push_touchdown({"seed": 1}, "blue_cube") is None  # a file written before touchdowns were recorded
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.vla_confusion import _plot_touchdowns

    fig, ax = plt.subplots()
    _plot_touchdowns(ax, {"push_touchdown": s})  # every point that came down is drawn, the successes apart
    drawn = {c.get_label(): len(c.get_offsets()) for c in ax.collections}
    assert drawn == {"failed": 200 - sum(ok[:200]), "succeeded": sum(ok[:200])}
    plt.close(fig)


def test_the_expert_push_start_is_where_the_scripted_expert_comes_down():
    """The reference point is the one the scripted expert flies to before it comes down: its target, high over the
    start, read back in the push frame of a scene with the marker at 30 degrees."""
    from hardware.sim_tasks import CUBE_HALF
    from hardware.teleop.scripted import HOME_DOWN_QUAT, ScriptedExpert
    from bench.vla_confusion import expert_push_start_cm, push_touchdown

    ex = ScriptedExpert(quality=1.0, noise_std=0.0, rot_noise_std=0.0, seed=0)
    ex.begin_episode("push_block_to_marker", seed=0)
    cube, marker = np.array([0.45, 0.05]), np.array([0.45, 0.05]) + 0.15 * np.array([np.cos(0.52), np.sin(0.52)])
    objs = {"blue_cube": np.array([*cube, CUBE_HALF, 1, 0, 0, 0]), "target": np.array([*marker, 0.001, 1, 0, 0, 0])}
    target, _, _ = ex._push(("push", "blue_cube", "target"), objs, np.array([0.3, -0.2, 0.25]), HOME_DOWN_QUAT, 0.0)
    ep = {"xy_start": {"blue_cube": cube.tolist(), "target": marker.tolist()},
          "touchdown": {"tick": 0, "xy": target[:2].tolist()}}
    assert ex.phase == "pre" and push_touchdown(ep, "blue_cube") == pytest.approx(expert_push_start_cm(), abs=0.011)


def test_the_first_touchdown_is_recorded_with_its_tick():
    """rollout() keeps where and when the tcp first went below pushing height, not a later one."""
    from bench.vla_confusion import rollout

    world = _StackWorld()
    plan = [(0.3, 0.1, 0.1, 0.0), (0.32, 0.1, 0.05, 0.0), (0.33, 0.11, 0.02, 0.0), (0.4, 0.1, 0.02, 0.0),
            (0.4, 0.1, 0.1, 0.0), (0.2, 0.2, 0.02, 0.0)]
    ep = rollout(world, world, _Rows(plan), 0, world.names)
    assert ep["touchdown"] == {"tick": 2, "xy": [0.33, 0.11]}
    ep = rollout(_StackWorld(), _StackWorld(), _Rows(plan[:2]), 0, world.names)
    assert ep["touchdown"] is None


class _StackWorld:
    """A kinematic stand-in for the sim task env and its bridge client: the tcp moves to each row's position, a closed
    gripper holds the cube within 3 cm of it (state 0.5) and carries it, an open one drops it where it is."""

    max_ticks = 40

    def __init__(self):
        from hardware.sim_tasks import OBJECT_NAMES

        self.names = list(OBJECT_NAMES)
        self.poses = np.zeros((len(self.names), 7))
        self.poses[:, 6] = 1.0
        for n, xyz in {"red_cube": (0.5, 0.1, 0.02), "green_cube": (0.5, -0.1, 0.02), "blue_cube": (0.4, 0.0, 0.02),
                       "bowl": (0.6, 0.2, 0.0), "target": (0.3, -0.2, 0.0)}.items():
            self.poses[self.names.index(n), :3] = xyz
        self.ee, self.grip, self.held = np.array([0.5, 0.0, 0.2]), 1.0, None
        self.last_state, self.t, self.drop_at = self, 0, None

    @property
    def arrays(self):
        return {"objects": self.poses.copy()}

    def _obs(self):
        return {"state": np.concatenate([self.ee, [1, 0, 0, 0], [self.grip]]).astype(np.float32)}

    def reset(self, seed=None):
        return self._obs(), {}

    def step(self, row):
        self.ee = np.asarray(row[:3], float)
        self.t += 1
        if self.t - 1 == self.drop_at and self.held is not None:  # it slips out: falls to the table, fingers shut
            self.poses[self.held, 2] = 0.02
            self.held, self.grip = None, 0.0
            return self._obs(), 0.0, False, False, {}
        if row[6] < 0.5 and self.held is None:
            near = [i for i in range(3) if np.linalg.norm(self.poses[i, :3] - self.ee) < 0.03]
            self.held = near[0] if near else None
        elif row[6] >= 0.5:
            self.held = None
        self.grip = 1.0 if row[6] >= 0.5 else (0.5 if self.held is not None else 0.0)
        if self.held is not None:
            self.poses[self.held, :3] = self.ee
        return self._obs(), 0.0, False, False, {}


def test_the_first_release_records_where_the_held_cube_was_let_go():
    """A stack attempt that lets the green cube go 1.5 cm beside the red one and 5 cm above it: the record names the
    cube and its offset from the red cube's centre at the release and at the end."""
    from bench.vla_confusion import rollout

    world = _StackWorld()
    plan = [(0.5, -0.1, 0.1, 1.0), (0.5, -0.1, 0.02, 1.0), (0.5, -0.1, 0.02, 0.0), (0.5, -0.1, 0.1, 0.0),
            (0.5, 0.085, 0.1, 0.0), (0.5, 0.085, 0.07, 0.0), (0.5, 0.085, 0.07, 1.0), (0.5, 0.085, 0.15, 1.0)]
    ep = rollout(world, world, _Rows(plan), 0, world.names)
    assert ep["first_grasped"] == "green_cube" and ep["release_cube"] == "green_cube"
    np.testing.assert_allclose(ep["release_offset_m"]["red_cube"], [0.0, -0.015, 0.05], atol=1e-4)
    np.testing.assert_allclose(ep["end_offset_m"]["red_cube"], [0.0, -0.015, 0.05], atol=1e-4)  # nothing fell here
    assert set(ep["release_offset_m"]) == {"red_cube", "blue_cube", "bowl", "target"} and ep["slipped_at"] is None
    # the same carry, but the cube leaves the closed fingers on the way (the world drops it at tick 4)
    world = _StackWorld()
    world.drop_at = 4
    ep = rollout(world, world, _Rows(plan), 0, world.names)
    assert ep["slipped_at"] == 4 and ep["release_cube"] == "green_cube"  # the open command still comes, later
    assert ep["release_offset_m"]["red_cube"][2] < 0.01  # where the dropped cube lies, not over the red one


class _Rows:
    """A policy that returns the plan's rows one per call, then holds the last one."""

    def __init__(self, plan):
        self.rows = [np.array([x, y, z, 0, 0, 0, g], np.float32) for x, y, z, g in plan]
        self.i = 0

    def __call__(self, obs):
        row = self.rows[min(self.i, len(self.rows) - 1)]
        self.i += 1
        return [row]


@pytest.mark.parametrize("path, label", [("runs/base-20261206/model", "base-20261206/model"),
                                         ("runs/base-20261206/model/", "base-20261206/model"),
                                         ("/abs/exp/push_240", "push_240"), ("model", "model"),
                                         ("data/base/b01_base", "b01_base")])
def test_the_plot_title_names_a_run_directory_model_by_its_run(path, label):
    from bench.vla_confusion import checkpoint_label, plot_title

    assert checkpoint_label(path) == label
    assert plot_title({"checkpoint": path, "episodes_per_task": 5}).startswith(f"{label}: 5 unseen")
