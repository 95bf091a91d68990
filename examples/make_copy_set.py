"""Build `domino_hf/prompt_sets/copy_heavy.jsonl`: 20 prompts whose answers mostly copy spans of the prompt.

Why: prompt lookup wins where answers restate their context (RAG, editing, refactoring); the benchmark needs
such a set, built from material no benchmark and no training set uses. Sources, all on any Python install:
* 10 "edit this code" prompts over functions of the Python standard library (`inspect.getsource`);
* 10 "answer from this document" prompts over the first paragraphs of the standard library's module
  docstrings (the answer's key phrases are in the prompt).
Deterministic (fixed module lists); rerun to regenerate, then commit the JSONL:

    python examples/make_copy_set.py --out domino_hf/prompt_sets/copy_heavy.jsonl
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
from pathlib import Path

CODE = [
    ("textwrap", "dedent"), ("shlex", "quote"), ("fnmatch", "translate"), ("shutil", "get_terminal_size"),
    ("string", "capwords"), ("colorsys", "rgb_to_hls"), ("random", "shuffle"), ("base64", "b32encode"),
    ("heapq", "nsmallest"), ("calendar", "monthrange"),
]
EDITS = [
    "Rewrite this Python function with type hints added, keeping the code otherwise unchanged.",
    "Add a comment above each line of this Python function, keeping the code itself unchanged.",
]
DOCS = ["csv", "json", "zipfile", "argparse", "logging", "sqlite3", "unittest", "pickle", "tarfile", "difflib"]
QUESTION = "Using only the document above, explain what the `{name}` module is for. Quote the document where you can."


def code_prompts() -> list[dict]:
    prompts = []
    for i, (module, function) in enumerate(CODE):
        source = inspect.getsource(getattr(importlib.import_module(module), function))
        prompts.append({"id": f"code_{module}_{function}", "turns": [f"{EDITS[i % 2]}\n\n```python\n{source}```"]})
    return prompts


def doc_prompts(max_chars: int = 1500) -> list[dict]:
    prompts = []
    for name in DOCS:
        doc = inspect.getdoc(importlib.import_module(name)) or ""
        text = doc[:max_chars].rsplit("\n", 1)[0] if len(doc) > max_chars else doc
        prompts.append({"id": f"doc_{name}", "turns": [f"Document:\n{text}\n\n{QUESTION.format(name=name)}"]})
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "data" / "copy_heavy.jsonl"))
    args = parser.parse_args()
    rows = code_prompts() + doc_prompts()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
