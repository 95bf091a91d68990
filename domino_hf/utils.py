"""Small shared helpers: cache locations and the project layout."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """Persistent state outside the repo (`$DOMINO_HF_CACHE`, default `~/.cache/domino-hf`)."""
    root = Path(os.environ.get("DOMINO_HF_CACHE", Path.home() / ".cache" / "domino-hf"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def project_root() -> Path:
    """The repository root (where `pyproject.toml` lives) for a source checkout."""
    return Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """`../shared/data` beside the checkout (override with `$DOMINO_HF_SHARED_DATA`)."""
    env = os.environ.get("DOMINO_HF_SHARED_DATA")
    return Path(env) if env else project_root().parent / "shared" / "data"


def require_paths(**paths) -> None:
    """Fail fast, before any model loads, when an input file or folder is missing. Keywords are option names
    (`features_dir=` reports `--features-dir`); values are a path, a list of paths, or None (not given)."""
    for option, value in paths.items():
        for path in value if isinstance(value, (list, tuple)) else [value]:
            if path is not None and not Path(path).exists():
                flag = "--" + option.replace("_", "-")
                raise FileNotFoundError(f"{flag} {path}: no such file or folder (relative to {Path.cwd()}).")
