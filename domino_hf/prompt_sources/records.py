"""What every built source shares: a record with a stable id, a fixed choice among wordings, and paragraphs."""

from __future__ import annotations

import hashlib
import re
import zlib


def record(source: str, key: str, turns: list[str], **meta) -> dict:
    """One raw record, its id `<source>:<key>:<8 hex digits of the text's hash>`."""
    digest = hashlib.sha1("\x1f".join(turns).encode("utf-8")).hexdigest()[:8]
    return {"id": f"{source}:{key}:{digest}", "turns": turns, **meta}


def pick(options: tuple, key: str, salt: str = ""):
    """A fixed, evenly spread choice among `options` for `key`."""
    return options[zlib.crc32((salt + key).encode("utf-8")) % len(options)]


def split_paragraphs(text: str) -> list[str]:
    """The non-blank paragraphs of `text` (split at blank lines)."""
    return [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]
