#!/usr/bin/env bash
# How the shipped draft drafts/smollm2-135m-instruct-domino was made (CPU, resumable at every stage), in rounds:
# round 1 trains from scratch on 5,516 ShareGPT answers; rounds 2, 4, 5 and 6 continue it on the data job's
# answers (round 3 shipped nothing: docs/training.md).
# State lives outside the repo ($DOMINO_HF_CACHE, default ~/.cache/domino-hf): rerun the same command after
# a kill and it continues (features: next missing shard; train: --resume from the newest complete checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${DOMINO_HF_CACHE:-$HOME/.cache/domino-hf}"
CONFIG=hub_configs/smollm2-135m-instruct-domino.json
PROBE=(--probe-prompts mt_bench --probe-num 4 --probe-max-new-tokens 48)
# bf16 (features: `--dtype auto`; training: autocast) where the CPU has it natively (AMX, avx512_bf16), as every
# round so far was made; elsewhere fp32, since PyTorch emulates bf16 there, ~60x slower (docs/cpu_kernels.md)
BF16="$(python -c 'from domino_hf.dtypes import bf16_is_fast; print("--bf16" if bf16_is_fast("cpu") else "--no-bf16")')"

export_round() {  # RUN OUT: a round's draft as it shipped (fp16 weights), once
  [ -f "$2/config.json" ] || domino export "$1" --out "$2" --dtype float16
}

continue_round() {  # RUN INIT SEED DATA: grow the shared feature folder by DATA's new records, then one pass of
  # 3,000 steps at lr 3e-4 (cosine, curriculum, bf16 autocast, batches grouped by length) from the draft INIT
  # shellcheck disable=SC2086
  domino features --target smollm2 --data $4 --config "$CONFIG" --dtype auto --out "$FEATURES2"
  # shellcheck disable=SC2086
  domino train --target smollm2 --data $4 --features "$FEATURES2" --init "from:$2" \
    --draft-vocab-size 8192 --out "$1" --max-steps 3000 --batch-size 8 --num-anchors 32 --lr 3e-4 \
    "$BF16" --group-by-length --seed "$3" --save-steps 500 --logging-steps 50 "${PROBE[@]}" --resume
}

# Round 1 (≈ 2 CPU-hours): 2-layer backbone, block 4, GRU 256 / rank 256, 8192-token sub-vocabulary, teacher
# forcing + curriculum, 5,500 steps (≈ 8 passes) on the target's own greedy answers to 5,516 ShareGPT prompts.
DATA1=data/regen/base/smollm2-135m-instruct_sharegpt.jsonl.gz
FEATURES1="$CACHE/features/smollm2-regen-l1-14-27"
RUN1="$CACHE/runs/smollm2-domino-b4"
domino features --target smollm2 --data "$DATA1" --config "$CONFIG" --out "$FEATURES1"
domino train --target smollm2 --data "$DATA1" --features "$FEATURES1" --config "$CONFIG" \
  --draft-vocab-size 8192 --out "$RUN1" --max-steps 5500 --batch-size 8 --num-anchors 32 --lr 1e-3 \
  --save-steps 500 --logging-steps 50 "${PROBE[@]}" --resume
# Round 1's draft as it shipped until session 11 (fp16 weights): round 2 starts from it.
ROUND1="$CACHE/exports/smollm2-domino-round1"
export_round "$RUN1" "$ROUND1"

# Round 2 (≈ 0.9 CPU-hour on features extracted in ≈ 0.6 h with 2 processes): two passes over the data job's
# answers (data/regen/, 6 sources, bf16 target; 16,730 prompts, 2.77M response tokens with the shared file),
# each 2,000 steps at lr 3e-4 (cosine, the curriculum again), bf16 autocast, batches grouped by length; the
# second pass continues the first with anchors and order drawn afresh (seed 1). Sub-vocabulary and config are
# round 1's. (examples/ablate_smollm2.sh's arms `warm` and `warm2`.)
DATA2="data/regen/a-20261202-0.jsonl.gz data/regen/a-20261202-1.jsonl.gz data/regen/a-20261202-2.jsonl.gz
  data/regen/b-20261202-0.jsonl.gz data/regen/b-20261202-1.jsonl.gz data/regen/b-20261202-2.jsonl.gz $DATA1"
FEATURES2="$CACHE/features/round2-l1-14-27"
# shellcheck disable=SC2086
domino features --target smollm2 --data $DATA2 --config "$CONFIG" --dtype auto --out "$FEATURES2"
INIT="from:$ROUND1"
for pass in 1 2; do
  RUN2="$CACHE/runs/smollm2-domino-b4-round2-pass$pass"
  # shellcheck disable=SC2086
  domino train --target smollm2 --data $DATA2 --features "$FEATURES2" --init "$INIT" \
    --draft-vocab-size 8192 --out "$RUN2" --max-steps 2000 --batch-size 8 --num-anchors 32 --lr 3e-4 \
    "$BF16" --group-by-length --seed $((pass - 1)) --save-steps 500 --logging-steps 50 "${PROBE[@]}" --resume
  INIT="from:$RUN2/final"
done

# Round 2's draft as it shipped in sessions 11-12 (fp16 weights): round 4 starts from it.
ROUND2="$CACHE/exports/smollm2-domino-round2"
export_round "$RUN2" "$ROUND2"

# Round 4 (≈ 0.6 CPU-hour; features grown by the new records only, ≈ 0.2 h): round 2's data, the data job's
# shards written since and stream c (3,000 questions SmolLM2 wrote itself, with its answers): 20,969 prompts,
# 3.63M response tokens. Listed after round 2's files, so round 2's feature folder grows. One pass of 3,000
# steps at lr 3e-4 from round 2's draft, seed 3 (examples/ablate_smollm2.sh's arm `warm4`).
DATA4="$DATA2 data/regen/a-20261202-3.jsonl.gz data/regen/a-20261202-4.jsonl.gz data/regen/c-20261203-0.jsonl.gz"
RUN4="$CACHE/runs/smollm2-domino-b4-round4"
continue_round "$RUN4" "$ROUND2" 3 "$DATA4"

# Round 4's draft as it shipped in session 13 (fp16 weights): round 5 starts from it.
ROUND4="$CACHE/exports/smollm2-domino-round4"
export_round "$RUN4" "$ROUND4"

# Round 5 (≈ 0.7 CPU-hour; features grown by the new records only, ≈ 0.15 h with two processes): round 4's
# data, stream b's shards of 2026-12-03 and stream d's (ShareGPT first turns of 769-2,048 tokens: documents to
# summarise or rewrite): 22,874 prompts, 3.96M response tokens. One pass of 3,000 steps at lr 3e-4 from round
# 4's draft, seed 4 (examples/ablate_smollm2.sh's arm `warm5`).
DATA5="$DATA4 data/regen/b-20261203-0.jsonl.gz data/regen/b-20261203-1.jsonl.gz
  data/regen/d-20261203-0.jsonl.gz data/regen/d-20261203-1.jsonl.gz"
RUN5="$CACHE/runs/smollm2-domino-b4-round5"
continue_round "$RUN5" "$ROUND4" 4 "$DATA5"

# Round 5's draft as it shipped in session 14 (fp16 weights): round 6 starts from it.
ROUND5="$CACHE/exports/smollm2-domino-round5"
export_round "$RUN5" "$ROUND5"

# Round 6 (≈ 0.7 CPU-hour; features grown by the new records only): round 5's data and the two shards of
# session 14: 24,193 prompts, 4.16M response tokens. One pass of 3,000 steps at lr 3e-4 from round 5's draft,
# seed 5 (examples/ablate_smollm2.sh's arm `warm6`).
DATA6="$DATA5 data/regen/b-20261203-2.jsonl.gz data/regen/d-20261203-2.jsonl.gz"
RUN6="$CACHE/runs/smollm2-domino-b4-round6"
continue_round "$RUN6" "$ROUND5" 5 "$DATA6"

# Export the Hub folder (fp16 weights, remote code, model card). The shipped card's round history and its
# Measured section were passed as Markdown files (--notes FILE --measured FILE) from docs/training.md and
# docs/bench/.
domino export "$RUN6" --out drafts/smollm2-135m-instruct-domino --dtype float16 \
  --dataset anon8231489123/ShareGPT_Vicuna_unfiltered
