"""`vla eval`: episode loop, statistics, and an end-to-end run on the fast sim Franka."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vla.evaluate import EpisodeResult, run_episode, summarize, wilson_interval


@pytest.mark.parametrize("k,n,lo,hi", [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0),
                                        (3, 20, 0.0524, 0.3604)])
def test_wilson_interval_matches_reference_values(k, n, lo, hi):
    a, b = wilson_interval(k, n)
    assert a == pytest.approx(lo, abs=1e-4) and b == pytest.approx(hi, abs=1e-4)


class CountingEnv:
    """Succeeds once ``succeed_at`` ticks have been executed; records every chunk it got (it declares
    chunk actions, as robot_io.RobotEnv does)."""

    chunk_actions = True

    def __init__(self, succeed_at: int | None) -> None:
        self.succeed_at, self.ticks, self.chunks = succeed_at, 0, []

    def _obs(self):
        return {"images": {"front": np.zeros((8, 8, 3), np.uint8)}, "state": np.zeros(8, np.float32),
                "instruction": "x"}

    def reset(self, seed=None):
        self.ticks, self.seed = 0, seed
        return self._obs(), {}

    def step(self, chunk):
        self.chunks.append(len(chunk))
        self.ticks += len(chunk)
        ok = self.succeed_at is not None and self.ticks >= self.succeed_at
        return self._obs(), float(ok), ok, False, {"success": ok}


def test_run_episode_stops_at_success_and_respects_the_tick_budget():
    policy = lambda obs: np.zeros((4, 7), np.float32)  # noqa: E731
    env = CountingEnv(succeed_at=9)
    r = run_episode(env, policy, seed=7, max_ticks=30)
    assert r.success and r.ticks == 12 and env.chunks == [4, 4, 4] and env.seed == 7
    env = CountingEnv(succeed_at=None)
    frames: list = []
    r = run_episode(env, policy, seed=0, max_ticks=10, frames=frames)
    assert not r.success and r.ticks == 10 and env.chunks == [4, 4, 2]  # the last chunk is cut to the budget
    assert len(frames) == 1 + 10  # one per tick: an env without a tick hook holds each chunk's last frame


class HookedEnv(CountingEnv):
    """A chunk-stepping env with RobotEnv's ``tick_callback`` hook; image value = tick."""

    tick_callback = None

    def _obs(self):
        o = super()._obs()
        o["images"]["front"] = np.full((8, 8, 3), self.ticks, np.uint8)
        return o

    def step(self, chunk):
        for _ in range(len(chunk) - 1):
            self.ticks += 1
            if self.tick_callback is not None:
                self.tick_callback(self._obs())
        self.ticks -= len(chunk) - 1
        return super().step(chunk)


def test_run_episode_records_a_frame_per_tick_through_the_env_hook():
    policy = lambda obs: np.zeros((4, 7), np.float32)  # noqa: E731
    env, frames = HookedEnv(succeed_at=None), []
    r = run_episode(env, policy, seed=0, max_ticks=10, frames=frames)
    assert r.ticks == 10 and env.chunks == [4, 4, 2] and env.tick_callback is None  # the hook is removed
    assert len(frames) == 11
    # frame k shows tick k (the image value; the corner holds the tick label)
    assert [int(f[0, 0, 0]) for f in frames] == list(range(11))


def test_run_episode_steps_a_single_action_env_row_by_row():
    from tests.vla.eval_toy_env import make_env

    env, frames = make_env(max_episode_steps=6), []
    r = run_episode(env, lambda obs: np.zeros((4, 2), np.float32), seed=0, max_ticks=50, frames=frames, task="reach")
    assert r.task == "reach" and r.ticks == 6 and not r.success and env.ticks == 6  # truncated by the env
    assert len(frames) == 7


def _frames_in(path) -> int:
    import av

    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


def test_vla_eval_on_a_user_env(tmp_path, capsys):
    """``vla eval --env``: a tiny compact VLA whose camera / state / action match the toy env, 2 episodes."""
    import torch

    from vla.cli import main
    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(0)
    m = CompactVLA(CompactVLAConfig(cameras=("front",), image_size=16, state_dim=4, action_dim=2, horizon=4,
                                    hidden=32, cond_dim=32, keypoints=4, pretrained=False))
    m.set_normalization(np.zeros(4), np.ones(4), -np.full(2, 0.2), np.full(2, 0.2))
    m.save(str(tmp_path / "ckpt"))
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    cfg["execution"] = {"gripper": "binary"}  # an --env defines its own actions: auto leaves them raw
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "eval"
    rc = main(["eval", "--checkpoint", str(tmp_path / "ckpt"), "--env", "tests.vla.eval_toy_env:make_env",
               "--episodes", "2", "--videos", "2", "--exec-steps", "3", "--out", str(out), "--threads", "1"])
    assert rc == 0
    rep = json.loads((out / "eval.json").read_text())
    assert rep["env"] == "tests.vla.eval_toy_env:make_env" and rep["exec_steps"] == 3 and rep["gripper"] == "raw"
    t = rep["tasks"]["make_env"]
    assert t["episodes"] == 2 and 0 <= t["successes"] <= 2
    eps = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert [e["seed"] for e in eps] == [100_000, 100_001] and all(1 <= e["ticks"] <= 12 for e in eps)
    for e in eps:  # one frame per executed tick (+ the first observation), at the control rate
        assert _frames_in(out / "videos" / f"make_env_seed{e['seed']}.mp4") == e["ticks"] + 1
    out_te = tmp_path / "eval_te"  # the default: ACT-style temporal ensembling, one row per tick
    assert main(["eval", "--checkpoint", str(tmp_path / "ckpt"), "--env", "tests.vla.eval_toy_env:make_env",
                 "--episodes", "1", "--videos", "0", "--out", str(out_te), "--threads", "1"]) == 0
    rep = json.loads((out_te / "eval.json").read_text())
    assert rep["exec_steps"] == 1 and rep["temporal_ensemble"] == 0.01
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "ckpt"), "--env", "tests.vla.eval_toy_env:make_env",
                 "--temporal-ensemble", "0.01", "--exec-steps", "2", "--out", str(out_te)]) != 0
    assert "drop --exec-steps" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path / "ckpt"), "--env", "tests.vla.eval_toy_env"]) != 0
    assert "--env must look like package.module:make_env" in capsys.readouterr().err


def test_summarize_counts_per_task():
    rs = [EpisodeResult("a", i, i < 3, 10 + i, 0.1) for i in range(10)] + [EpisodeResult("b", 0, False, 5, 0.1)]
    s = summarize(rs)
    assert s["a"]["successes"] == 3 and s["a"]["episodes"] == 10 and s["a"]["success_rate"] == 0.3
    assert s["a"]["mean_ticks_success"] == 11.0 and s["b"]["mean_ticks_success"] is None
    assert s["a"]["ci95"] == pytest.approx(list(wilson_interval(3, 10)))


@pytest.mark.e2e  # `vla eval` on the sim bridge
def test_vla_eval_end_to_end_on_the_sim(tmp_path):
    """A random (untrained) compact VLA, 2 episodes: the report, the plot and a video are written."""
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla
    from vla.cli import main

    save_tiny_vla(str(tmp_path / "ckpt"), extra={"sim_tasks": ["pick_red_cube"], "execution": {"gripper": "binary"}})
    out = tmp_path / "eval"
    rc = main(["eval", "--checkpoint", str(tmp_path / "ckpt"), "--episodes", "2", "--videos", "1",
               "--out", str(out), "--threads", "1"])
    assert rc == 0
    rep = json.loads((out / "eval.json").read_text())
    assert rep["gripper"] == "binary"  # --gripper auto: what the checkpoint's config.json names
    t = rep["tasks"]["pick_red_cube"]
    assert t["episodes"] == 2 and 0 <= t["successes"] <= 2 and rep["seed_start"] == 100_000
    eps = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert [e["seed"] for e in eps] == [100_000, 100_001]
    assert all(e["ticks"] <= 100 for e in eps)
    assert (out / "success.png").stat().st_size > 5_000

    vids = list((out / "videos").glob("*.mp4"))
    assert len(vids) == 1
    assert _frames_in(vids[0]) == eps[0]["ticks"] + 1  # every executed control tick (RobotEnv's tick hook)


def test_vla_eval_token_holds_a_behaviour_token(tmp_path, capsys):
    """``vla eval --token K``: every chunk is sampled under token K (what one ExToken mode does on its own); a token
    the checkpoint does not have is refused by name."""
    import torch

    from vla.cli import main
    from vla.envs import VLAPolicy
    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(0)
    m = CompactVLA(CompactVLAConfig(cameras=("front",), image_size=16, state_dim=4, action_dim=2, horizon=4,
                                    hidden=32, cond_dim=32, keypoints=4, pretrained=False, num_tokens=2))
    m.set_normalization(np.zeros(4), np.ones(4), -np.full(2, 0.2), np.full(2, 0.2))
    m.eval()
    with torch.no_grad():
        m.head.token_emb.weight[2] += 5.0  # token 2 moves the chunk
    obs = {"images": {"front": np.zeros((16, 16, 3), np.uint8)}, "state": np.zeros(4, np.float32), "instruction": "x"}
    noise = np.zeros((4, 2), np.float32)
    a1, a2 = VLAPolicy(m, token=1)(obs, noise=noise), VLAPolicy(m, token=2)(obs, noise=noise)
    assert not np.allclose(a1, a2)
    assert np.allclose(VLAPolicy(m, token=2)(obs, noise=noise, token=1), a1)  # a call's own token wins
    m.save(str(tmp_path / "ckpt"))
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(tmp_path / "ckpt"), "--env", "tests.vla.eval_toy_env:make_env",
                 "--episodes", "1", "--videos", "0", "--exec-steps", "4", "--token", "2", "--out", str(out),
                 "--threads", "1"]) == 0
    assert json.loads((out / "eval.json").read_text())["token"] == 2
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "ckpt"), "--env", "tests.vla.eval_toy_env:make_env",
                 "--token", "3", "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "--token 3" in err and "tokens 0..2" in err


def _tiny_vla(tokens: int = 0):
    import torch

    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(0)
    m = CompactVLA(CompactVLAConfig(cameras=("front",), image_size=16, state_dim=4, action_dim=2, horizon=4,
                                    hidden=32, cond_dim=32, keypoints=4, pretrained=False, num_tokens=tokens))
    m.set_normalization(np.zeros(4), np.ones(4), -np.full(2, 0.2), np.full(2, 0.2))
    return m.eval()


def test_a_chunk_can_be_the_mean_of_several_noise_draws_or_come_from_zero_noise():
    """``VLAPolicy(draws=N)``: each chunk is the mean of N seeded draws' chunks (draw 0 the one-draw policy's
    episode noise), reproducible per episode; ``zero_noise``: the chunk the sampler gives from 0."""
    import torch

    from vla.envs import VLAPolicy, episode_noise

    m = _tiny_vla()
    obs = {"images": {"front": np.full((16, 16, 3), 90, np.uint8)}, "state": np.ones(4, np.float32),
           "instruction": "x"}
    batch = VLAPolicy.batch(obs)
    g = torch.Generator().manual_seed(7 * 1000 + 1)  # episode 7, chunk 1
    draws = torch.cat([torch.randn(1, *m.noise_shape, generator=g) for _ in range(3)])
    assert torch.equal(draws[:1], episode_noise(m.noise_shape, 7, 1))
    with torch.no_grad():
        want = torch.stack([m.sample_actions(batch, noise=draws[j:j + 1])[0] for j in range(3)]).mean(0).numpy()
    pol = VLAPolicy(m, draws=3)
    pol.reset(7)
    pol(obs)  # chunk 0
    np.testing.assert_allclose(pol(obs), want, atol=1e-5)
    pol.reset(7)
    first = pol(obs)
    pol.reset(7)
    np.testing.assert_allclose(pol(obs), first)  # the same episode seed gives the same chunks
    one = VLAPolicy(m)
    one.reset(7)
    assert not np.allclose(one(obs), first, atol=1e-4)  # a mean of 3 is not the first draw alone
    with torch.no_grad():
        zero = m.sample_actions(batch, noise=torch.zeros(1, *m.noise_shape))[0].numpy()
    np.testing.assert_allclose(VLAPolicy(m, zero_noise=True)(obs), zero, atol=1e-6)
    for bad in ({"draws": 0}, {"draws": 2.5}, {"draws": True}, {"draws": 2, "zero_noise": True}):
        with pytest.raises(ValueError, match="draws"):
            VLAPolicy(m, **bad)


@pytest.mark.parametrize("spec,want", [("sample", (1, False)), ("zero", (1, True)), ("mean:8", (8, False)),
                                       (" mean:1 ", (1, False))])
def test_the_noise_option_names_one_draw_zero_or_a_mean_of_draws(spec, want):
    from vla.envs import noise_option

    got = noise_option(spec)
    assert (got["draws"], got["zero_noise"]) == want


@pytest.mark.parametrize("bad", ["", "zeros", "mean", "mean:0", "mean:-2", "mean:2.5", "mean:x", "8"])
def test_a_bad_noise_option_is_refused_by_name(bad):
    from vla.envs import noise_option

    with pytest.raises(ValueError, match="--noise"):
        noise_option(bad)
