"""`vla train` over several processes (accelerate / DDP on CPUs, gloo): the same loss curve and weights as one
process at the same global batch, one writer of the run directory, and resume on another number of processes.

Tolerances: the processes' gradients are averaged by DDP where one process sums over its whole batch, so the
two differ only in the order of float sums. Measured on the tiny dataset: 12 steps at batch 8, equal losses to
the 6 decimals of loss.csv and weights within 2e-7 (frozen) / 3e-6 (lora); 300 steps at batch 32, losses within
1e-6 and weights within 3e-6. The tests allow 1e-4 on a step's loss and 1e-5 on a weight (1e-4 after 40 lora
steps). The mistakes they guard against are three orders above that: both processes training on the same rows
moved the 12-step curve by up to 0.27, each process drawing its own flow-matching noise by up to 0.63.

A 2-process launch costs ~25 s on two CPU cores (two imports of torch, MiniLM and the dataset).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("lerobot")
pytest.importorskip("accelerate")

from vla.distributed import Processes  # noqa: E402
from vla.train import TrainConfig, draw_batch, frame_sampler, train  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LOSS_TOL = 1e-4
"""Largest difference allowed between a step's logged loss with 1 and with 2 processes."""
WEIGHT_TOL = 1e-5
"""Largest difference allowed between a weight of the final model with 1 and with 2 processes."""

COMMON = dict(steps=12, batch_size=8, warmup_steps=2, save_every=4, log_every=1, image_size=64, horizon=4,
              aug_views=1, seed=0, threads=1, keep_checkpoints=10)


def cfg_for(dataset: str, out, **kw) -> TrainConfig:
    return TrainConfig(datasets=(dataset,), out=str(out), **{**COMMON, **kw})


def cli_args(dataset: str, out, **kw) -> list[str]:
    """The ``vla train`` flags of ``cfg_for(dataset, out, **kw)`` (keep_checkpoints: the default 3 suffices)."""
    c = {**COMMON, **kw}
    args = ["train", "--dataset", dataset, "--out", str(out)]
    for k in ("steps", "batch_size", "warmup_steps", "save_every", "log_every", "image_size", "horizon", "aug_views",
              "seed", "threads"):
        args += ["--" + k.replace("_", "-"), str(c[k])]
    for k in ("mode", "shift_pad"):
        if k in c:
            args += ["--" + k.replace("_", "-"), str(c[k])]
    return args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_cmd(n: int, vla_args: list[str]) -> list[str]:
    """``accelerate launch`` of ``n`` processes of ``python -m vla.cli``; no config file needed, nothing prompted.
    ``--multi_gpu`` is accelerate's torchrun launcher (``--cpu`` would start one process): with no GPU visible,
    vla train puts the processes on the CPU (gloo)."""
    return [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--multi_gpu", "--num_processes",
            str(n), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(_free_port()), "-m", "vla.cli", *vla_args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path even on a machine with GPUs
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_launched(n: int, vla_args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    p = subprocess.run(launch_cmd(n, vla_args), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def losses(run) -> dict[int, float]:
    rows = (Path(run) / "loss.csv").read_text().splitlines()[1:]
    steps = [int(r.split(",")[0]) for r in rows]
    assert len(steps) == len(set(steps)), f"a step logged twice in {run}: {steps}"
    return {int(r.split(",")[0]): float(r.split(",")[1]) for r in rows}


def weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def assert_same_model(a, b, tol: float = WEIGHT_TOL) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    worst = max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)
    assert worst <= tol, f"weights of {a} and {b} differ by up to {worst:.3g} (tolerance {tol})"


def assert_same_curve(a: dict[int, float], b: dict[int, float], steps) -> None:
    worst = max(abs(a[s] - b[s]) for s in steps)
    assert worst <= LOSS_TOL, f"losses differ by up to {worst:.3g} (tolerance {LOSS_TOL}): {a} vs {b}"


def resumed(run: Path) -> TrainConfig:
    """The config ``vla train --resume RUN`` continues ``run`` with (it may be a copy of another run)."""
    return dataclasses.replace(TrainConfig.from_json(str(run / "train_config.json")), out=str(run))


def roll_back(run: Path, step: int) -> None:
    """What a kill right after checkpoint ``step`` leaves (later checkpoints, final model and summary never
    written; loss.csv has rows past it, which resume drops)."""
    ck = run / "checkpoints"
    for d in ck.iterdir():
        if d.name.isdigit() and int(d.name) > step:
            shutil.rmtree(d)
    (ck / "last").write_text(f"{step:07d}")
    shutil.rmtree(run / "model")
    (run / "train_summary.json").unlink()


# -- the global batch and its parts -----------------------------------------------------------
def test_the_parts_of_a_global_batch_are_the_one_process_batch_and_the_sampler_ignores_the_count(tiny_dataset):
    """Unit level, no launch: rank r's part of every step is rows r*b.. of the batch one process draws (noise
    and time of the flow loss included), the two parts differ, and the generators end where one process's do."""
    from vla.models.encoders import TextEncoder
    from vla.train import build_data

    cfg = cfg_for(tiny_dataset, "unused", mode="lora", shift_pad=2)
    data, _, _ = build_data(cfg, TextEncoder(), progress=False)
    std = data.state.std(0)

    def steps(world: int, rank: int, n: int = 3):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            gen = torch.Generator().manual_seed(0)
            draw = frame_sampler(data, cfg.balance, cfg.batch_size, gen)
            part = Processes(rank=rank, world=world).part(cfg.batch_size)
            out = [draw_batch(data, cfg, draw, gen, std, part) for _ in range(n)]
            return out, gen.get_state(), torch.get_rng_state()

    whole, g1, r1 = steps(1, 0)
    halves = [steps(2, r) for r in (0, 1)]
    for (h0, h1) in zip(halves[0][0], halves[1][0]):
        assert h0["state"].shape[0] == h1["state"].shape[0] == cfg.batch_size // 2
    for i, w in enumerate(whole):
        a, b = halves[0][0][i], halves[1][0][i]
        for k in ("state", "action", "text", "noise", "t"):
            assert torch.equal(torch.cat([a[k], b[k]]), w[k]), (i, k)
        for k in ("state", "noise", "t"):  # the two processes train on different rows
            assert not torch.equal(a[k], b[k]), (i, k)
        for c in w["images"]:
            assert torch.equal(torch.cat([a["images"][c], b["images"][c]]), w["images"][c]), (i, c)
    for _, g, r in halves:
        assert torch.equal(g, g1) and torch.equal(r, r1)


def test_a_global_batch_that_does_not_split_evenly_is_refused():
    with pytest.raises(ValueError, match=r"--batch-size 10 does not split evenly over 4 processes"):
        Processes(rank=0, world=4).part(10)
    assert Processes(rank=2, world=4).part(8) == slice(4, 6)


# -- two processes against one ----------------------------------------------------------------
@pytest.fixture(scope="module")
def one_process(tiny_dataset, tmp_path_factory) -> Path:
    """The reference: plain `vla train` (no launcher) in this process, 12 steps at global batch 8."""
    out = tmp_path_factory.mktemp("ddp") / "one"
    train(cfg_for(tiny_dataset, out), progress=False)
    return out


@pytest.fixture(scope="module")
def two_processes(tiny_dataset, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The same run through `accelerate launch` of 2 processes: each trains on 4 rows of every batch of 8. Its trunk
    features go to a shared --feature-cache (the 1-process run keeps its own in its run directory)."""
    out = tmp_path_factory.mktemp("ddp") / "two"
    return out, run_launched(2, cli_args(tiny_dataset, out) + ["--feature-cache", str(out.parent / "features")])


@pytest.mark.e2e  # two training processes (the module's two_processes fixture)
def test_two_processes_train_the_one_process_curve_and_only_the_main_one_writes(one_process, two_processes):
    out, p = two_processes
    assert_same_curve(losses(one_process), losses(out), range(1, 13))
    assert_same_model(one_process / "model", out / "model")
    # one writer: one set of checkpoints, one TensorBoard file, no half-written leftovers, one summary line
    assert sorted(os.listdir(out / "checkpoints")) == ["0000004", "0000008", "0000012", "last"]
    assert len(os.listdir(out / "tb")) == 1
    # the features came from the shared cache (one file: one dataset), the same as the run directory's own
    assert not (out / "features_cache.pt").exists() and len(os.listdir(out.parent / "features")) == 1
    left = [str(f) for f in out.rglob("*") if f.name.endswith((".tmp", ".partial", ".tmp.png"))]
    assert not left, left
    assert p.stdout.count('"steps": 12') == 1 and p.stdout.count("2 processes, 4 samples each") == 1, p.stdout
    assert p.stderr.count("train:   0%") == 1  # one progress bar
    # accelerate needed no config file and defaulted nothing; vla train saw the processes it was promised
    assert "Traceback" not in p.stderr and "were not passed to `accelerate launch`" not in p.stderr, p.stderr[-2000:]
    assert "started one process" not in p.stderr
    # the sampler is where one process's is: checkpoint 4's generator and RNG states are the same bytes
    a = torch.load(one_process / "checkpoints/0000004/train_state.pt", weights_only=False)
    b = torch.load(out / "checkpoints/0000004/train_state.pt", weights_only=False)
    assert torch.equal(a["generator"], b["generator"]) and torch.equal(a["rng"]["torch"], b["rng"]["torch"])


@pytest.mark.e2e  # two training processes (the module's two_processes fixture)
def test_a_run_of_two_processes_resumes_on_one(one_process, two_processes, tmp_path):
    """The 2-process run, killed after step 4, continued by one process: it ends where the 1-process run did."""
    run = tmp_path / "two_then_one"
    shutil.copytree(two_processes[0], run)
    roll_back(run, 4)
    out = train(resumed(run), resume=True, progress=False)
    assert out["steps"] == 12 and out["processes"] == 1
    assert sorted(losses(run)) == list(range(1, 13))
    assert_same_curve(losses(one_process), losses(run), range(1, 13))
    assert_same_model(one_process / "model", run / "model")


@pytest.mark.slow
def test_a_run_of_one_process_resumes_on_two(one_process, tmp_path):
    """The 1-process run, killed after step 4, continued by two (the main one computes the feature cache again
    while the other waits): it ends where the 1-process run did."""
    run = tmp_path / "one_then_two"
    shutil.copytree(one_process, run)
    roll_back(run, 4)
    (run / "features_cache.pt").unlink()
    p = run_launched(2, ["train", "--resume", str(run)])
    assert f"resumed {run} from step 4" in p.stdout, p.stdout
    assert sorted(losses(run)) == list(range(1, 13))
    assert_same_curve(losses(one_process), losses(run), range(1, 13))
    assert_same_model(one_process / "model", run / "model")


# -- longer: lora (the trunk runs under DDP on augmented images), a real kill -------------------
@pytest.mark.slow
def test_lora_on_two_processes_killed_and_resumed_on_one_matches_one_process(tiny_dataset, tmp_path):
    kw = dict(mode="lora", shift_pad=2, steps=40, save_every=5, warmup_steps=5)
    ref = tmp_path / "one"
    train(cfg_for(tiny_dataset, ref, **kw), progress=False)

    run = tmp_path / "two"
    p = subprocess.Popen(launch_cmd(2, cli_args(tiny_dataset, run, **kw)), cwd=REPO, env=_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "0000010").is_dir():  # kill the launcher and both processes mid-run
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()[-3000:] if p.stderr else ""
        time.sleep(0.05)
    # SIGKILL the launcher and the processes it started (torchrun starts each in a session of its own)
    import psutil

    everyone = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    assert len(everyone) >= 3, everyone
    for q in everyone:
        q.send_signal(signal.SIGKILL)
    psutil.wait_procs(everyone, timeout=60)
    p.wait(timeout=60)
    assert not (run / "model").exists()
    out = train(resumed(run), resume=True, progress=False)
    assert out["steps"] == 40
    assert_same_curve(losses(ref), losses(run), range(1, 41))
    assert_same_model(ref / "model", run / "model", tol=1e-4)
