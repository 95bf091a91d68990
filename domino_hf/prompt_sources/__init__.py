"""Training prompt sources built offline, from packages and from the Python standard library.

A draft learns the target's answers to the prompts it is trained on, so the prompt mix decides what kinds of
answer it drafts well. These sources add what ShareGPT has little of, each named for `--prompts`:

* `dm-math`: school mathematics questions (algebra, arithmetic, calculus, numbers, comparison, measurement,
  probability) from DeepMind's `mathematics_dataset` generator, every train difficulty, a fixed seed per question;
* `chatterbot`: short multilingual chit-chat, the user turns of `chatterbot-corpus` (28 languages);
* `translate`: translation requests in both directions, over chatterbot's sentences and the prose of the Python
  documentation (`pydoc_data`);
* `python-docs`: a long passage of the Python reference or a stdlib module's documentation, then a question
  about it (retrieval-augmented QA shape);
* `python-code`: code tasks over standard-library functions: write one from its signature and docstring, or
  explain, test, review or port its source.
* `summarize`: a long document of running prose to summarise under one of several instructions (a headline, a
  paragraph, bullet points, keep the names and numbers). The documents are ShareGPT's long assistant replies:
  articles, stories, essays and explanations of 1,500-6,000 characters, none of them a benchmark's.

Every builder is deterministic: a record's id is `<source>:<key>:<hash of its text>`, so ids are stable and a
changed prompt (another Python version's docs) gets a new id rather than a stale answer. `domino_hf.data`
reads them through the benchmark filter. The stdlib modules the copy-heavy benchmark set is built from
(`examples/make_copy_set.py`) are left out here as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .chit_chat import chatterbot
from .mathematics import dm_math
from .python_stdlib import COPY_SET_MODULES, python_code, python_docs
from .records import pick, record
from .summaries import DOCUMENTS_PER_CONVERSATION, MIN_DOCUMENT_CHARS, SUMMARY_TASKS, summarize
from .translations import translate

__all__ = [
    "BUILDERS", "COPY_SET_MODULES", "DOCUMENTS_PER_CONVERSATION", "MIN_DOCUMENT_CHARS", "SUMMARY_TASKS", "build",
    "chatterbot", "dm_math", "pick", "python_code", "python_docs", "record", "summarize", "translate",
]

BUILDERS: dict[str, Callable[[], Iterator[dict]]] = {
    "dm-math": dm_math, "chatterbot": chatterbot, "translate": translate, "python-docs": python_docs,
    "python-code": python_code, "summarize": summarize,
}


def build(name: str) -> Iterator[dict]:
    """The raw records of the built source `name` (see `BUILDERS`), lazily."""
    return BUILDERS[name]()
