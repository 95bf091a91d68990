"""The repeated-workload suite (`domino bench --suite repeated`): workloads that repeat themselves, where a draft
that remembers earlier requests (a cross-request `SuffixCache`) has something to find.

The three packaged workloads (`benchmark_sets.REPEATED_SETS`, written for this project):

* `repeated_eval`: an evaluation-style run, one fixed few-shot preamble (worked exemplars ending "The answer is
  N.") above each of 20 questions; every question is an independent `generate` call.
* `refine_loop`: short writing and explaining tasks, each followed by "improve your answer" turns.
* `edit_loop`: small Python functions, each edited turn after turn (docstring, type hints, a rename, an edge case).

Every record is a conversation whose turns run chained: turn k's prompt is the chat template applied to the user
turns so far and the previous answers. The answers fed back are the reference method's outputs (`autoregressive`
when it runs: every lossless method reproduces them greedily; at T > 0 its sample), so all methods see the same
prompts; a method whose greedy output differs is flagged by the lossless check as in `runner.run_benchmark`.

Methods interleave turn by turn, their order rotated per turn. `domino_cache` gets its own store, passed with each
call (`suffix_cache=`); the other Domino methods pass `use_suffix_cache=False`. Warm-up runs use `WARMUP_TURN`,
never a timed prompt, and every store is emptied after the warm-up and at the start of each workload, so each
workload starts cold and its numbers do not depend on which workloads ran before it. With `repeats`, the whole
suite runs again (stores emptied again).

Besides the usual per-method numbers (`stats.summarize`: overall and `by_set`), the result has `suffix_cache`:
for each workload and store-using method, the store's final size and its measured cost (`measure_cache_cost`).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..chat import chat_input_ids
from ..data import read_prompts
from .runner import (
    AR,
    BenchConfig,
    BenchPrompt,
    Method,
    Probes,
    RunRecord,
    config_record,
    log_mismatches,
    make_generation_config,
    prepare_methods,
    resolve_profile,
    run_once,
    warm_up,
)
from .stats import summarize

logger = logging.getLogger(__name__)

# The untimed warm-up prompt: in no workload, so no timed prompt is ever seen (or stored) before it is timed.
WARMUP_TURN = "Name the seven days of the week, one per line."
CONTEXT_TOKENS = 64  # a cost-measure lookup reads this many tokens of context …
LOOKUP_TOKENS = 32  # … and asks for this many
LOOKUPS_PER_SEQUENCE = 4  # cut points per stored sequence in the cost measure


@dataclass
class Conversation:
    """One record of a workload: its user turns, run chained.

    Args:
        prompt_set (`str`): the workload (prompt set) it belongs to.
        id (`str`): the record's id.
        turns (`list[str]`): the user turns, in order.
        system (`str`, *optional*): the record's own system prompt.
    """

    prompt_set: str
    id: str
    turns: list[str]
    system: str | None = None


def read_conversations(sources: list[str], limit: int | None = None) -> list[Conversation]:
    """The records of each source (a prompt set name or a JSONL path), every user turn kept.

    Args:
        sources (`list[str]`): what `data.read_prompts` reads.
        limit (`int`, *optional*): records per source (all when None).
    """
    conversations = []
    for source in sources:
        name = Path(source).stem if Path(source).suffix else source
        for record in read_prompts(source, limit).records:
            conversations.append(Conversation(name, record.id, list(record.turns), record.meta.get("system")))
    return conversations


def turn_prompt(tokenizer, conversation: Conversation, answers: list[str], system: str | None = None,
                chat_template: str = "auto") -> BenchPrompt:
    """The prompt of the turn after `answers`: user turns and answers alternating, the next user turn last.

    Args:
        tokenizer (`PreTrainedTokenizerBase`): the target's tokenizer.
        conversation (`Conversation`): the record.
        answers (`list[str]`): the answers to its first `len(answers)` turns.
        system (`str`, *optional*): a system prompt (else the record's own).
        chat_template (`str`): as `chat.chat_input_ids` takes it.
    """
    k = len(answers)
    history = [text for turn, answer in zip(conversation.turns, answers) for text in (turn, answer)]
    ids = chat_input_ids(tokenizer, [*history, conversation.turns[k]], system=system or conversation.system,
                         chat_template=chat_template)
    return BenchPrompt(conversation.prompt_set, f"{conversation.id}/turn{k + 1}", ids)


def answer_text(tokenizer, output_ids: list[int]) -> str:
    """A generated answer as the text the next turn's history holds (special tokens dropped)."""
    return tokenizer.decode(output_ids, skip_special_tokens=True).strip()


def store_of(method: Method):
    """The method's cross-request `SuffixCache`, or None for a method without one."""
    return getattr(method, "suffix_cache", None)


def _us(seconds: list[float]) -> float | None:
    return 1e6 * statistics.median(seconds) if seconds else None


def measure_cache_cost(cache, sequences: list[tuple[int, list[int]]]) -> dict:
    """What a store costs, measured on what it holds: its size, a lookup, and an add.

    `lookup` is timed on `cache` itself with the last `CONTEXT_TOKENS` tokens before `LOOKUPS_PER_SEQUENCE` cut
    points spread over each sequence's output (the last one at its end), asking for `LOOKUP_TOKENS` tokens. `add`
    is timed by replaying the sequences, in order, into an empty store of the same settings, which then holds
    what `cache` holds.

    Args:
        cache (`SuffixCache`): the store after a workload.
        sequences (`list[tuple[int, list[int]]]`): (prompt length, prompt + output ids) of each call, in order.
    """
    lookups = []
    for prompt_len, ids in sequences:
        new = len(ids) - prompt_len
        for j in range(1, LOOKUPS_PER_SEQUENCE + 1):
            cut = prompt_len + (new * j) // LOOKUPS_PER_SEQUENCE
            context = ids[max(cut - CONTEXT_TOKENS, 0) : cut]
            t0 = time.perf_counter()
            cache.lookup(context, LOOKUP_TOKENS)
            lookups.append(time.perf_counter() - t0)
    replay = type(cache)(max_tokens=cache.max_tokens, ngram_levels=cache.ngram_levels,
                         max_candidates=cache.max_candidates, max_match=cache.max_match)
    adds = []
    for _, ids in sequences:
        t0 = time.perf_counter()
        replay.add(ids)
        adds.append(time.perf_counter() - t0)
    tokens = sum(len(ids) for _, ids in sequences)
    return {
        "num_tokens": cache.num_tokens,
        "nbytes": cache.nbytes,
        "sequences": len(sequences),
        "lookups": len(lookups),
        "lookup_us_median": _us(lookups),
        "add_us_median": _us(adds),
        "add_us_per_token": 1e6 * sum(adds) / tokens if tokens else None,
    }


def _per_step_us(cost: dict, runs: list[RunRecord]) -> float | None:
    """One lookup per verify step plus the call's add spread over its steps."""
    steps = sum(len(r.accepted) for r in runs)
    if not steps or cost["lookup_us_median"] is None:
        return None
    return cost["lookup_us_median"] + (cost["add_us_median"] or 0.0) * len(runs) / steps


def _reference(methods: list[Method]) -> Method:
    for method in methods:
        if method.name == AR:
            return method
    logger.warning("No 'autoregressive' method: the chained turns feed back %s's answers.", methods[0].name)
    return methods[0]


def _workloads(conversations: list[Conversation]) -> dict[str, list[Conversation]]:
    groups: dict[str, list[Conversation]] = defaultdict(list)
    for conversation in conversations:
        groups[conversation.prompt_set].append(conversation)
    return dict(groups)


class _Suite:
    """The state of one suite run: the methods, the runs so far, the turn counter that rotates the order."""

    def __init__(self, target, tokenizer, config: BenchConfig, methods: list[Method], probes, system, chat_template):
        self.target, self.tokenizer, self.config = target, tokenizer, config
        self.methods, self.probes = methods, probes
        self.system, self.chat_template = system, chat_template
        self.generation_config = make_generation_config(target, config.max_new_tokens, config.temperature)
        self.reference = _reference(methods)
        self.runs: list[RunRecord] = []
        self.timed_prompts: list[BenchPrompt] = []
        self.turn_index = 0

    def warm_up(self) -> BenchPrompt:
        ids = chat_input_ids(self.tokenizer, [WARMUP_TURN], system=self.system, chat_template=self.chat_template)
        prompt = BenchPrompt("warmup", "warmup", ids)
        warm_up(self.target, self.methods, prompt, self.config, self.generation_config, self.probes)
        return prompt

    def workload(self, conversations: list[Conversation], repeat: int, bar) -> dict[str, dict]:
        """Run one workload from empty stores; the cost of each store at its end."""
        for method in self.methods:
            method.reset()
        stored: dict[str, list[tuple[int, list[int]]]] = defaultdict(list)
        runs: dict[str, list[RunRecord]] = defaultdict(list)
        for conversation in conversations:
            answers: list[str] = []
            for _ in conversation.turns:
                prompt = turn_prompt(self.tokenizer, conversation, answers, self.system, self.chat_template)
                outputs = self.turn(prompt, repeat, bar, stored, runs)
                answers.append(answer_text(self.tokenizer, outputs[self.reference.name]))
        costs = {}
        for method in self.methods:
            cache = store_of(method)
            if cache is not None:
                costs[method.name] = measure_cache_cost(cache, stored[method.name])
                costs[method.name]["per_step_us"] = _per_step_us(costs[method.name], runs[method.name])
        return costs

    def turn(self, prompt: BenchPrompt, repeat: int, bar, stored, runs) -> dict[str, list[int]]:
        """Every method on one prompt, in the order rotated for this turn; {method: output ids}."""
        if repeat == 0:
            self.timed_prompts.append(prompt)
        config = self.config
        seed = None if config.greedy else config.seed + 1000 * self.turn_index + repeat
        shift = (self.turn_index + repeat) % len(self.methods)
        self.turn_index += 1
        outputs = {}
        for method in self.methods[shift:] + self.methods[:shift]:
            record = run_once(self.target, method, prompt, repeat, self.generation_config, self.probes, seed)
            self.runs.append(record)
            runs[method.name].append(record)
            outputs[method.name] = record.output_ids
            if store_of(method) is not None:
                stored[method.name].append((len(prompt.input_ids), prompt.input_ids + record.output_ids))
            bar.set_postfix_str(f"{prompt.prompt_set}/{prompt.prompt_id} {method.name}")
            bar.update()
        return outputs


def pooled_cost(by_set: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Per store-using method over all workloads: the largest store, and medians of the per-workload costs."""
    pooled: dict[str, dict] = {}
    names = {name for costs in by_set.values() for name in costs}
    for name in sorted(names):
        costs = [c[name] for c in by_set.values() if name in c]
        pooled[name] = {
            "num_tokens": max(c["num_tokens"] for c in costs),
            "nbytes": max(c["nbytes"] for c in costs),
            "sequences": sum(c["sequences"] for c in costs),
        }
        for key in ("lookup_us_median", "add_us_median", "add_us_per_token", "per_step_us"):
            values = [c[key] for c in costs if c[key] is not None]
            pooled[name][key] = statistics.median(values) if values else None
    return pooled


def run_repeated(target, tokenizer, conversations: list[Conversation], config: BenchConfig, draft=None,
                 assistant=None, system: str | None = None, chat_template: str = "auto", references=()) -> dict:
    """Run the repeated-workload suite; the JSON-ready result of `runner.run_benchmark` plus `suffix_cache`.

    Args:
        target (`PreTrainedModel`): the loaded target (its kernels decide whether the stock baseline runs).
        tokenizer (`PreTrainedTokenizerBase`): the target's tokenizer, for the chained prompts.
        conversations (`list[Conversation]`): the workloads' records (`read_conversations`), grouped by prompt set.
        config (`BenchConfig`): methods, decoding and timing settings, as for `run_benchmark`.
        draft (`DominoDraftModel`, *optional*): the draft of the Domino methods.
        assistant (`PreTrainedModel`, *optional*): the model of `assisted`.
        system (`str`, *optional*): a system prompt for every conversation.
        chat_template (`str`): as `chat.chat_input_ids` takes it.
        references (`list[Method]`): reference rows, as for `run_benchmark`.
    """
    if not conversations:
        raise ValueError("No conversations to benchmark.")
    from tqdm.auto import tqdm

    profile = resolve_profile(config.profile, target.device)
    methods, kernels = prepare_methods(target, config, draft, assistant, profile, references)
    probes = Probes(target, [assistant], profile, [m.generator for m in methods])
    suite = _Suite(target, tokenizer, config, methods, probes, system, chat_template)
    workloads = _workloads(conversations)
    total = len(methods) * config.repeats * sum(len(c.turns) for c in conversations)
    costs: dict[str, dict] = {}
    try:
        warm = suite.warm_up()
        with tqdm(total=total, desc="bench (repeated)", unit="run", disable=not config.progress) as bar:
            for repeat in range(config.repeats):
                for name, group in workloads.items():
                    costs[name] = suite.workload(group, repeat, bar)  # the last repeat's stores are reported
    finally:
        probes.remove()

    names = [m.name for m in methods]
    record = config_record(config, suite.timed_prompts, profile)
    record.update(target_kernels=kernels, suite="repeated", reference_method=suite.reference.name,
                  warmup_prompt=WARMUP_TURN, warmup_prompt_tokens=len(warm.input_ids),
                  conversations={name: len(group) for name, group in workloads.items()})
    result = {"config": record, **summarize(suite.runs, names, config.greedy, profile)}
    if any(costs.values()):
        result["suffix_cache"] = {"methods": pooled_cost(costs), "by_set": costs}
    result["runs"] = [r.summary() for r in suite.runs]
    log_mismatches(result)
    return result
