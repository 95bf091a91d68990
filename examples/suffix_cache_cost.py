"""Memory and step cost of `SuffixCache` at 10k, 100k and 1M cached tokens.

The store is filled with the SmolLM2 target's own answers (prompt + response token ids of the committed training
data, data/regen/*.jsonl.gz), and looked up with held-out answers cut at random points: the last 64 tokens of
each cut are the context, as in a decoding step. Reports, per size: the arrays' memory, the time of one lookup
(median and 99th percentile), how often a lookup proposes something and how long its proposal is, and the time
to add a sequence per token.

With `--rates`, also how often the store's proposals are right (`rates.json` / `rates.md`), by the length of the
match that found them: a store of `--rates-size` tokens of answers, then held-out answers cut at random points of
their response, and per span position j the rate at which token j is right given the tokens before it were (the
`h[j]` of the drafter's span history, whose priors for cache spans are `CACHE_START_RATES` in
modeling/hybrid_domino.py). These answers are to unrelated prompts: the case where the store has least to offer.

    python examples/suffix_cache_cost.py --out docs/bench/suffix_cache --rates
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from domino_hf.modeling.hybrid_domino import CACHE_BUCKETS, Span
from domino_hf.modeling.suffix_domino import SuffixCache
from domino_hf.training.dataset import RegenDataset

ROOT = Path(__file__).resolve().parent.parent


class Sequence(list):
    """Prompt + response ids; `prompt_length` marks where the response starts."""

    prompt_length = 0


def read_sequences(limit_tokens: int) -> list[Sequence]:
    """Prompt + response ids of the committed training data, read as `domino train` reads it, up to about
    `limit_tokens` tokens."""
    paths = sorted(str(p) for p in (ROOT / "data" / "regen").glob("**/*.jsonl.gz"))
    sequences, total = [], 0
    for example in RegenDataset.from_jsonl(paths, max_length=1 << 20).examples:
        sequence = Sequence(example.prompt_ids + example.response_ids)
        sequence.prompt_length = len(example.prompt_ids)
        sequences.append(sequence)
        total += len(sequence) + 1
        if total >= limit_tokens:
            break
    return sequences


def fill(size: int, sequences: list[list[int]]) -> tuple[SuffixCache, list[float]]:
    """A store of `size` tokens filled with `sequences` until full, and the seconds per token of each add."""
    cache = SuffixCache(max_tokens=size)
    add_times, added = [], 0
    for seq in sequences:
        if added >= size:
            break
        start = time.perf_counter()
        cache.add(seq)
        add_times.append((time.perf_counter() - start) / (len(seq) + 1))
        added += len(seq) + 1
    return cache, add_times


def span_rates(size: int, sequences: list[Sequence], held_out: list[Sequence], lookups: int, span: int) -> dict:
    """Per match-length bucket (the drafter's `CACHE_BUCKETS`, as `Span.bucket` assigns them): lookups, and
    h[j] = P(token j right | tokens before it right) for j < 4."""
    cache, _ = fill(size, sequences)
    rng = random.Random(2)
    reached = {b: [0] * span for b in CACHE_BUCKETS}
    right = {b: [0] * span for b in CACHE_BUCKETS}
    for _ in range(lookups):
        seq = rng.choice(held_out)
        cut = rng.randint(seq.prompt_length + 1, len(seq) - 1)
        match = cache.lookup(seq[max(0, cut - 64) : cut], span)
        if match is None:
            continue
        _, bucket = Span(match.tokens, match.match_length, "cache").bucket
        for j, token in enumerate(match.tokens):
            if cut + j >= len(seq):
                break
            reached[bucket][j] += 1
            if token != seq[cut + j]:
                break
            right[bucket][j] += 1
    rows = []
    lower = sorted(CACHE_BUCKETS)
    for b, above in zip(lower, lower[1:] + [None]):
        label = f"{b}+" if above is None else f"{b}–{above - 1}"
        rates = [right[b][j] / reached[b][j] if reached[b][j] else None for j in range(4)]
        rows.append({"match_length": label, "lookups": reached[b][0], "h": rates})
    return {"cached_tokens": cache.num_tokens, "rows": rows}


def measure(size: int, sequences: list[list[int]], held_out: list[list[int]], lookups: int, span: int) -> dict:
    cache, add_times = fill(size, sequences)
    rng = random.Random(0)
    times, lengths, hits = [], [], 0
    for _ in range(lookups):
        seq = rng.choice(held_out)
        cut = rng.randint(4, len(seq) - 1)
        context = seq[max(0, cut - 64) : cut]
        start = time.perf_counter()
        match = cache.lookup(context, span)
        times.append(time.perf_counter() - start)
        if match is not None:
            hits += 1
            lengths.append(len(match.tokens))
    times.sort()
    return {
        "cached_tokens": cache.num_tokens,
        "capacity_tokens": size,
        "memory_mb": cache.nbytes / 1e6,
        "lookup_us_median": 1e6 * statistics.median(times),
        "lookup_us_p99": 1e6 * times[int(0.99 * (len(times) - 1))],
        "lookup_hit_rate": hits / lookups,
        "mean_span": statistics.mean(lengths) if lengths else 0.0,
        "add_us_per_token_median": 1e6 * statistics.median(add_times),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--span", type=int, default=16, help="tokens asked of each lookup (default: %(default)s)")
    parser.add_argument("--out", "--output_dir", dest="out", default="runs/suffix_cache")
    parser.add_argument("--rates", action="store_true", help="also measure how often the proposals are right")
    parser.add_argument("--rates-size", type=int, default=100_000, help="store size for --rates (default: %(default)s)")
    args = parser.parse_args(argv)
    pool = read_sequences(max(args.sizes) + 200_000)
    rng = random.Random(1)
    rng.shuffle(pool)
    held_out, stored = pool[:500], pool[500:]
    rows = [measure(size, stored, held_out, args.lookups, args.span) for size in args.sizes]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost.json").write_text(json.dumps({"config": vars(args), "rows": rows}, indent=1))
    lines = [
        "| cached tokens | memory | lookup (median) | lookup (p99) | lookups that propose | mean span "
        "| add, per token |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cached_tokens']:,} | {r['memory_mb']:.1f} MB | {r['lookup_us_median']:.0f} µs | "
            f"{r['lookup_us_p99']:.0f} µs | {100 * r['lookup_hit_rate']:.0f}% | {r['mean_span']:.1f} | "
            f"{r['add_us_per_token_median']:.1f} µs |"
        )
    (out / "cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.rates:
        rates = span_rates(args.rates_size, stored, held_out, args.lookups * 5, 24)
        (out / "rates.json").write_text(json.dumps({"config": vars(args), **rates}, indent=1))
        lines = [f"Store of {rates['cached_tokens']:,} tokens; h[j] = P(token j right | the tokens before it were).",
                 "", "| match length | lookups | h[0] | h[1] | h[2] | h[3] |", "|---|---:|---:|---:|---:|---:|"]
        for r in rates["rows"]:
            cells = " | ".join("–" if h is None else f"{h:.2f}" for h in r["h"])
            lines.append(f"| {r['match_length']} | {r['lookups']:,} | {cells} |")
        (out / "rates.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
