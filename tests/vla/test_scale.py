"""Scale-out on Ray (issue 35): ``vla eval --workers N`` and ``vla rl --actors N`` on the fast sim Franka, each
worker / actor with a simulator bridge of its own on leased ports; a local Ray cluster per test.

* two evaluation workers give the same per-episode outcomes (success, length, where the arm ended) as one
  process at the same seeds, in the same order;
* two RL actors both feed the learner's replay buffer, with disjoint training seeds;
* an actor killed at a random moment (``ray.kill``) is dropped and the session goes on: nothing the other actor
  sent is lost, the dead actor's unfinished episode is not counted, the final evaluation passes to the survivor.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time

import numpy as np
import pytest
import yaml

pytest.importorskip("ray")

BASE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "vla", "checkpoints",
                    "base")
SMALL = ["--max-episode-ticks", "16", "--warmup-steps", "2", "--utd", "1", "--batch-size", "8", "--num-critics", "2",
         "--hidden", "32", "--eval-every", "0", "--eval-episodes", "1", "--videos", "0", "--threads", "1"]


@pytest.fixture(scope="module")
def tiny_vla(tmp_path_factory) -> str:
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    return save_tiny_vla(str(tmp_path_factory.mktemp("vla") / "ckpt"), extra={"sim_tasks": ["pick_red_cube"]})


def _ports(site_yaml) -> set[int]:
    raw = yaml.safe_load(open(site_yaml))
    return {int(d[k].rpartition(":")[2]) for d in raw["devices"].values() for k in ("command", "stream") if k in d}


@pytest.mark.e2e  # `vla eval` of the shipped base twice, once on two workers with bridges of their own
def test_eval_workers_give_the_same_episodes_as_one_process(tmp_path):
    """The shipped base VLA (it reacts to what it sees: a one-level pixel change in a frame moves its actions) with
    `vla eval`'s default execution (temporal ensembling: a VLA call per tick). Each worker's episodes follow other
    histories than the one process's (its warm-up, other seeds before), which must not matter."""
    from vla.cli import main

    base = ["eval", "--checkpoint", BASE, "--task", "pick_red_cube", "--episodes", "4", "--videos", "1",
            "--threads", "1", "--seed-start", "100000"]
    assert main([*base, "--out", str(tmp_path / "one")]) == 0
    assert main([*base, "--out", str(tmp_path / "two"), "--workers", "2"]) == 0
    one = [json.loads(x) for x in (tmp_path / "one/episodes.jsonl").read_text().splitlines()]
    two = [json.loads(x) for x in (tmp_path / "two/episodes.jsonl").read_text().splitlines()]
    assert [e["seed"] for e in two] == [e["seed"] for e in one] == list(range(100_000, 100_004))
    for a, b in zip(one, two):  # the same outcome, episode by episode: success, length, where the arm ended
        assert (a["success"], a["ticks"]) == (b["success"], b["ticks"]), (a, b)
        np.testing.assert_allclose(b["final_state"], a["final_state"], atol=1e-5, err_msg=str(a["seed"]))
    assert len({tuple(e["final_state"]) for e in one}) == 4  # the seeds set different scenes: a real comparison
    assert any(e["success"] for e in one)  # a VLA that does the task: its actions follow what it sees
    rep = json.loads((tmp_path / "two/eval.json").read_text())
    assert rep["workers"] == 2 and rep["tasks"] == json.loads((tmp_path / "one/eval.json").read_text())["tasks"]
    assert rep["timing"]["episodes_per_s"] > 0
    assert [p.name for p in (tmp_path / "two/videos").glob("*.mp4")] == ["pick_red_cube_seed100000.mp4"]
    # each worker served its own copy of the site, on ports of its own (not the preset's)
    p0, p1 = (_ports(tmp_path / f"two/workers/worker{i}-site.yaml") for i in (0, 1))
    assert len(p0) == len(p1) == 4 and not p0 & p1 and not (p0 | p1) & {5560, 5561, 5562, 5564}


@pytest.mark.e2e  # two ray actors and their bridges
def test_rl_two_ray_actors_feed_one_replay_buffer_with_disjoint_seeds(tiny_vla, tmp_path):
    from policies.common.replay import ReplayBuffer
    from session.config import RLConfig
    from session.runner import actor_episode, episode_seed
    from vla.cli import main

    def session(attempt: int):
        out = tmp_path / f"run{attempt}"
        assert main(["rl", "--actors", "2", "--checkpoint", tiny_vla, "--task", "pick_red_cube", "--out", str(out),
                     "--total-ticks", "160", *SMALL]) == 0
        return out, json.loads((out / "summary.json").read_text())

    out, s = session(0)
    if any("deadline_exceeded" in (a["lost"] or "") for a in s["actors"]):
        # on a loaded 2-core box an actor's bridge stalled past the arm's 2-s command deadline (CI, once): the learner
        # dropped that actor and went on, as it must, but this test's premise (both actors feed) was never tried.
        print(f"an actor dropped out by itself: {[a['lost'] for a in s['actors']]}; once more")
        out, s = session(1)
    lanes = s["actors"]
    assert [a["slot"] for a in lanes] == [0, 1] and all(a["lost"] is None for a in lanes)
    assert all(a["transitions"] > 0 for a in lanes)  # both actors' transitions are in the replay buffer
    online = ReplayBuffer.load(out / "checkpoint/online.npz")
    assert len(online) == s["steps"] == sum(a["transitions"] for a in lanes) and s["ticks"] >= 160
    state = json.loads((out / "checkpoint/state.json").read_text())
    assert [d["transitions"] for d in state["lanes"]] == [a["transitions"] for a in lanes]
    cfg = RLConfig.from_json(str(out / "rl_config.json"))
    eps = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    seeds = {i: [e["seed"] for e in eps if e["actor"] == i] for i in (0, 1)}
    for i in (0, 1):  # actor i plays session episodes i, i + 2, ...: disjoint seeds
        assert len(seeds[i]) == lanes[i]["episodes"] >= 1
        assert seeds[i] == [episode_seed(cfg, actor_episode(k, i, 2)) for k in range(len(seeds[i]))]
    assert not set(seeds[0]) & set(seeds[1])
    assert s["final_success_rate"] is not None and s["base_success_rate"] is not None and s["vla_weights_unchanged"]
    logs = sorted(p.name for p in (out / "actors").iterdir())
    assert {"actor0.log", "actor1.log", "actor0-bridge.log", "actor1-bridge.log"} <= set(logs)
    assert not _ports(out / "actors/actor0-site.yaml") & _ports(out / "actors/actor1-site.yaml")


@pytest.mark.e2e  # two ray actors, one killed
def test_rl_an_actor_killed_mid_episode_is_dropped_and_the_session_goes_on(tiny_vla, tmp_path):
    """``ray.kill`` of one actor at a random moment once both are acting: the session ends normally, every
    transition the survivor sent is in the replay buffer, the dead actor's finished episodes stay logged and its
    unfinished one is not; the final evaluation is the survivor's when the evaluator (actor 0) was killed."""
    import ray

    from policies.common.replay import ReplayBuffer
    from session.config import RLConfig
    from session.pool import run_pool
    from vla.commands.rl import make_env
    from vla.models import load_vla

    def session(attempt: int):
        seed = random.randrange(1 << 30)
        rnd = random.Random(seed)
        victim, delay = rnd.randrange(2), rnd.uniform(0.0, 2.0)
        print(f"attempt {attempt}: kill actor {victim} {delay:.2f} s after both act (random seed {seed})")
        out = tmp_path / f"run{attempt}"
        cfg = RLConfig.flat(checkpoint=tiny_vla, out=str(out), task="pick_red_cube", total_ticks=192, actors=2,
                            max_episode_ticks=16, warmup_steps=2, utd=1, batch_size=8, num_critics=2, hidden=(32,),
                            eval_every=0, eval_episodes=1, videos=0)
        killed: dict = {}

        def kill_at_random(handles, learner):
            def later():
                deadline = time.monotonic() + 120
                while min(lane.received for lane in learner.lanes) < 1:  # both actors are acting
                    if time.monotonic() > deadline or learner.finished:
                        return
                    time.sleep(0.01)
                time.sleep(delay)
                killed["lane"] = {k: getattr(learner.lanes[victim], k) for k in ("received", "recv_episode")}
                ray.kill(handles[victim])
                killed["at"] = time.monotonic()

            threading.Thread(target=later, daemon=True).start()

        summary = run_pool(cfg, load_vla(tiny_vla), make_env, progress=False, on_start=kill_at_random)
        return summary, killed, victim, out

    summary, killed, victim, out = session(0)
    if "at" not in killed and any(lane["lost"] for lane in summary["actors"]):
        # an actor dropped out by itself before both acted (on a loaded 2-core box a bridge stalled past the
        # arm's 2-s command deadline once): the session went on as it must, but the kill was never tried. Once more.
        print(f"an actor was lost before the kill: {[lane['lost'] for lane in summary['actors']]}")
        summary, killed, victim, out = session(1)
    assert "at" in killed, "the session ended before the kill"
    survivor = 1 - victim
    lanes = summary["actors"]
    assert lanes[victim]["lost"] and lanes[survivor]["lost"] is None, lanes
    mine = summary["actor_summaries"][survivor]
    assert summary["actor_summaries"][victim] is None and mine is not None
    # nothing the survivor sent is lost: its every transition and episode reached the buffer and the logs
    assert lanes[survivor]["transitions"] == mine["steps"] and lanes[survivor]["episodes"] == mine["episodes"]
    eps = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert [e["seed"] for e in eps if e["actor"] == survivor] == mine["seeds"]
    # the dead actor: its finished episodes are logged, its unfinished one is not (its transitions stay)
    dead = [e for e in eps if e["actor"] == victim]
    assert len(dead) == lanes[victim]["episodes"] >= killed["lane"]["recv_episode"]
    assert lanes[victim]["transitions"] >= 2 * len(dead) and lanes[victim]["transitions"] >= killed["lane"]["received"]
    online = ReplayBuffer.load(out / "checkpoint/online.npz")
    assert len(online) == summary["steps"] == lanes[0]["transitions"] + lanes[1]["transitions"]
    assert summary["ticks"] >= 192 and summary["final_success_rate"] is not None  # the survivor evaluated
    assert not {e["seed"] for e in dead} & set(mine["seeds"])
    assert os.path.isfile(out / "learning_curve.png")


def test_scale_flags_that_cannot_apply_are_refused_by_name(tmp_path, capsys, monkeypatch):
    """One clear line naming the flag, before any model loads or any Ray starts."""
    from session.config import RLConfig
    from vla.cli import main

    ev = ["eval", "--checkpoint", str(tmp_path / "none"), "--task", "pick_red_cube"]
    rl = ["rl", "--checkpoint", str(tmp_path / "none"), "--task", "pick_red_cube", "--out", str(tmp_path / "run")]
    RLConfig.flat(checkpoint="x", out=str(tmp_path / "old"), task="pick_red_cube", actors=2).to_json(
        str(tmp_path / "rl_config.json"))
    cases = {
        "--workers must be >= 1": [*ev, "--workers", "0"],
        "--ray-address names the Ray cluster of --workers": [*ev, "--ray-address", "auto"],
        "--serve never: with --workers": [*ev, "--workers", "2", "--serve", "never"],
        "--robot franka-lab is not a simulator": [*ev, "--workers", "2", "--robot", "franka-lab"],
        "--actors starts the actors as Ray actors": [*rl, "--actors", "2", "--role", "learner"],
        "--actors must be >= 0": [*rl, "--actors", "-1"],
        "--ray-address names the Ray cluster of --actors": [*rl, "--ray-address", "auto"],
        "--actor-robots gives each of --actors N its robot": [*rl, "--actor-robots", "a.yaml"],
        "actor_robots names 1 site(s) for 2 actor(s)": [*rl, "--actors", "2", "--actor-robots", "franka-lab"],
        "--robot franka-lab is a real robot": [*rl, "--actors", "2", "--robot", "franka-lab"],
        "--total-episodes is for in-process sessions": [*rl, "--actors", "2", "--total-episodes", "4"],
        "runs with 2 actor(s)": ["rl", "--resume", str(tmp_path), "--actors", "3"],
    }
    for message, argv in cases.items():
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (message, err)
    assert not (tmp_path / "run").exists()
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # Ray not installed
    for argv in ([*ev, "--workers", "2"], [*rl, "--actors", "2"]):
        assert main(argv) == 2
        assert "pip install -e .[scale]" in capsys.readouterr().err


@pytest.mark.slow
def test_rl_actors_resume_continues_each_actors_scenes(tiny_vla, tmp_path):
    """`vla rl --resume RUN` of a session with 2 actors (every process gone, as after a kill of the command): two
    new actors take the lanes where the checkpoint left them; each actor's seeds continue its own sequence (none
    replayed, none skipped) and the replay buffer keeps everything checkpointed."""
    from policies.common.replay import ReplayBuffer
    from session.config import RLConfig
    from session.runner import actor_episode, episode_seed
    from vla.cli import main

    out = tmp_path / "run"
    assert main(["rl", "--actors", "2", "--checkpoint", tiny_vla, "--task", "pick_red_cube", "--out", str(out),
                 "--total-ticks", "64", *SMALL]) == 0
    first = json.loads((out / "summary.json").read_text())
    assert main(["rl", "--resume", str(out), "--total-ticks", "160"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] > first["steps"] and s["ticks"] >= 160
    assert len(ReplayBuffer.load(out / "checkpoint/online.npz")) == s["steps"]
    cfg = RLConfig.from_json(str(out / "rl_config.json"))
    eps = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert [e["episode"] for e in eps] == list(range(len(eps)))
    for i in (0, 1):
        seeds = [e["seed"] for e in eps if e["actor"] == i]
        assert seeds == [episode_seed(cfg, actor_episode(k, i, 2)) for k in range(len(seeds))]
        assert len(seeds) >= first["actors"][i]["episodes"]
    assert len(eps) > first["episodes"]
