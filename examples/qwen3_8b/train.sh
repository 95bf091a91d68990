#!/usr/bin/env bash
# Stages 2-4 of the Qwen3-8B recipe (docs/training.md): train the draft with accelerate on N GPUs, export it,
# push it to the Hub. NOT RUN in this repository's development (no GPU there): the trainer, DDP and resume are
# tested on CPU; the FSDP config was not run (accelerate refuses FSDP on CPU).
#   bash examples/qwen3_8b/train.sh [DATA] [RUN] [ddp|fsdp]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DATA="${1:-data/qwen3_8b_regen.jsonl}"
RUN="${2:-runs/qwen3-8b-domino-b16}"
MODE="${3:-ddp}"
GPUS="${GPUS:-$(nvidia-smi -L | wc -l)}"

# The paper's recipe: block 16, 5 layers (hub_configs/qwen3-8b-domino-b16.json), max length 3072, AdamW lr 6e-4,
# cosine with 4% warmup, grad clip 1, global batch 16 (GPUS x --batch_size x --grad_accum), 3-6 epochs, bf16.
# No `domino features` cache at this size: 5 layers x 4096 x fp16 = 40 KiB per token, ~30 TB for the data set;
# every process runs the frozen target (bf16, ~16 GB) forward on the fly instead.
accelerate launch --config_file "$HERE/accelerate_$MODE.yaml" --num_processes "$GPUS" -m domino_hf.train \
  --target Qwen/Qwen3-8B --data "$DATA" --config hub_configs/qwen3-8b-domino-b16.json \
  --out "$RUN" --max_length 3072 --epochs 3 --batch_size 2 --grad_accum $((16 / (2 * GPUS) > 0 ? 16 / (2 * GPUS) : 1)) \
  --num_anchors 256 --lr 6e-4 --save_steps 1000 --logging_steps 50 --report_to tensorboard \
  --probe_prompts mt_bench --probe_num 8 --probe_max_new_tokens 128 --resume

# Export the Hub folder (remote code, model card) and upload it; then the folder SGLang serves (docs/serving.md).
domino export "$RUN" --out "drafts/qwen3-8b-domino-b16" --dtype bfloat16 \
  --push_to_hub --hub_model_id "${HUB_REPO:?set HUB_REPO=user/Qwen3-8B-Domino-b16}"
domino export "$RUN" --out "drafts/qwen3-8b-domino-b16-sglang" --format sglang
