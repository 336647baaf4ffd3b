"""bench/archive/token_probe.py (an archived probe, run as ``python -m bench.archive.token_probe``): the first
chunk's turn under each behaviour token, with the same noise draws for every token. A head that ignores its token
gives every token the same turns; one whose token moves the chunk does not."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e  # a bench smoke test: bench/archive/token_probe.py at toy size
def test_token_probe_tells_a_token_that_matters_from_one_that_does_not(tiny_dataset, tmp_path):
    pytest.importorskip("lerobot")
    from vla.cli import main
    from vla.models import load_vla
    from vla.train import TrainConfig, train

    tokens = str(tmp_path / "tokens.json")
    assert main(["tokens", "--dataset", tiny_dataset, "--k", "2", "--chunks", "1", "--horizon", "4", "--out",
                 tokens]) == 0
    train(TrainConfig(datasets=(tiny_dataset,), out=str(tmp_path / "run"), steps=2, batch_size=8, warmup_steps=1,
                      save_every=2, log_every=1, image_size=64, horizon=4, aug_views=0, seed=0, threads=1,
                      tokens=tokens, num_tokens=2), progress=False)
    ckpt = str(tmp_path / "run" / "model")
    m = load_vla(ckpt)
    with torch.no_grad():  # the same embedding for every token: the token cannot matter
        m.head.token_emb.weight[:] = m.head.token_emb.weight[0]
    m.save(str(tmp_path / "same"))
    with torch.no_grad():  # token 2 shifts the observation far: its chunks change
        m.head.token_emb.weight[2] += 50.0
    m.save(str(tmp_path / "moved"))
    out = tmp_path / "res"
    r = subprocess.run([sys.executable, "-m", "bench.archive.token_probe", "--checkpoint", str(tmp_path / "same"),
                        "--checkpoint", str(tmp_path / "moved"), "--dataset", tiny_dataset, "--tokens", tokens,
                        "--episodes", "4", "--draws", "2", "--out", str(out), "--name", "probe"],
                       cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "probe.json").read_text())
    same, moved = res["results"]
    v = {t: d["values"] for t, d in same["first_chunk_drz"].items()}
    assert v["0"] == v["1"] == v["2"] and len(v["0"]) == 8
    assert same["first_frame_loss"]["own_token"] == pytest.approx(same["first_frame_loss"]["other_token"])
    w = {t: d["values"] for t, d in moved["first_chunk_drz"].items()}
    assert w["0"] == w["1"] and w["2"] != w["1"]
    assert (out / "probe.png").stat().st_size > 5_000 and str(tmp_path) not in (out / "probe.json").read_text()
