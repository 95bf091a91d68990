"""`domino bench --batch_size`: the prompts decoded in left-padded batches, every method that decodes a batch
interleaved batch by batch on the same target, and per batch size B the throughput, the latency a row sees, τ,
the speedups and a lossless check against plain batched decoding (the result's `batch` section, `report.py`).

How a batch size runs:

* The prompts are sorted by length, longest first (ties keep the prompt order), and cut into batches of B (the last
  holds what is left): the same batches, in the same order, for every method. Each batch is left-padded with the
  tokenizer's pad token and passed to `generate` with its attention mask (`padding_side='left'`).
* Each method gets `warmup` untimed calls on the first batch; then, per batch and repeat, every method runs back to
  back in an order rotated per batch (`runner.run_interleaved`, as for single prompts). Sampling reseeds torch per
  (batch, repeat).
* transformers' prompt lookup and assisted decoding take one sequence at a time, and so do draft trees
  (`domino_tree`: a batch would run `domino`'s chain): at B ≥ 2 they are not run and are reported as not applicable.

What is measured, per batch (one `generate` call over its rows):

* total = the call's wall time; prefill = its start to the end of the target's first forward (the prefill over
  the padded batch; on CUDA that forward is waited for); decode = the rest.
* a row's tokens = its generated tokens up to and including its first EOS (what follows are pads); its decode
  tokens = those after the one the prefill produced.
* tokens/s = Σ decode tokens of every row ÷ Σ decode time of every batch (prefill excluded, as the single-sequence
  speedup); tokens/s e2e = Σ row tokens ÷ Σ total time.
* row ms/token = the batch's decode time ÷ the row's decode tokens (what a row waits per token when it waits for
  its batch), median over rows × repeats.
* speedup = tokens/s ÷ plain batched decoding's at the same B on the same kernels; `speedup_vs_stock` = ÷ plain
  batched decoding's on stock transformers kernels (`autoregressive_stock_kernels`) at the same B.
* τ = tokens per row-verify, bonus included, pooled over rows and steps (a Domino draft records one entry per row
  and step); plain decoding's is 1.
* lossless (greedy) = every row of every batch token-identical, pads included, to plain batched decoding's same row
  of the same batch at that B (its first repeat).
* profile (with `BenchConfig.profile`, on by default on CPU): a batch step's decode time split, in ms per step
  (decode time ÷ the target's forwards after the prefill): `verify` (the target forward and reading its logits),
  `draft` (backbone + LM head + head rollout, every live row at once), `rows` (the verify loop's own bookkeeping:
  spans, the policy, rows leaving, whole-batch criteria) and `other` (what the draft does not time: the call's
  set-up and return, and everything of a method whose draft times nothing, such as plain decoding).

B = 1 is the single-sequence benchmark (`runner.run_benchmark`, the run without `--batch_size`, unchanged): its
entry here is computed from those runs with the same formulas, its decode time being the streamer's (the first
generated chunk to the last) and its lossless check the single-sequence one.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from ..modeling.generation_domino import acceptance_length
from .instrument import ForwardProbe
from .runner import (
    BenchConfig,
    BenchPrompt,
    config_record,
    make_generation_config,
    prepare_methods,
    resolve_profile,
    run_benchmark,
    run_interleaved,
)
from .stats import (
    AR,
    AR_STOCK,
    AR_STOCK_FP32,
    LLAMA_CPP,
    MAX_REPORTED_MISMATCHES,
    REFERENCE_METHODS,
    median,
    ratio,
    source_shares,
)

logger = logging.getLogger(__name__)

# Methods that decode one sequence at a time: not applicable at B ≥ 2 (transformers raises for a batch; a batch with
# `use_draft_tree` would run `domino`'s chain, already measured as `domino`).
SINGLE_SEQUENCE_ONLY = {
    "prompt_lookup": "transformers' prompt lookup decoding takes one sequence at a time",
    "assisted": "transformers' assisted decoding takes one sequence at a time",
    "domino_tree": "draft trees verify one prompt at a time; a batch runs domino's chain (the domino row)",
    AR_STOCK_FP32: "a reference row of one prompt per call",
    LLAMA_CPP: "a reference row of one prompt per call (another engine)",
}
BATCH_ORDER = "sorted by prompt length, longest first (ties in prompt order); the last batch holds the rest"


@dataclass
class PromptBatch:
    """The prompts of one batch (`size` asked; the last batch of a run may hold fewer), padded on the left."""

    size: int
    index: int
    prompts: list[BenchPrompt]
    pad_token_id: int

    @property
    def label(self) -> str:
        return f"B={self.size} batch {self.index}"

    @property
    def padding(self) -> int:
        """Pad tokens added to the batch's prompts."""
        width = max(len(p.input_ids) for p in self.prompts)
        return sum(width - len(p.input_ids) for p in self.prompts)

    def tensors(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask), (rows, longest prompt), padded on the left."""
        width = max(len(p.input_ids) for p in self.prompts)
        ids = torch.full((len(self.prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(self.prompts):
            length = len(prompt.input_ids)
            ids[row, width - length :] = torch.tensor(prompt.input_ids, dtype=torch.long)
            mask[row, width - length :] = 1
        return ids.to(device), mask.to(device)


def make_batches(prompts: list[BenchPrompt], size: int, pad_token_id: int) -> list[PromptBatch]:
    """`prompts` in batches of `size`, in `BATCH_ORDER`."""
    ordered = sorted(prompts, key=lambda p: -len(p.input_ids))  # stable: ties keep the prompt order
    return [PromptBatch(size, i, ordered[start : start + size], pad_token_id)
            for i, start in enumerate(range(0, len(ordered), size))]


def row_tokens(row: list[int], eos_ids: set[int]) -> int:
    """Generated tokens of a row up to and including its first EOS (plain batched decoding pads after it)."""
    return next((i + 1 for i, token in enumerate(row) if token in eos_ids), len(row))


def eos_ids(generation_config) -> set[int]:
    eos = generation_config.eos_token_id
    return set() if eos is None else set(eos if isinstance(eos, list) else [eos])


@dataclass
class BatchRecord:
    """One timed `generate` call of one method on one batch (at B = 1: one single-sequence run). Seconds.

    `accepted` holds the draft tokens accepted at every row-verify (pooled over rows); `forwards` the target's
    verify forwards after the prefill (one per batch step)."""

    method: str
    batch_size: int
    index: int
    repeat: int
    prompts: list[str]
    rows: list[list[int]]  # generated ids per row as `generate` returned them, pads included
    tokens: list[int]  # per row, up to its EOS
    decode_tokens: list[int]  # per row, after the prefill's token
    total_s: float
    prefill_s: float
    decode_s: float
    accepted: list[int]
    sources: list[str]
    forwards: int
    padding: int = 0
    phases: dict[str, float] | None = None  # seconds per phase of the draft's own timing (`profile_drafting`)

    def row_ms_per_token(self) -> list[float]:
        return [1000.0 * self.decode_s / n for n in self.decode_tokens if n > 0]

    def summary(self) -> dict:
        """JSON-friendly view without the token ids."""
        return {"method": self.method, "batch_size": self.batch_size, "batch": self.index, "repeat": self.repeat,
                "prompts": self.prompts, "padding": self.padding, "row_tokens": self.tokens,
                "row_steps": len(self.accepted), "forwards": self.forwards,
                "total_ms": round(1000 * self.total_s, 3), "prefill_ms": round(1000 * self.prefill_s, 3),
                "decode_ms": round(1000 * self.decode_s, 3)}


def run_batch(target, method, batch: PromptBatch, repeat: int, generation_config, probe: ForwardProbe,
              seed) -> BatchRecord:
    """One timed `generate` call of `method` on `batch` (see the module doc for what is measured)."""
    input_ids, attention_mask = batch.tensors(target.device)
    probe.reset()
    if seed is not None:
        torch.manual_seed(seed)
    with method.active():
        t0 = time.perf_counter()
        output = method.generate(target, input_ids, generation_config, None, attention_mask=attention_mask)
        if output.is_cuda:
            torch.cuda.synchronize(output.device)
        t1 = time.perf_counter()
        steps = method.steps_from_stats()
        sources = method.step_sources()
        phases = method.phase_timings()
    rows = output[:, input_ids.shape[1] :].tolist()
    tokens = [row_tokens(row, eos_ids(generation_config)) for row in rows]
    decode_tokens = [max(n - 1, 0) for n in tokens]
    prefill_end = probe.calls[0].end if probe.calls else t1
    if not probe.calls or probe.calls[0].length != input_ids.shape[1]:
        logger.warning("%s, %s: the target's first forward is not the prefill over the padded batch (%s positions, "
                       "not %d): the prefill and decode times of this call are not split where they should be.",
                       method.name, batch.label, probe.calls[0].length if probe.calls else "no forward",
                       input_ids.shape[1])
    return BatchRecord(
        method=method.name, batch_size=batch.size, index=batch.index, repeat=repeat,
        prompts=[p.label for p in batch.prompts], rows=rows, tokens=tokens, decode_tokens=decode_tokens,
        total_s=t1 - t0, prefill_s=prefill_end - t0, decode_s=t1 - prefill_end,
        accepted=list(steps[1]) if steps is not None else [0] * sum(decode_tokens),  # plain decoding: τ = 1
        sources=sources, forwards=max(len(probe.calls) - 1, 0), padding=batch.padding, phases=phases,
    )


def single_sequence_records(runs: list[dict]) -> list[BatchRecord]:
    """The single-sequence benchmark's runs (`result["runs"]`) as batches of one."""
    return [
        BatchRecord(
            method=r["method"], batch_size=1, index=i, repeat=r["repeat"], prompts=[f"{r['set']}/{r['prompt_id']}"],
            rows=[], tokens=[r["new_tokens"]], decode_tokens=[r["decode_tokens"]], total_s=r["total_ms"] / 1000,
            prefill_s=r["prefill_ms"] / 1000, decode_s=r["decode_ms"] / 1000, accepted=r["accepted"],
            sources=r.get("sources", []), forwards=r["steps"],
        )
        for i, r in enumerate(runs)
    ]


def find_row_mismatches(records: list[BatchRecord]) -> dict[str, list[dict]]:
    """Greedy losslessness at B ≥ 2: every row vs the same row of the first plain batched run of its batch."""
    reference = {}
    for r in records:
        if r.method == AR:
            reference.setdefault((r.batch_size, r.index), r.rows)
    found: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        expected_rows = reference.get((r.batch_size, r.index))
        if expected_rows is None or r.method in REFERENCE_METHODS:
            continue
        for row, (expected, got) in enumerate(zip(expected_rows, r.rows)):
            if expected == got:
                continue
            pos = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
            found[r.method].append({
                "batch_size": r.batch_size, "batch": r.index, "row": row, "prompt": r.prompts[row],
                "repeat": r.repeat, "position": pos, "expected": expected[pos] if pos < len(expected) else None,
                "got": got[pos] if pos < len(got) else None,
            })
    return dict(found)


def summarize_records(records: list[BatchRecord]) -> dict:
    """One method's numbers at one batch size (speedups and lossless filled in by `summarize_size`)."""
    accepted = [a for r in records for a in r.accepted]
    decode_s = sum(r.decode_s for r in records)
    total_s = sum(r.total_s for r in records)
    return {
        "supported": True,
        "tau": acceptance_length(accepted),
        "tokens_per_s": ratio(sum(sum(r.decode_tokens) for r in records), decode_s),
        "tokens_per_s_e2e": ratio(sum(sum(r.tokens) for r in records), total_s),
        "row_ms_per_token": median([ms for r in records for ms in r.row_ms_per_token()]),
        "speedup": None,
        "speedup_vs_stock": None,
        "lossless": None,
        "mismatched_rows": None,
        "prefill_ms": median([1000 * r.prefill_s for r in records]),
        "new_tokens": sum(sum(r.tokens) for r in records),
        "row_steps": len(accepted),
        "forwards": sum(r.forwards for r in records),
        "num_batches": len(records),
        "num_rows": sum(len(r.tokens) for r in records),
        "step_sources": source_shares([s for r in records for s in r.sources]),
        "profile": step_profile(records),
    }


PROFILE_PHASES = {"verify": ("verify",), "draft": ("backbone", "lm_head", "head_rollout"), "rows": ("rows",)}


def step_profile(records: list[BatchRecord]) -> dict | None:
    """ms per batch step (decode time ÷ forwards after the prefill), split into `PROFILE_PHASES` and `other` where
    every record was profiled (`step_ms` alone otherwise, e.g. plain decoding); None without forwards."""
    forwards = sum(r.forwards for r in records)
    if not forwards:
        return None
    step_ms = 1000 * sum(r.decode_s for r in records) / forwards
    if any(r.phases is None for r in records):
        return {"step_ms": step_ms}
    split = {f"{phase}_ms": 1000 * sum(r.phases.get(key, 0.0) for r in records for key in keys) / forwards
             for phase, keys in PROFILE_PHASES.items()}
    return {"step_ms": step_ms, **split, "other_ms": max(step_ms - sum(split.values()), 0.0)}


def summarize_size(records: list[BatchRecord], names: list[str], size: int,
                   lossless: dict[str, tuple[bool | None, int | None]]) -> dict:
    """{method: numbers} at one batch size, in `names`' order; a method that takes one sequence at a time is
    `{"supported": False, "note": why}` at B ≥ 2. `lossless[name]` = (lossless, mismatched rows)."""
    by_method = defaultdict(list)
    for r in records:
        by_method[r.method].append(r)
    summary = {name: summarize_records(by_method[name]) for name in names if by_method.get(name)}
    ar, stock = summary.get(AR), summary.get(AR_STOCK)
    for name, values in summary.items():
        values["speedup"] = ratio(values["tokens_per_s"], ar["tokens_per_s"]) if ar else None
        values["speedup_vs_stock"] = ratio(values["tokens_per_s"], stock["tokens_per_s"]) if stock else None
        values["lossless"], values["mismatched_rows"] = lossless.get(name, (None, None))
    if size > 1:
        for name in names:
            if name in SINGLE_SEQUENCE_ONLY:
                summary[name] = {"supported": False, "note": SINGLE_SEQUENCE_ONLY[name]}
    return {name: summary[name] for name in names if name in summary}


def run_batch_sizes(target, prompts: list[BenchPrompt], config: BenchConfig, sizes: list[int], draft=None,
                    assistant=None, pad_token_id: int | None = None, references=()) -> dict:
    """The benchmark at every batch size of `sizes`: B = 1 is `run_benchmark` as without batching (its result is
    the top level, as ever; left out when 1 is not asked), and the result's `batch` section holds every size.

    Args:
        target, prompts, config, draft, assistant, references: as for `runner.run_benchmark` (the references run at
            B = 1 only).
        sizes (`list[int]`): positive batch sizes.
        pad_token_id (`int`, *optional*): the left padding's token (the tokenizer's pad token); default: the
            generation config's pad token (the target's EOS without one), else 0.
    """
    if not prompts:
        raise ValueError("No prompts to benchmark.")
    if any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"Batch sizes are positive integers, got {list(sizes)}.")
    sizes = sorted(set(sizes))
    generation_config = make_generation_config(target, config.max_new_tokens, config.temperature)
    profile = resolve_profile(config.profile, target.device)
    methods, kernels = prepare_methods(target, config, draft, assistant, profile=profile, references=references)
    if 1 in sizes:
        result = run_benchmark(target, prompts, config, draft=draft, assistant=assistant, references=references)
    else:  # no single-sequence run: the report holds the batch section alone
        record = config_record(config, prompts, profile=profile)
        result = {"config": {**record, "target_kernels": kernels}, "methods": {}, "mismatches": {}, "runs": []}
    names = [m.name for m in methods]
    if pad_token_id is None:
        pad_token_id = generation_config.pad_token_id if generation_config.pad_token_id is not None else 0
    batchable = [m for m in methods if m.name not in SINGLE_SEQUENCE_ONLY]
    records: list[BatchRecord] = []
    probe = ForwardProbe(target, synchronize_first=True)
    try:
        for size in (s for s in sizes if s > 1 and batchable):
            batches = make_batches(prompts, size, pad_token_id)
            records += run_interleaved(target, batchable, batches, config, generation_config, probe, run_batch,
                                       desc=f"bench B={size}")
    finally:
        probe.remove()
    mismatches = find_row_mismatches(records) if config.greedy else {}
    for name, found in mismatches.items():
        first = found[0]
        logger.error("LOSSLESS CHECK FAILED: '%s' differs from plain batched decoding in %d row(s); first: batch size "
                     "%d, prompt %s at new token %d (expected %s, got %s).", name, len(found), first["batch_size"],
                     first["prompt"], first["position"], first["expected"], first["got"])
    by_size = {}
    for size in sizes:
        if size == 1:
            single = result["methods"]
            checked = {n: (m["lossless"], m["mismatched_runs"]) for n, m in single.items()}
            by_size["1"] = summarize_size(single_sequence_records(result["runs"]), names, 1, checked)
            continue
        checked = {n: ((len(mismatches.get(n, [])) == 0, len(mismatches.get(n, [])))
                       if config.greedy and n not in REFERENCE_METHODS else (None, None)) for n in names}
        by_size[str(size)] = summarize_size([r for r in records if r.batch_size == size], names, size, checked)
    result["batch"] = {
        "config": {"sizes": sizes, "order": BATCH_ORDER, "pad_token_id": pad_token_id, "padding_side": "left",
                   "batches": {str(s): -(-len(prompts) // s) for s in sizes}},
        "sizes": by_size,
        "mismatches": {m: found[:MAX_REPORTED_MISMATCHES] for m, found in mismatches.items()},
        "runs": [r.summary() for r in records],
    }
    return result

