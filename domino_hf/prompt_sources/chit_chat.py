"""`chatterbot`: short multilingual chit-chat, the user turns of `chatterbot-corpus` (28 languages)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from importlib import resources

from ..extras import require
from .records import record

logger = logging.getLogger(__name__)


def chatterbot_conversations() -> Iterator[tuple[str, str, int, list[str]]]:
    """`(language, topic, index, lines)` of every chatterbot-corpus conversation, in file order."""
    yaml = require("yaml", "the `chatterbot` and `translate` prompts")
    require("chatterbot_corpus", "the `chatterbot` and `translate` prompts")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = resources.files("chatterbot_corpus").joinpath("data")
    for language in sorted(p.name for p in data.iterdir() if p.is_dir()):
        for path in sorted(data.joinpath(language).iterdir(), key=lambda p: p.name):
            if not path.name.endswith(".yml"):
                continue
            try:
                doc = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
            except yaml.YAMLError as err:
                logger.warning("chatterbot: skipping unreadable %s/%s (%s)", language, path.name, err)
                continue
            for index, lines in enumerate(doc.get("conversations") or []):
                if isinstance(lines, list) and lines and all(isinstance(x, str) and x.strip() for x in lines):
                    yield language, path.name[:-4], index, [x.strip() for x in lines]


def language_name(folder: str) -> str:
    return {"traditionalchinese": "Traditional Chinese", "hinglish": "Hinglish"}.get(folder, folder.capitalize())


def chatterbot() -> Iterator[dict]:
    """The user side (lines 1, 3, …) of every chatterbot-corpus conversation, each distinct first line once."""
    seen: set[str] = set()
    for language, topic, index, lines in chatterbot_conversations():
        turns = lines[0::2]
        if turns[0].casefold() in seen:
            continue
        seen.add(turns[0].casefold())
        yield record("chatterbot", f"{language}/{topic}/{index}", turns, kind="chat", language=language)
