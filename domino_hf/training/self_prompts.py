"""Prompts the target writes itself: a training source of any size, in the target's own sense of a user turn.

Why: a draft is only as general as the prompts its training answers come from, and offline prompt sets run
out (ShareGPT has ~17k usable first turns) or cover few kinds of request. A chat model has learned what users
ask: open the chat template's *user* turn instead of the assistant's and sample, and it writes a question,
which `domino regen` then answers as usual. The `--start` texts steer the kinds (the model continues "Summarize
the following article:" or "Translate into French:" instead of a blank turn).

Contract of `write_self_prompts`:

* Appends `{"id", "prompt", "turns"}` records (ids `self-<seed>-<batch>-<row>`) to a JSONL file that
  `domino regen --prompts FILE` reads; a question is the sampled user turn up to the template's end of turn.
* Keeps only finished questions (the model closed its turn within `max_new_tokens`), non-empty, not already
  in the file, and not flagged by `exclude` (the benchmark filter in the CLI); the drops are counted.
* Resumable and reproducible: batch b is sampled from a generator seeded by (seed, b); a rerun samples the
  last batch in the file again and writes only what it had not, so an interrupted run and an uninterrupted
  one write the same records.

The command's options (`register`) import neither torch nor transformers: `write_self_prompts` imports torch and
the batch decoder when it runs, so `domino self-prompts --help` and its usage errors come at once.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..cli_common import (
    HelpFormatter,
    add_command,
    add_device_argument,
    add_target_arguments,
    target_device,
    target_kwargs,
)
from ..data import add_chat_template_argument, resolve_chat_template, to_messages
from ..dtypes import DTYPE_CHOICES, resolve_dtype
from .decontaminate import BenchmarkFilter
from .answers import append_lines, read_answers

logger = logging.getLogger(__name__)

_SENTINEL = "\x00DOMINO_USER_TURN\x00"


def user_turn_prefix(tokenizer: Any, system: str | None = None, chat_template: str = "auto") -> str:
    """The chat-templated text up to where a user's message starts (system prompt included, the template's
    default one when `system` is None), so a model continuing it writes the user's turn. Raises a ValueError
    when there is no chat template: a base model has no user turn to open."""
    template = resolve_chat_template(tokenizer, chat_template)
    if template is None:
        raise ValueError("self-written prompts need a chat template (the model writes the user's turn of it); the "
                         "tokenizer has none: pass --chat_template FILE, or use another prompt source.")
    text = tokenizer.apply_chat_template(
        to_messages(_SENTINEL, system), chat_template=None if template == "tokenizer" else template, tokenize=False,
    )
    if _SENTINEL not in text:
        raise ValueError("the chat template does not show the user's message verbatim; self-written prompts need "
                         "one that does.")
    return text[: text.index(_SENTINEL)]


def _written(out_path: Path) -> tuple[set[str], set[str], int]:
    """The questions and ids already in the file, and the batch to go on from: the last one that wrote a record
    (a run that reached its count may have stopped inside it). A line cut short by a kill is cut off the file
    first (`regen.read_answers`)."""
    answered = read_answers(out_path)
    batches = [int(record_id.split("-")[2]) for record_id in answered]
    return {a.prompt for a in answered.values()}, set(answered), max(batches, default=0)


def write_self_prompts(model: Any, tokenizer: Any, out_path: str | Path, num_prompts: int, starts=("",),
                       batch_size: int = 16, max_new_tokens: int = 128, temperature: float = 1.0, seed: int = 0,
                       system: str | None = None, chat_template: str = "auto",
                       exclude: Callable[[str], bool] | None = None) -> dict[str, int]:
    """Sample user turns from `model` until `out_path` holds `num_prompts` kept questions (see the module
    docstring). Batch b opens every row with `starts[b % len(starts)]`, which begins the question. Returns the
    run's counts."""
    import torch

    from .batch_decode import decode_shrinking

    if num_prompts < 1 or batch_size < 1 or max_new_tokens < 1 or not temperature > 0:
        raise ValueError("num_prompts, batch_size and max_new_tokens must be positive and temperature > 0")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    prefix = user_turn_prefix(tokenizer, system, chat_template)
    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]
    seen, ids_written, batch_index = _written(out_path)
    counts = {"written": 0, "unfinished": 0, "empty": 0, "duplicate": 0, "benchmark": 0}
    bar = tqdm(total=num_prompts, initial=min(len(seen), num_prompts), unit="prompt", desc="self-written prompts")
    with open(out_path, "a", encoding="utf-8") as handle:
        while len(seen) < num_prompts:
            start = starts[batch_index % len(starts)]
            ids = tokenizer(prefix + start, add_special_tokens=False)["input_ids"]
            input_ids = torch.tensor([ids] * batch_size, device=model.device)
            torch.manual_seed(seed * 1_000_003 + batch_index)  # the batch's draws depend on (seed, batch) only
            answers = decode_shrinking(model, input_ids, torch.ones_like(input_ids), max_new_tokens, eos_ids,
                                       temperature)
            rows = []
            for row, (sampled, finished) in enumerate(answers):
                record_id = f"self-{seed}-{batch_index}-{row}"
                if record_id in ids_written:  # the batch a previous run stopped in
                    continue
                prompt = (start + tokenizer.decode(sampled, skip_special_tokens=True)).strip()
                reason = ("unfinished" if not finished else "empty" if prompt == start.strip()
                          else "duplicate" if prompt in seen else "benchmark" if exclude and exclude(prompt) else None)
                if reason:
                    counts[reason] += 1
                    continue
                seen.add(prompt)
                rows.append({"id": record_id, "prompt": prompt, "turns": [prompt]})
                if len(seen) >= num_prompts:
                    break
            append_lines(handle, rows)
            counts["written"] += len(rows)
            bar.update(len(rows))
            batch_index += 1
    bar.close()
    logger.info("Self-written prompts: %d in %s (this run: %s)", len(seen), out_path, counts)
    return counts


def register(subparsers) -> None:
    parser = add_command(
        subparsers, "self-prompts",
        help="Have the target write user prompts itself (a training source for `domino regen`).",
        description="Open the chat template's user turn and let the target write the question, then append it to a "
        "JSONL file that `domino regen --prompts FILE` answers. Only finished, new, non-empty questions that overlap "
        "no benchmark are kept. Rerunning with the same --out resumes (the same records as one uninterrupted run).",
        formatter_class=HelpFormatter,
    )
    add = parser.add_argument
    add_target_arguments(parser)
    add("--out", "--output_file", dest="out", required=True, metavar="FILE",
        help="Output JSONL file, appended to and created if missing.")
    add("--num_prompts", type=int, required=True, metavar="N", help="Stop when the file holds N questions.")
    add("--start", action="append", default=None, metavar="TEXT",
        help="Begin each question with TEXT (repeatable: batches cycle through them), e.g. --start 'Summarize this "
        "article:' to steer the kind of request (default: a blank user turn).")
    add("--batch_size", "--per_device_batch_size", dest="batch_size", type=int, default=16, metavar="N",
        help="Questions sampled together (default: %(default)s).")
    add("--max_new_tokens", type=int, default=128, metavar="N",
        help="Longest question; one the model has not closed by then is dropped (default: %(default)s).")
    add("--temperature", type=float, default=1.0, metavar="T",
        help="Sampling temperature; 1 samples the model's own distribution of user turns (default: %(default)s).")
    add("--seed", type=int, default=0, help="Random seed (default: %(default)s).")
    add("--system", default=None, metavar="TEXT",
        help="System prompt (default: none, so the chat template's own default applies, as in `domino regen`).")
    add_chat_template_argument(parser)
    add("--dtype", default="float32", choices=DTYPE_CHOICES,
        help="Dtype of the target weights; bfloat16 is several times faster on CPUs with native bf16 (and many "
        "times slower on others); auto = bfloat16 where it is fast, else float32 (default: %(default)s).")
    add_device_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of `domino self-prompts`; returns the exit code."""
    from ..targets import load_target

    try:
        device = target_device(args)
        model, tokenizer = load_target(args.target, dtype=resolve_dtype(args.dtype, device), device=device,
                                       **target_kwargs(args))
        write_self_prompts(model, tokenizer, args.out, args.num_prompts, starts=tuple(args.start or ("",)),
                           batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, seed=args.seed, system=args.system,
                           chat_template=args.chat_template, exclude=BenchmarkFilter.for_benchmarks())
    except (OSError, ImportError, RuntimeError, ValueError) as err:  # model, Hub, no chat template, bad option
        logger.error("%s", err)
        return 2
    return 0
