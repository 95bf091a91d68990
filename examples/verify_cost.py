"""How much does one target forward cost as a function of the tokens it verifies and of the context, per kernel set?

Speculative decoding pays one target forward over [last token, candidates…] per step, so its speedup is
τ × cost(1) / (cost(k + 1) + drafting). On a GPU cost(k) is almost flat for small k; on a CPU it depends on
the matmul kernels, and on long prompts on how attention reads the KV cache (see docs/cpu_kernels.md). This
times cost(k) in ms and cost(k) / cost(1) for each kernel set at each context length (a KV cache of that many
random tokens), as medians of `--repeats` timed forwards, each cropped from the cache again afterwards. All
kernel sets, contexts and lengths are timed interleaved (every repeat runs each once), so a slow drift of a
shared machine hits all alike. Kernel sets:

* `stock`: transformers as installed (`nn.Linear` → MKL sgemm in fp32, "sdpa" attention, `DynamicCache`);
* `optimized`: `domino_hf.optimize_for_cpu` as it runs by default: the length-invariant kernels where this CPU has
  them for the target's dtype, else the `fastest` set;
* `invariant`: `optimize_for_cpu(kernels="invariant")`: linear layers and attention whose every output is computed
  in one fixed order, `GrowingCache`;
* `fastest`: `optimize_for_cpu(kernels="fastest")` (each linear layer, at each forward length, on the fastest of
  stock MKL, packed oneDNN and packed MKL measured on this CPU, grouped-query attention without repeated heads,
  `GrowingCache`);
* `linear-only`: the `fastest` set's linears alone, with stock attention and `DynamicCache`;
* `packed`: `optimize_for_cpu(stock_rows=0)`, packed oneDNN for every forward;
* `compiled`: the upstream route, `torch.compile(dynamic=True)` with inductor freezing (which packs weights
  the same way). Slow to build: its compile time and recompiles are printed too.

It also reports how a plain 1-token step grows from the shortest to the longest context next to the
memory-bandwidth floor: the time to read the KV cache added in between once, at the bandwidth of a plain
large-tensor read measured here. `--out PREFIX` writes PREFIX.json and PREFIX.md.

    python examples/verify_cost.py --kernels stock,optimized --out docs/bench/verify_cost
    python examples/verify_cost.py --kernels stock,optimized,compiled --contexts 300 --tokens 1,2,4,8,16,17
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import DynamicCache

from domino_hf.cpu_attention import use_stock_attention
from domino_hf.cpu_kernels import optimize_for_cpu
from domino_hf.dtypes import DTYPE_NAMES, torch_dtype
from domino_hf.kv_cache import GrowingCache, use_default_cache
from domino_hf.modeling.dispatch_domino import CACHE_ARGUMENT
from domino_hf.targets import load_target

KERNEL_SETS = ("stock", "optimized", "invariant", "fastest", "linear-only", "packed", "compiled")
TARGETS = {"verify(5)": 1.2, "verify(9)": 1.35}  # cost(k) / cost(1) the optimized kernels aim at, long contexts


class Bench:
    """One kernel set at one context: a model to call and a KV cache of `context` random tokens."""

    def __init__(self, name: str, model, context: int, vocab: int, cache_class):
        self.name, self.model, self.vocab, self.context = name, model, vocab, context
        self.cache = cache_class(config=model.config)
        self.times: dict[int, list[float]] = {}
        self.first_call_s: dict[int, float] = {}
        generator = torch.Generator().manual_seed(context)
        with torch.no_grad():
            for start in range(0, context, 512):  # prefill in chunks: bounded attention memory
                chunk = torch.randint(0, vocab, (1, min(512, context - start)), generator=generator)
                self.model(chunk, **{CACHE_ARGUMENT: self.cache})

    @torch.no_grad()
    def forward(self, tokens: int) -> None:
        ids = torch.randint(0, self.vocab, (1, tokens))
        start = time.perf_counter()
        self.model(ids, **{CACHE_ARGUMENT: self.cache})
        seconds = time.perf_counter() - start
        self.cache.crop(-tokens)
        if tokens not in self.first_call_s:  # includes compilation for the compiled route
            self.first_call_s[tokens] = seconds
            return
        self.times.setdefault(tokens, []).append(seconds)

    def ms(self, tokens: int) -> float:
        return 1000 * statistics.median(self.times[tokens])


def compiled_model(model):
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    return torch.compile(model, dynamic=True)


def recompiles() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def kernel_set(name: str, model):
    """(model to call, cache class) for a kernel set."""
    if name == "stock":
        return model, DynamicCache
    if name == "compiled":
        return compiled_model(copy.deepcopy(model)), DynamicCache
    runner = optimize_for_cpu(copy.deepcopy(model), stock_rows=0 if name == "packed" else None,
                              kernels=name if name == "invariant" else "auto" if name == "optimized" else "fastest")
    if name == "linear-only":
        use_stock_attention(runner)
        use_default_cache(runner)
        return runner, DynamicCache
    return runner, GrowingCache


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_bandwidth_gbs(megabytes: int = 512, repeats: int = 9) -> float:
    """GB/s of a plain read of a large fp32 tensor (a sum), median of `repeats`, at the current threads."""
    data = torch.ones(megabytes * 2**20 // 4)
    data.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.numel() * 4 / statistics.median(times) / 1e9


def kv_bytes_per_token(config, context: int, element_size: int) -> float:
    """Bytes of keys and values one more cached token adds at `context` (sliding layers stop growing)."""
    text = config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    window = getattr(text, "sliding_window", None)
    growing = sum(1 for t in layer_types if t == "full_attention" or window is None or context < window)
    return growing * 2 * kv_heads * head_dim * element_size


def render_markdown(report: dict) -> str:
    lengths, env = report["config"]["tokens"], report["environment"]
    lines = [
        "# Verify cost by context length",
        "",
        f"`python examples/verify_cost.py {report['config']['argv']}` on {env['date']}: {env['cpu']}, "
        f"{env['threads']} thread{'s' if env['threads'] > 1 else ''}, torch {env['torch']}, "
        f"transformers {env['transformers']}; median of "
        f"{report['config']['repeats']} interleaved forwards per cell. Load average (1 min) "
        f"{env['load_before']:.2f} before and {env['load_after']:.2f} after: "
        f"{env['load_note']}.",
        "",
        "| kernels | context | " + " | ".join(f"{k} token{'s' if k > 1 else ''}" for k in lengths) + " |",
        "|---|---:|" + "---:|" * len(lengths),
    ]
    for row in report["rows"]:
        cells = [f"{row['ms'][str(lengths[0])]:.1f} ms"] + [
            f"{row['ms'][str(k)]:.1f} ({row['ratio'][str(k)]:.2f}×)" for k in lengths[1:]]
        lines.append(f"| {row['kernels']} | {row['context']:,} | " + " | ".join(cells) + " |")
    growth = report.get("plain_step_growth")
    if growth:
        lines += ["", f"Plain 1-token step from {growth['from']:,} to {growth['to']:,} tokens of context, next to "
                  f"the time to read the {growth['kv_mb']:.0f} MB of KV cache added in between once at "
                  f"{growth['bandwidth_gbs']:.1f} GB/s (a plain large-tensor read here, "
                  f"{growth['kv_bytes_per_token'] / 1000:.0f} KB per cached token): "
                  f"floor +{growth['floor_ms']:.1f} ms.", "",
                  "| kernels | step at short context | at long context | growth |", "|---|---:|---:|---:|"]
        for name, item in growth["kernels"].items():
            lines.append(f"| {name} | {item['short_ms']:.1f} ms | {item['long_ms']:.1f} ms | "
                         f"+{item['growth_ms']:.1f} ms ({item['growth_ms'] / growth['floor_ms']:.1f}× the floor) |")
    checks = report.get("targets")
    if checks:
        lines += ["", "Targets for the optimized kernels at long contexts: " + "; ".join(
            f"{c['what']} at {c['context']:,} = {c['ratio']:.2f}× (≤ {c['target']}×: {'met' if c['met'] else 'missed'})"
            for c in checks) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--target", default="smollm2", help="`smollm2`, a local folder or a Hub id")
    parser.add_argument("--kernels", default="stock,optimized", help=f"comma-separated: {', '.join(KERNEL_SETS)}")
    parser.add_argument("--dtype", default="float32", choices=DTYPE_NAMES, help="torch dtype of the target")
    parser.add_argument("--tokens", default="1,5,9", help="comma-separated forward lengths (the first is the base)")
    parser.add_argument("--contexts", "--context", default="300,1500,4000",
                        help="comma-separated tokens already in the cache")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's; 1 is the steadiest "
                        "on a machine other jobs share)")
    parser.add_argument("--out", help="write the report to OUT.json and OUT.md")
    args = parser.parse_args()
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads takes a positive integer")
        torch.set_num_threads(args.threads)
    lengths = [int(k) for k in args.tokens.split(",")]
    contexts = sorted(int(c) for c in args.contexts.split(","))
    kernels = args.kernels.split(",")
    unknown = set(kernels) - set(KERNEL_SETS)
    if unknown:
        parser.error(f"unknown kernel set(s) {sorted(unknown)}; choose from {', '.join(KERNEL_SETS)}")
    if min(lengths) < 1 or min(contexts) < 1:
        parser.error("--tokens and --contexts take positive integers")

    load_before = os.getloadavg()[0]
    model, _ = load_target(args.target, dtype=torch_dtype(args.dtype))
    vocab = model.config.get_text_config().vocab_size
    benches = []
    for name in kernels:
        start = time.perf_counter()
        graphs = recompiles() if name == "compiled" else 0
        runner, cache_class = kernel_set(name, model)
        for context in contexts:
            bench = Bench(name, runner, context, vocab, cache_class)
            for k in lengths:
                bench.forward(k)
            benches.append(bench)
        print(f"{name}: set-up and prefill {time.perf_counter() - start:.1f} s")
        if name == "compiled":
            print(f"  graphs compiled: {recompiles() - graphs}")

    for _ in range(args.repeats):  # interleaved: each repeat times every kernel set, context and length
        for k in lengths:
            for bench in benches:
                bench.forward(k)
    bandwidth = read_bandwidth_gbs()
    load_after = os.getloadavg()[0]

    rows = [{"kernels": b.name, "context": b.context, "ms": {str(k): b.ms(k) for k in lengths},
             "ratio": {str(k): b.ms(k) / b.ms(lengths[0]) for k in lengths}} for b in benches]
    print(f"\n{'kernels':>12} {'context':>8} " + " ".join(f"{k:>7}" for k in lengths) + "   (ms, then × the first)")
    for row in rows:
        print(f"{row['kernels']:>12} {row['context']:>8} " + " ".join(f"{row['ms'][str(k)]:7.1f}" for k in lengths))
        print(f"{'':>21} " + " ".join(f"{row['ratio'][str(k)]:6.2f}×" for k in lengths))

    report = {"config": {"argv": " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                          if v is not None and k != "out"),
                         "target": args.target, "dtype": args.dtype, "tokens": lengths, "contexts": contexts,
                         "kernels": kernels, "repeats": args.repeats},
              "rows": rows}
    if len(contexts) > 1 and 1 in lengths:
        short, long = contexts[0], contexts[-1]
        per_token = kv_bytes_per_token(model.config, long, model.dtype.itemsize)
        kv_mb = (long - short) * per_token / 1e6
        floor_ms = kv_mb / 1e3 / bandwidth * 1e3
        growth = {"from": short, "to": long, "kv_bytes_per_token": per_token, "kv_mb": kv_mb,
                  "bandwidth_gbs": bandwidth, "floor_ms": floor_ms, "kernels": {}}
        for name in kernels:
            by_context = {b.context: b.ms(1) for b in benches if b.name == name}
            growth["kernels"][name] = {"short_ms": by_context[short], "long_ms": by_context[long],
                                       "growth_ms": by_context[long] - by_context[short]}
            print(f"{name}: plain step {by_context[short]:.1f} ms at {short} tokens, {by_context[long]:.1f} ms at "
                  f"{long} (+{by_context[long] - by_context[short]:.1f} ms; reading {kv_mb:.0f} MB of KV once at "
                  f"{bandwidth:.1f} GB/s: +{floor_ms:.1f} ms)")
        report["plain_step_growth"] = growth
    if "optimized" in kernels and lengths[0] == 1:
        report["targets"] = [
            {"what": what, "context": row["context"], "ratio": row["ratio"][what[7:-1]], "target": target,
             "met": row["ratio"][what[7:-1]] <= target}
            for row in rows if row["kernels"] == "optimized" and row["context"] >= 1500
            for what, target in TARGETS.items() if what[7:-1] in row["ratio"]]
    busy = max(load_before, load_after) > 0.5 * (os.cpu_count() or 1)
    report["environment"] = {
        "date": datetime.date.today().isoformat(), "cpu": cpu_name(),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "load_before": load_before, "load_after": load_after,
        "load_note": "other jobs shared the CPU, so absolute times are noisy; the interleaved ratios less so"
        if busy else "the CPU was otherwise mostly idle",
    }
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        out.with_suffix(".md").write_text(render_markdown(report))
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
