"""`vla tokens`: ExToken's behaviour prior, k-means over recorded demonstrations (policies/extoken/prior.py)."""

from __future__ import annotations

import argparse
import os


def add_parser(sub, name: str, help_: str) -> None:
    from policies.extoken.prior import PriorConfig

    d = PriorConfig()
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "ExToken's behaviour prior. Demonstrations of one task hold several modes (grasp yaw, approach side, ...); "
        "this clusters them with k-means into K behaviour tokens 1..K (0 stays the null token) and writes, per "
        "dataset and episode, the token of every frame, the token prior (share of frames per token) and a picture "
        "of what each token does (PNG beside the file). `vla train --tokens FILE` then trains the VLA conditioned "
        "on the token, pi(a | s, c), and an ExToken RL session picks the token online. Only the parquet columns "
        "(actions, states) are read: no video is decoded."),
        epilog="""\
example:
  vla tokens --dataset data/pick --k 4 --out runs/pick_tokens.json --purity-field expert_mode
  vla train --dataset data/pick --tokens runs/pick_tokens.json --out runs/vla_pick_tok

units: episode = one point per episode, its opening (the first --chunks chunks of --horizon actions, where a
mode is decided), and every frame of the episode gets its token; chunk = one point per frame, its action chunk
(+ its state x --state-weight), and every frame gets its own token. Each action dimension is standardised
over the datasets first.
""")
    p.add_argument("--dataset", action="append", default=[], metavar="DIR", required=True,
                   help="a LeRobot v3 dataset directory (repeat: the datasets are clustered together)")
    p.add_argument("--k", type=int, default=d.k, help=f"behaviour tokens K (default {d.k})")
    p.add_argument("--unit", choices=["episode", "chunk"], default=d.unit,
                   help=f"what is clustered: an episode's opening or every frame's chunk (default {d.unit})")
    p.add_argument("--chunks", type=int, default=d.chunks,
                   help=f"episode unit: chunks M in the opening (default {d.chunks}, i.e. M x H ticks)")
    p.add_argument("--horizon", type=int, default=d.horizon, help=f"actions per chunk H (default {d.horizon})")
    p.add_argument("--state-weight", type=float, default=d.state_weight,
                   help="chunk unit: weight of the standardised state appended to the chunk (default 0: actions only)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="the token file to write, e.g. tokens.json (the PNG goes beside it)")
    p.add_argument("--purity-field", metavar="FIELD",
                   help="an episode-log field (meta/vla_episodes.jsonl), e.g. expert_mode or success: print and store "
                        "the table token x value and the purity (1 = each token is one value)")
    p.add_argument("--seed", type=int, default=d.seed, help="k-means seed (10 restarts, the best kept)")
    p.set_defaults(run=run)


def run(args) -> int:
    from policies.extoken.prior import PriorConfig, build_prior, load_episodes, plot_prior, write_prior

    cfg = PriorConfig(k=args.k, unit=args.unit, chunks=args.chunks, horizon=args.horizon,
                      state_weight=args.state_weight, seed=args.seed, purity_field=args.purity_field)
    demos = load_episodes(args.dataset, progress=True)
    prior = build_prior(demos, cfg)
    write_prior(prior, args.out)
    png = os.path.splitext(args.out)[0] + ".png"
    plot_prior(prior, demos, png)

    pur = prior["purity"]
    values = pur["values"] if pur else []
    head = f"{'token':>5} {cfg.unit + 's':>9} {'frames':>8} {'prior':>6}"
    if values:
        head += "  | " + pur["field"] + ": " + " ".join(f"{v:>8}" for v in values)
    print(f"{len(demos)} episodes, {sum(prior['frames_per_token'])} frames -> K={cfg.k} tokens (unit {cfg.unit})")
    print(head)
    for t in range(1, cfg.k + 1):
        line = f"{t:>5} {prior['cluster_sizes'][t - 1]:>9} {prior['frames_per_token'][t - 1]:>8} {prior['prior'][t - 1]:>6.3f}"
        if values:
            line += "  | " + " " * (len(pur["field"]) + 2) + " ".join(f"{pur['table'][str(t)][v]:>8}" for v in values)
        print(line)
    if pur:
        if pur["purity"] is None:
            print(f"purity: no episode's log row has the field {pur['field']!r}")
        else:
            print(f"purity vs {pur['field']}: {pur['purity']:.3f} over {pur['counted']} {cfg.unit}s"
                  + (f" ({pur['missing']} without the field)" if pur["missing"] else ""))
    print(f"wrote {args.out} and {png}")
    return 0
