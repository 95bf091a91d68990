"""The answers file `domino regen` writes, and what every way of writing it shares.

The target's own generation (`regen.regenerate`), a serving engine (`endpoint.regenerate_via_endpoint`) and the
source's own replies (`source_answers.write_source_answers`) all take one `RegenOptions`, plan the same turns
over the same file (`plan_turns`), write the same rows (`make_row`, `append_lines`, in the schema of
`shared/data/regen/README.md`) and report the same counts (`summarize`). The file is append-only JSONL: a run
can be killed at any time and rerun to resume.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..prompt_records import PromptSet
from .turns import Answered, TurnPlan, TurnPrompt

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegenOptions:
    """Which prompts are answered, how, and at what length: the settings every way of answering shares.

    `turns="first"` answers the first user turn of each record; `"all"` every user turn, turn by turn, with the
    target's own earlier answers as history (see `domino_hf.training.turns`). `limit` caps how many records of
    the source are considered (so a rerun with the same limit resumes rather than extends). Prompts over
    `max_prompt_tokens` chat-templated tokens, or under `min_prompt_tokens` (a later job adding the long prompts
    an earlier one capped), are skipped and counted. `chat_template` formats the prompts (see
    `domino_hf.chat.chat_input_ids`), after the `system` prompt if one is given. Answers are greedy unless
    `temperature > 0`, then sampled with `seed`; they stop at `max_new_tokens`.
    """

    max_new_tokens: int = 128
    max_prompt_tokens: int = 256
    min_prompt_tokens: int = 0
    limit: int | None = None
    system: str | None = None
    chat_template: str = "auto"
    turns: str = "first"
    temperature: float = 0.0
    seed: int | None = None

    @classmethod
    def of(cls, options: RegenOptions | None = None, **changes: Any) -> RegenOptions:
        """`options` (default: the defaults) with `changes`; an unknown name is a TypeError."""
        return dataclasses.replace(options or cls(), **changes)


def plan_turns(tokenizer: Any, prompts: PromptSet, out_path: Path, options: RegenOptions) -> TurnPlan:
    """The run's `TurnPlan` over the ids already in `out_path` (its tail repaired); creates the output's folder."""
    plan = TurnPlan(tokenizer, prompts, {}, options.max_prompt_tokens, limit=options.limit, system=options.system,
                    chat_template=options.chat_template, turns=options.turns,
                    min_prompt_tokens=options.min_prompt_tokens)  # checks first
    out_path.parent.mkdir(parents=True, exist_ok=True)
    plan.answers.update(read_answers(out_path))
    return plan


def read_existing(out_path: str | Path) -> set[str]:
    """Ids already answered in `out_path`, repairing the file's tail if a previous run was killed (see
    `read_answers`)."""
    return set(read_answers(out_path))


def read_answers(out_path: str | Path) -> dict[str, Answered]:
    """What each id already in `out_path` answered, repairing the file's tail if a previous run was killed.

    A last line without its newline is a write cut short: it is cut off the file (its prompt is answered
    again). Other unreadable lines are reported and ignored, so their prompts are answered again too.
    """
    path = Path(out_path)
    if not path.exists():
        return {}
    done: dict[str, Answered] = {}
    bad = 0
    good_end = 0
    with path.open("rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break  # partial tail
            good_end += len(line)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                done[str(obj["id"])] = Answered(*(v if isinstance(v := obj.get(k), str) else None
                                                  for k in ("prompt", "response")))
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
                bad += 1
    if good_end < path.stat().st_size:
        logger.warning("%s: dropping a partial last line (%d bytes) left by an interrupted run", path,
                       path.stat().st_size - good_end)
        with path.open("r+b") as fh:
            fh.truncate(good_end)
    if bad:
        logger.warning("%s: ignoring %d unreadable line(s); their prompts will be answered again", path, bad)
    return done


def special_ids(generation_config: Any, tokenizer: Any) -> tuple[int, list[int]]:
    """`(pad id, eos ids)` from the target's generation config, falling back to the tokenizer."""
    eos = generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not eos_ids:
        raise ValueError("the target has no EOS token id; cannot tell finished answers from cut ones")
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = generation_config.pad_token_id
    return (eos_ids[0] if pad is None else pad), eos_ids


def append_lines(fh: Any, rows: list[dict[str, Any]]) -> None:
    """Append whole lines and force them to disk, so a kill loses at most the batch in flight."""
    fh.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    fh.flush()
    os.fsync(fh.fileno())


def make_row(
    tokenizer: Any, item: TurnPrompt, response_ids: list[int], finished: bool, counts: Counter[str]
) -> dict[str, Any]:
    """One output line (the schema of `shared/data/regen/README.md`, plus `turn` and `earlier_prompts` after
    the first turn); adds it to the run's `counts`."""
    counts["response_tokens"] += len(response_ids)
    counts["finished"] += finished
    counts["written"] += 1
    row = {
        "id": item.id,
        "prompt": item.prompt,
        "response": tokenizer.decode(response_ids, skip_special_tokens=True),
        "prompt_ids": item.prompt_ids,
        "response_ids": response_ids,
        "finished": finished,
    }
    if item.turn > 1:
        row.update(turn=item.turn, earlier_prompts=item.earlier_prompts)
    return row


def summarize(counts: Counter[str], seconds: float, out_path: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The run's summary (returned by the regen functions) and its log line; `extra` names more counts."""
    keys = ("written", "finished", "response_tokens", "skipped_existing", "skipped_malformed", "skipped_too_long")
    summary: dict[str, Any] = {key: counts[key] for key in keys + extra}
    summary.update(seconds=round(seconds, 2), tokens_per_s=round(counts["response_tokens"] / max(seconds, 1e-9), 1),
                   out=str(out_path))
    logger.info(
        "regen: wrote %(written)d answers (%(finished)d finished, %(response_tokens)d tokens, %(tokens_per_s).1f "
        "tok/s) to %(out)s; skipped %(skipped_existing)d existing, %(skipped_malformed)d malformed, "
        "%(skipped_too_long)d too long",
        summary,
    )
    return summary
