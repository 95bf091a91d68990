"""Prompts as the token ids a model generates from: chat messages, through a chat template or as plain text."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def to_messages(turns_or_messages: str | Sequence[str] | Sequence[dict], system: str | None = None) -> list[dict]:
    """Chat messages from a prompt: a string, alternating user/assistant turns (user first), or messages."""
    items = [turns_or_messages] if isinstance(turns_or_messages, str) else list(turns_or_messages)
    if not items:
        raise ValueError("empty conversation")
    if all(isinstance(item, dict) for item in items):
        messages = [dict(item) for item in items]
    elif all(isinstance(item, str) for item in items):
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(items)]
    else:
        raise TypeError("pass either strings (turns) or message dicts, not a mix")
    if system is not None:
        messages = [{"role": "system", "content": system}, *messages]
    return messages


_PLAIN_TEXT_LOGGED: set[str] = set()


def check_chat_template(chat_template: str) -> None:
    """Fail fast on a `--chat_template` that is neither `auto`, `none` nor an existing file."""
    if chat_template not in ("auto", "none") and not Path(chat_template).expanduser().is_file():
        raise FileNotFoundError(
            f"--chat_template {chat_template}: no such file; pass `auto`, `none` or a Jinja template file.")


@functools.lru_cache(maxsize=8)
def _read_template(path: str) -> str:
    check_chat_template(path)
    return Path(path).expanduser().read_text(encoding="utf-8")


def resolve_chat_template(tokenizer: Any, chat_template: str = "auto") -> str | None:
    """The template `chat_input_ids` formats with: "tokenizer" for the tokenizer's own, a Jinja string from a
    file, or None for plain text. `auto` without a tokenizer template logs the plain-text fallback once."""
    if chat_template == "none":
        return None
    if chat_template != "auto":
        return _read_template(chat_template)
    if getattr(tokenizer, "chat_template", None):
        return "tokenizer"
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    if name not in _PLAIN_TEXT_LOGGED:
        _PLAIN_TEXT_LOGGED.add(name)
        logger.warning(
            "%s has no chat template: prompts are plain text and answers are the base model's continuations "
            "(pass --chat_template PATH for a chat format, --chat_template none to silence this, --stop to end "
            "answers at a text)", name,
        )
    return None


def chat_input_ids(
    tokenizer: Any,
    turns_or_messages: str | Sequence[str] | Sequence[dict],
    system: str | None = None,
    chat_template: str = "auto",
) -> list[int]:
    """Token ids of a prompt ready for generation (the assistant turn is opened).

    `chat_template` (see `resolve_chat_template`): a chat template is applied with `add_generation_prompt=True`
    and `enable_thinking=False` (Qwen3 style templates answer without a reasoning block; templates that do
    not know the flag ignore it); its text already holds its special tokens, so it is tokenized without adding
    more. Plain text is the turns joined by blank lines, with the tokenizer's usual special tokens.
    """
    messages = to_messages(turns_or_messages, system)
    template = resolve_chat_template(tokenizer, chat_template)
    if template is not None:
        text = tokenizer.apply_chat_template(
            messages, chat_template=None if template == "tokenizer" else template, tokenize=False,
            add_generation_prompt=True, enable_thinking=False,
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    text = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer(text)["input_ids"])
