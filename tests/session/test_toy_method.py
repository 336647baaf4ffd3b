"""A new RL method needs only a registry line (issue 14, acceptance 1), and `vla rl --env` runs any
gymnasium env with the observation layout of DESIGN.md (acceptance 4): the toy method of
``toy_method.py`` runs an in-process session and an actor / learner session over loopback ZMQ on
the toy env of ``toy_env.py``, with no edit to ``session/``, the protocol or the CLI."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import policies
from session.config import RLConfig
from tests.session.toy_env import INSTRUCTION, make_env
from tests.session.toy_method import ToyAgent, ToyConfig

ROOT = Path(__file__).resolve().parents[2]
TOY = ("tests.session.toy_method:ToyAgent", "tests.session.toy_method:ToyConfig")


class StubVLA(torch.nn.Module):
    """A frozen 'VLA' for the toy env: embedding = a projection of the state and the image's mean
    colour; chunk = tanh(noise + the first two embedding columns) (normalised = robot units)."""

    noise_shape = action_shape = (4, 2)
    embed_dim = 6

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Parameter(torch.linspace(-1, 1, 18).reshape(3, 6))

    def embed(self, batch):
        state = torch.as_tensor(np.asarray(batch["state"]), dtype=torch.float32)
        img = torch.as_tensor(np.asarray(batch["images"]["front"]), dtype=torch.float32).mean(dim=(1, 2, 3)) / 255
        return torch.cat([state, img[:, None]], dim=1) @ self.proj

    def sample_actions_from_embedding(self, emb, noise=None, token=None, num_steps=None, normalized=False):
        if noise is None:
            noise = torch.zeros(len(emb), *self.noise_shape)
        return torch.tanh(noise + emb[:, None, :2])

    def normalize_actions(self, a):
        return torch.as_tensor(a)

    def unnormalize_actions(self, a):
        return torch.as_tensor(a)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(policies.REGISTRY, "toy", TOY)


def _cfg(out, **kw) -> RLConfig:
    return RLConfig(checkpoint="stub", out=str(out), task="", env="tests.session.toy_env:make_env", method="toy",
                    agent=ToyConfig(noise="random"), instruction=INSTRUCTION, total_ticks=48, warmup_steps=2,
                    eval_every=2, eval_episodes=1, videos=0, **kw)


def test_registry_names_methods_and_suggests_on_typos(toy):
    assert policies.get_method("toy") == (ToyAgent, ToyConfig)
    with pytest.raises(ValueError, match="did you mean 'dsrl'"):
        policies.get_method("dsrll")
    with pytest.raises(ValueError, match="did you mean 'toy'"):
        RLConfig(checkpoint="c", out="o", task="", env="a:b", method="tyo")


def test_a_vla_without_a_handle_is_refused_naming_it(toy):
    from session.runner import Session

    class NoEmbed(StubVLA):
        embed = property(lambda self: (_ for _ in ()).throw(AttributeError("embed")))

    with pytest.raises(ValueError, match="embed"):
        Session(_cfg("unused"), make_env(), NoEmbed(), progress=False)


def test_toy_method_runs_an_in_process_session_on_the_toy_env(toy, tmp_path):
    from session.runner import run_session

    torch.set_num_threads(1)
    vla = StubVLA()
    before = {k: v.clone() for k, v in vla.state_dict().items()}
    summary = run_session(_cfg(tmp_path / "run"), make_env(), vla, progress=False)
    assert summary["ticks"] >= 48 and summary["vla_weights_unchanged"]
    assert all(torch.equal(before[k], v) for k, v in vla.state_dict().items())
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    assert [e["episode"] for e in eps] == list(range(summary["episodes"]))
    assert any("losses/mean_reward" in e for e in eps)  # the toy agent learned after its warm-up
    evals = [json.loads(x) for x in open(tmp_path / "run/evals.jsonl")]
    assert len(evals) == summary["episodes"] // 2
    from policies.common.replay import ReplayBuffer

    online = ReplayBuffer.load(tmp_path / "run/checkpoint/online.npz")
    assert online.obs_spec == {"emb": ((6,), np.dtype(np.float32))} and len(online) == summary["steps"]
    cfg = RLConfig.from_json(str(tmp_path / "run/rl_config.json"))
    assert cfg.method == "toy" and cfg.agent == ToyConfig(noise="random")


def test_toy_method_runs_an_actor_learner_session_over_loopback(toy, tmp_path):
    from session.actor import ActorConfig, run_actor
    from session.learner import Learner

    torch.set_num_threads(1)
    ln = Learner(_cfg(tmp_path / "run"), StubVLA(), bind="tcp://127.0.0.1:*", progress=False)
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(summary=ln.serve()), daemon=True)
    th.start()
    sent: list = []
    summary = run_actor(ActorConfig(learner=ln.endpoint, learner_timeout_s=20, heartbeat_s=0.1),
                        make_env=lambda cfg: make_env(), load_vla=lambda cfg: StubVLA(), progress=False,
                        on_transition=lambda seq, tr: sent.append(tr))
    th.join(timeout=30)
    assert not th.is_alive()
    s = out["summary"]
    assert summary["ticks"] == s["ticks"] >= 48 and s["steps"] == len(sent) and s["vla_weights_unchanged"]
    assert summary["params_version"] > 0  # the learner's updates reached the actor
    online = ln.sess.online
    np.testing.assert_array_equal(online.obs["emb"][: len(sent)], np.stack([t["obs"]["emb"] for t in sent]))
    np.testing.assert_array_equal(online.action[: len(sent)], np.stack([t["action"] for t in sent]))
    assert json.loads((tmp_path / "run/checkpoint/state.json").read_text())["step"] == len(sent)
    evals = [json.loads(x) for x in open(tmp_path / "run/evals.jsonl")]  # the actor evaluated, the learner logged
    assert len(evals) == s["episodes"] // 2


def _tiny_vla_for_the_toy_env(path) -> str:
    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(0)
    m = CompactVLA(CompactVLAConfig(cameras=("front",), image_size=32, state_dim=2, action_dim=2, horizon=4,
                                    hidden=32, cond_dim=32, keypoints=4, pretrained=False))
    m.set_normalization(np.zeros(2), np.ones(2), -np.ones(2), np.ones(2))
    m.save(str(path))
    return str(path)


@pytest.mark.parametrize("method", ["dsrl", "toy"])
def test_vla_rl_env_runs_a_session_on_a_gymnasium_env_from_the_command_line(toy, tmp_path, method):
    """`vla rl --env tests.session.toy_env:make_env`: no robot, no bridge; a compact VLA sized for
    the toy env; the toy method's own flag (--noise) comes from its config dataclass."""
    from vla.cli import main

    ckpt = _tiny_vla_for_the_toy_env(tmp_path / "ckpt")
    own = ["--noise", "random"] if method == "toy" else ["--utd", "1", "--batch-size", "4", "--num-critics", "2",
                                                         "--hidden", "16", "--distill-steps", "1"]
    argv = ["rl", "--method", method, "--checkpoint", ckpt, "--env", "tests.session.toy_env:make_env",
            "--instruction", INSTRUCTION, "--out", str(tmp_path / "run"), "--total-ticks", "16", "--warmup-steps", "1",
            "--eval-every", "0", "--eval-episodes", "1", "--videos", "0", *own]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["ticks"] >= 16 and summary["vla_weights_unchanged"]
    cfg = json.loads((tmp_path / "run/rl_config.json").read_text())
    assert cfg["method"] == method and cfg["env"] == "tests.session.toy_env:make_env"
    if method == "toy":
        assert cfg["agent"] == {"noise": "random", "step_size": 0.1}
    else:
        assert cfg["agent"]["sac"]["hidden"] == [16]
        # every update's diagnostics reach TensorBoard, and the summary holds the first and the last
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        tb = EventAccumulator(str(tmp_path / "run/tb"))
        tb.Reload()
        steps = [e.step for e in tb.Scalars("diag/entropy")]
        assert len(steps) == summary["steps"] - 1 and steps == sorted(set(steps)), (steps, summary["steps"])
        assert {"diag/qa_spread_std", "diag/qw_spread_range", "losses/qa_loss"} <= set(tb.Tags()["scalars"])
        diag = summary["update_diagnostics"]
        assert {"diag/entropy", "diag/alpha", "diag/actor_log_std", "diag/qw_spread_std"} <= set(diag["last"])
        assert main([*argv[:2], "toy", *argv[3:], "--variant", "sac"]) == 2  # another method's flag: refused


def test_the_session_package_never_names_a_method():
    """session/ runs any Agent: no method name (nor DSRL's SAC / noise vocabulary) appears in its code."""
    names = set(policies.REGISTRY) | {"dsrl", "sac", "variant", "noise_bound", "feat"}
    pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b", re.IGNORECASE)
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in sorted((ROOT / "session").glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, "\n".join(hits)


def test_the_session_stores_rows_and_time_limit_cuts_and_keeps_agent_snapshots(toy, tmp_path):
    """Every stored step says how many ticks it executed and whether a time limit (not a terminal state) ended the
    episode after it (the value target reads both, issue 61); --snapshot-every keeps the agent as it learned."""
    from policies.common.replay import ReplayBuffer
    from session.runner import run_session

    torch.set_num_threads(1)
    summary = run_session(_cfg(tmp_path / "run", snapshot_every=16), make_env(), StubVLA(), progress=False)
    online = ReplayBuffer.load(tmp_path / "run/checkpoint/online.npz")
    n = len(online)
    rows, trunc, done = online.extras["rows"][:n], online.extras["truncated"][:n], online.done[:n]
    assert rows.sum() == summary["ticks"] and set(rows.tolist()) <= {1, 2, 3, 4}
    assert not (trunc & done).any()
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    ends = np.flatnonzero(trunc | done)  # every episode ends in exactly one of the two
    assert len(ends) == len(eps) and ends[-1] == n - 1
    assert [bool(done[i]) for i in ends] == [bool(e["success"]) for e in eps]
    snaps = sorted((tmp_path / "run/snapshots").glob("agent_*.pt"))
    ticks = [int(p.stem.split("_")[1]) for p in snaps]
    assert len(ticks) >= 2 and ticks == sorted(set(ticks))
    assert [t // 16 for t in ticks] == sorted(set(t // 16 for t in ticks))  # one per multiple passed
    assert isinstance(torch.load(snaps[-1], weights_only=False), dict)
