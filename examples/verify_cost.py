"""How much does one target forward cost as a function of the tokens it verifies, per kernel set?

Speculative decoding pays one target forward over [last token, candidates…] per step, so its speedup is
τ × cost(1) / (cost(k + 1) + drafting). On a GPU cost(k) is almost flat for small k; on a CPU it depends on
the matmul kernels (see docs/cpu_kernels.md). This prints cost(k) in ms and cost(k) / cost(1) for each kernel
set, with a KV cache of `--context` tokens, as medians of `--repeats` timed forwards. The kernel sets are
timed interleaved (every repeat runs each set once), so a slow drift of a shared machine hits all alike:

* `stock`: transformers as installed (`nn.Linear` → MKL sgemm in fp32);
* `optimized`: `domino_hf.optimize_for_cpu` (every `nn.Linear` on pre-packed oneDNN weights, few-token
  forwards on the stock kernel where it measured faster on this CPU);
* `packed`: `optimize_for_cpu(stock_rows=0)`, the packed kernels for every forward;
* `compiled`: the upstream route, `torch.compile(dynamic=True)` with inductor freezing (which packs weights
  the same way). Slow to build: its compile time, recompiles (across k and across growing cache lengths)
  and resident memory are printed too.

    python examples/verify_cost.py --target smollm2 --kernels stock,optimized
    python examples/verify_cost.py --kernels stock,optimized,compiled --tokens 1,2,4,8,16,17
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from transformers import DynamicCache

from domino_hf.cpu_kernels import optimize_for_cpu
from domino_hf.dtypes import DTYPE_NAMES, torch_dtype
from domino_hf.modeling.dispatch_domino import CACHE_ARGUMENT
from domino_hf.targets import load_target


def rss_mb() -> float:
    """Resident memory of this process, MiB (Linux)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Bench:
    """One kernel set: a model to call and a KV cache of `context` random tokens."""

    def __init__(self, name: str, model, context: int, vocab: int):
        self.name, self.model, self.vocab = name, model, vocab
        self.cache = DynamicCache(config=model.config)
        self.times: dict[int, list[float]] = {}
        self.first_call_s: dict[int, float] = {}
        with torch.no_grad():
            self.first_call_s[context] = self._timed(torch.randint(0, vocab, (1, context)), crop=False)

    def _timed(self, ids, crop=True) -> float:
        start = time.perf_counter()
        self.model(ids, **{CACHE_ARGUMENT: self.cache})
        seconds = time.perf_counter() - start
        if crop:
            self.cache.crop(-ids.shape[1])
        return seconds

    @torch.no_grad()
    def forward(self, tokens: int) -> None:
        seconds = self._timed(torch.randint(0, self.vocab, (1, tokens)))
        if tokens not in self.first_call_s:  # includes compilation for the compiled route
            self.first_call_s[tokens] = seconds
            return
        self.times.setdefault(tokens, []).append(seconds)

    @torch.no_grad()
    def grow(self, tokens: int) -> float:
        """One forward that stays in the cache (the context grows): seconds, compilation included."""
        return self._timed(torch.randint(0, self.vocab, (1, tokens)), crop=False)


def compiled_model(model):
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    return torch.compile(model, dynamic=True)


def recompiles() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--target", default="smollm2", help="`smollm2`, a local folder or a Hub id")
    parser.add_argument("--kernels", default="stock,optimized",
                        help="comma-separated: stock, optimized, packed, compiled")
    parser.add_argument("--dtype", default="float32", choices=DTYPE_NAMES, help="torch dtype of the target")
    parser.add_argument("--tokens", default="1,2,3,4,5,8,9,16,17", help="comma-separated forward lengths")
    parser.add_argument("--context", type=int, default=300, help="tokens already in the KV cache")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    lengths = [int(k) for k in args.tokens.split(",")]
    kernels = args.kernels.split(",")
    unknown = set(kernels) - {"stock", "optimized", "packed", "compiled"}
    if unknown:
        parser.error(f"unknown kernel set(s) {sorted(unknown)}")

    base_rss = rss_mb()
    model, _ = load_target(args.target, dtype=torch_dtype(args.dtype))
    vocab = model.config.get_text_config().vocab_size
    print(f"target loaded: {rss_mb() - base_rss:.0f} MiB resident")
    benches = []
    for name in kernels:
        before = rss_mb()
        start = time.perf_counter()
        if name == "stock":
            runner = model
        elif name in ("optimized", "packed"):
            runner = optimize_for_cpu(copy.deepcopy(model), stock_rows=0 if name == "packed" else None)
        else:
            runner = compiled_model(copy.deepcopy(model))
        graphs = recompiles() if name == "compiled" else 0
        bench = Bench(name, runner, args.context, vocab)
        print(f"{name}: set-up {time.perf_counter() - start:.1f} s (first forward included), "
              f"+{rss_mb() - before:.0f} MiB resident")
        for k in lengths:
            bench.forward(k)
        if name == "compiled":
            firsts = ", ".join(f"k={k}: {bench.first_call_s[k]:.1f} s" for k in lengths)
            print(f"  first call per k (compiles): {firsts}; graphs compiled: {recompiles() - graphs}")
            before_grow = recompiles()
            grow_s = [bench.grow(1) for _ in range(64)]
            print(f"  64 steps growing the cache: max {max(grow_s):.2f} s/step, "
                  f"{recompiles() - before_grow} more graph(s)")
        benches.append(bench)

    for _ in range(args.repeats):  # interleaved: each repeat times every kernel set at every length
        for k in lengths:
            for bench in benches:
                bench.forward(k)

    print(
        f"\n{'kernels':>10} " + " ".join(f"{k:>7}" for k in lengths) + "   (ms per forward, then × a 1-token forward)",
    )
    for bench in benches:
        costs = [1000 * statistics.median(bench.times[k]) for k in lengths]
        print(f"{bench.name:>10} " + " ".join(f"{c:7.1f}" for c in costs))
        print(f"{'':>10} " + " ".join(f"{c / costs[0]:6.2f}×" for c in costs))
    stock = next((b for b in benches if b.name == "stock"), None)
    if stock is not None:
        for bench in benches:
            if bench is not stock:
                ratio = statistics.median(bench.times[1]) / statistics.median(stock.times[1])
                print(f"{bench.name}: 1-token step = {ratio:.2f}× the stock step")


if __name__ == "__main__":
    main()
