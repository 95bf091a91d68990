"""`domino` command line: regen → train → export → bench.

Each subcommand lives beside the code it drives and registers itself through `register(subparsers)`; only the
subcommand being run is imported (`domino --help` lists them all from `SUBCOMMANDS` without importing any). Those
modules build their parsers without torch, transformers or `domino_hf.modeling`, which load inside the command
once the arguments parse: `domino <command> --help` and usage errors come at once. On a transformers release
outside the supported range, a command that runs says so in one line (`refuse_unsupported_transformers`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .cli_common import ArgumentParser, HelpFormatter

# name -> (module with `register(subparsers)`, one-line help for `domino --help`)
SUBCOMMANDS = {
    "regen": ("domino_hf.training.regen_cli", "Have the target answer prompts: the training data for a draft."),
    "self-prompts": ("domino_hf.training.self_prompts", "Have the target write user prompts: a training source."),
    "features": ("domino_hf.training.features_cli",
                 "Cache the target's context features of training data (resumable)."),
    "train": ("domino_hf.training.train_cli", "Train a Domino draft for a target on regenerated data."),
    "export": ("domino_hf.training.export_cli", "Turn a training run into a Hub-ready draft repo (and push it)."),
    "bench": ("domino_hf.bench.cli", "Benchmark Domino against plain, prompt-lookup, assisted and DFlash decoding."),
}
# Commands whose arguments belong to another tool's command line, handed over unparsed: name -> (module with
# `cli(argv) -> int`, one-line help).
PASSTHROUGH = {
    "lm-eval": ("domino_hf.eval_cli", "lm-evaluation-harness's command line with `--model domino` (scores, with τ)."),
}
LOG_LEVELS = ("debug", "info", "warning", "error")


def _command_position(argv: list[str]) -> int | None:
    """Where the subcommand's name is in `argv` (after the global options), or None."""
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in ("--log_level", "--log-level"):
            skip = True
        elif not arg.startswith("-"):
            return i
    return None


def requested_command(argv: list[str]) -> str | None:
    """The subcommand named in `argv` (after the global options), or None."""
    position = _command_position(argv)
    return argv[position] if position is not None and argv[position] in SUBCOMMANDS else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `domino` parser with `command`'s full options (its module imported); the other subcommands are
    listed by name and help only. `command=None` imports none of them."""
    parser = ArgumentParser(
        prog="domino",
        description="Domino speculative decoding for 🤗 Transformers: regenerate data with a target, train a "
        "draft, export it as a Hub repo, and benchmark it against the alternatives. "
        "`domino <command> --help` shows a command's options.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--log_level", default="info", choices=LOG_LEVELS, help="Logging level.")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if name == command:
            importlib.import_module(module_name).register(subparsers)
        else:
            subparsers.add_parser(name, help=help_text)
    for name, (_, help_text) in PASSTHROUGH.items():
        subparsers.add_parser(name, help=help_text + " `domino lm-eval --help` shows its options.")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    position = _command_position(argv)
    if position is not None and argv[position] in PASSTHROUGH:
        return _run_passthrough(argv[position], argv[position + 1:])
    parser = build_parser(requested_command(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    if refuse_unsupported_transformers(args.command):
        return 2
    return int(args.func(args) or 0)


def _run_passthrough(name: str, argv: list[str]) -> int:
    """Hand `argv` to the tool behind `name` (its `--help` is the tool's own); its module says a missing optional
    dependency or an unsupported transformers in one line on stderr."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(importlib.import_module(PASSTHROUGH[name][0]).cli(argv) or 0)


def refuse_unsupported_transformers(command: str) -> bool:
    """When the installed transformers is outside the supported range, print one line naming it and return True.
    Checked once a command's arguments parse, before it runs; `--help` works on any release."""
    from .modeling.dispatch_domino import UnsupportedTransformersError, check_transformers_version

    import transformers

    try:
        check_transformers_version(transformers.__version__)
    except UnsupportedTransformersError as err:
        print(f"domino {command}: {err}", file=sys.stderr)
        return True
    return False


if __name__ == "__main__":
    sys.exit(main())
