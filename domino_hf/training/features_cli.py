"""`domino features`'s command line: cache the target's context features of training data (`features.py`). The
parser imports neither torch nor transformers; the target and the extraction load when the command runs."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..cli_common import (
    HelpFormatter,
    add_command,
    add_device_argument,
    add_target_arguments,
    target_device,
    target_kwargs,
)
from ..dtypes import DTYPE_CHOICES, resolve_dtype
from ..utils import require_paths
from .choices import CONFIG, STORES
from .decontaminate import BenchmarkFilter
from .train_cli import add_draft_config_arguments, draft_sizing

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add `domino features` to the CLI."""
    parser = add_command(
        subparsers, "features",
        help="Cache the target's context features of training data on disk (resumable).",
        description="Run the frozen target once over `domino regen` data and store the hidden states of the "
        "draft's target_layer_ids, so `domino train --features DIR` needs no target forward. The draft config "
        "(from --config, else derived from the target and the sizing options, as `domino train` does) is written "
        f"beside the shards as {CONFIG}; `domino train --features DIR` uses it.",
        formatter_class=HelpFormatter,
    )
    add_target_arguments(parser)
    add_device_argument(parser)
    parser.add_argument(
        "--data", "--train_file", dest="data", nargs="+", required=True,
        help="JSONL file(s) written by `domino regen`.",
    )
    parser.add_argument(
        "--out", "--output_dir", dest="out", required=True,
        help="Feature folder (shards, features.json, draft_config.json).",
    )
    parser.add_argument(
        "--max_length", "--max_seq_length", dest="max_length", type=int, default=3072,
        help="Same truncation as `domino train`.",
    )
    parser.add_argument("--limit", type=int, default=None, help="Only the first N examples (default: all).")
    parser.add_argument(
        "--batch_size", "--per_device_batch_size", dest="batch_size", type=int, default=8,
        help="Sequences per target forward.",
    )
    parser.add_argument("--shard_size", type=int, default=64, help="Examples per shard file.")
    parser.add_argument("--store", default="bfloat16", choices=STORES,
                        help="On-disk format: bfloat16 (fp32's range, 2 bytes/value), float16-scaled (fp16 with a "
                        "power-of-two scale per layer and example), float32 (exact, 4 bytes) (default: %(default)s).")
    parser.add_argument("--kl_topk", type=int, default=0, metavar="K",
                        help="Also store the target's K most probable next tokens at every response position (int32 "
                        "ids + float16 log-probs: 6·K bytes a token), for `domino train --loss kl`; 0 = none "
                        "(default: %(default)s).")
    parser.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES,
                        help="Dtype of the target's forward; bfloat16 is several times faster on CPUs with native "
                        "bf16 (and many times slower on others); auto = bfloat16 where it is fast, else float32 "
                        "(default: %(default)s).")
    parser.add_argument("--num_processes", dest="num_processes", type=int,
                        default=int(os.environ.get("WORLD_SIZE", 1)),
                        help="Split the shards between this many processes writing the same --out, each started "
                        "with its own --process_index (default: $WORLD_SIZE as set by torchrun or accelerate "
                        "launch, else 1).")
    parser.add_argument("--process_index", dest="process_index", type=int,
                        default=int(os.environ.get("RANK", 0)),
                        help="This process's share: shards index, index + N, … (default: $RANK, else 0).")
    add_draft_config_arguments(
        parser, "Draft config JSON (e.g. hub_configs/…json) whose target_layer_ids are the layers stored; else "
        "derived from the target. Written beside the features with the sizes below: the draft `domino train "
        "--features DIR` trains unless told otherwise.")
    parser.set_defaults(func=run)


def run(args) -> int:
    """Entry point of `domino features`; returns the exit code."""
    from .. import targets
    from .dataset import load_training_data
    from .features import NonFiniteFeatures, check_process, extract_features
    from .recipe import draft_config

    try:  # bad options and missing inputs fail before the (slower) target load
        check_process(args.process_index, args.num_processes)
        require_paths(data=args.data, config=args.config)
        device = target_device(args)
        target, tokenizer = targets.load_target(args.target, dtype=resolve_dtype(args.dtype, device), device=device,
                                        **target_kwargs(args))
        vocab = target.config.get_text_config().vocab_size
        dataset = load_training_data(
            args.data, args.max_length, vocab, args.limit, exclude=BenchmarkFilter.for_benchmarks(),
        )
    except (OSError, ImportError, RuntimeError, ValueError) as err:  # missing/empty file, package, model; no Hub
        logger.error("%s", err)
        return 2
    config = draft_config(target, tokenizer, dataset, **draft_sizing(args))
    try:
        extract_features(target, dataset, config.target_layer_ids, args.out, shard_size=args.shard_size,
                         batch_size=args.batch_size, store=args.store, draft_config=config, kl_topk=args.kl_topk,
                         process=(args.process_index, args.num_processes))
    except (NonFiniteFeatures, ValueError) as err:
        logger.error("%s", err)
        return 2
    logger.info("Draft config for these features: %s", Path(args.out) / CONFIG)
    return 0
