"""Which verify loop should drive a single prompt's chain? transformers' `_assisted_decoding` with the Domino
candidate generator (what `generate(assistant_model=draft)` runs today), or domino-hf's own loop
(`DominoBatchDecoder`, which batches and draft trees use, with one row)?

Times both on the same prompts, interleaved with plain decoding, after a warm-up, greedy, without the suffix cache
(each prompt is decoded three times; a suffix cache would find the earlier answers), and checks every output
against plain decoding. Prints median ms per new token and each prompt's own-loop ÷ transformers-loop ratio.

    python examples/compare_loops.py --dtype bfloat16 --num_prompts 6
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import domino_hf.modeling.dispatch_domino as dispatch
from domino_hf import load_draft, load_target, optimize_for_cpu
from domino_hf.bench.pipeline import build_prompts
from domino_hf.dtypes import DTYPE_NAMES, torch_dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPE_NAMES)
    parser.add_argument("--prompts", default="humaneval,mt_bench")
    parser.add_argument("--num_prompts", type=int, default=6, help="per prompt set")
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch_dtype(args.dtype)
    target, tokenizer = load_target("smollm2", dtype=dtype)[:2]
    optimize_for_cpu(target)
    draft = optimize_for_cpu(load_draft("smollm2", target).to(dtype))
    prompts = build_prompts(tokenizer, args.prompts.split(","), args.num_prompts)
    chain_only = dispatch._verifies_tree

    def decode(ids, loop: str | None):
        kwargs = {} if loop is None else {"assistant_model": draft, "use_draft_tree": False, "use_suffix_cache": False}
        dispatch._verifies_tree = (lambda *a: True) if loop == "own" else chain_only  # the own loop takes the row
        try:
            start = time.perf_counter()
            out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=args.max_new_tokens, **kwargs)[0, ids.shape[1]:].tolist()
            return out, (time.perf_counter() - start) / len(out)
        finally:
            dispatch._verifies_tree = chain_only

    loops = (None, "transformers", "own")
    for prompt in prompts[:2]:  # warm-up
        for loop in loops:
            decode(torch.tensor([prompt.input_ids]), loop)
    seconds = {loop: [] for loop in loops}
    identical = 0
    for prompt in prompts:
        ids = torch.tensor([prompt.input_ids])
        outs = {}
        for loop in loops:
            outs[loop], per_token = decode(ids, loop)
            seconds[loop].append(per_token)
        identical += outs["transformers"] == outs[None] and outs["own"] == outs[None]
    print(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, {args.dtype}, {torch.get_num_threads()} threads; "
          f"outputs identical to plain decoding: {identical}/{len(prompts)}")
    print(" · ".join(f"{loop or 'plain'}: {statistics.median(s) * 1e3:.1f} ms/token" for loop, s in seconds.items()))
    ratios = [own / theirs for theirs, own in zip(seconds["transformers"], seconds["own"])]
    print(f"own ÷ transformers loop, per prompt: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
