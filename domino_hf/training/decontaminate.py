"""Keep benchmark prompts out of training data.

A draft trained on a benchmark's prompts (or on the target's answers to them) reports a τ on that benchmark
that says nothing about new prompts. `BenchmarkFilter` flags a training prompt that equals a benchmark prompt
after normalisation (case, whitespace, punctuation) or shares a run of `ngram` words with one (13, as in the
usual LLM decontamination practice). `domino train` and `domino features` drop such records, with a count.

The benchmarks: HumanEval and every turn of every prompt set shipped with the package
(`domino_hf/prompt_sets/`: MT-Bench, Alpaca, summarisation, QA, and the project's own copy-heavy set and
held-out prompt types).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from ..benchmark_sets import BENCHMARK_SOURCES, read_benchmark

logger = logging.getLogger(__name__)

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
        package is logged and skipped)."""
        texts: list[str] = []
        for source in sources:
            try:
                texts += [turn for record in read_benchmark(source).records for turn in record.turns]
            except (OSError, ImportError) as err:
                logger.warning("decontamination: cannot read benchmark %s (%s); not filtered against it", source, err)
        return cls(texts, ngram=ngram)
