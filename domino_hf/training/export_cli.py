"""`domino export`'s command line: a training run (or checkpoint) -> a Hub-ready draft repo (`export.py`). The
parser imports neither torch nor transformers (help and usage errors come at once); the draft loads when the
command runs."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..cli_common import HelpFormatter, add_command
from ..dtypes import DTYPE_NAMES

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = add_command(
        subparsers, "export",
        help="Turn a training run into a Hub-ready draft repo (and push it).",
        description="Export a trained Domino draft (a run folder, checkpoint, or draft folder) as a Hub repo: "
        "config with auto_map, remote-code files, draft-only safetensors and a model card.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("source", help="Run folder (uses final/ or the newest complete checkpoint) or draft folder.")
    parser.add_argument("--out", "--output_dir", dest="out", required=True, help="Output folder.")
    parser.add_argument(
        "--format", default="hub", choices=("hub", "sglang", "vllm"),
        help="hub: the Hub folder (remote code, model card). sglang: the form SGLang's DFLASH algorithm serves "
             "as it is (Domino head included; bf16, full vocabulary). vllm: a head-less DFlash draft for vLLM's "
             "dflash method. A draft the engine cannot serve as trained is refused with the fix; see "
             "docs/serving.md.",
    )
    parser.add_argument(
        "--dtype", default=None, choices=DTYPE_NAMES,
        help="Weight dtype (default float16 for --format hub, bfloat16 for the engines; upcast at load for fp32 "
             "runs).",
    )
    hub = parser.add_argument_group("Hub")
    hub.add_argument(
        "--push_to_hub", action="store_true",
        help="Upload the folder to --hub_model_id (token from HF_TOKEN or `hf auth login`).",
    )
    hub.add_argument(
        "--hub_model_id", default=None, metavar="REPO_ID",
        help="Hub repo the card's snippet loads and --push_to_hub uploads to (default: the --out folder's name in "
             "your namespace).",
    )
    # The earlier spelling `--push-to-hub REPO_ID`, kept working: --push_to_hub --hub_model_id REPO_ID.
    hub.add_argument("--push-to-hub", dest="push_repo", nargs="?", const=True, default=None, help=argparse.SUPPRESS)
    hub.add_argument(
        "--private", "--hub_private_repo", dest="private", action="store_true", help="Create the Hub repo as private.",
    )
    hub.add_argument(
        "--base_model", dest="base_model", default=None, metavar="HUB_ID",
        help="The card's `base_model`: the target's Hub id (default: the recorded target when it is a Hub id; a local "
             "path is never written).",
    )
    hub.add_argument(
        "--dataset", "--dataset_name", dest="datasets", action="append", default=[], metavar="HUB_ID",
        help="Hub id of a prompt source, for the card's `datasets:` (repeatable).",
    )
    card = parser.add_argument_group("model card")
    card.add_argument(
        "--published_dialect", dest="format", action="store_const", const="sglang",
        help="The same as --format sglang: the official Domino/DFlash checkpoints' config form, which SGLang "
             "serves (no remote code: load it in domino-hf with DominoDraftModel.from_pretrained).",
    )
    card.add_argument(
        "--measured", default=None,
        help="Markdown (or a file of it) for the card's 'Measured' section (e.g. a `domino bench` table).",
    )
    card.add_argument("--notes", default=None,
                      help="Extra Markdown (or a file of it) for the card's 'Training' section.")
    card.add_argument("--license", default="apache-2.0", help="License of the draft weights.")
    parser.set_defaults(func=run)


def run(args) -> int:
    """Entry point of `domino export`; returns the exit code."""
    from .export import export_draft

    repo_id = args.hub_model_id
    if isinstance(args.push_repo, str):  # `--push-to-hub REPO_ID`
        if repo_id and repo_id != args.push_repo:
            logger.error("--push-to-hub %s and --hub_model_id %s name two repos: give one, as --push_to_hub "
                         "--hub_model_id REPO_ID", args.push_repo, repo_id)
            return 2
        repo_id = args.push_repo
    measured, notes = (Path(text).read_text() if text and Path(text).exists() else text
                       for text in (args.measured, args.notes))
    try:
        export_draft(args.source, args.out, dtype=args.dtype, repo_id=repo_id,
                     push=bool(args.push_to_hub or args.push_repo), private=args.private,
                     format=args.format, measured=measured, notes=notes,
                     license=args.license, base_model=args.base_model, datasets=args.datasets)
    except (FileNotFoundError, ValueError) as err:  # no draft at the source; an impossible export
        logger.error("%s", err)
        return 2
    return 0
