#!/usr/bin/env bash
# How the shipped draft drafts/smollm2-135m-instruct-domino was made (CPU, resumable at every stage).
# State lives outside the repo ($DOMINO_HF_CACHE, default ~/.cache/domino-hf): rerun the same command after
# a kill and it continues (features: next missing shard; train: --resume from the newest complete checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${DOMINO_HF_CACHE:-$HOME/.cache/domino-hf}"
DATA=../shared/data/regen/smollm2-135m-instruct_sharegpt.jsonl   # the target's own greedy answers (domino regen)
CONFIG=hub_configs/smollm2-135m-instruct-domino.json
FEATURES="$CACHE/features/smollm2-regen-l1-14-27"
RUN="$CACHE/runs/smollm2-domino-b4"

# 0. (optional) more data: domino regen --target smollm2 --prompts sharegpt --out more.jsonl --max-new-tokens 128
# 1. Context features of the target's layers [1, 14, 27], once, in fp16 (~1M tokens).
domino features --target smollm2 --data "$DATA" --config "$CONFIG" --out "$FEATURES"
# 2. Train: 2-layer backbone, block 4, GRU 256 / rank 256, 8192-token sub-vocabulary, teacher forcing + curriculum.
domino train --target smollm2 --data "$DATA" --features "$FEATURES" --config "$CONFIG" \
  --draft-vocab-size 8192 --out "$RUN" --max-steps "${STEPS:-5500}" --batch-size 8 --num-anchors 32 --lr 1e-3 \
  --save-steps "${SAVE_STEPS:-500}" --logging-steps 50 --probe-prompts mt_bench --probe-num 4 --probe-max-new-tokens 48 --resume
# 3. Export the Hub folder (fp16 weights, remote code, model card).
domino export "$RUN" --out drafts/smollm2-135m-instruct-domino --dtype float16 --dataset anon8231489123/ShareGPT_Vicuna_unfiltered
