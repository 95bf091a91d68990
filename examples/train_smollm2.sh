#!/usr/bin/env bash
# How the shipped draft drafts/smollm2-135m-instruct-domino was made (CPU, resumable at every step), in five
# stages: stage 1 trains from scratch on 5,516 ShareGPT answers; stages 2-5 each continue the previous stage's
# draft on more of the data job's answers (docs/experiments.md has what each stage measured).
# State lives outside the repo ($DOMINO_HF_CACHE, default ~/.cache/domino-hf): rerun the same command after
# a kill and it continues (features: next missing shard; train: --resume from the newest complete checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${DOMINO_HF_CACHE:-$HOME/.cache/domino-hf}"
CONFIG=hub_configs/smollm2-135m-instruct-domino.json
PROBE=(--probe_prompts mt_bench --probe_num 4 --probe_max_new_tokens 48)
# bf16 (features: `--dtype auto`; training: autocast) where the CPU has it natively (AMX, avx512_bf16), as every
# stage was made; elsewhere fp32, since PyTorch emulates bf16 there, many times slower (docs/cpu_kernels.md)
BF16="$(python -c 'from domino_hf.dtypes import bf16_is_fast; print("--bf16" if bf16_is_fast("cpu") else "--no_bf16")')"

export_stage() {  # RUN OUT: a stage's draft as it shipped (fp16 weights), once
  [ -f "$2/config.json" ] || domino export "$1" --out "$2" --dtype float16
}

continue_stage() {  # RUN INIT SEED DATA: grow the shared feature folder by DATA's new records, then one pass of
  # 3,000 steps at lr 3e-4 (cosine, curriculum, bf16 autocast, batches grouped by length) from the draft INIT
  # shellcheck disable=SC2086
  domino features --target smollm2 --data $4 --config "$CONFIG" --dtype auto --out "$FEATURES"
  # shellcheck disable=SC2086
  domino train --target smollm2 --data $4 --features "$FEATURES" --init "from:$2" \
    --draft_vocab_size 8192 --out "$1" --max_steps 3000 --batch_size 8 --num_anchors 32 --lr 3e-4 \
    "$BF16" --group_by_length --seed "$3" --save_steps 500 --logging_steps 50 "${PROBE[@]}" --resume
}

# Stage 1 (≈ 2 CPU-hours): 2-layer backbone, block 4, GRU 256 / rank 256, 8192-token sub-vocabulary, teacher
# forcing + curriculum, 5,500 steps (≈ 8 passes) on the target's own greedy answers to 5,516 ShareGPT prompts.
DATA1=data/regen/base/smollm2-135m-instruct_sharegpt.jsonl.gz
FEATURES1="$CACHE/features/smollm2-regen-l1-14-27"
RUN1="$CACHE/runs/smollm2-domino-b4"
domino features --target smollm2 --data "$DATA1" --config "$CONFIG" --out "$FEATURES1"
domino train --target smollm2 --data "$DATA1" --features "$FEATURES1" --config "$CONFIG" \
  --draft_vocab_size 8192 --out "$RUN1" --max_steps 5500 --batch_size 8 --num_anchors 32 --lr 1e-3 \
  --save_steps 500 --logging_steps 50 "${PROBE[@]}" --resume
# Stage 1's draft as it shipped (fp16 weights): stage 2 starts from it.
STAGE1="$CACHE/exports/smollm2-domino-stage1"
export_stage "$RUN1" "$STAGE1"

# Stage 2 (≈ 0.9 CPU-hour on features extracted in ≈ 0.6 h with 2 processes): two passes over the data job's
# answers (data/regen/, 6 sources, bf16 target; 16,730 prompts, 2.77M response tokens with stage 1's file),
# each 2,000 steps at lr 3e-4 (cosine, the curriculum again), bf16 autocast, batches grouped by length; the
# second pass continues the first with anchors and order drawn afresh (seed 1). Sub-vocabulary and config are
# stage 1's. (examples/ablate_smollm2.sh's arms `warm` and `warm2`.) Later stages list their new files after
# these, so this feature folder grows by their new records only.
DATA2="data/regen/a-20261202-0.jsonl.gz data/regen/a-20261202-1.jsonl.gz data/regen/a-20261202-2.jsonl.gz
  data/regen/b-20261202-0.jsonl.gz data/regen/b-20261202-1.jsonl.gz data/regen/b-20261202-2.jsonl.gz $DATA1"
FEATURES="$CACHE/features/datajob-l1-14-27"
# shellcheck disable=SC2086
domino features --target smollm2 --data $DATA2 --config "$CONFIG" --dtype auto --out "$FEATURES"
INIT="from:$STAGE1"
for pass in 1 2; do
  RUN2="$CACHE/runs/smollm2-domino-b4-stage2-pass$pass"
  # shellcheck disable=SC2086
  domino train --target smollm2 --data $DATA2 --features "$FEATURES" --init "$INIT" \
    --draft_vocab_size 8192 --out "$RUN2" --max_steps 2000 --batch_size 8 --num_anchors 32 --lr 3e-4 \
    "$BF16" --group_by_length --seed $((pass - 1)) --save_steps 500 --logging_steps 50 "${PROBE[@]}" --resume
  INIT="from:$RUN2/final"
done
STAGE2="$CACHE/exports/smollm2-domino-stage2"
export_stage "$RUN2" "$STAGE2"

# Stage 3 (≈ 0.6 CPU-hour; features grown by the new records only, ≈ 0.2 h): stage 2's data, the data job's
# shards written since and stream c (3,000 questions SmolLM2 wrote itself, with its answers): 20,969 prompts,
# 3.63M response tokens. One pass from stage 2's draft, seed 3 (examples/ablate_smollm2.sh's arm `warm4`).
DATA3="$DATA2 data/regen/a-20261202-3.jsonl.gz data/regen/a-20261202-4.jsonl.gz data/regen/c-20261203-0.jsonl.gz"
RUN3="$CACHE/runs/smollm2-domino-b4-stage3"
continue_stage "$RUN3" "$STAGE2" 3 "$DATA3"
STAGE3="$CACHE/exports/smollm2-domino-stage3"
export_stage "$RUN3" "$STAGE3"

# Stage 4 (≈ 0.7 CPU-hour; features grown by the new records only, ≈ 0.15 h with two processes): stage 3's
# data, stream b's shards of 2026-12-03 and stream d's (ShareGPT first turns of 769-2,048 tokens: documents to
# summarise or rewrite): 22,874 prompts, 3.96M response tokens. One pass from stage 3's draft, seed 4
# (examples/ablate_smollm2.sh's arm `warm5`).
DATA4="$DATA3 data/regen/b-20261203-0.jsonl.gz data/regen/b-20261203-1.jsonl.gz
  data/regen/d-20261203-0.jsonl.gz data/regen/d-20261203-1.jsonl.gz"
RUN4="$CACHE/runs/smollm2-domino-b4-stage4"
continue_stage "$RUN4" "$STAGE3" 4 "$DATA4"
STAGE4="$CACHE/exports/smollm2-domino-stage4"
export_stage "$RUN4" "$STAGE4"

# Stage 5, the shipped draft (≈ 0.7 CPU-hour; features grown by the new records only): stage 4's data and two
# more shards: 24,193 prompts, 4.16M response tokens. One pass from stage 4's draft, seed 5
# (examples/ablate_smollm2.sh's arm `warm6`).
DATA5="$DATA4 data/regen/b-20261203-2.jsonl.gz data/regen/d-20261203-2.jsonl.gz"
RUN5="$CACHE/runs/smollm2-domino-b4-stage5"
continue_stage "$RUN5" "$STAGE4" 5 "$DATA5"

# Export the Hub folder (fp16 weights, remote code, model card). The shipped card's stage history and its
# Measured section were written as Markdown files and passed with --notes FILE --measured FILE.
domino export "$RUN5" --out drafts/smollm2-135m-instruct-domino --dtype float16 \
  --dataset anon8231489123/ShareGPT_Vicuna_unfiltered
