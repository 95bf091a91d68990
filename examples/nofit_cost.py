"""What does a draft that does not fit cost? Plain decoding vs Domino with a random (never accepted) draft.

A draft is only worth its forward when its tokens are accepted. With a draft that never fits, the generator's
back-off (`DraftBackoff`: plain steps, probing the draft at growing intervals) must keep generation close to
plain decoding. Timing needs no trained weights, so this builds random models of a realistic shape: by default
a Gemma-3-270M-shaped target (262k vocabulary, sliding-window layers, soft-capped logits) and a 1-layer draft,
and runs `domino bench`'s interleaved loop on random prompts:

    python examples/nofit_cost.py                        # Gemma-3-270M shape
    python examples/nofit_cost.py --vocab 49152 --hidden 576 --layers 30 --heads 9 --kv-heads 3 --head-dim 64
"""

from __future__ import annotations

import argparse
import json

import torch
import transformers

from domino_hf import DominoDraftModel, optimize_for_cpu
from domino_hf.bench import BenchConfig, BenchPrompt, run_benchmark
from domino_hf.bench.report import methods_table, profile_table


def build_target(args):
    config = transformers.Gemma3TextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, sliding_window=512, final_logit_softcapping=30.0, max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    return transformers.Gemma3ForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=262144)
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--target-kernels", choices=("stock", "optimized"), default="optimized")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args()

    target = build_target(args)
    draft = DominoDraftModel.from_target(target, num_hidden_layers=1, block_size=args.block_size).eval()
    with torch.no_grad():
        # A random draft on a random target copies the token random targets repeat (its output is close to the
        # anchor's embedding, and the head is tied): negating its final norm makes it reliably wrong.
        draft.norm.weight.neg_()
    draft = draft.to(torch.bfloat16)
    if args.target_kernels == "optimized":
        optimize_for_cpu(target)
        optimize_for_cpu(draft)
    generator = torch.Generator().manual_seed(1)
    prompts = [
        BenchPrompt("random", str(i), torch.randint(0, args.vocab, (64,), generator=generator).tolist())
        for i in range(args.prompts)
    ]
    config = BenchConfig(
        methods=("autoregressive", "domino_no_lookup", "domino"), max_new_tokens=args.max_new_tokens, warmup=1,
    )
    result = run_benchmark(target, prompts, config, draft=draft)
    print(methods_table(result["methods"]))
    print()
    print(profile_table(result["profile"]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({k: v for k, v in result.items() if k != "runs"}, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
