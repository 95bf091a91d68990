"""`domino` command line: regen → train → export → bench.

Each subcommand lives beside the code it drives and registers itself through `register(subparsers)`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

SUBCOMMANDS = (
    "domino_hf.training.regen",
    "domino_hf.training.features",
    "domino_hf.training.train",
    "domino_hf.training.export",
    "domino_hf.bench.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="domino",
        description="Domino speculative decoding for 🤗 Transformers: regenerate data with a target, train a "
        "draft, export it as a Hub repo, and benchmark it against the alternatives.",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    subparsers = parser.add_subparsers(dest="command", metavar="<command>")
    for module_name in SUBCOMMANDS:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
