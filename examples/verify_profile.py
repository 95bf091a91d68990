"""Where one target forward's time goes at a long context, stock against optimized kernels: the share of
`aten::copy_` (repeated key/value heads) and `aten::cat` (cache appends) in a torch.profiler trace of a 1-token
(plain) and a 9-token (verify) forward over a cache of `--context` tokens.

    python examples/verify_profile.py --context 1500
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile
from verify_cost import Bench, kernel_set

from domino_hf import load_target


def shares(bench: Bench, tokens: int) -> tuple[float, dict[str, float]]:
    """(total self CPU ms, {op: share}) of one forward of `tokens` new tokens over the bench's cache (which
    `Bench.forward` crops back), after one untimed warm-up forward."""
    bench.forward(tokens)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        bench.forward(tokens)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return total / 1e3, {e.key: e.self_cpu_time_total / total for e in events}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--context", type=int, default=1500)
    args = parser.parse_args(argv)
    target, _ = load_target(args.target)
    torch.manual_seed(0)
    print("| kernels | tokens | self CPU ms | aten::copy_ | aten::cat | top op |")
    print("|---|---:|---:|---:|---:|---|")
    for name in ("stock", "optimized"):
        model, cache_class = kernel_set(name, target.eval())
        bench = Bench(name, model, args.context, model.config.vocab_size, cache_class)
        for tokens in (1, 9):
            ms, share = shares(bench, tokens)
            top = max(share, key=share.get)
            print(f"| {name} | {tokens} | {ms:.1f} | {100 * share.get('aten::copy_', 0):.1f}% | "
                  f"{100 * share.get('aten::cat', 0):.1f}% | {top} {100 * share[top]:.0f}% |")


if __name__ == "__main__":
    main()
