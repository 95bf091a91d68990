"""`python-docs` and `python-code`: prompts over the Python documentation (`pydoc_data`) and the source of
pure-Python standard-library modules, read from their files (never imported, so neither import side effects nor
another library's patches change what is read). The modules the copy-heavy benchmark set is built from
(`examples/make_copy_set.py`) are left out.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

from .records import pick, record, split_paragraphs

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
CODE_LANGUAGES = ("JavaScript", "TypeScript", "Go", "Rust", "Java", "C++", "C#", "Ruby")
MAX_PASSAGE_CHARS = 1800  # ~450 SmolLM2 tokens: with its question, such a prompt needs --max_prompt_tokens 768
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


def topics() -> dict[str, str]:
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


def _passages(text: str, max_chars: int = MAX_PASSAGE_CHARS) -> list[str]:
    """Consecutive paragraphs packed into passages of at most `max_chars` (a longer paragraph stands alone,
    cut at a line end)."""
    passages, current = [], ""
    for paragraph in split_paragraphs(text):
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
    for key, text in sorted(topics().items()):
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
