"""`domino regen --responses source`: training records whose answer is the source's own assistant reply.

Why: on a CPU the target writes ~60 answer tokens a second per core, while `domino features` reads ~900, so
data the target must write is what bounds a draft's training there (docs/training.md). A conversation source
such as ShareGPT already holds an answer to each prompt. A record built from it keeps that answer as
*context* only: `domino train` labels its blocks with the target's own greedy next token after the anchor
(from the target's forward, or cached by `domino features --kl_topk`), at the first draft slot alone. That slot
is the one the target fills from the context; a later slot's label would be the target's continuation of its
own choices, which a source answer does not hold (`DominoTrainer._source_labels`). So the draft still learns
what its target says next, on contexts the target did not have to write.

The contract, kept apart from the target's own answers:
* rows carry `"response_from": "source"`; `RegenDataset` keeps such a record next to the target's answer to
  the same prompt (two contexts, not one counted twice);
* first user turns only: a later turn's history would be the source's replies, which `--turns all` never uses
  as history for the target's answers;
* the reply is cut to `--max_new_tokens` tokens (`finished` says whether it was whole), and records without
  one are counted (`skipped_no_reply`); resuming works as for regen (ids already in the file are skipped).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..prompt_records import PromptSet
from .answers import RegenOptions, append_lines, make_row, plan_turns, summarize

logger = logging.getLogger(__name__)

RESPONSE_FROM = "response_from"


def write_source_answers(
    tokenizer: Any, prompts: PromptSet, out_path: str | Path, options: RegenOptions | None = None, **changes: Any,
) -> dict[str, Any]:
    """Append one row per first user turn of `prompts` with the source's reply as the response (module doc).

    Same options (`RegenOptions`, with `changes` applied; first turns only, nothing sampled), caps, resume and
    schema as `regenerate`, plus `response_from`; returns the run's counts."""
    options = RegenOptions.of(options, **changes)
    max_new_tokens = options.max_new_tokens
    if max_new_tokens < 2:
        raise ValueError("max_new_tokens must be at least 2 (a training record needs two response tokens)")
    if options.turns != "first":
        raise ValueError(f"source answers are first turns only (a later turn's history would be the source's "
                         f"replies, never the target's); got turns={options.turns!r}")
    out_path = Path(out_path)
    plan = plan_turns(tokenizer, prompts, out_path, options)
    replies = {record.id: (record.meta.get("replies") or [None])[0] for record in plan.records}
    counts = plan.counts
    start = time.perf_counter()
    with out_path.open("a", encoding="utf-8") as fh:
        for todo in plan:
            rows = []
            for item in tqdm(todo, unit="prompt", desc="source answers"):
                reply = replies.get(item.id)
                ids = tokenizer(reply, add_special_tokens=False)["input_ids"] if reply else []
                if len(ids) < 2:
                    counts["skipped_no_reply"] += 1
                    continue
                row = make_row(tokenizer, item, ids[:max_new_tokens], len(ids) <= max_new_tokens, counts)
                rows.append({**row, RESPONSE_FROM: "source"})
            append_lines(fh, rows)
    summary = summarize(counts, time.perf_counter() - start, out_path, extra=("skipped_no_reply",))
    if not summary["written"] and not summary["skipped_existing"] and counts["skipped_no_reply"]:
        logger.warning("regen --responses source: no record of %s holds an assistant reply (ShareGPT "
                       "`conversations` or chat `messages` with assistant turns do)", prompts.source or "the source")
    return summary
