#!/usr/bin/env bash
# The full benchmark report into docs/bench/full/ (≈ 1.5 h on 2 CPU cores; run it on a quiet machine). What is
# committed there now is a historical run of the first draft on stock kernels (docs/bench/README.md); this script
# replaces it with today's draft and code.
# Every run puts all its methods in one process on the same target, so its ratios are comparable; absolute
# times are not comparable across runs. Extra arguments go to every `domino bench` call.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=".venv/bin/domino bench --draft drafts/smollm2-135m-instruct-domino --overwrite_output_dir"  # this script regenerates the committed report
OUT=docs/bench/full
SETS=humaneval,mt_bench,alpaca,sum,qa,copy_heavy   # no ShareGPT: the draft trained on it

# 1. Greedy (T=0), fp32 target: speedup, τ and the token-by-token lossless check on every prompt set.
$BENCH --prompts "$SETS" --num_prompts 10 --max_new_tokens 128 --out "$OUT" --name greedy "$@"
# 2. Sampling (T=1): τ and speedup under speculative sampling (seeded per prompt).
$BENCH --prompts "$SETS" --num_prompts 10 --max_new_tokens 128 --temperature 1.0 --out "$OUT" --name sampling_T1 "$@"
# 3. Task-level losslessness at T>0: HumanEval pass@1 of autoregressive vs Domino sampling, executed.
$BENCH --methods autoregressive,domino --prompts humaneval --num_prompts 2 --humaneval_pass1 --pass1_problems 20 \
  --pass1_samples 5 --pass1_temperature 0.2 --out "$OUT" --name humaneval_pass1 "$@"
# 4. bf16 target: verify cost is flat in the number of tokens on a CPU with native bf16, but bf16 kernels make
#    the target's own greedy output depend on how many tokens a forward sees: no method is token-identical.
$BENCH --dtype bfloat16 --prompts humaneval,mt_bench --num_prompts 10 --out "$OUT" --name bf16_target "$@" || true
