"""Writing a benchmark result: `bench.json`, `bench.md` and PNG plots.

JSON schema (top level):

* `config`: what was run (methods, prompt sets and counts, generation settings, target/draft names,
  library versions, threads, date).
* `methods`: {method: {tau, speedup, speedup_paired, tokens_per_s, decode_ms_per_token, prefill_ms,
  lossless, mismatched_runs, per_position_acceptance, per_position_drafted, histogram,
  mean_drafted_per_step, num_steps, num_runs, new_tokens}}. `lossless` is null when sampling.
* `by_set`: the same per prompt set (only when several sets ran; speedups against that set's baseline).
* `profile` (when profiling; `config.profile` says whether it was on): {method: {steps, runs, step_ms,
  draft_ms, ms_per_step: {target_verify, backbone, lm_head, head_rollout, draft_other, loop_overhead},
  ratios: {draft_to_verify, head_rollout_to_draft, loop_overhead_to_step}, prefill_ms_median,
  target_prefill_ms_median}}; ms per verify step, pooled means (definitions: `stats.profile_method`).
* `mismatches`: {method: [first greedy differences vs autoregressive]}.
* `suffix_cache` (the repeated-workload suite, `workloads.py`, with a store-using method such as `domino_cache`):
  `by_set`: {workload: {method: {num_tokens, nbytes, sequences, lookups, lookup_us_median,
  add_us_median, add_us_per_token, per_step_us}}}, the store at the end of each workload and its measured cost;
  `methods`: the same pooled over workloads (largest store, medians of the per-workload costs). The config then
  has `suite`, `reference_method`, `warmup_prompt` and `conversations`; `prompt_sets` counts turns.
* `batch` (with `--batch_size` other than 1; `batched.py`): `config`: {sizes, order, pad_token_id, padding_side,
  batches (per size)}; `sizes`: {B: {method: {supported, tau, tokens_per_s, tokens_per_s_e2e, row_ms_per_token,
  speedup, speedup_vs_stock, lossless, mismatched_rows, prefill_ms, new_tokens, row_steps, forwards, num_batches,
  num_rows, step_sources, profile: {step_ms, verify_ms, draft_ms, rows_ms, other_ms} (ms per batch step; plain
  decoding step_ms alone)}}}, a method that takes one sequence at a time being {supported: false, note} at B ≥ 2;
  `mismatches`: {method: [first rows that differ from plain batched decoding]}; `runs`: one entry per timed batch.
  B = 1 is the single-sequence run of the top level; without 1 among the sizes, `methods` and `runs` are empty.
* `humaneval_pass1`: present with `--humaneval_pass1` (see `humaneval.py`).
* `runs`: one entry per timed generate call (per-step accepted/drafted counts, timings, and `phase_ms`
  when profiling).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .instrument import PHASES
from .references import NOT_CHECKED, reference_notes
from .stats import AR_STOCK, repeat_spread

logger = logging.getLogger(__name__)


def _fmt(value, pattern="{:.2f}", missing="–"):
    return missing if value is None else pattern.format(value)


def _lossless(value, name: str = "") -> str:
    if value is None and name in NOT_CHECKED:
        return NOT_CHECKED[name]
    return {True: "yes", False: "**NO**", None: "n/a (sampling)"}[value]


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; every column but the first is right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _shares(shares: dict | None, cache: bool = False) -> str:
    if not shares:
        return "–"
    names = ("lookup", "cache", "none") if cache else ("lookup", "none")
    return " / ".join(f"{shares.get(name, 0.0):.0%}" for name in names)


def methods_table(methods: dict, spread: dict | None = None) -> str:
    """The headline table; `spread` ({method: (min, max)}, `stats.repeat_spread`) adds the speedup's range over
    the repeats."""
    spread = spread or {}
    vs_stock = any(m.get("speedup_vs_stock") is not None for m in methods.values())
    vs_fp32 = any(m.get("speedup_vs_stock_fp32") is not None for m in methods.values())
    header = ["method", "τ", "speedup", *(["speedup per repeat, min–max"] if spread else []),
              *(["vs stock transformers"] if vs_stock else []), *(["vs stock fp32"] if vs_fp32 else [])]
    sources = any(m.get("step_sources") for m in methods.values())
    cache = any((m.get("step_sources") or {}).get("cache") for m in methods.values())
    columns = "steps: lookup / cache / plain" if cache else "steps: lookup / plain"
    header += ["decode ms/token", "tokens/s (e2e)", *([columns] if sources else []), "lossless"]
    rows = [
        [
            name,
            _fmt(m["tau"]),
            _fmt(m["speedup"], "{:.2f}×"),
            *([f"{spread[name][0]:.2f}–{spread[name][1]:.2f}×" if name in spread else "–"] if spread else []),
            *([_fmt(m.get("speedup_vs_stock"), "{:.2f}×")] if vs_stock else []),
            *([_fmt(m.get("speedup_vs_stock_fp32"), "{:.2f}×")] if vs_fp32 else []),
            _fmt(m["decode_ms_per_token"], "{:.1f}"),
            _fmt(m["tokens_per_s"], "{:.1f}"),
            *([_shares(m.get("step_sources"), cache)] if sources else []),
            _lossless(m["lossless"], name),
        ]
        for name, m in methods.items()
    ]
    return _table(header, rows)


def by_set_table(by_set: dict) -> str:
    methods = list(next(iter(by_set.values())).keys())
    rows = [
        [name] + [f"{_fmt(b[m]['speedup'], '{:.2f}×')} / {_fmt(b[m]['tau'])}" if m in b else "–" for m in methods]
        for name, b in by_set.items()
    ]
    return _table(["set", *methods], rows)


PHASE_LABELS = {
    "target_verify": "target verify",
    "backbone": "backbone",
    "lm_head": "LM head",
    "head_rollout": "head rollout",
    "draft_other": "assistant",
    "loop_overhead": "loop overhead",
}


def profile_table(profile: dict) -> str:
    header = [
        "method",
        "step ms",
        *PHASE_LABELS.values(),
        "draft ÷ verify",
        "rollout ÷ draft",
        "overhead ÷ step",
        "prefill ms",
    ]
    rows = []
    for name, p in profile.items():
        r = p["ratios"]
        rows.append(
            [name, _fmt(p["step_ms"])]
            + [_fmt(p["ms_per_step"][k]) for k in PHASES]
            + [_fmt(r["draft_to_verify"]), _fmt(r["head_rollout_to_draft"], "{:.0%}")]
            + [_fmt(r["loop_overhead_to_step"], "{:.0%}"), _fmt(p["prefill_ms_median"], "{:.1f}")]
        )
    return _table(header, rows)


def cache_table(suffix_cache: dict) -> str:
    """One row per workload and store-using method, then the pooled row: size and measured cost of the store."""

    def row(label: str, c: dict) -> list[str]:
        return [label, f"{c['num_tokens']:,}", _fmt(c["nbytes"] / 2**20, "{:.1f}"),
                _fmt(c["lookup_us_median"], "{:.0f}"), _fmt(c["add_us_median"], "{:.0f}"),
                _fmt(c["add_us_per_token"], "{:.2f}"), _fmt(c["per_step_us"], "{:.0f}")]

    rows = [row(f"{workload} · {name}", c) for workload, costs in suffix_cache["by_set"].items()
            for name, c in costs.items()]
    rows += [row(f"all (largest, medians) · {name}", c) for name, c in suffix_cache["methods"].items()]
    header = ["workload · method", "stored tokens", "MiB", "lookup µs", "add µs",
              "add µs/token", "µs per step"]
    return _table(header, rows)


CACHE_NOTE = (
    "Each workload starts with empty stores. The store's memory is fixed when it is created; a lookup reads the last "
    "64 tokens before points spread over each stored output and asks for 32 tokens (medians); an add is timed by "
    "replaying the workload's sequences into an empty store; µs per step = one lookup + the call's add spread over "
    "its steps."
)


# Below these a speedup is a rough estimate from a small sample, and the report says so.
FEW_PROMPTS = 10
FEW_TOKENS = 64


def sample_note(config: dict, repeats_spread: bool) -> str | None:
    """A caution under the headline when it comes from fewer than FEW_PROMPTS prompts or FEW_TOKENS new tokens a
    prompt (what to raise for a headline, and --repeats for a spread when there is none); None otherwise."""
    prompts = config.get("num_prompts") or sum(config.get("prompt_sets", {}).values())
    small = [f"{prompts} prompt{'s' * (prompts != 1)}"] * (prompts < FEW_PROMPTS)
    small += [f"{config['max_new_tokens']} new tokens a prompt"] * (config["max_new_tokens"] < FEW_TOKENS)
    if not small:
        return None
    spread = "" if repeats_spread else ", and --repeats 3 or more for a spread over repeats"
    return (f"**Small sample: {' and '.join(small)}.** These speedups are a rough estimate, not a headline: for one, "
            f"run at least {FEW_PROMPTS} prompts (--num_prompts) of at least {FEW_TOKENS} new tokens "
            f"(--max_new_tokens){spread}.")


def warmup_text(config: dict) -> str:
    """What ran before timing: `config.warmup` untimed calls per method ("" when the report does not record it)."""
    warmup = config.get("warmup")
    if warmup is None:
        return ""
    return "no warm-up" if warmup == 0 else f"{warmup} untimed warm-up call{'s' * (warmup != 1)} per method"


BATCH_NOTE = (
    "The prompts, sorted by length (longest first), decoded in left-padded batches of B; at each B the methods run "
    "interleaved batch by batch, {warmup}. tokens/s = the rows' generated tokens after the prefill (pads "
    "excluded) ÷ the batches' decode time (prefill excluded), pooled over batches; speedup = tokens/s ÷ plain batched "
    "decoding's at the same B on the same kernels; row ms/token = a batch's decode time ÷ a row's tokens, median over "
    "rows; τ = tokens per row-verify (bonus included); lossless = every row token-identical to plain batched decoding "
    "at the same B. B = 1 is the single-sequence run, its decode timed from the first generated token to the last."
)


def batch_table(batch: dict) -> str:
    """One row per batch size and method: τ, throughput, speedups, a row's latency, losslessness; n/a rows for the
    methods that take one sequence at a time."""
    sizes = batch["sizes"]
    vs_stock = any(m.get("speedup_vs_stock") is not None for block in sizes.values() for m in block.values())
    header = ["batch size", "method", "τ", "tokens/s", "speedup", *(["vs stock transformers"] if vs_stock else []),
              "row ms/token", "tokens/s (e2e)", "lossless"]
    rows = []
    for size, block in sizes.items():
        for name, m in block.items():
            if not m["supported"]:
                rows.append([size, name, *["n/a"] * (len(header) - 3), "n/a (one sequence at a time)"])
                continue
            rows.append([size, name, _fmt(m["tau"]), _fmt(m["tokens_per_s"], "{:.1f}"), _fmt(m["speedup"], "{:.2f}×"),
                         *([_fmt(m["speedup_vs_stock"], "{:.2f}×")] if vs_stock else []),
                         _fmt(m["row_ms_per_token"], "{:.1f}"), _fmt(m["tokens_per_s_e2e"], "{:.1f}"),
                         _lossless(m["lossless"], name)])
    return _table(header, rows)


BATCH_PROFILE_NOTE = (
    "ms per batch step (decode time ÷ the target's forwards after the prefill), means over the batches: verify = "
    "the target forward over every live row; draft = backbone + LM head + head rollout, every live row at once; "
    "rows = the verify loop's own bookkeeping (spans, choosing the step's length, rows leaving, whole-batch "
    "criteria); other = what no phase covers (the call's set-up; all of plain decoding's step)."
)


def batch_profile_table(batch: dict) -> str | None:
    """Where a batch step's time goes, per batch size ≥ 2 and method (`batched.step_profile`); None when nothing
    was profiled."""
    rows = []
    for size, block in batch["sizes"].items():
        for name, m in block.items():
            profile = m.get("profile") if m.get("supported") and size != "1" else None
            if not profile:
                continue
            split = [profile.get(f"{phase}_ms") for phase in ("verify", "draft", "rows", "other")]
            rows.append([size, name, _fmt(profile["step_ms"], "{:.2f}"), *[_fmt(v, "{:.2f}") for v in split],
                         _fmt(profile["rows_ms"] / profile["step_ms"], "{:.0%}") if profile.get("rows_ms") is not None
                         else "–"])
    if not any(row[3] != "–" for row in rows):
        return None
    return _table(["batch size", "method", "step ms", "verify", "draft", "rows", "other", "rows ÷ step"], rows)


def batch_lossless_failures(result: dict) -> list[str]:
    """'method at batch size B' for every B ≥ 2 where a method's greedy rows differed from plain batched decoding."""
    sizes = (result.get("batch") or {}).get("sizes", {})
    return [f"{m} at batch size {b}" for b, block in sizes.items() if b != "1"
            for m, v in block.items() if v.get("lossless") is False]


def lossless_failures(result: dict) -> list[str]:
    """Every method whose greedy output differed from plain decoding: single-sequence, then per batch size."""
    return [m for m, v in result["methods"].items() if v["lossless"] is False] + batch_lossless_failures(result)


def pass1_table(pass1: dict) -> str:
    rows = [
        [name, f"{r['pass1']:.3f}", f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]", str(r["num_samples"])]
        for name, r in pass1["methods"].items()
    ]
    lines = [_table(["method", "pass@1", "95% CI", "samples"], rows)]
    diff = pass1["difference"]
    verdict = "agree" if pass1["agree"] else "**DISAGREE**"
    lines.append(
        f"\nDifference (domino − autoregressive): {diff['mean']:+.3f}, 95% CI [{diff['ci95'][0]:+.3f}, "
        f"{diff['ci95'][1]:+.3f}] over {pass1['num_problems']} problems → {verdict}."
    )
    return "\n".join(lines)


STOCK_NOTE = (
    " vs stock transformers = the same ratio against plain decoding on stock transformers kernels "
    f"(`{AR_STOCK}`), timed in the same run: what switching from stock `generate` gains."
)


def draft_dtype_note(config: dict) -> str:
    dtype = config.get("draft_dtype")
    return f" (draft {dtype})" if dtype and dtype != config.get("dtype") else ""


def dtype_note(config: dict) -> str:
    """Why the target runs its dtype (`--dtype auto`) and whether its kernels are length-invariant (self-checked at
    load: greedy output exact in any dtype)."""
    note = config.get("dtype_note")
    invariant = "target on the length-invariant kernels, self-checked at load" if config.get("length_invariant") else ""
    inside = "; ".join(part for part in (note, invariant) if part)
    return f" ({inside})" if inside else ""


HUB_KERNELS_NOTE = (" transformers kernelized the target at load (its default from 5.25: a layer with a Hub kernel for "
                    "this device runs it; `USE_HUB_KERNELS=0` turns it off), in every method alike.")


def environment_line(env: dict | None) -> str:
    """Where and with what a report was made: date, CPU (model and kernel features) or GPU, library versions."""
    if not env:
        return "Environment not recorded."
    machine = env.get("cuda_device") or (
        f"{env.get('cpu') or 'CPU'} ({', '.join(env.get('cpu_features') or []) or 'no AVX2'}), "
        f"{env.get('torch_threads', '?')} threads")
    return (f"Run {env.get('date', '?')} on {machine}; transformers {env.get('transformers', '?')}, torch "
            f"{env.get('torch', '?')}, domino-hf {env.get('domino_hf', '?')}, Python {env.get('python', '?')}.")


def markdown(result: dict) -> str:
    """The human-readable report: headline table, per-set breakdown, profile, settings."""
    config = result["config"]
    sets = ", ".join(f"{k} ({v})" for k, v in config["prompt_sets"].items())
    mode = "greedy" if config["greedy"] else f"sampling, T={config['temperature']}"
    title = "Repeated-workload benchmark" if config.get("suite") == "repeated" else "Speculative decoding benchmark"
    warmup = warmup_text(config)
    parts = [
        f"# {title}",
        "",
        environment_line(config.get("environment")),
        "",
        f"Target `{config.get('target', '?')}`, draft `{config.get('draft', '–')}`; prompts: {sets}; "
        f"{config['max_new_tokens']} new tokens, {mode}, {config['repeats']} repeat(s){', ' * bool(warmup)}{warmup}, "
        f"dtype {config.get('dtype', '?')}{dtype_note(config)}{draft_dtype_note(config)}, device "
        f"{config.get('device', '?')}.",
    ]
    kernels = f"(`{config.get('target_kernels', 'stock')}`)."
    hub_note = HUB_KERNELS_NOTE * bool(config.get("target_hub_kernels"))
    if result["methods"]:  # empty when only batches ran (`--batch_size` without 1)
        spread = repeat_spread(result.get("runs") or [])
        parts += [
            "",
            "τ = tokens per target forward (bonus included); speedup = autoregressive decode time per token ÷ the "
            "method's (prefill excluded, medians over prompts × repeats), every method on the same target kernels "
            f"{kernels}" + STOCK_NOTE * (AR_STOCK in result["methods"])
            + reference_notes(config, result["methods"]) + hub_note,
            "",
            methods_table(result["methods"], spread),
        ]
        caution = sample_note(config, bool(spread))
        parts += ["", caution] if caution else []
    elif result.get("batch"):
        sizes = ",".join(str(size) for size in result["batch"]["sizes"])
        parts += ["", f"Batches only (`--batch_size {sizes}`, without 1): no one-prompt-per-call table."]
    if config.get("suite") == "repeated":
        stores = ("Warm-up on a prompt of no workload; every store emptied after it and before each workload."
                  if config.get("warmup") != 0 else "No warm-up; every store emptied before each workload.")
        parts += ["", f"Turns run chained: each prompt holds the conversation so far with "
                  f"`{config['reference_method']}`'s answers. {stores}"]
    if result.get("by_set"):
        parts += ["", "## Per prompt set (speedup / τ)", "", by_set_table(result["by_set"])]
    if result.get("suffix_cache"):
        parts += ["", "## The cross-request store", "", CACHE_NOTE, "", cache_table(result["suffix_cache"])]
    if result.get("profile"):
        parts += [
            "",
            "## Where a verify step's time goes (ms per step)",
            "",
            "Means per verify step pooled over all runs; draft = backbone + LM head + head rollout (+ assistant); "
            "loop overhead = everything no probe covers (transformers' loop, logits processing, Python).",
            "",
            profile_table(result["profile"]),
        ]
    elif config.get("profile") is False and result["methods"]:
        parts += ["", "Per-step profile off (it synchronises CUDA); run with `--profile` for it."]
    if result.get("batch"):
        stock = any(AR_STOCK in block for block in result["batch"]["sizes"].values())
        note = BATCH_NOTE.format(warmup="with no warm-up" if config.get("warmup") == 0
                                 else f"after {warmup or 'a warm-up'}")
        note += f" Every method on the same target kernels {kernels}" + STOCK_NOTE * stock
        parts += ["", "## Batched decoding: throughput by batch size", "", note + hub_note * (not result["methods"]),
                  "", batch_table(result["batch"])]
        profile = batch_profile_table(result["batch"])
        if profile:
            parts += ["", "### Where a batch step's time goes", "", BATCH_PROFILE_NOTE, "", profile]
    if result.get("humaneval_pass1"):
        parts += ["", "## HumanEval pass@1 (sampling)", "", pass1_table(result["humaneval_pass1"])]
    bad = [m for m, v in result["methods"].items() if v["lossless"] is False]
    if bad:
        parts += ["", f"**Lossless check FAILED for: {', '.join(bad)}** (see `mismatches` in the JSON)."]
    batch_bad = batch_lossless_failures(result)
    if batch_bad:
        parts += ["", f"**Batched lossless check FAILED for: {', '.join(batch_bad)}** (see `batch.mismatches` in the "
                  "JSON)."]
    return "\n".join(parts) + "\n"


def plot(result: dict, out_dir: Path, stem: str = "bench") -> list[Path]:
    """Acceptance-length histogram, per-position acceptance, speedup bars, when profiled the per-step time split,
    and with batch sizes the throughput by batch size (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    methods = result["methods"]
    drafting = {n: m for n, m in methods.items() if m["per_position_acceptance"]}
    written = []
    if result.get("batch"):
        written.append(plot_batch_throughput(result["batch"], out_dir / f"{stem}_batch_throughput.png"))
    if not methods:  # only batches ran
        return written

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(drafting), 1)
    for i, (name, m) in enumerate(drafting.items()):
        hist = m["histogram"]
        total = sum(hist.values()) or 1
        xs = [int(k) + (i - (len(drafting) - 1) / 2) * width for k in hist]
        ax.bar(xs, [v / total for v in hist.values()], width=width, label=f"{name} (τ={_fmt(m['tau'])})")
    ax.set(xlabel="tokens per target forward (accepted + bonus)", ylabel="fraction of verify steps")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    written.append(_save(fig, ax, "Acceptance length", bool(drafting), out_dir / f"{stem}_acceptance_histogram.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, m in drafting.items():
        rates = m["per_position_acceptance"]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=name)
    ax.set(xlabel="draft position", ylabel="P(accepted | drafted)", ylim=(0, 1.02))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    path = out_dir / f"{stem}_per_position_acceptance.png"
    written.append(_save(fig, ax, "Per-position acceptance", bool(drafting), path))

    fig, ax = plt.subplots(figsize=(7, 4))
    groups = {"all": methods, **result.get("by_set", {})}
    names = list(methods)
    width = 0.8 / len(groups)
    for g, (group, block) in enumerate(groups.items()):
        xs = [i + (g - (len(groups) - 1) / 2) * width for i in range(len(names))]
        ys = [(block.get(n) or {}).get("speedup") or 0.0 for n in names]
        bars = ax.bar(xs, ys, width=width, label=group)
        for bar, n in zip(bars, names):
            t = (block.get(n) or {}).get("tau")
            if t is not None:
                top = (bar.get_x() + bar.get_width() / 2, bar.get_height())
                ax.annotate(f"τ {t:.2f}", top, ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set(ylabel="decode speedup vs autoregressive (×)")
    written.append(_save(fig, ax, "Speedup (prefill excluded)", len(groups) > 1, out_dir / f"{stem}_speedup.png"))
    if result.get("profile"):
        written.append(plot_profile(result["profile"], out_dir / f"{stem}_profile.png"))
    return written


def plot_batch_throughput(batch: dict, path: Path) -> Path:
    """Tokens/s (decode, pads excluded) against the batch size, one line per method that takes a batch."""
    import matplotlib.pyplot as plt

    sizes = batch["sizes"]
    names = list(dict.fromkeys(n for block in sizes.values() for n, m in block.items() if m["supported"]))
    single = {n for block in sizes.values() for n, m in block.items() if not m["supported"]}
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in names:
        points = [(int(b), block[name]["tokens_per_s"]) for b, block in sizes.items()
                  if block.get(name, {}).get("tokens_per_s") is not None]
        if points:
            ax.plot(*zip(*points), marker="o", label=name + " (B = 1 only)" * (name in single))
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(b) for b in sizes], [str(b) for b in sizes])
    ax.set(xlabel="batch size", ylabel="tokens/s of the batch (decode)", ylim=(0, None))
    return _save(fig, ax, "Throughput by batch size", bool(names), path)


def plot_profile(profile: dict, path: Path) -> Path:
    """One stacked bar per method: ms per verify step by phase (phases that are 0 everywhere are left out)."""
    import matplotlib.pyplot as plt

    names = list(profile)
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(names)
    for phase in PHASES:
        values = [profile[n]["ms_per_step"][phase] or 0.0 for n in names]
        if not any(values):
            continue
        ax.bar(names, values, bottom=bottom, label=PHASE_LABELS[phase])
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, n in enumerate(names):
        step = profile[n]["step_ms"]
        if step is not None:
            ax.annotate(f"{step:.1f} ms", (i, bottom[i]), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set(ylabel="ms per verify step")
    return _save(fig, ax, "Where a verify step's time goes", True, path)


def _save(fig, ax, title: str, legend: bool, path: Path) -> Path:
    import matplotlib.pyplot as plt

    ax.set_title(title)
    if legend:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(result: dict, out_dir: str | Path, stem: str = "bench", plots: bool = True) -> dict[str, Path]:
    """Write `<stem>.json`, `<stem>.md` and `<stem>_*.png` into `out_dir`; return {kind: path}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    paths["json"].write_text(json.dumps(result, indent=1, default=str) + "\n")
    paths["markdown"].write_text(markdown(result))
    if plots:
        try:
            for path in plot(result, out, stem):
                paths[path.stem[len(stem) + 1 :]] = path
        except ImportError:
            logger.warning("matplotlib is not installed: no plots (pip install 'domino-hf[bench]').")
    logger.info("Benchmark written to %s", out)
    return paths
