"""`domino lm-eval ARGS`: lm-evaluation-harness's own command line with `--model domino` (`domino_hf.eval`).

lm-eval's parser runs first, with nothing heavy imported: its help and usage errors come at once. Then, as for
every `domino` command, a transformers release outside the supported range is refused in one line (exit code 2);
`domino_hf.eval` registers `--model domino`, and the results of the run gain the draft's per-task numbers
(`eval.evaluate_with_stats`).
"""

from __future__ import annotations

import functools
import importlib
import sys

LM_EVAL_RANGE = ">=0.4.13,<0.5"  # the tested lm-eval releases (the `eval` extra)
INSTALL = f"pip install 'domino-hf[eval]' (lm-eval{LM_EVAL_RANGE})"
_MISSING = f"`domino lm-eval` and `domino_hf.eval` need lm-evaluation-harness: {INSTALL}."


def require_lm_eval():
    """Import lm_eval, or raise an ImportError naming the extra that installs it."""
    try:
        return importlib.import_module("lm_eval")
    except ImportError as err:
        raise ImportError(_MISSING) from err


HELP_WITHOUT_LM_EVAL = """\
usage: domino lm-eval [lm-eval's options] --model domino --model_args pretrained=TARGET,draft=DRAFT --tasks TASKS

lm-evaluation-harness's own command line with `--model domino`: its scores, and the draft's τ per task.
Its options are lm-eval's; they are listed here once lm-eval is installed, and running needs it too:
  {install}
"""


def cli(argv: list[str]) -> int:
    """`domino lm-eval ARGS`: what lm-eval's `cli_evaluate` does, with the range check and `--model domino`
    between parsing and running; returns the exit code. Without lm-eval, `--help` says what to install (exit 0)
    and anything else says it as an error (exit 2)."""
    try:
        lm_eval = require_lm_eval()
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging
    except ImportError as err:
        if not argv or any(arg in ("-h", "--help") for arg in argv):
            print(HELP_WITHOUT_LM_EVAL.format(install=INSTALL), end="")
            return 0
        print(f"domino lm-eval: {err}", file=sys.stderr)
        return 2
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]  # lm-eval's parser reads sys.argv
    try:
        setup_logging()
        parser = HarnessCLI()
        args = parser.parse_args()
        from .cli import refuse_unsupported_transformers

        if refuse_unsupported_transformers("lm-eval"):
            return 2
        from . import eval as domino_eval  # registers `--model domino`

        original = lm_eval.simple_evaluate
        lm_eval.simple_evaluate = functools.partial(domino_eval.evaluate_with_stats, original)
        try:
            parser.execute(args)
        finally:
            lm_eval.simple_evaluate = original
    except SystemExit as exit:
        return int(exit.code or 0)
    finally:
        sys.argv = saved
    return 0
