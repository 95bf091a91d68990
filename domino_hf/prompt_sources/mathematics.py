"""`dm-math`: school mathematics questions from DeepMind's `mathematics_dataset` generator.

The generator (2019) runs in a child process (`python -m domino_hf.prompt_sources dm-math N`) with a fixed
string-hash seed, so its questions are the same in every process, and the compatibility patches it needs on
today's numpy and sympy stay out of the reader's process.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import random
import subprocess
import sys
import warnings
import zlib
from collections.abc import Callable, Iterator

from ..extras import require
from .records import pick, record

logger = logging.getLogger(__name__)

MATH_SUFFIXES = ("", "", "Show your work.", "Explain your reasoning step by step.", "Answer briefly.")


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
    command = [sys.executable, "-m", "domino_hf.prompt_sources", "dm-math", str(per_module)]
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


def generate_dm_math(per_module: int) -> Iterator[dict]:
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
