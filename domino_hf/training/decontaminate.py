"""Keep benchmark prompts out of training data.

A draft trained on a benchmark's prompts (or on the target's answers to them) reports a τ on that benchmark
that says nothing about new prompts. `BenchmarkFilter` flags a training prompt that equals a benchmark prompt
after normalisation (case, whitespace, punctuation) or shares a run of `ngram` words with one (13, as in the
usual LLM decontamination practice). `domino train` and `domino features` drop such records, with a count.

The benchmarks: HumanEval, every turn of MT-Bench, the shared Alpaca / summarisation / QA sets, and every
prompt set of the project's own (`examples/data/*.jsonl`: the copy-heavy set and the held-out prompt types).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path

from ..data import read_prompts
from ..utils import project_root

logger = logging.getLogger(__name__)

BENCHMARK_SOURCES = ("humaneval", "mt_bench", "alpaca", "sum", "qa")
PROJECT_SETS = Path("examples") / "data"  # every *.jsonl in it is a benchmark set
COPY_HEAVY_SET = PROJECT_SETS / "copy_heavy.jsonl"
_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class BenchmarkFilter:
    """`filter(text)` is True when `text` overlaps a benchmark prompt (see the module doc)."""

    def __init__(self, texts: Iterable[str], ngram: int = 13):
        self.ngram = ngram
        self.exact: set[str] = set()
        self.ngrams: set[tuple[str, ...]] = set()
        for text in texts:
            words = _words(text)
            self.exact.add(" ".join(words))
            self.ngrams.update(tuple(words[i : i + ngram]) for i in range(len(words) - ngram + 1))

    def __call__(self, text: str) -> bool:
        words = _words(text)
        if " ".join(words) in self.exact:
            return True
        return any(tuple(words[i : i + self.ngram]) in self.ngrams for i in range(len(words) - self.ngram + 1))

    @classmethod
    def for_benchmarks(cls, sources: Iterable[str] = BENCHMARK_SOURCES, ngram: int = 13) -> BenchmarkFilter:
        """A filter over every turn of the benchmark prompt sets that can be read here (a missing optional
        package or shared folder is logged and skipped) and the project's own sets (`PROJECT_SETS`)."""
        texts: list[str] = []
        for source in sources:
            try:
                texts += [turn for record in read_prompts(source).records for turn in record.turns]
            except (OSError, ImportError) as err:
                logger.warning("decontamination: cannot read benchmark %s (%s); not filtered against it", source, err)
        for path in sorted((project_root() / PROJECT_SETS).glob("*.jsonl")):
            texts += [turn for record in read_prompts(str(path)).records for turn in record.turns]
        return cls(texts, ngram=ngram)
