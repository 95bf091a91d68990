"""`translate`: translation requests in both directions, over chatterbot's sentences and the prose of the
Python documentation."""

from __future__ import annotations

from collections.abc import Iterator

from .chit_chat import chatterbot_conversations, language_name
from .python_stdlib import topics
from .records import pick, record, split_paragraphs

LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Russian", "Chinese", "Japanese",
             "Korean", "Arabic", "Hindi", "Turkish", "Polish", "Swedish", "Indonesian")
TRANSLATE_TASKS = (
    "Translate into {target}:\n\n{text}",
    "Translate the following {src} text into {target}.\n\n{text}",
    'How would you say "{text}" in {target}?',
    "{text}\n\nTranslate the text above from {src} to {target}.",
    "Please translate this sentence into {target}: {text}",
)


def _prose(paragraph: str) -> bool:
    """A paragraph of running text (no code, grammar or list layout)."""
    return (100 <= len(paragraph) <= 600 and not paragraph.startswith((" ", "*", "-"))
            and "::=" not in paragraph and ">>>" not in paragraph and paragraph.rstrip().endswith((".", ":")))


def translate() -> Iterator[dict]:
    """English chatterbot lines and Python-docs paragraphs into one of `LANGUAGES`; the other languages'
    chatterbot lines into English."""
    seen: set[str] = set()

    def request(key: str, text: str, src: str, target: str) -> dict:
        turn = pick(TRANSLATE_TASKS, key).format(text=text, src=src, target=target)
        return record("translate", key, [turn], kind="translation", source_language=src, target_language=target)

    for language, topic, index, lines in chatterbot_conversations():
        for j, line in enumerate(lines):
            if not 12 <= len(line) <= 400 or line.casefold() in seen or "\n" in line.strip():
                continue
            seen.add(line.casefold())
            key = f"chatterbot/{language}/{topic}/{index}/{j}"
            src = language_name(language)
            target = pick(LANGUAGES, key) if language == "english" else "English"
            yield request(key, line, src, target)
    for key, text in sorted(topics().items()):
        for i, paragraph in enumerate(split_paragraphs(text)):
            if _prose(paragraph):
                para_key = f"topic/{key}/{i}"
                yield request(para_key, " ".join(paragraph.split()), "English", pick(LANGUAGES, para_key))
