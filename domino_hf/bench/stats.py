"""Turning `RunRecord`s into the numbers the speculative decoding literature reports.

Definitions (the same for every method, see `instrument.py` for how steps are counted):

* τ (acceptance length) = tokens produced per target verify forward, bonus token included, pooled over
  all runs: `Σ(accepted + 1) / #steps` (`acceptance_length`, the generator's own definition). Plain decoding
  has exactly one token per forward: τ = 1.
* per-position acceptance[k] = P(draft slot k accepted | slot k was drafted), pooled over steps.
* histogram: number of verify steps that produced 1, 2, … tokens (sums to the number of steps).
* decode ms/token = (last chunk − first generated chunk) / tokens after prefill, per run; a method's
  value is the median over prompts × repeats; speedup = median(autoregressive) / median(method), so the
  autoregressive row is exactly 1. `speedup_paired` is the median of per-(prompt, repeat) ratios.
* tokens/s = Σ new tokens / Σ end-to-end generate time (prefill included).
* profile: decode time per verify step split into `instrument.PHASES`, see `profile_method`.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

from ..modeling.generation_domino import acceptance_length
from .instrument import DRAFT_PHASES, PHASES, RunRecord

AR = "autoregressive"
# Plain decoding on stock transformers kernels, timed beside optimized-kernel runs (`--target_kernels optimized`):
# `speedup_vs_stock` is what a user switching from stock `generate` gains. Its tokens are not lossless-checked:
# another kernel set may flip a near-tied argmax.
AR_STOCK = "autoregressive_stock_kernels"
# Plain decoding by a second, float32 copy of the target on stock kernels, timed beside a bfloat16 target
# (`speedup_vs_stock_fp32`: what bf16 on the product's kernels gains over stock transformers in fp32), and llama.cpp
# decoding the packaged target's GGUF (`references.py`): reference rows, not lossless-checked either.
AR_STOCK_FP32 = "autoregressive_stock_fp32"
LLAMA_CPP = "llama_cpp"
REFERENCE_METHODS = (AR_STOCK, AR_STOCK_FP32, LLAMA_CPP)
MAX_REPORTED_MISMATCHES = 20
# Where a Domino draft's proposal of a step came from: its block, a span of the context (lookup), a span of the
# cross-request store (cache), or nothing (a plain target step).
STEP_SOURCES = ("domino", "lookup", "cache", "none")


def per_position_acceptance(drafted: list[int], accepted: list[int]) -> tuple[list[float], list[int]]:
    """Rate and number of steps at which each draft position was drafted (position 0 = first draft token)."""
    width = max(drafted, default=0)
    seen = [0] * width
    hits = [0] * width
    for d, a in zip(drafted, accepted):
        for k in range(d):
            seen[k] += 1
            hits[k] += k < a
    return [h / s if s else 0.0 for h, s in zip(hits, seen)], seen


def histogram(accepted: list[int]) -> dict[str, int]:
    """{tokens produced in a step: number of steps}, keys "1".."max" (strings: JSON keys)."""
    counts = Counter(a + 1 for a in accepted)
    top = max(counts, default=0)
    return {str(n): counts.get(n, 0) for n in range(1, top + 1)}


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def summarize_method(
    runs: list[RunRecord], ar_runs: list[RunRecord] | None, stock_runs: list[RunRecord] | None = None,
    fp32_runs: list[RunRecord] | None = None,
) -> dict:
    """Aggregate the runs of one method (optionally restricted to one prompt set)."""
    drafted = [d for r in runs for d in r.drafted]
    accepted = [a for r in runs for a in r.accepted]
    rates, seen = per_position_acceptance(drafted, accepted)
    ms = median([r.decode_ms_per_token for r in runs])
    result = {
        "tau": acceptance_length(accepted),
        "speedup": None,
        "speedup_paired": None,
        "speedup_vs_stock": None,
        "speedup_vs_stock_fp32": None,
        "tokens_per_s": ratio(sum(r.new_tokens for r in runs), sum(r.total_s for r in runs)),
        "decode_ms_per_token": ms,
        "prefill_ms": median([1000 * r.prefill_s for r in runs]),
        "lossless": None,
        "per_position_acceptance": rates,
        "per_position_drafted": seen,
        "histogram": histogram(accepted),
        "mean_drafted_per_step": ratio(sum(drafted), len(drafted)),
        "num_steps": len(accepted),
        "step_sources": source_shares([s for r in runs for s in r.sources]),
        "num_runs": len(runs),
        "new_tokens": sum(r.new_tokens for r in runs),
    }
    if ar_runs:
        ar_ms = median([r.decode_ms_per_token for r in ar_runs])
        result["speedup"] = 1.0 if runs is ar_runs else ratio(ar_ms, ms)
        by_key = {(r.prompt_set, r.prompt_id, r.repeat): r.decode_ms_per_token for r in ar_runs}
        paired = [
            ratio(by_key.get((r.prompt_set, r.prompt_id, r.repeat)), r.decode_ms_per_token)
            for r in runs
            if r.decode_ms_per_token
        ]
        result["speedup_paired"] = 1.0 if runs is ar_runs else median(paired)
    if stock_runs:
        result["speedup_vs_stock"] = ratio(median([r.decode_ms_per_token for r in stock_runs]), ms)
    if fp32_runs:
        result["speedup_vs_stock_fp32"] = ratio(median([r.decode_ms_per_token for r in fp32_runs]), ms)
    return result


def source_shares(sources: list[str]) -> dict[str, float] | None:
    """Share of verify steps per proposal source (a Domino draft's domino / lookup / cache / none), None
    without."""
    if not sources:
        return None
    counts = Counter(sources)
    return {name: counts[name] / len(sources) for name in STEP_SOURCES}


def profile_method(runs: list[RunRecord]) -> dict:
    """Where a verify step's time goes, in milliseconds per verify step.

    Aggregation: the mean per step pooled over all timed runs (Σ phase time ÷ Σ verify steps), not a median:
    means of the parts add up to the mean step time, medians would not. Phases (`instrument.PHASES`):

    * `target_verify`: target forwards after prefill (one per step).
    * `backbone` (context K/V update included), `lm_head` (base logits of all slots), `head_rollout`
      (slot-by-slot choice, with the Domino head's corrections when on): a Domino draft's own timings; 0 for
      methods without one. DFlash mode still has a rollout: the per-slot argmax / processing loop.
    * `draft_other`: the assistant's forwards (`assisted`); its own generate loop around them is overhead.
    * `loop_overhead`: decode time minus all of the above: transformers' loop, logits processing, cache
      cropping, acceptance, Python (and prompt lookup's n-gram search). Clamped at 0 (timer noise on a very
      short run could push it slightly below).

    Ratios (None where undefined): `draft_to_verify` = draft time (backbone + lm_head + head_rollout +
    draft_other) ÷ one target verify forward; `head_rollout_to_draft` = head_rollout ÷ draft time (Domino
    drafts only); `loop_overhead_to_step` = loop_overhead ÷ step time.
    """
    steps = sum(len(r.accepted) for r in runs)
    totals = dict.fromkeys(PHASES, 0.0)
    for r in runs:
        for phase, seconds in r.phase_seconds().items():
            totals[phase] += seconds
    decode = sum(r.decode_s for r in runs)
    ms = {p: (1000 * s / steps if steps else None) for p, s in totals.items()}
    if steps:
        ms["loop_overhead"] = max(ms["loop_overhead"], 0.0)
    draft = sum(ms[p] for p in DRAFT_PHASES) if steps else None
    domino_phases = steps and any(ms[p] for p in ("backbone", "lm_head", "head_rollout"))
    step = 1000 * decode / steps if steps else None
    return {
        "steps": steps,
        "runs": len(runs),
        "step_ms": step,
        "draft_ms": draft,
        "ms_per_step": ms,
        "ratios": {
            "draft_to_verify": ratio(draft, ms["target_verify"]) if draft else None,
            "head_rollout_to_draft": ratio(ms["head_rollout"], draft) if domino_phases else None,
            "loop_overhead_to_step": ratio(ms["loop_overhead"], step),
        },
        "prefill_ms_median": median([1000 * r.prefill_s for r in runs]),
        "target_prefill_ms_median": median([1000 * r.target_prefill_s for r in runs]),
    }


def find_mismatches(runs: list[RunRecord]) -> dict[str, list[dict]]:
    """Greedy losslessness: every run's tokens vs the first autoregressive run of the same prompt."""
    reference = {}
    for r in runs:
        if r.method == AR:
            reference.setdefault((r.prompt_set, r.prompt_id), r.output_ids)
    out: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        ref = reference.get((r.prompt_set, r.prompt_id))
        if ref is None or r.output_ids == ref or r.method in REFERENCE_METHODS:
            continue
        pos = next((i for i, (a, b) in enumerate(zip(ref, r.output_ids)) if a != b), min(len(ref), len(r.output_ids)))
        out[r.method].append(
            {
                "set": r.prompt_set,
                "prompt_id": r.prompt_id,
                "repeat": r.repeat,
                "position": pos,
                "expected": ref[pos] if pos < len(ref) else None,
                "got": r.output_ids[pos] if pos < len(r.output_ids) else None,
                "expected_len": len(ref),
                "got_len": len(r.output_ids),
            }
        )
    return dict(out)


def summarize(runs: list[RunRecord], methods: list[str], greedy: bool, profile: bool = True) -> dict:
    """{"methods": {name: …}, "by_set": {set: {name: …}}, "profile": {name: …}, "mismatches": …}; no
    "profile" when the runs were not profiled (their forward times are then not synchronised on CUDA)."""
    by_method = defaultdict(list)
    for r in runs:
        by_method[r.method].append(r)
    mismatches = find_mismatches(runs) if greedy else {}

    def block(selected: dict[str, list[RunRecord]], scope: set[str]) -> dict:
        ar_runs, stock_runs, fp32_runs = selected.get(AR), selected.get(AR_STOCK), selected.get(AR_STOCK_FP32)
        summary = {m: summarize_method(selected[m], ar_runs, stock_runs, fp32_runs) for m in methods if selected.get(m)}
        for name, values in summary.items():
            checked = greedy and name not in REFERENCE_METHODS
            bad = sum(x["set"] in scope for x in mismatches.get(name, []))
            values["lossless"] = (bad == 0) if checked else None
            values["mismatched_runs"] = bad if checked else None
        return summary

    sets = sorted({r.prompt_set for r in runs})
    result = {"methods": block(by_method, set(sets))}
    if len(sets) > 1:
        result["by_set"] = {
            s: block({m: [r for r in rs if r.prompt_set == s] for m, rs in by_method.items()}, {s}) for s in sets
        }
    if profile:  # not for another engine's runs (llama.cpp): no forward of theirs was probed
        result["profile"] = {m: profile_method(by_method[m]) for m in methods
                             if any(r.target_prefill_s for r in by_method.get(m, ()))}
    result["mismatches"] = {m: found[:MAX_REPORTED_MISMATCHES] for m, found in mismatches.items()}
    return result


def repeat_spread(runs: list[dict]) -> dict[str, tuple[float, float]]:
    """Each method's speedup computed within each repeat (medians over that repeat's prompts, as the headline's),
    lowest and highest: {method: (min, max)}. Empty with fewer than two repeats or no autoregressive runs. `runs`
    are the report's JSON `runs` (`RunRecord.summary`)."""
    ms: dict[tuple[str, int], list[float]] = defaultdict(list)
    for run in runs:
        if run.get("decode_ms_per_token") is not None:
            ms[(run["method"], run["repeat"])].append(run["decode_ms_per_token"])
    repeats = sorted({repeat for _, repeat in ms})
    baseline = {repeat: median(ms[(AR, repeat)]) for repeat in repeats if (AR, repeat) in ms}
    if len(repeats) < 2 or not baseline:
        return {}
    spread = {}
    for method in dict.fromkeys(name for name, _ in ms):
        speedups = [baseline[r] / median(ms[(method, r)]) for r in repeats if r in baseline and (method, r) in ms]
        if speedups:
            spread[method] = (min(speedups), max(speedups))
    return spread
