"""`vla train`: supervised fine-tuning of the compact VLA on LeRobot v3 datasets (see vla/train.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os


def add_parser(sub, name: str, help_: str) -> None:
    from vla.train_config import TrainConfig

    d = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Train the compact flow-matching VLA (frozen MiniLM for the instruction, ImageNet "
        "EfficientNet-Lite0 for the cameras, a flow-matching action expert over action chunks) on one "
        "or more LeRobot v3 datasets. Several datasets = multi-task: each episode keeps its instruction. "
        "The run directory gets checkpoints, TensorBoard scalars (tb/), loss.csv and loss_curve.png; "
        "--resume continues a killed run from its last checkpoint."),
        epilog="""\
examples:
  vla train --dataset data/pick_red --dataset data/pick_blue --out runs/vla_pick
  vla train --dataset data/pick_red --out runs/vla_lora --mode lora --steps 3000
  vla train --dataset data/place --dataset data/pick_red --out runs/multi --paraphrases sim
                                                     # sub-skill-labelled data (vla record --label-subskills):
                                                     # tasks + sub-skills, trained with their paraphrases
  vla train --resume runs/vla_pick                   # continue after a kill
  accelerate launch --multi_gpu --num_processes 4 --num_machines 1 --mixed_precision no --dynamo_backend no \
      -m vla.cli train --dataset data/pick --out runs/vla_pick_ddp
                                                     # 4 processes (one per GPU; on the CPU without one), DDP:
                                                     # --batch-size is the global batch, split among them; the
                                                     # same updates as one process. --resume on any number
  vla train --dataset data/pick --tokens runs/pick_tokens.json --out runs/vla_pick_tok
                                                     # ExToken: pi(a | s, c) with the tokens of `vla tokens`
  vla eval --checkpoint runs/vla_pick --task pick_red_cube --episodes 20
  tensorboard --logdir runs/vla_pick/tb

modes: frozen = the vision trunk stays ImageNet's (its features are computed once and cached,
fast on a CPU); lora = peft LoRA adapters on the trunk's 1x1 convolutions; full = every weight
but the sentence encoder trains. The fusion and the action expert always train.
""")
    p.add_argument("--dataset", action="append", default=[], metavar="DIR",
                   help="a LeRobot v3 dataset directory (repeat for multi-task)")
    p.add_argument("--out", help="run directory (new), e.g. runs/vla_pick")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--init", metavar="CHECKPOINT", help="start a new run from this compact checkpoint or run "
                   "directory: its weights, normalisation and model settings (image size, crops, neck, cameras, "
                   "horizon), e.g. to fine-tune on DAgger data")
    p.add_argument("--mode", choices=["frozen", "lora", "full"], default=d["mode"],
                   help=f"what happens to the pretrained vision trunk (default {d['mode']})")
    p.add_argument("--steps", type=int, default=d["steps"], help=f"optimiser steps (default {d['steps']})")
    p.add_argument("--batch-size", type=int, default=d["batch_size"])
    p.add_argument("--lr", type=float, default=d["lr"])
    p.add_argument("--warmup-steps", type=int, default=d["warmup_steps"],
                   help=f"linear learning-rate warm-up (default {d['warmup_steps']})")
    p.add_argument("--horizon", type=int, default=d["horizon"], help="actions per chunk H")
    p.add_argument("--image-size", type=int, default=d["image_size"], help="camera frames are resized to this (px)")
    p.add_argument("--camera", action="append", dest="cameras", metavar="NAME",
                   help="camera to read (repeat; default every camera of the first dataset)")
    p.add_argument("--crop", action="append", default=[], metavar="CAM=X0,Y0,X1,Y1",
                   help="cut this region out of camera CAM before the resize (fractions of the frame; repeat "
                        "per camera), e.g. front=0.2,0.4,0.8,0.85 for a camera that frames the whole cell. "
                        "Default: the region of interest (`roi`) that the site file gave each camera when the "
                        "data was recorded (stored with every episode by `vla record`); CAM=0,0,1,1 keeps the "
                        "whole frame")
    p.add_argument("--success-only", action="store_true",
                   help="train on successful episodes only (outcomes from meta/vla_episodes.jsonl, written by "
                        "`vla record`; for data recorded with --keep-failures)")
    p.add_argument("--num-tokens", type=int, default=0, help="behaviour tokens for ExToken (0 = none; --tokens sets it)")
    p.add_argument("--tokens", metavar="FILE",
                   help="ExToken's behaviour prior (written by `vla tokens`): every frame is trained with its behaviour "
                        "token, so the VLA learns pi(a | s, c); sets --num-tokens to the file's K. The file must cover "
                        "every episode of the datasets")
    p.add_argument("--token-dropout", type=float, default=None,
                   help=f"with --tokens: share of the samples trained with the null token 0 instead of their own "
                        f"(classifier-free-guidance style, so the VLA still acts without a token; default "
                        f"{d['token_dropout']})")
    p.add_argument("--neck", choices=["film", "keypoints"], default=d["neck"],
                   help="camera neck: film = instruction-modulated convolutions -> keypoints (default), "
                        "keypoints = 1x1 convolutions -> keypoints")
    p.add_argument("--head-hidden", type=int, default=d["head_hidden"],
                   help=f"width of the action expert's velocity MLP (default {d['head_hidden']})")
    p.add_argument("--head-depth", type=int, default=d["head_depth"],
                   help=f"hidden layers of the action expert's velocity MLP (default {d['head_depth']})")
    p.add_argument("--head-film", action="store_true",
                   help="FiLM-condition every hidden layer of the action expert on the observation and instruction "
                        "(default: the condition enters its input only)")
    p.add_argument("--fine-blocks", type=int, default=d["fine_blocks"],
                   help=f"trunk blocks before the keypoint map (default {d['fine_blocks']}; 3: stride 4, 24x24 keypoint map "
                        "at 96 px; 5: stride 8, coarser and about 2.4x cheaper to cache)")
    p.add_argument("--aug-views", type=int, default=d["aug_views"],
                   help=f"frozen mode: augmented copies of each frame whose features are cached (default {d['aug_views']})")
    p.add_argument("--shift-pad", type=int, default=d["shift_pad"],
                   help=f"random-shift augmentation, pixels at image size (default {d['shift_pad']}: none, a fixed camera "
                        "keeps every object where it is; 4 for a camera that moves between sessions)")
    p.add_argument("--jitter", type=float, default=d["jitter"],
                   help=f"brightness / contrast jitter, +- (default {d['jitter']})")
    p.add_argument("--labels", choices=["both", "episode", "frame"], default=d["labels"],
                   help="data recorded with `vla record --label-subskills`: train each frame with its episode's "
                        "instruction, its sub-skill's, or both (default both: one model for the tasks and "
                        "their sub-skills)")
    p.add_argument("--paraphrases", metavar="sim|FILE", default=None,
                   help="train on other wordings of the instructions too: each sample gets its instruction or one "
                        "of its wordings, uniformly. 'sim': the sim tasks' paraphrases except the held-out ones "
                        "(vla record --list-tasks; bench/vla_confusion.py --wording held-out measures those); "
                        "FILE: a JSON object {\"instruction\": [\"wording\", ...]}")
    p.add_argument("--opening-weight", type=float, default=d["opening_weight"], metavar="W",
                   help="draw the frames of each episode's first chunk W times as often (default 1): with --tokens, "
                        "where a behaviour mode is decided and the token is the only cue for it")
    p.add_argument("--dagger-rows", choices=["all", "coherent"], default=d["dagger_rows"],
                   help="data recorded with `vla record --dagger`: which rows of a frame's action-chunk target train "
                        "(default all). coherent: row k of frame t only when the expert executed frames t..t+k-1 "
                        "itself, so a frame the policy drove trains its first row only (the later rows are the "
                        "expert's labels along the policy's path, not a plan); demonstration frames keep every row")
    p.add_argument("--balance", choices=["frames", "tasks"], default=d["balance"],
                   help=f"how batches draw frames from several datasets (default {d['balance']}): frames = uniformly over "
                        "all frames (a task with longer episodes gets more of each batch), tasks = an equal share per "
                        "instruction")
    p.add_argument("--lora-rank", type=int, default=d["lora_rank"])
    p.add_argument("--lora-targets", nargs="+", default=None, help="module names for LoRA (default the trunk's 1x1 convs)")
    p.add_argument("--save-every", type=int, default=d["save_every"], help="checkpoint period in steps")
    p.add_argument("--log-every", type=int, default=d["log_every"],
                   help=f"loss.csv / TensorBoard period in steps (default {d['log_every']})")
    p.add_argument("--max-minutes", type=float, default=None, help="stop (and save) after this many minutes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--feature-cache", metavar="DIR", default=os.environ.get("VLA_FEATURE_CACHE"),
                   help="frozen mode: keep each dataset's trunk features in DIR (one file per dataset, named by a hash "
                        "of its frames, the trunk and the augmentation settings) and reuse them in every run that "
                        "trains on that dataset again, also beside other datasets; default $VLA_FEATURE_CACHE, else "
                        "only the run directory's own cache (reused on --resume). About 140 MB per 1000 frames of "
                        "two cameras at 96 px with --aug-views 1")
    p.set_defaults(run=run)


def _parse_crop(text: str) -> tuple[str, float, float, float, float]:
    cam, sep, box = text.partition("=")
    try:
        vals = tuple(float(v) for v in box.split(","))
    except ValueError:
        vals = ()
    if not sep or not cam or len(vals) != 4:
        raise ValueError(f"--crop {text!r}: expected CAM=X0,Y0,X1,Y1 with four fractions, e.g. front=0.2,0.4,0.8,0.85")
    return (cam, *vals)


def _init_settings(path: str) -> dict:
    """The TrainConfig fields that shape the model, read from a compact checkpoint's config.json."""
    import json

    from vla.models import resolve_checkpoint

    with open(os.path.join(resolve_checkpoint(path), "config.json")) as f:
        meta = json.load(f)
    if meta.get("kind") != "compact-flow-vla":
        raise ValueError(f"--init {path}: not a compact VLA checkpoint (kind {meta.get('kind') or meta.get('type')!r})")
    c = meta["config"]
    return {"image_size": c["image_size"], "horizon": c["horizon"], "cameras": tuple(c["cameras"]),
            "crops": tuple(tuple(x) for x in c.get("crops", ())), "fine_blocks": c["fine_blocks"],
            "neck": c.get("neck", "keypoints"), "num_tokens": c["num_tokens"],
            "head_hidden": c.get("hidden", 256), "head_depth": c.get("depth", 3),
            "head_film": c.get("head_film", False)}


def resolve_paraphrases(src: str | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``--paraphrases``: 'sim' (every sim task's training wordings, held-out ones left out) or a
    JSON file ``{instruction: [wording, ...]}``; () when not given."""
    if not src:
        return ()
    if src == "sim":
        from hardware.sim_tasks import TASKS

        return tuple((t.instruction, t.train_wordings[1:]) for t in TASKS.values() if len(t.train_wordings) > 1)
    if not os.path.isfile(src):
        raise FileNotFoundError(f"--paraphrases {src!r}: not 'sim' and no such file")
    with open(src) as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"--paraphrases {src}: not JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"--paraphrases {src}: expected an object {{instruction: [wording, ...]}}, got "
                         f"{type(d).__name__}")
    out = []
    for k, v in d.items():
        if not isinstance(v, list) or not all(isinstance(w, str) and w.strip() for w in v):
            raise ValueError(f"--paraphrases {src}: the value of {k!r} must be a list of non-empty strings, got {v!r}")
        out.append((k, tuple(v)))
    return tuple(out)


def recorded_crops(datasets) -> tuple[tuple[str, float, float, float, float], ...]:
    """The cameras' regions of interest that ``vla record`` stored with the datasets' episodes
    (from the site file's ``roi``), as ``--crop`` entries; () when none were recorded. Datasets
    recorded with different regions must be given ``--crop`` explicitly."""
    from vla.data.episode_log import has_episode_log, read_episode_log

    seen: dict[str, set] = {}
    for d in datasets:
        rows = read_episode_log(d).values() if has_episode_log(d) else []
        for row in rows:
            seen.setdefault(json.dumps(row.get("roi") or {}, sort_keys=True), set()).add(d)
    if len(seen) > 1:
        raise ValueError("the datasets were recorded with different camera regions of interest ("
                         + "; ".join(f"{k} in {sorted(v)}" for k, v in seen.items())
                         + "): pass --crop CAM=X0,Y0,X1,Y1 for each camera")
    rois = json.loads(next(iter(seen))) if seen else {}
    return tuple((c, *map(float, box)) for c, box in sorted(rois.items()))


def run(args) -> int:
    from vla.distributed import finish, is_main_process
    from vla.train import TrainConfig, train

    say = print if is_main_process() else (lambda *a, **k: None)  # under a launcher: the main process speaks

    if args.resume:
        cfg_path = os.path.join(args.resume, "train_config.json")
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f"--resume {args.resume}: no train_config.json there (not a training run)")
        # the run directory is where it is now (it may have been moved or copied since it was started)
        cfg = dataclasses.replace(TrainConfig.from_json(cfg_path), out=args.resume)
        if args.max_minutes is not None:
            cfg = dataclasses.replace(cfg, max_minutes=args.max_minutes)
        summary = train(cfg, resume=True, feature_cache=args.feature_cache)
    else:
        if not args.out:
            raise ValueError("give --out RUN_DIR for a new run (or --resume RUN_DIR)")
        if not args.dataset:
            raise ValueError("give at least one --dataset DIR")
        model_args = {}
        crops = tuple(_parse_crop(c) for c in args.crop)
        if not args.crop and not args.init:
            crops = recorded_crops(args.dataset)
            if crops:
                say("crop (the cameras' regions of interest from the site the data was recorded with; --crop "
                    "overrides): " + " ".join(f"{c[0]}={','.join(f'{v:g}' for v in c[1:])}" for c in crops))
        crops = tuple(c for c in crops if tuple(c[1:]) != (0.0, 0.0, 1.0, 1.0))  # CAM=0,0,1,1: the whole frame
        if args.init:
            model_args = _init_settings(args.init)
            say("--init: model settings from the checkpoint: " + ", ".join(f"{k}={v}" for k, v in model_args.items()))
        cfg = TrainConfig(datasets=tuple(args.dataset), out=args.out, mode=args.mode, steps=args.steps,
                          batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps,
                          horizon=args.horizon, image_size=args.image_size,
                          cameras=tuple(args.cameras) if args.cameras else None, success_only=args.success_only,
                          crops=crops,
                          fine_blocks=args.fine_blocks, head_hidden=args.head_hidden, head_depth=args.head_depth,
                          head_film=args.head_film,
                          num_tokens=args.num_tokens,
                          neck=args.neck, aug_views=args.aug_views, shift_pad=args.shift_pad, jitter=args.jitter,
                          balance=args.balance, opening_weight=args.opening_weight, paraphrases=resolve_paraphrases(args.paraphrases),
                          labels=args.labels, dagger_rows=args.dagger_rows,
                          lora_rank=args.lora_rank,
                          lora_targets=tuple(args.lora_targets) if args.lora_targets else None,
                          save_every=args.save_every, log_every=args.log_every, max_minutes=args.max_minutes,
                          seed=args.seed,
                          threads=args.threads, init=args.init)
        if model_args:
            cfg = dataclasses.replace(cfg, **model_args)
        if args.tokens:
            from vla.data.tokens import load_prior

            k = load_prior(args.tokens).k
            if cfg.num_tokens not in (0, k):
                raise ValueError(f"--tokens {args.tokens} holds K={k} behaviour tokens but the model would have "
                                 f"{cfg.num_tokens} ({'--init' if args.init else '--num-tokens'}); drop "
                                 f"{'--init' if args.init else '--num-tokens'} or give a matching one")
            cfg = dataclasses.replace(cfg, num_tokens=k, tokens=args.tokens,
                                      token_dropout=cfg.token_dropout if args.token_dropout is None else args.token_dropout)
        elif args.token_dropout is not None:
            raise ValueError("--token-dropout is for --tokens (the share of samples trained with the null token)")
        summary = train(cfg, feature_cache=args.feature_cache)
    finish()
    say(json.dumps({k: summary[k] for k in ("run_dir", "steps", "wall_s", "episodes", "frames")}, indent=None))
    say(f"model: {os.path.join(summary['run_dir'], 'model')}  loss curve: "
        f"{os.path.join(summary['run_dir'], 'loss_curve.png')}")
    return 0
