"""`vla reward`: train and evaluate success classifiers, the learned reward of real-robot RL
sessions (see rewards/success_classifier.py)."""

from __future__ import annotations

import argparse
import dataclasses


def add_parser(sub, name: str, help_: str) -> None:
    from rewards.classifier_config import ClassifierConfig, ClassifierTrainConfig

    d = {f.name: f.default for f in dataclasses.fields(ClassifierTrainConfig)}
    m = {f.name: f.default for f in dataclasses.fields(ClassifierConfig) if f.default is not dataclasses.MISSING}
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "A real robot has no simulator to say when a task succeeded. `vla reward train` trains a binary "
        "success classifier on camera frames of recorded LeRobot v3 datasets (a frozen ImageNet "
        "EfficientNet-Lite0 and a small head per camera); `vla rl --reward classifier:DIR` then uses it "
        "as the reward: 1 and the episode ends when it says success. Labels come from each dataset's "
        "meta/vla_episodes.jsonl (written by `vla record`): the last --last-k frames of a successful "
        "episode are positives, every other frame and every frame of a failed episode negatives."),
        epilog="""\
examples:
  vla record --robot my_lab.yaml --teleop keyboard --instruction "fold the towel" --keep-failures --root data/towel
  vla reward train --dataset data/towel --out runs/towel_succ --steps 1000
  vla reward train --dataset data/towel --dataset data/towel_fails --out runs/towel_succ --camera wrist
  vla reward eval --classifier runs/towel_succ --dataset data/towel_heldout
  vla rl --robot my_lab.yaml --reward classifier:runs/towel_succ ...

Record failed episodes too (--keep-failures) and hold the robot in the success state for a moment
before pressing Enter: near-misses are the negatives that matter. The threshold is chosen on held-out
episodes for high precision (a false positive ends an episode and rewards a failure); the run
directory gets report.json and pr_curve.png.
""")
    rsub = p.add_subparsers(dest="reward_command", metavar="ACTION", required=True)

    def labels(q) -> None:
        q.add_argument("--dataset", action="append", default=[], metavar="DIR", required=True,
                       help="a LeRobot v3 dataset directory with meta/vla_episodes.jsonl (repeat for several)")
        q.add_argument("--last-k", type=int, default=None,
                       help="frames at the end of a successful episode labelled success "
                            "(train default 2; eval default: the classifier's)")
        q.add_argument("--margin", type=int, default=None,
                       help="frames before those left out, neither success nor failure "
                            "(train default 3; eval default: the classifier's)")

    t = rsub.add_parser("train", help="train a success classifier on labelled dataset frames",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=(
                            "Train a success classifier: trunk features of every frame (and --aug-views "
                            "augmented copies) are computed once, the head trains on class-balanced batches, "
                            "episodes are split into train / validation, the head with the lowest validation "
                            "loss is kept and the threshold is chosen on validation for --target-precision."),
                        epilog="examples:\n  vla reward train --dataset data/towel --out runs/towel_succ --steps 1000\n")
    labels(t)
    t.add_argument("--out", required=True, help="output directory (model, report.json, pr_curve.png)")
    t.add_argument("--steps", type=int, default=d["steps"], help=f"optimiser steps (default {d['steps']})")
    t.add_argument("--camera", action="append", dest="cameras", metavar="NAME",
                   help="camera to use (repeat; default every camera of the first dataset)")
    t.add_argument("--image-size", type=int, default=m["image_size"],
                   help=f"frames are resized to this (px, default {m['image_size']})")
    t.add_argument("--batch-size", type=int, default=d["batch_size"])
    t.add_argument("--lr", type=float, default=d["lr"])
    t.add_argument("--aug-views", type=int, default=d["aug_views"],
                   help=f"augmented copies of each training frame (default {d['aug_views']})")
    t.add_argument("--val-fraction", type=float, default=d["val_fraction"],
                   help=f"episodes held out for validation and the threshold (default {d['val_fraction']})")
    t.add_argument("--target-precision", type=float, default=d["target_precision"],
                   help=f"validation precision the threshold must reach (default {d['target_precision']})")
    t.add_argument("--seed", type=int, default=d["seed"])
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    t.set_defaults(run=run_train)

    e = rsub.add_parser("eval", help="accuracy, precision and recall of a classifier on a dataset",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=(
                            "Score a trained success classifier on labelled frames of one or more datasets "
                            "(ideally episodes it never saw), at its threshold or --threshold."),
                        epilog="examples:\n  vla reward eval --classifier runs/towel_succ --dataset data/towel_heldout\n")
    e.add_argument("--classifier", required=True, help="directory written by `vla reward train`")
    labels(e)
    e.add_argument("--threshold", type=float, default=None, help="P(success) threshold (default: the classifier's)")
    e.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    e.set_defaults(run=run_eval)


def _print_metrics(name: str, m: dict) -> None:
    prec = "n/a (nothing predicted positive)" if m["tp"] + m["fp"] == 0 else f"{m['precision']:.3f}"
    print(f"{name}: {m['n']} frames ({m['positives']} success) at threshold {m['threshold']:.3f}\n"
          f"  accuracy {m['accuracy']:.3f}  balanced accuracy {m['balanced_accuracy']:.3f}  "
          f"precision {prec}  recall {m['recall']:.3f}\n"
          f"  confusion: tp {m['tp']}  fp {m['fp']}  tn {m['tn']}  fn {m['fn']}")


def run_train(args) -> int:
    import json
    import os

    from rewards.success_classifier import ClassifierConfig, ClassifierTrainConfig, label_frames, train_classifier

    if os.path.isfile(os.path.join(args.out, "config.json")):
        raise ValueError(f"{args.out} already holds a classifier: choose another --out")
    tc = ClassifierTrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, aug_views=args.aug_views,
                               val_fraction=args.val_fraction, target_precision=args.target_precision,
                               seed=args.seed, threads=args.threads)
    last_k = 2 if args.last_k is None else args.last_k
    margin = 3 if args.margin is None else args.margin
    data = label_frames(args.dataset, args.image_size, args.cameras, last_k=last_k, margin=margin)
    cfg = ClassifierConfig(cameras=tuple(args.cameras or sorted(data.images)), image_size=args.image_size)
    label_rule = {"last_k": last_k, "margin": margin, "datasets": [os.path.abspath(d) for d in args.dataset]}
    rep = train_classifier(data, args.out, cfg, tc, extra={"labels": label_rule})
    _print_metrics("validation", rep["val"])
    if not rep["target_precision_met"]:
        print(f"WARNING: no threshold reached precision {tc.target_precision:g} on the validation episodes; "
              f"record more episodes (failures and near-misses too)")
    print(json.dumps({k: rep[k] for k in ("out_dir", "threshold", "train_frames", "train_positives", "val_frames",
                                          "val_episodes", "best_step", "wall_s")}))
    print(f"model: {rep['out_dir']}  report: {os.path.join(rep['out_dir'], 'report.json')}  "
          f"plot: {os.path.join(rep['out_dir'], 'pr_curve.png')}")
    return 0


def run_eval(args) -> int:
    import json

    import torch

    from rewards.success_classifier import evaluate_classifier, label_frames, read_meta

    if args.threads:
        torch.set_num_threads(args.threads)
    meta = read_meta(args.classifier)
    rule = meta.get("labels", {})
    last_k = args.last_k if args.last_k is not None else rule.get("last_k", 2)
    margin = args.margin if args.margin is not None else rule.get("margin", 3)
    cams = list(meta["config"]["cameras"])
    data = label_frames(args.dataset, meta["config"]["image_size"], cams, last_k=last_k, margin=margin)
    m = evaluate_classifier(args.classifier, data, threshold=args.threshold)
    _print_metrics(f"{len(args.dataset)} dataset(s), {m['episodes']} episode(s)", m)
    print(json.dumps({k: m[k] for k in ("accuracy", "balanced_accuracy", "precision", "recall", "average_precision",
                                        "threshold", "n")}))
    return 0
