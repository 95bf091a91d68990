"""Prompt records and the JSON files that hold them.

A record file (JSONL, optionally gzipped, or a top-level JSON array such as a ShareGPT dump) is read into a
`PromptSet` of `PromptRecord`s: an id plus the user turns. Malformed records (no readable turns, no usable id) are
never used silently: they are skipped, counted in `PromptSet.skipped` and reported in a warning, so a typo in a data
file shows up as a number instead of as a quietly smaller benchmark. A field the prompt does not need never costs a
record: a `reference` that is not text (e.g. several acceptable answers per turn, a list of lists) stays in the
record's `meta["reference"]`, said once per source in a warning.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

# ShareGPT speaker names of the user side; "system" turns go to `meta["system"]`.
_USER_SPEAKERS = {"human", "user"}
_ASSISTANT_SPEAKERS = {"gpt", "assistant", "chatgpt"}
_ID_KEYS = ("id", "question_id", "task_id")
_JSON_CHUNK_CHARS = 1 << 20
_ARRAY_SEPARATORS = re.compile(r"[\s,]*")


class MalformedRecord(ValueError):
    """A record that cannot be turned into a prompt (counted, never used)."""


@dataclass
class PromptRecord:
    """One prompt: `turns` are the user turns in order (most sources have one); `reference` the source's answer when
    it is a string or a list of strings (joined by blank lines); `meta` keeps the rest, a `reference` of any other
    shape included (`meta["reference"]`)."""

    id: str
    turns: list[str]
    reference: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class PromptSet:
    """The usable records of a source, how many were skipped as malformed, and where they came from."""

    records: list[PromptRecord]
    skipped: int = 0
    source: str = ""
    contaminated: int = 0  # records dropped by the benchmark filter (built sources only)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[PromptRecord]:
        return iter(self.records)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise MalformedRecord(f"{what} is not a non-empty string")
    return value


def _texts(values: Any, what: str) -> list[str]:
    if not isinstance(values, list) or not values:
        raise MalformedRecord(f"{what} is not a non-empty list")
    return [_text(v, what) for v in values]


def _chat_turns(messages: Any, role_key: str, text_key: str, meta: dict[str, Any]) -> list[str]:
    """User turns of a `messages` / ShareGPT `conversations` list; a system turn is kept in `meta`, and the
    source's assistant replies in `meta["replies"]` (reply i follows user turn i; None where none does)."""
    if not isinstance(messages, list):
        raise MalformedRecord(f"{role_key!r} conversation is not a list")
    turns: list[str] = []
    replies: list[str | None] = []
    for message in messages:
        if not isinstance(message, dict):
            raise MalformedRecord("a conversation entry is not an object")
        role = message.get(role_key)
        if role in _USER_SPEAKERS:
            turns.append(_text(message.get(text_key), "a user turn"))
            replies.append(None)
        elif role in _ASSISTANT_SPEAKERS and replies and replies[-1] is None:
            text = message.get(text_key)
            replies[-1] = text if isinstance(text, str) and text.strip() else None
        elif role == "system" and isinstance(message.get(text_key), str):
            meta.setdefault("system", message[text_key])
    if not turns:
        raise MalformedRecord("conversation has no user turn")
    if any(reply is not None for reply in replies):
        meta["replies"] = replies
    return turns


def _reference(value: Any, meta: dict[str, Any]) -> str | None:
    """The text of a `reference` field. Any other shape is not needed for the prompt: it goes to `meta["reference"]`
    as it is (reported by `collect_records`), never a skipped record."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n\n".join(value) if value else None
    meta["reference"] = value
    return None


def parse_record(obj: Any, fallback_id: str) -> PromptRecord:
    """Turn one JSON object into a `PromptRecord` or raise `MalformedRecord`.

    Recognised shapes, first match wins: `turns` (list of user turns), `messages` (OpenAI style, user turns
    kept), `conversations` (ShareGPT, human turns kept), `prompt`, `question`, `instruction` (+ optional
    `input`). The id is `id` / `question_id` / `task_id`, else `fallback_id` (the line number). All other
    keys land in `meta`, and so does a `reference` that is not text.
    """
    if not isinstance(obj, dict):
        raise MalformedRecord("record is not a JSON object")
    meta: dict[str, Any] = {}
    if "turns" in obj:
        turns, used = _texts(obj["turns"], "turns"), {"turns"}
    elif "messages" in obj:
        turns, used = _chat_turns(obj["messages"], "role", "content", meta), {"messages"}
    elif "conversations" in obj:
        turns, used = _chat_turns(obj["conversations"], "from", "value", meta), {"conversations"}
    elif "prompt" in obj:
        turns, used = [_text(obj["prompt"], "prompt")], {"prompt"}
    elif "question" in obj:
        turns, used = [_text(obj["question"], "question")], {"question"}
    elif "instruction" in obj:
        text = _text(obj["instruction"], "instruction")
        extra = obj.get("input")
        if isinstance(extra, str) and extra.strip():
            text = f"{text}\n\n{extra}"
        turns, used = [text], {"instruction", "input"}
    else:
        raise MalformedRecord("no prompt/turns/messages/conversations field")
    record_id = next((obj[k] for k in _ID_KEYS if obj.get(k) is not None), fallback_id)
    if not isinstance(record_id, (str, int)) or isinstance(record_id, bool):
        raise MalformedRecord("id is neither a string nor an integer")
    reference = _reference(obj.get("reference"), meta)
    meta.update((k, v) for k, v in obj.items() if k not in used and k not in _ID_KEYS and k != "reference")
    return PromptRecord(id=str(record_id), turns=turns, reference=reference, meta=meta)


def collect_records(items: Iterable[tuple[str, Any]], source: str, limit: int | None) -> PromptSet:
    """Parse `(fallback_id, obj)` pairs until `limit` good records; count and report the bad ones.

    `obj` may be a `MalformedRecord` instance already (a line that was not even valid JSON).
    """
    records: list[PromptRecord] = []
    skipped = 0
    if limit is not None and limit <= 0:
        return PromptSet([], 0, source)
    for fallback_id, obj in items:
        try:
            if isinstance(obj, MalformedRecord):
                raise obj
            records.append(parse_record(obj, fallback_id))
        except MalformedRecord as err:
            skipped += 1
            logger.debug("%s: skipping record %s: %s", source, fallback_id, err)
        if limit is not None and len(records) >= limit:
            break
    if skipped:
        logger.warning("%s: skipped %d malformed record(s), kept %d", source, skipped, len(records))
    unread = sum("reference" in record.meta for record in records)
    if unread:
        logger.warning("%s: %d record(s) have a `reference` that is neither a string nor a list of strings (e.g. a "
                       "list of answers per turn); kept, with that field in meta['reference'] and no reference",
                       source, unread)
    return PromptSet(records, skipped, source)


@contextmanager
def open_text(path: str | Path) -> Iterator[IO[str]]:
    """A UTF-8 text file, gunzipped when its name ends in `.gz`."""
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        yield fh


def iter_jsonl(fh: IO[str]) -> Iterator[tuple[str, Any]]:
    """`(line number, object or MalformedRecord)` for each non-blank line."""
    for number, line in enumerate(fh, start=1):
        if not line.strip():
            continue
        try:
            yield str(number), json.loads(line)
        except json.JSONDecodeError as err:
            yield str(number), MalformedRecord(f"bad JSON: {err}")


def iter_json_array(fh: IO[str]) -> Iterator[Any]:
    """Stream the elements of a (possibly truncated) top-level JSON array, one `raw_decode` at a time.

    Reads `_JSON_CHUNK_CHARS` at a time, so the first few records of a 120 MB file come back at once. A
    truncated tail (the ShareGPT package ships one) ends the stream cleanly with an info message; it is not
    a record, so it is not counted as skipped. An element that is broken in the middle of the file cannot
    be told from a truncated one, so it also ends the stream.
    """
    decoder = json.JSONDecoder()
    buf, eof = fh.read(_JSON_CHUNK_CHARS), False
    pos = _ARRAY_SEPARATORS.match(buf).end()
    if not buf[pos:].startswith("["):
        raise ValueError("not a JSON array")
    pos += 1
    index = 0
    while True:
        pos = _ARRAY_SEPARATORS.match(buf, pos).end()
        if pos < len(buf) and buf[pos] == "]":
            return
        try:
            if pos >= len(buf):
                raise json.JSONDecodeError("need more data", buf, pos)
            obj, pos = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                if pos < len(buf):
                    logger.info("JSON array truncated after %d element(s); ignoring the partial tail", index)
                return
            more = fh.read(_JSON_CHUNK_CHARS)
            eof = not more
            buf, pos = buf[pos:] + more, 0
            continue
        index += 1
        yield obj


def _starts_with_array(path: Path) -> bool:
    with open_text(path) as fh:
        while chunk := fh.read(4096):
            stripped = chunk.lstrip()
            if stripped:
                return stripped.startswith("[")
    return False


def read_records_file(path: Path, source: str, limit: int | None) -> PromptSet:
    """JSONL (optionally gzipped), or a top-level JSON array such as a ShareGPT dump."""
    is_array = _starts_with_array(path)
    with open_text(path) as fh:
        if is_array:
            items = ((str(i), obj) for i, obj in enumerate(iter_json_array(fh), start=1))
            return collect_records(items, source, limit)
        return collect_records(iter_jsonl(fh), source, limit)
