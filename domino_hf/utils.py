"""Small shared helpers: cache locations and the project layout."""

from __future__ import annotations

import os
import subprocess
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


def require_paths(**paths) -> None:
    """Fail fast, before any model loads, when an input file or folder is missing. Keywords are option names
    (`features_dir=` reports `--features-dir`); values are a path, a list of paths, or None (not given)."""
    for option, value in paths.items():
        for path in value if isinstance(value, (list, tuple)) else [value]:
            if path is not None and not Path(path).exists():
                flag = "--" + option.replace("_", "-")
                raise FileNotFoundError(f"{flag} {path}: no such file or folder (relative to {Path.cwd()}).")


def looks_like_local_path(name: str) -> bool:
    """Whether `name` can only mean a local path: it starts with `.`, `/` or `~`, or has other than exactly one
    `/` (a Hub id is `name` or `owner/name`). Such a name that does not exist is a typo, not a Hub id."""
    return (name.startswith((".", "/", "~")) or name.endswith("/") or name.count("/") > 1
            or os.sep != "/" and os.sep in name)


def git_tracked(path: str | Path) -> bool:
    """Whether `path` is a file tracked by git (False outside a repository or without git)."""
    path = Path(path)
    if not path.is_file():
        return False
    try:
        result = subprocess.run(["git", "ls-files", "--error-unmatch", path.name], cwd=path.parent,
                                capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0
