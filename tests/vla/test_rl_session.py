"""`vla rl` sessions on the fast sim Franka: frozen VLA, operator interventions, kill + exact resume; the cnn
encoder's session on a stub VLA and camera env."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

pytest.importorskip("lerobot")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--max-episode-ticks", "16", "--warmup-steps", "2", "--utd", "1", "--batch-size", "8",
         "--eval-every", "0", "--eval-episodes", "1", "--threads", "1"]


@pytest.fixture(scope="module")
def tiny_vla(tmp_path_factory) -> str:
    from tests.conftest import save_tiny_vla

    return save_tiny_vla(str(tmp_path_factory.mktemp("vla") / "ckpt"))


def test_session_keeps_the_vla_frozen_and_records_interventions(tiny_vla, tmp_path):
    from robot_io.bridge_process import running_bridge
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from vla.envs import task_env
    from vla.models import load_vla
    from session.runner import run_session
    from session.config import RLConfig

    vla = load_vla(tiny_vla)
    before = {k: v.clone() for k, v in vla.state_dict().items()}
    takeovers = []

    def operator(obs, ctx):  # a scripted operator: takes over on the second macro-step of every episode
        if ctx["step_in_episode"] == 1:
            takeovers.append(ctx["episode"])
            return np.tile(np.array([0.0, 0.0, 0.01, 0, 0, 0, 1.0], np.float32), (8, 1))
        return None

    cfg = RLConfig.flat(checkpoint=tiny_vla, out=str(tmp_path / "run"), task="pick_red_cube", total_ticks=48,
                        max_episode_ticks=16, warmup_steps=2, utd=1, batch_size=8, num_critics=2, hidden=(32,),
                        eval_every=0, eval_episodes=1, videos=0)
    site = load_site("sim-franka-fast")
    with running_bridge(site, str(tmp_path / "bridge.log")):
        client = RobotClient(site)
        try:
            summary = run_session(cfg, task_env(client, "pick_red_cube"), vla, operator=operator, progress=False)
        finally:
            client.close()
    assert summary["ticks"] == 48 and summary["episodes"] == 3 and summary["gripper"] == "raw"
    # the frozen VLA: bit-identical weights (checked tensor by tensor, besides the session's own hash)
    after = vla.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert summary["vla_weights_unchanged"]
    # every takeover is flagged and lands in the demo buffer too
    from policies.common.replay import ReplayBuffer

    online = ReplayBuffer.load(tmp_path / "run/checkpoint/online.npz")
    demo = ReplayBuffer.load(tmp_path / "run/checkpoint/demo.npz")
    assert len(takeovers) == 3 and len(demo) == 3 and demo.extras["intervention"][:3].all()
    flags = online.extras["intervention"][: len(online)]
    assert flags.sum() == 3 and list(np.flatnonzero(flags)) == [1, 3, 5]  # 2 macro-steps per episode
    np.testing.assert_allclose(demo.extras["chunk"][0], online.extras["chunk"][1])
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    assert [e["interventions"] for e in eps] == [1, 1, 1]


class _StubVLA(torch.nn.Module):
    """A frozen 'VLA' without a trunk: embedding = a projection of the state, chunk = tanh(noise + bias)."""

    noise_shape = action_shape = (4, 7)

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.full((4, 7), -0.5))
        self.proj = torch.nn.Parameter(torch.linspace(-1, 1, 48).reshape(8, 6))
        self.cfg = type("C", (), {"cond_dim": 6})()

    def embed(self, batch):
        return torch.as_tensor(batch["state"]) @ self.proj

    def sample_actions_from_embedding(self, emb, noise=None, normalized=False):
        x = torch.tanh(noise + self.bias)
        return x if normalized else self.unnormalize_actions(x)

    def unnormalize_actions(self, x):
        return x * 0.02

    def normalize_actions(self, x):
        return x / 0.02


class _CameraEnv:
    """Two 96 x 96 cameras whose frames and state come from the seed and the step; rewarded when the
    chunk's mean is positive; 8 ticks per episode. It steps whole chunks (and says so)."""

    max_ticks = 8
    chunk_actions = True

    def __init__(self) -> None:
        from gymnasium import spaces

        self.observation_space = spaces.Dict({
            "images": spaces.Dict({c: spaces.Box(0, 255, (96, 96, 3), np.uint8) for c in ("front", "wrist")}),
            "state": spaces.Box(-np.inf, np.inf, (8,), np.float32)})

    def _obs(self):
        rng = np.random.default_rng([self.seed, self.t])
        return {"images": {c: rng.integers(0, 256, (96, 96, 3), dtype=np.uint8) for c in ("front", "wrist")},
                "state": rng.normal(size=8).astype(np.float32), "instruction": "pick"}

    def reset(self, seed=None):
        self.seed, self.t = seed, 0
        return self._obs(), {}

    def step(self, chunk):
        self.t += len(chunk)
        r = float(np.mean(chunk) > 0)
        return self._obs(), r, r > 0, False, {"success": r > 0}


def test_cnn_encoder_session_stores_frames_and_resumes_exactly(tmp_path):
    """`vla rl --encoder cnn` at the Session level (a stub VLA and a camera env, no simulator): the
    replay holds each camera at 64 x 64 uint8 + the state (+ the VLA embedding, NA), the agent
    learns, and save / load continues with identical transitions and updates."""
    from vla.models.encoders import resize_uint8
    from session.runner import Session, start_run
    from session.config import RLConfig

    torch.set_num_threads(1)
    cfg = RLConfig.flat(checkpoint="stub", out=str(tmp_path / "run"), task="pick_red_cube", encoder="cnn", total_ticks=64,
                        warmup_steps=1, utd=1, batch_size=4, num_critics=2, hidden=(16,), distill_steps=1, eval_every=0)
    start_run(cfg, resume=False)
    sess = Session(cfg, _CameraEnv(), _StubVLA(), progress=False)
    n = sess.agent.parameter_counts()
    assert 0 < n["encoder"] < n["total"] < 1_000_000
    frame = ((64, 64, 3), np.dtype(np.uint8))
    assert sess.online.obs_spec == {"front": frame, "wrist": frame, "state": ((8,), np.dtype(np.float32)),
                                    "feat": ((6,), np.dtype(np.float32))}
    for ep in range(2):
        r = sess.run_episode(ep)
        sess.episode += 1
    assert r["losses"] and len(sess.online) == 4  # 2 episodes x 2 macro-steps of 4 ticks
    o0, _ = _CameraEnv().reset(0)
    small = resize_uint8(torch.from_numpy(o0["images"]["front"])[None], 64)[0]
    np.testing.assert_array_equal(sess.online.obs["front"][0], small)
    np.testing.assert_array_equal(sess.online.obs["state"][0], o0["state"])
    np.testing.assert_array_equal(sess.online.next_obs["wrist"][0], sess.online.obs["wrist"][1])  # s'0 = s1
    sess.save()
    back = Session(cfg, _CameraEnv(), _StubVLA(), progress=False)
    back.load()
    ra, rb = sess.run_episode(2), back.run_episode(2)
    assert ra["losses"] == rb["losses"] and ra["return"] == rb["return"]
    for k in sess.online.obs_spec:
        np.testing.assert_array_equal(sess.online.obs[k][:6], back.online.obs[k][:6])
    np.testing.assert_array_equal(sess.online.action[:6], back.online.action[:6])


@pytest.mark.e2e  # a `vla rl` process killed and resumed
def test_kill_and_resume_continues_from_the_same_step_and_replay(tiny_vla, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "vla.cli", "rl", "--checkpoint", tiny_vla, "--task", "pick_red_cube", "--out", str(out),
           "--total-ticks", "96", *SMALL]
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    state = out / "checkpoint" / "state.json"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            try:
                episode = json.loads(state.read_text())["episode"]
            except FileNotFoundError:  # none yet, or save() is swapping the checkpoint directory in
                episode = -1
            if episode >= 2:
                break
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the session and its bridge, no cleanup
    finally:
        proc.wait(timeout=30)
    saved = tmp_path / "saved"
    shutil.copytree(out / "checkpoint", saved)
    s = json.loads((saved / "state.json").read_text())
    assert 2 <= s["episode"] < 6 and s["step"] == 2 * s["episode"]

    from policies.common.replay import ReplayBuffer
    r = subprocess.run([sys.executable, "-m", "vla.cli", "rl", "--resume", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed {out} at episode {s['episode']}, step {s['step']}" in r.stdout
    before = ReplayBuffer.load(saved / "online.npz")
    after = ReplayBuffer.load(out / "checkpoint/online.npz")
    n = s["step"]
    assert len(before) == n and len(after) == 12  # 96 ticks / 8 per macro-step
    np.testing.assert_array_equal(after.obs["feat"][:n], before.obs["feat"][:n])
    np.testing.assert_array_equal(after.action[:n], before.action[:n])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ticks"] == 96 and summary["vla_weights_unchanged"]
    eps = [json.loads(x) for x in open(out / "episodes.jsonl")]
    assert [e["episode"] for e in eps] == list(range(6))  # no episode logged twice


def test_demos_enter_the_na_demo_buffer_as_macro_steps_with_their_outcome(tiny_vla, tiny_dataset, tmp_path):
    """`vla rl --demos`: episodes of the session's instruction become 8-tick macro-steps (reward 1
    and done on a successful episode's last one), chunks normalised like the VLA's actions; the
    others are skipped; they survive a checkpoint; NA learns from them; other variants refuse."""
    from vla.models import load_vla
    from session.runner import Session
    from session.config import RLConfig

    data = tmp_path / "demos"
    shutil.copytree(tiny_dataset, data)  # 4 episodes x 12 frames; 0 and 2 say "pick up the red cube"
    with open(data / "meta/vla_episodes.jsonl", "w") as f:
        for ep, ok in [(0, True), (1, True), (2, False), (3, False)]:
            f.write(json.dumps({"episode_index": ep, "success": ok}) + "\n")
    cfg = RLConfig.flat(checkpoint=tiny_vla, out=str(tmp_path / "run"), task="pick_red_cube", demos=(str(data),),
                        warmup_steps=0, utd=1, batch_size=8, num_critics=2, hidden=(32,), distill_steps=1, total_ticks=64)
    os.makedirs(cfg.out)
    vla = load_vla(tiny_vla)
    sess = Session(cfg, None, vla, progress=False)
    report = sess.add_demos()
    assert report["episodes"] == 2 and report["successes"] == 1 and report["skipped_other_instruction"] == 2
    d = sess.demo
    assert len(d) == report["transitions"] == 4  # ceil(12 / 8) = 2 macro-steps per episode
    assert json.load(open(tmp_path / "run/demos.json"))["transitions"] == 4
    np.testing.assert_array_equal(d.reward[:4], [0, 1, 0, 0])
    np.testing.assert_array_equal(d.done[:4], [False, True, False, False])
    assert d.extras["intervention"][:4].all() and not d.action[:4].any()
    # episode 0's second macro-step: ticks 8..11, padded with tick 11's action, in the VLA's [-1, 1] units
    ticks = np.array([8, 9, 10, 11, 11, 11, 11, 11])
    want = np.stack([[0.01, 0.0, -0.01 + 0.001 * i, 0, 0, 0.02, float(i > 6)] for i in ticks]).astype(np.float32)
    np.testing.assert_allclose(d.extras["chunk"][1], np.clip(want / 0.02, -1, 1), atol=1e-5)
    # frame 8 is the first macro-step's next_obs and the second one's obs; frame 11 ends the episode
    np.testing.assert_array_equal(d.next_obs["feat"][0], d.obs["feat"][1])
    assert not np.array_equal(d.obs["feat"][1], d.next_obs["feat"][1])
    # NA learns from them (RLPD: half of each batch from the demo buffer)
    for i in range(2):
        sess.online.add(obs={"feat": d.obs["feat"][i]}, action=np.zeros(sess.agent.noise_dim, np.float32),
                        reward=0.0, next_obs={"feat": d.next_obs["feat"][i]}, done=False,
                        chunk=d.extras["chunk"][i], intervention=False)
    losses = sess.agent.update(sess.online, sess.demo, sess.rng)
    assert np.isfinite(losses["losses/qa_loss"])
    # a checkpoint holds them: a resumed session does not load them again
    sess.save()
    again = Session(cfg, None, vla, progress=False)
    again.load()
    assert len(again.demo) == 4
    np.testing.assert_array_equal(again.demo.extras["chunk"][:4], d.extras["chunk"][:4])
    with pytest.raises(ValueError, match="demos"):
        RLConfig.flat(checkpoint=tiny_vla, out="x", task="pick_red_cube", variant="sac", demos=(str(data),))
    missing = tmp_path / "no_outcomes"
    shutil.copytree(tiny_dataset, missing)
    with pytest.raises(ValueError, match="vla_episodes.jsonl"):
        Session(RLConfig(**{**cfg.__dict__, "demos": (str(missing),), "out": str(tmp_path / "run2")}), None, vla,
                progress=False).add_demos()


def test_residual_demos_are_continuous_macro_steps_so_n_step_returns_run_through_them(tiny_vla, tiny_dataset, tmp_path):
    """Residual RL's view of a demo frame holds a *sampled* base chunk: a macro-step's next_obs must be the next
    one's obs (the same draw), as in a session, or n-step returns would stop after one step on every demo."""
    from vla.models import load_vla
    from session.runner import Session
    from session.config import RLConfig

    data = tmp_path / "demos"
    shutil.copytree(tiny_dataset, data)
    with open(data / "meta/vla_episodes.jsonl", "w") as f:
        for ep, ok in [(0, True), (1, True), (2, False), (3, False)]:
            f.write(json.dumps({"episode_index": ep, "success": ok}) + "\n")
    cfg = RLConfig.flat(checkpoint=tiny_vla, out=str(tmp_path / "run"), method="residual", task="pick_red_cube",
                        demos=(str(data),), exec_steps=4, n_step=3, gamma=0.5, warmup_steps=0, utd=1, batch_size=8,
                        num_critics=2, hidden=(32,), total_ticks=64)
    os.makedirs(cfg.out)
    sess = Session(cfg, None, load_vla(tiny_vla), progress=False)
    assert sess.add_demos()["transitions"] == 6  # 2 episodes x ceil(12 / 4)
    d = sess.demo
    for i in (0, 1, 3, 4):  # within an episode: the same arrays, the base chunk's draw included
        np.testing.assert_array_equal(d.next_obs["base"][i], d.obs["base"][i + 1])
    assert d.continues(np.arange(6)).tolist() == [True, True, False, True, True, False]
    ret, last, disc = d.n_step_returns(np.array([0, 3]), 3, 0.5)
    np.testing.assert_allclose(ret, [0.25, 0.0])  # episode 0 succeeds on its third macro-step
    assert last.tolist() == [2, 5] and disc.tolist() == [0.125, 0.125]


@pytest.mark.parametrize("eval_policy", ["sample", "mean"])
def test_evaluation_noise_is_seeded_per_episode_and_the_first_policy_is_near_the_base_vla(tmp_path, eval_policy):
    """``eval_policy`` sample: an evaluation draws the agent's noise from a generator seeded by the
    episode (repeatable, training RNG untouched), and the untrained agent (init_log_std 0) draws it
    as widely as the base VLA's N(0, I); ``mean`` gives the policy's mean, ~0 before any update."""
    from session.runner import Session
    from session.config import RLConfig

    torch.set_num_threads(1)
    cfg = RLConfig.flat(checkpoint="stub", out=str(tmp_path / "run"), task="pick_red_cube", total_ticks=64, warmup_steps=0,
                        utd=1, batch_size=4, num_critics=2, hidden=(16,), distill_steps=1, eval_policy=eval_policy)
    sess = Session(cfg, _CameraEnv(), _StubVLA(), progress=False)
    ws: list[torch.Tensor] = []
    chunk = sess.agent.chunk
    sess.agent.chunk = lambda feat, w, normalized=False, **kw: (ws.append(w.clone()), chunk(feat, w, normalized, **kw))[1]
    before = sess.agent.sac.generator.get_state()
    first = sess.evaluate(4, 100)
    w1 = torch.cat(ws)
    ws.clear()
    again = sess.evaluate(4, 100)
    torch.testing.assert_close(torch.cat(ws), w1)
    assert again["successes"] == first["successes"]
    assert torch.equal(sess.agent.sac.generator.get_state(), before)
    if eval_policy == "sample":
        assert 0.7 < float(w1.std()) < 1.2  # b tanh(N(0, 1)), b = 1.5: std ~0.94, like the base VLA's noise
    else:
        assert float(w1.abs().max()) < 0.1


def test_base_evaluation_is_reused_only_for_the_same_vla_and_evaluation_seeds(tmp_path, capsys):
    """RUN/base_eval.json records what it evaluated; a new session reuses it only when the VLA's
    weights, the evaluation episodes and seeds match (`bench/dsrl.py` copies it between sessions of a
    task); a resumed run also takes a file from before those fields existed."""
    from session.runner import Session, read_base_eval, write_base_eval
    from session.config import RLConfig

    cfg = RLConfig.flat(checkpoint="stub", out=str(tmp_path / "run"), task="pick_red_cube", total_ticks=64,
                        num_critics=2, hidden=(16,), eval_episodes=4)
    os.makedirs(cfg.out)
    sess = Session(cfg, _CameraEnv(), _StubVLA(), progress=False)
    assert read_base_eval(sess, resume=False) is None
    written = write_base_eval(sess, {"episodes": 4, "successes": 1, "success_rate": 0.25, "frames": []})
    assert read_base_eval(sess, resume=False) == written and written["vla_sha256"] == sess.digest_before
    other = _StubVLA()
    with torch.no_grad():
        other.bias += 0.1
    assert read_base_eval(Session(cfg, _CameraEnv(), other, progress=False), resume=False) is None
    assert "vla_sha256" in capsys.readouterr().out
    more = RLConfig(**{**cfg.__dict__, "eval_episodes": 8})
    assert read_base_eval(Session(more, _CameraEnv(), _StubVLA(), progress=False), resume=False) is None
    legacy = {"episodes": 4, "successes": 1, "success_rate": 0.25}
    with open(os.path.join(cfg.out, "base_eval.json"), "w") as f:
        json.dump(legacy, f)
    assert read_base_eval(sess, resume=False) is None and read_base_eval(sess, resume=True) == legacy


def test_an_operator_stop_at_reset_checkpoints_the_finished_episodes_and_resume_continues(tmp_path):
    """On a real robot the operator's reset prompt raises OperatorStop ('q') or OperatorTimeout (no
    answer) in env.reset, before the episode moves anything: run_session saves the episodes done so
    far (even between checkpoints) and re-raises; `--resume` continues from there."""
    from vla.operator_reset import OperatorTimeout
    from session.runner import run_session
    from session.config import RLConfig

    class _StopsAtReset(_CameraEnv):
        def __init__(self, stop_at: int | None) -> None:
            super().__init__()
            self.resets, self.stop_at = 0, stop_at

        def reset(self, seed=None):
            if self.resets == self.stop_at:
                raise OperatorTimeout("nobody answered the reset prompt")
            self.resets += 1
            return super().reset(seed)

    torch.set_num_threads(1)
    # checkpoint_every 5: without the save on OperatorStop the 3 finished episodes would be lost
    cfg = RLConfig.flat(checkpoint="stub", out=str(tmp_path / "run"), task="pick_red_cube", total_ticks=48, warmup_steps=1,
                        utd=1, batch_size=4, num_critics=2, hidden=(16,), distill_steps=1, eval_every=0, eval_episodes=1,
                        checkpoint_every=5, videos=0)
    # the base evaluation resets once (1 episode), then training episodes 0, 1, 2; the 5th reset stops
    with pytest.raises(OperatorTimeout):
        run_session(cfg, _StopsAtReset(stop_at=4), _StubVLA(), progress=False)
    state = json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())
    assert state["episode"] == 3 and state["step"] == 6
    summary = run_session(cfg, _StopsAtReset(stop_at=None), _StubVLA(), resume=True, progress=False)
    assert summary["ticks"] == 48 and summary["episodes"] == 6
    eps = [json.loads(x) for x in open(tmp_path / "run" / "episodes.jsonl")]
    assert [e["episode"] for e in eps] == list(range(6))


@pytest.mark.e2e  # a session on the sim bridge
def test_oracle_encoder_session_stores_the_simulators_object_poses(tiny_vla, tmp_path):
    """`vla rl --encoder oracle` on the fast sim: every stored observation carries the privileged vector
    (object offsets from the gripper, orientations, gripper pose), and it changes as the arm moves."""
    from policies.common.replay import ReplayBuffer

    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "vla.cli", "rl", "--checkpoint", tiny_vla, "--task", "pick_red_cube",
                        "--out", str(out), "--total-ticks", "32", "--variant", "sac", "--encoder", "oracle", *SMALL],
                       cwd=ROOT, env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    buf = ReplayBuffer.load(out / "checkpoint/online.npz")
    priv = buf.obs["privileged"][: len(buf)]
    assert len(buf) == 4 and (priv.shape[1] - 4) % 7 == 0 and priv.shape[1] > 4
    n = (priv.shape[1] - 4) // 7
    assert np.all(np.abs(priv[:, : 3 * n]) < 1.5)  # object offsets from the gripper, metres, inside the cell
    assert np.abs(np.diff(priv[:, -4:-1], axis=0)).max() > 1e-4  # the gripper moved between macro-steps
    assert json.loads((out / "summary.json").read_text())["vla_weights_unchanged"]


def test_a_residual_on_the_noise_free_chunk_is_compared_with_the_noise_free_base(tmp_path):
    """`--base-noise zero`: the residual corrects the deterministic chunk, so the session's base evaluation runs the
    VLA without noise too, and says so in base_eval.json; a base evaluation with sampled noise is not reused."""
    from session.runner import Session, read_base_eval, write_base_eval
    from session.config import RLConfig

    class _NoiseLog(_StubVLA):
        def __init__(self):
            super().__init__()
            self.noises = []

        def sample_actions_from_embedding(self, emb, noise=None, normalized=False):
            self.noises.append(noise.clone())
            return super().sample_actions_from_embedding(emb, noise, normalized)

    def session(base_noise, out):
        cfg = RLConfig.flat(checkpoint="stub", out=str(tmp_path / out), task="pick_red_cube", method="residual",
                            base_noise=base_noise, total_ticks=64, num_critics=2, hidden=(16,), eval_episodes=2)
        os.makedirs(cfg.out, exist_ok=True)
        return Session(cfg, _CameraEnv(), _NoiseLog(), progress=False)

    zero, sampled = session("zero", "run"), session("sample", "run")
    res = zero.evaluate(2, 100, base=True)
    assert res["episodes"] == 2 and zero.vla.noises and all(not n.any() for n in zero.vla.noises)
    sampled.evaluate(2, 100, base=True)
    assert all(n.abs().sum() > 0 for n in sampled.vla.noises)
    assert write_base_eval(zero, res)["base_noise"] == "zero"
    assert read_base_eval(zero, resume=False) is not None
    assert read_base_eval(sampled, resume=False) is None  # the other base: evaluated again
