"""`domino train`'s command line (also `python -m domino_hf.train`): the options, parsed into a `TrainJob` that
`recipe.run_training` carries out. Options also answer to the 🤗 Trainer scripts' names (--output_dir, …).
The parser imports neither torch nor transformers (help and usage errors come at once); the recipe loads when the
command runs.
"""

from __future__ import annotations

import argparse
import logging
import os

from ..cli_common import (
    ArgumentParser,
    BooleanFlag,
    HelpFormatter,
    add_command,
    add_chat_template_argument,
    add_target_arguments,
    target_kwargs,
)
from .checkpoint import FINAL
from .choices import BIG_VOCAB, DEFAULT_DRAFT_VOCAB, DEFAULT_TOPK, LOSSES

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = add_command(
        subparsers, "train",
        help="Train a Domino draft for a target on regenerated data.",
        description="Train a Domino draft (DFlash backbone + Domino head) with teacher forcing and the "
        "base-anchored curriculum. Single process here; `accelerate launch -m domino_hf.train …` for many GPUs. "
        "Options also answer to the 🤗 Trainer scripts' names (--output_dir, --learning_rate, …).",
        formatter_class=HelpFormatter,
    )
    add_train_arguments(parser)
    parser.set_defaults(func=run)


NUM_LAYERS_HELP = "Draft decoder layers (default 1 when derived)."


def add_draft_config_arguments(parser: argparse.ArgumentParser, config_help: str, num_layers_help=NUM_LAYERS_HELP):
    """The draft config's options, taken by both `domino train` and `domino features` (which writes the config):
    `--config`, `--num_layers`, `--block_size`, `--draft_vocab_size`, `--no_head`; returns their argument group."""
    draft = parser.add_argument_group("draft architecture")
    draft.add_argument("--config", "--config_name", dest="config", default=None, help=config_help)
    draft.add_argument("--num_layers", type=int, default=None, help=num_layers_help)
    draft.add_argument("--block_size", type=int, default=None, help="Slots per parallel draft block (default 16).")
    draft.add_argument(
        "--draft_vocab_size", type=int, default=None,
        help="Restrict drafting to the K most frequent response tokens of the data (FR-Spec); coverage is reported. "
             f"Default: {DEFAULT_DRAFT_VOCAB} when the target's vocabulary has over {BIG_VOCAB:,} tokens (said in the "
             "log), else the whole vocabulary; 0 = always the whole vocabulary.",
    )
    draft.add_argument("--no_head", action="store_true", help="Ablation: no Domino head (pure DFlash draft).")
    return draft


def draft_sizing(args: argparse.Namespace) -> dict:
    """`recipe.draft_config`'s sizing keywords from the options of `add_draft_config_arguments`."""
    return {"config_path": args.config, "num_layers": args.num_layers, "block_size": args.block_size,
            "draft_vocab_size": args.draft_vocab_size, "use_head": not args.no_head}


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    add_target_arguments(target)
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data", "--train_file", dest="data", nargs="+", required=True,
        help="JSONL file(s) written by `domino regen`.",
    )
    data.add_argument(
        "--max_length", "--max_seq_length", dest="max_length", type=int, default=3072,
        help="Truncate prompt+response to this many tokens.",
    )
    data.add_argument("--limit", type=int, default=None, help="Use only the first N examples.")
    data.add_argument(
        "--features", default=None,
        help="Context features cached by `domino features` (no target forward while training).",
    )
    draft = add_draft_config_arguments(
        parser, "Draft config JSON (e.g. hub_configs/…json); else the one beside --features, else derived from the "
        "target (head sized by `head_sizes_for`).",
        NUM_LAYERS_HELP + " With --init from:DIR, a larger number deepens that draft (the new layers start as "
        "identity).")
    draft.add_argument(
        "--new_layer_lr_scale", type=float, default=1.0,
        help="Learning-rate multiplier for the layers --num_layers adds to an --init from: draft (they start at "
             "zero output and at a fine-tuning rate barely move in a short run).",
    )
    draft.add_argument(
        "--init", default="random",
        help="Draft initialisation: `random`, `target-layers` (copy the target's last layers), or `from:DIR` to "
             "continue from a trained draft.",
    )
    recipe = parser.add_argument_group("recipe")
    recipe.add_argument(
        "--out", "--output_dir", dest="out", required=True,
        help="Run folder: checkpoints, logs, and the final draft in OUT/final.",
    )
    recipe.add_argument(
        "--epochs", "--num_train_epochs", dest="epochs", type=float, default=3.0,
        help="Passes over the data (paper: 3–6).",
    )
    recipe.add_argument(
        "--max_steps", dest="max_steps", type=int, default=-1,
        help="Stop after N optimizer steps (overrides --epochs when > 0).",
    )
    recipe.add_argument(
        "--batch_size", "--per_device_train_batch_size", dest="batch_size", type=int, default=4,
        help="Sequences per device per step.",
    )
    recipe.add_argument(
        "--grad_accum", "--gradient_accumulation_steps", dest="grad_accum", type=int, default=1,
        help="Gradient accumulation steps (global batch = devices × batch × accum).",
    )
    recipe.add_argument(
        "--lr", "--learning_rate", dest="lr", type=float, default=6e-4,
        help="Peak AdamW learning rate (cosine schedule, 4%% warmup).",
    )
    recipe.add_argument(
        "--num_anchors", dest="num_anchors", type=int, default=32,
        help="Random anchors (blocks) per sequence, inside the response.",
    )
    recipe.add_argument(
        "--gamma", type=float, default=None, help="Position-weight decay γ in exp(-k/γ) (default by block size).",
    )
    recipe.add_argument("--no_curriculum", action="store_true", help="Ablation: train on the final loss only (λ = 0).")
    recipe.add_argument(
        "--loss", choices=LOSSES, default="ce",
        help="ce: cross entropy on the target's own tokens (the paper's); kl: KL divergence from the target's "
             "next-token distribution (its --kl_topk most probable tokens, renormalised over the draft vocabulary), "
             "from its forward in each step or from --features extracted with `domino features --kl_topk`.",
    )
    recipe.add_argument(
        "--kl_topk", type=int, default=DEFAULT_TOPK, metavar="K",
        help="With --loss kl: how many of the target's most probable next tokens make the soft label.",
    )
    recipe.add_argument(
        "--kl_temperature", type=float, default=1.0, metavar="T",
        help="With --loss kl: both distributions at temperature T, the loss scaled by T².",
    )
    recipe.add_argument(
        "--weight_decay", dest="weight_decay", type=float, default=0.0,
        help="AdamW weight decay (the paper's recipe: 0).",
    )
    recipe.add_argument(
        "--feature_noise", type=float, default=0.0, metavar="SIGMA",
        help="Regulariser: multiply each context feature by (1 + SIGMA·N(0, 1)) in training, so that the draft "
             "cannot key on exact hidden-state values of the answers it has seen (0 = off; e.g. 0.1).",
    )
    recipe.add_argument("--seed", type=int, default=0, help="Seed for init, data order and anchors.")
    recipe.add_argument(
        "--group_by_length", dest="group_by_length", action="store_true",
        help="Batch examples of similar length (transformers' grouping, ordered by seed and epoch): far less "
             "padding on data of mixed lengths (1.2x a step on SmolLM2's mixed training data, docs/experiments.md).",
    )
    run_group = parser.add_argument_group("run")
    run_group.add_argument(
        "--resume_from_checkpoint", "--resume", dest="resume", nargs="?", const=True, default=False,
        metavar="CHECKPOINT",
        help="Continue from CHECKPOINT (a checkpoint-N folder), or without a value from the newest complete one in "
             "--out.",
    )
    run_group.add_argument(
        "--save_steps", dest="save_steps", type=int, default=200,
        help="Checkpoint every N steps (atomic; resumable).",
    )
    run_group.add_argument(
        "--save_total_limit", dest="save_total_limit", type=int, default=2,
        help="Keep at most N checkpoints in --out, the oldest deleted first (0: keep every one, for a curve of "
             "τ against steps).",
    )
    run_group.add_argument(
        "--logging_steps", dest="logging_steps", type=int, default=10,
        help="Log losses/accuracies/throughput every N steps.",
    )
    run_group.add_argument(
        "--bf16", action=BooleanFlag, default=None,
        help="bf16 mixed precision (fp32 master weights). Default: on with a GPU that supports it; on a CPU with "
             "native bf16 (AMX, AVX512-BF16) --bf16 trains ~1.5x faster (docs/experiments.md), on other CPUs many "
             "times slower.",
    )
    run_group.add_argument(
        "--report_to", dest="report_to", default="none",
        help="Trainer integrations: none, tensorboard, wandb, …",
    )
    run_group.add_argument(
        "--probe_prompts", default=None,
        help="Held-back prompt source; at each checkpoint, measure τ by real greedy decoding on a few of them "
             "(probe_tau) and the draft's own τ replayed on those answers (probe_replay_tau).",
    )
    run_group.add_argument("--probe_num", type=int, default=6, help="Prompts in the τ probe.")
    run_group.add_argument("--probe_max_new_tokens", type=int, default=64, help="New tokens per probe prompt.")
    add_chat_template_argument(run_group)


def train_job(args: argparse.Namespace):
    """The `recipe.TrainJob` that `domino train`'s options ask for (a ValueError when the recipe's settings are
    bad)."""
    from .recipe import TrainJob, TrainSettings

    settings = TrainSettings(
        output_dir=args.out, epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size,
        grad_accum=args.grad_accum, learning_rate=args.lr, num_anchors=args.num_anchors, gamma=args.gamma,
        curriculum=not args.no_curriculum, logging_steps=args.logging_steps, save_steps=args.save_steps,
        save_total_limit=args.save_total_limit or None, seed=args.seed, report_to=args.report_to, resume=args.resume,
        loss=args.loss, kl_topk=args.kl_topk,
        kl_temperature=args.kl_temperature, bf16=args.bf16, group_by_length=args.group_by_length,
        weight_decay=args.weight_decay, feature_noise=args.feature_noise,
    )
    sizing = draft_sizing(args)
    return TrainJob(
        target=args.target, data=args.data, settings=settings, target_options=target_kwargs(args),
        max_length=args.max_length, limit=args.limit, features=args.features, config=sizing.pop("config_path"),
        **sizing, init=args.init, new_layer_lr_scale=args.new_layer_lr_scale, probe_prompts=args.probe_prompts,
        probe_num=args.probe_num, probe_max_new_tokens=args.probe_max_new_tokens, chat_template=args.chat_template,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of `domino train`; returns the exit code (2: bad options or inputs; 3: non-finite training)."""
    from .features import NonFiniteFeatures
    from .recipe import TrainSetupError, run_training
    from .trainer import NonFiniteTraining

    try:
        job = train_job(args)
    except ValueError as err:  # the settings validate themselves
        logger.error("%s (--weight_decay, --feature_noise)", err)
        return 2
    try:
        trainer = run_training(job)
    except TrainSetupError as err:
        logger.error("%s", err)
        return 2
    except (NonFiniteTraining, NonFiniteFeatures) as err:
        logger.error("%s", err)
        return 3
    trainer.accelerator.end_training()  # trackers, and the process group of a multi-process run
    logger.info("Final draft written to %s", os.path.join(args.out, FINAL))
    return 0


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m domino_hf.train", formatter_class=HelpFormatter,
                                     description="Train a Domino draft (see `domino train --help`).")
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args)
