"""Which conversation turns `domino regen` answers next, and their prompts.

`--turns first` answers the first user turn of each record, keyed by the record's id. `--turns all` also
answers the later user turns of multi-turn records (ShareGPT conversations), each with the target's *own*
earlier answers as the assistant turns, never the source's assistant text: a draft must learn what its target
says in context. Turn k > 1 of conversation `c` gets the id `c#t<k>`; its prompt is the chat template over
[user 1, answer 1, ..., user k], the answers being the `response` texts already in the output file (an answer
cut at `--max_new_tokens` included: it is what the target said). Such a row also stores `turn` and the earlier
user turns (`earlier_prompts`), which the benchmark filter checks along with `prompt`.

**Turn-major order.** Every pending turn 1, then every turn 2 whose turn-1 answer exists, then turn 3, and so
on: batches hold prompts of similar depth, and a run killed anywhere resumes exactly, since a turn is ready as
soon as the answer before it is in the output file (and not before).

**The prompt cap ends a conversation.** A turn whose full prompt is longer than `max_prompt_tokens` is skipped
with every later turn of its conversation (each later prompt contains it, so all are counted as too long).
History is never dropped to make a turn fit: a record must be a prompt a chat client really sends, with the
context its answer depends on. A "now make it shorter" without the text it refers to is a different,
context-free question, and the target's answer to it would teach the draft the wrong thing. Raise the cap to
get more later turns.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..data import PromptRecord, PromptSet, chat_input_ids

logger = logging.getLogger(__name__)

TURN_CHOICES = ("first", "all")


def turn_id(conversation_id: str, turn: int) -> str:
    """The output id of `turn` (1-based) of a conversation: its own id for turn 1, `<id>#t<turn>` after."""
    return conversation_id if turn == 1 else f"{conversation_id}#t{turn}"


@dataclass
class Answered:
    """What the output file says about one id: the user turn it answered and the answer's text (None when a
    row lacks them: it is done, but cannot serve as history)."""

    prompt: str | None
    response: str | None


@dataclass
class TurnPrompt:
    """One prompt to answer: its output `id`, the user turn (`prompt`) and the chat-templated `prompt_ids`."""

    id: str
    prompt: str
    prompt_ids: list[int]
    turn: int = 1
    earlier_prompts: list[str] = field(default_factory=list)  # user turns 1..turn-1, all inside prompt_ids


class TurnPlan:
    """The pending prompts of a source, turn by turn (see the module doc).

    `answers` maps the ids already in the output file to what they answered; `answered(rows)` adds the rows a
    run writes, which makes the next turn ready. `counts` holds the skip counts (`skipped_existing`,
    `skipped_too_long`, `skipped_too_short` (under `min_prompt_tokens`), `skipped_malformed`,
    `skipped_no_history`: a later turn whose earlier answer is missing or answered a different text under the
    same id). A repeated record id is answered once, from its first record that fits the caps.
    """

    def __init__(
        self, tokenizer: Any, prompts: PromptSet, answers: dict[str, Answered], max_prompt_tokens: int,
        limit: int | None = None, system: str | None = None, chat_template: str = "auto", turns: str = "first",
        min_prompt_tokens: int = 0,
    ):
        if turns not in TURN_CHOICES:
            raise ValueError(f"turns={turns!r}: pass one of {', '.join(TURN_CHOICES)}")
        if min_prompt_tokens > max_prompt_tokens:
            raise ValueError(f"--min_prompt_tokens {min_prompt_tokens} is over --max_prompt_tokens "
                             f"{max_prompt_tokens}: no prompt could be answered; lower the one or raise the other")
        self.tokenizer, self.answers, self.max_prompt_tokens = tokenizer, answers, max_prompt_tokens
        self.min_prompt_tokens = min_prompt_tokens
        self.system, self.chat_template = system, chat_template
        self.records = prompts.records[:limit]
        self.last_turn = 1 if turns == "first" else max((len(r.turns) for r in self.records), default=1)
        self.counts: Counter[str] = Counter(skipped_malformed=prompts.skipped)
        self._cut: set[int] = set()  # indices of the records whose conversation the prompt cap ended

    @property
    def extra_counts(self) -> tuple[str, ...]:
        """The counts a multi-turn run reports besides the usual ones (`regen.summarize`'s `extra`)."""
        return (("skipped_no_history",) if self.last_turn > 1 else ()) + (
            ("skipped_too_short",) if self.min_prompt_tokens else ())

    def __iter__(self) -> Iterator[list[TurnPrompt]]:
        """Each turn's pending prompts in source order; a turn's list is built only once the previous one
        has been answered (reported through `answered`)."""
        for turn in range(1, self.last_turn + 1):
            todo = self.pending(turn)
            if todo:
                if self.last_turn > 1:
                    logger.info("regen: turn %d: %d prompts to answer", turn, len(todo))
                yield todo

    def answered(self, rows: list[dict[str, Any]]) -> None:
        """Record rows just written, so that the turns after them become ready."""
        for row in rows:
            self.answers[row["id"]] = Answered(row["prompt"], row["response"])

    def pending(self, turn: int) -> list[TurnPrompt]:
        """The prompts of `turn` that are ready and not answered yet; counts the others."""
        todo: list[TurnPrompt] = []
        taken: set[str] = set()
        for index, record in enumerate(self.records):
            if turn == 1:
                if record.id in taken or record.id in self.answers:
                    self.counts["skipped_existing"] += 1
                    continue
            elif len(record.turns) < turn or record.id in taken or index in self._cut:
                continue
            elif getattr(self.answers.get(record.id), "prompt", None) != record.turns[0]:
                continue  # its first turn was not answered: too long (counted), or a repeated id's other record
            taken.add(record.id)
            item = self._prompt(record, turn)
            if item is None:
                continue
            length = len(item.prompt_ids)
            if not self.min_prompt_tokens <= length <= self.max_prompt_tokens:
                self._cut.add(index)  # the later turns need this one's answer
                reason = "skipped_too_long" if length > self.max_prompt_tokens else "skipped_too_short"
                self.counts[reason] += min(len(record.turns), self.last_turn) - turn + 1
                if turn == 1:
                    taken.discard(record.id)  # a repeated id may still be answered from a later record
                continue
            todo.append(item)
        return todo

    def _answered(self, record: PromptRecord, turn: int) -> bool:
        """Whether the output holds this record's answer to `turn` (same user text, with its answer)."""
        answer = self.answers.get(turn_id(record.id, turn))
        return answer is not None and answer.prompt == record.turns[turn - 1] and answer.response is not None

    def _prompt(self, record: PromptRecord, turn: int) -> TurnPrompt | None:
        """Turn `turn` of `record` with the target's earlier answers, or None (answered already, or not
        ready: counted)."""
        rid = turn_id(record.id, turn)
        if turn > 1 and rid in self.answers:
            self.counts["skipped_existing"] += 1
            return None
        messages: list[str] = []
        for earlier in range(1, turn):
            if not self._answered(record, earlier):
                self.counts["skipped_no_history"] += 1
                return None
            messages += [record.turns[earlier - 1], self.answers[turn_id(record.id, earlier)].response]
        user = record.turns[turn - 1]
        ids = chat_input_ids(self.tokenizer, [*messages, user], system=self.system, chat_template=self.chat_template)
        return TurnPrompt(rid, user, ids, turn, list(record.turns[: turn - 1]))
