"""The serving engines' own code, from their released wheels, for the export tests (`test_serving_export.py`).

The wheel is fetched once with `pip download --no-deps` into `~/.cache/domino-hf/wheels` (or
`$DOMINO_HF_WHEEL_CACHE`); without it and without network the tests skip, saying so. Nothing is installed: the
engine's runtime needs CUDA kernels, so the tests run the pieces that need only torch, read from the wheel:

* a module that imports only torch and the standard library (SGLang's `domino_utils.py`: the Domino runtime
  validator and greedy rollout) runs whole;
* from a module that imports the serving runtime at its top (SGLang's `dflash_utils.py`, `models/dflash.py`,
  `model_loader/weight_utils.py`), the named definitions run as the wheel writes them, with the module's other
  imports (the standard library, torch) and without its imports of SGLang itself, which no named definition uses
  (`definitions`). A method (`DFlashDraftModel.load_weights`) runs on a stand-in `self`.
"""

from __future__ import annotations

import __future__
import ast
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

SGLANG_VERSION = "0.5.23"
WHEEL_CACHE = Path(os.environ.get("DOMINO_HF_WHEEL_CACHE", Path.home() / ".cache" / "domino-hf" / "wheels"))


def wheel(name: str, version: str) -> Path:
    """The cached wheel of `name==version`, downloaded (no dependencies) when missing; skips the test when it
    cannot be had."""
    pattern = f"{name}-{version}-*.whl"
    found = sorted(WHEEL_CACHE.glob(pattern))
    if not found:
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        try:
            result = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{name}=={version}",
                 "-d", str(WHEEL_CACHE)], capture_output=True, text=True, timeout=900,
            )
            reason = result.stderr.strip().splitlines()[-1:] or ["no wheel for this platform"]
        except (OSError, subprocess.TimeoutExpired) as err:
            reason = [str(err)]
        found = sorted(WHEEL_CACHE.glob(pattern))
        if not found:
            pytest.skip(f"{name} {version}'s wheel is not in {WHEEL_CACHE} and `pip download` could not fetch it "
                        f"(offline?): {reason[0]}")
    return found[0]


def source(wheel_path: Path, path: str) -> str:
    with zipfile.ZipFile(wheel_path) as archive:
        return archive.read(path).decode()


def module(wheel_path: Path, path: str) -> types.ModuleType:
    """Run the wheel's module `path` whole (it must import only what is installed here)."""
    mod = types.ModuleType(f"wheel_{Path(path).stem}")
    mod.__file__ = path
    exec(compile(source(wheel_path, path), path, "exec"), mod.__dict__)
    return mod


def definitions(wheel_path: Path, path: str, names, methods=(), extra=None) -> types.SimpleNamespace:
    """The top-level definitions `names` of the wheel's module `path`, and the methods `methods` ("Class.name",
    as plain functions), executed as written after the module's own imports other than SGLang's (an import that
    is not installed here is left out; a definition that needed it fails when called, by name). `extra` adds
    names to their globals (the definitions of another module)."""
    tree = ast.parse(source(wheel_path, path))
    mod = types.ModuleType(f"wheel_{Path(path).stem}")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up there
    namespace = mod.__dict__
    namespace.update(extra or {})
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            roots = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(root.split(".")[0] == "sglang" for root in roots):
                continue
            try:
                exec(compile(ast.Module([node], []), path, "exec"), namespace)
            except ImportError:
                pass
    wanted = set(names)
    by_class = {}
    for item in methods:
        owner, method = item.split(".")
        by_class.setdefault(owner, set()).add(method)
    chosen = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in wanted:
            chosen.append(node)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) in wanted for t in node.targets):
            chosen.append(node)
        elif isinstance(node, ast.ClassDef) and node.name in by_class:
            chosen += [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name in by_class[node.name]]
    found = {getattr(n, "name", None) or n.targets[0].id for n in chosen}
    missing = wanted | {m.split(".")[1] for m in methods}
    assert missing <= found, f"{path} in the wheel lacks {sorted(missing - found)}"
    # as the module is compiled: `from __future__ import annotations` (annotations stay strings)
    exec(compile(ast.Module(chosen, []), path, "exec", flags=__future__.annotations.compiler_flag), namespace)
    return types.SimpleNamespace(**{name: namespace[name] for name in found})
