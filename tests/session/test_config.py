"""RLConfig: session fields + the method's nested config; flags generated from documented fields."""

from __future__ import annotations

import json

import pytest

from session.config import RLConfig

# every `vla rl` flag before the flags were generated from the config dataclasses (README, bench, tests use them)
OLD_FLAGS = ["--batch-size", "--bind", "--checkpoint", "--demos", "--distill-steps", "--encoder", "--eval-episodes",
             "--eval-every", "--eval-policy", "--exec-steps", "--init-log-std", "--init-temperature", "--insecure",
             "--instruction", "--keys", "--learner", "--learner-timeout", "--max-episode-ticks", "--method",
             "--noise-bound", "--noise-dims", "--num-critics", "--out", "--reset-timeout", "--resume", "--reward",
             "--robot", "--role", "--seed", "--serve", "--task", "--threads", "--total-ticks", "--utd", "--variant",
             "--warmup-steps"]


def test_method_settings_nest_and_round_trip_through_json():
    cfg = RLConfig.flat(checkpoint="c", out="o", task="pick_red_cube", variant="sac", utd=3, hidden=[32],
                        warmup_steps=2, init_log_std=None)
    assert cfg.method == "dsrl" and cfg.warmup_steps == 2
    assert cfg.agent.variant == "sac" and cfg.agent.sac.utd == 3 and cfg.agent.sac.hidden == (32,)
    assert cfg.agent.sac.init_log_std is None
    assert RLConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match=r"no field\(s\) \['bogus'\]"):
        RLConfig.flat(checkpoint="c", out="o", task="pick_red_cube", bogus=1)


def test_a_run_directory_written_before_the_nesting_still_resumes():
    flat = {"checkpoint": "c", "out": "o", "task": "pick_red_cube", "method": "dsrl", "variant": "na",
            "encoder": "vla", "robot": "sim-franka-fast", "total_ticks": 100, "max_episode_ticks": None,
            "exec_steps": None, "noise_bound": 1.5, "noise_dims": None, "warmup_steps": 50, "distill_steps": 10,
            "utd": 4, "batch_size": 256, "num_critics": 10, "hidden": [256, 256], "gamma": 0.99,
            "init_temperature": 0.01, "init_log_std": 0.0, "eval_policy": "sample", "backup_entropy": False,
            "eval_every": 10, "eval_episodes": 20, "eval_seed_start": 200000, "checkpoint_every": 1, "seed": 0,
            "threads": 1, "videos": 1, "reward": "task", "instruction": None, "demos": [], "reset_timeout_s": 300.0}
    cfg = RLConfig.from_dict(flat)
    assert cfg.warmup_steps == 50 and cfg.agent.sac.utd == 4 and cfg.agent.variant == "na"


def test_vla_rl_help_keeps_every_flag_and_documents_the_generated_ones(capsys):
    from vla.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["rl", "--help"])
    out = capsys.readouterr().out
    missing = [f for f in OLD_FLAGS if f not in out]
    assert not missing, missing
    assert "Target network smoothing" in out  # SACConfig.tau's field docstring is --tau's help
    assert "method dsrl (DSRLConfig)" in out and "--env" in out
