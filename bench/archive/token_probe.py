#!/usr/bin/env python
"""Does a token-conditioned VLA follow its behaviour token? (issue 33, ExToken)

From the first frame of recorded demos (where the demonstrator has not yet chosen its mode), sample the VLA's first
chunk under each token (0 = null, 1..K) with the same random noise draws, and read the mode off the chunk: the summed
z-rotation (action dim 5, rad) over the chunk, which the scripted expert's grasp modes (``--expert-mode ccw | cw``)
make +-1.34 rad. A VLA that follows its tokens turns one way under one token and the other way under the other; one
that ignores them gives the same split under every token, the mode drawn from the sampler's noise. Also reported:
the flow-matching loss on those frames under each frame's own token and under the other one (a model that uses the
token fits its own token better).

Writes ``bench/archive/results/<name>.json`` and ``<name>.png`` (one histogram per token and checkpoint).

    .venv/bin/python -m bench.archive.token_probe --checkpoint runs/extoken/tok --dataset data/extoken/yaw45_random \\
        --tokens data/extoken/tokens_k2.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import sys

from bench.harness.results import ROOT  # noqa: E402

import numpy as np  # noqa: E402

DRZ = 5  # the action's z-rotation (hardware.teleop.base.TeleopCommand: dpos, drot, gripper)


def probe(ckpt: str, demos, prior, draws: int, seed: int) -> dict:
    import torch

    from vla.data.demos import action_chunks
    from vla.models import load_vla

    m = load_vla(ckpt)
    cfg = m.cfg
    k = int(m.num_tokens)
    if k < 1:
        raise ValueError(f"{ckpt} has no behaviour tokens (train it with `vla train --tokens`)")
    g = torch.Generator().manual_seed(seed)
    noises = [torch.randn(1, *m.noise_shape, generator=g) for _ in range(len(demos) * draws)]
    out: dict = {"checkpoint": ckpt, "num_tokens": k, "first_chunk_drz": {}}
    for tok in range(k + 1):
        vals = []
        for i, e in enumerate(demos):
            obs = {"images": {c: e.images[c][0:1] for c in cfg.cameras}, "state": e.state[0:1],
                   "instruction": [e.instruction]}
            for d in range(draws):
                with torch.no_grad():
                    a = m.sample_actions(obs, noise=noises[i * draws + d], token=tok)
                vals.append(float(a[0, :, DRZ].sum()))
        v = np.array(vals)
        out["first_chunk_drz"][str(tok)] = {"values": [round(x, 4) for x in vals], "mean": float(v.mean()),
                                            "turn_ccw": int((v > 0.5).sum()), "turn_cw": int((v < -0.5).sum()),
                                            "n": len(vals)}
    if prior is not None:  # the loss on the first frames under each frame's own token and under another
        imgs = {c: np.concatenate([e.images[c][0:1] for e in demos]) for c in cfg.cameras}
        batch = {"images": imgs, "state": np.concatenate([e.state[0:1] for e in demos]),
                 "instruction": [e.instruction for e in demos],
                 "action": np.concatenate([action_chunks(e.action, cfg.horizon)[0][0:1] for e in demos])}
        own = torch.tensor([int(prior.episode(e.dataset, e.episode_index).tokens[0]) for e in demos])
        other = own % k + 1
        losses = {}
        for name, tok in (("own_token", own), ("other_token", other), ("null_token", torch.zeros_like(own))):
            torch.manual_seed(seed)
            with torch.no_grad():
                losses[name] = float(np.mean([float(m.loss({**batch, "token": tok})[0]) for _ in range(50)]))
        out["first_frame_loss"] = losses
    return out


def plot(results: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.8), squeeze=False)
    for ax, r in zip(axes[0], results):
        for tok, d in r["first_chunk_drz"].items():
            ax.hist(d["values"], bins=np.linspace(-1.6, 1.6, 33), alpha=0.5, label=f"token {tok}"
                    + (" (null)" if tok == "0" else ""))
        ax.set_title(f"{r['name']}: first chunk's z-turn per token", fontsize=9)
        ax.set_xlabel("summed drz over the first chunk (rad); demos: +-1.34")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", action="append", required=True, help="token-conditioned VLA (repeat)")
    ap.add_argument("--dataset", required=True, help="demos whose first frames are probed")
    ap.add_argument("--tokens", default=None, help="the tokens.json the VLAs trained with (adds the loss check)")
    ap.add_argument("--episodes", type=int, default=10, help="demos probed (their first frame each)")
    ap.add_argument("--draws", type=int, default=4, help="noise draws per frame (the same draws for every token)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="extoken_probe")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "archive" / "results")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from bench.harness.results import portable
    from vla.data.demos import load_demos
    from vla.data.tokens import load_prior
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    prior = load_prior(args.tokens) if args.tokens else None
    results = []
    for c in args.checkpoint:
        ckpt = resolve_checkpoint(c)
        cfg = load_vla(ckpt).cfg
        demos = load_demos([args.dataset], cfg.image_size, list(cfg.cameras), progress=False)[: args.episodes]
        r = probe(ckpt, demos, prior, args.draws, args.seed)
        r["name"] = os.path.basename(os.path.normpath(c))
        r["checkpoint"] = portable(os.path.abspath(ckpt))
        with open(os.path.join(ckpt, "config.json")) as f:
            meta = json.load(f)
        r["trained_with"] = {k: v for k, v in (meta.get("train") or {}).items() if k != "datasets"}
        results.append(r)
        row = "  ".join(f"token {t}: ccw {d['turn_ccw']} / cw {d['turn_cw']} of {d['n']}"
                        for t, d in r["first_chunk_drz"].items())
        print(f"{r['name']:<10} {row}")
        if "first_frame_loss" in r:
            print(f"{'':<10} first-frame loss: " + ", ".join(f"{k} {v:.4f}" for k, v in r["first_frame_loss"].items()))
    res = {"bench": "token_probe", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "dataset": portable(os.path.abspath(args.dataset)), "tokens": portable(os.path.abspath(args.tokens))
           if args.tokens else None, "episodes": args.episodes, "draws": args.draws, "seed": args.seed,
           "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{args.name}.json", "w") as f:
        json.dump(res, f, indent=1)
    plot(results, args.out / f"{args.name}.png")
    print(f"wrote {args.out / (args.name + '.json')} and {args.name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
