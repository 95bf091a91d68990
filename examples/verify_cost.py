"""How much does one target forward cost as a function of the tokens it verifies, on this machine?

Speculative decoding pays one target forward over [last token, candidates…] per step, so its speedup is
τ × cost(1) / (cost(k + 1) + drafting). On a GPU cost(k) is almost flat for small k; on a CPU it depends on
the matmul kernels for the dtype (see docs/drafting.md). This prints cost(k) / cost(1) per dtype, with a KV
cache of `--context` tokens, as medians of `--repeats` timed forwards:

    python examples/verify_cost.py --target smollm2 --dtypes float32,bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from domino_hf.targets import load_target


@torch.no_grad()
def forward_ms(model, context: int, tokens: int, repeats: int) -> float:
    """Median wall time (ms) of one forward over `tokens` new tokens after a `context`-token prefill."""
    vocab = model.config.get_text_config().vocab_size
    cache = DynamicCache(config=model.config)
    model(torch.randint(0, vocab, (1, context)), past_key_values=cache)
    times = []
    for _ in range(repeats + 2):  # 2 warm-up forwards
        new = torch.randint(0, vocab, (1, tokens))
        start = time.perf_counter()
        model(new, past_key_values=cache)
        times.append(time.perf_counter() - start)
        cache.crop(-tokens)
    return 1000 * statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2", help="`smollm2`, a local folder or a Hub id")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated torch dtypes")
    parser.add_argument("--tokens", default="1,2,3,4,5,8,16", help="comma-separated forward lengths")
    parser.add_argument("--context", type=int, default=300, help="tokens already in the KV cache")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    lengths = [int(k) for k in args.tokens.split(",")]
    print(f"{'dtype':>9} " + " ".join(f"{k:>9}" for k in lengths) + "   (ms per forward; × = ratio to 1 token)")
    for name in args.dtypes.split(","):
        model, _ = load_target(args.target, dtype=getattr(torch, name))
        costs = [forward_ms(model.eval(), args.context, k, args.repeats) for k in lengths]
        print(f"{name:>9} " + " ".join(f"{c:9.1f}" for c in costs))
        print(f"{'':>9} " + " ".join(f"{c / costs[0]:8.2f}×" for c in costs))


if __name__ == "__main__":
    main()
