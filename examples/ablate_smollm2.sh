#!/usr/bin/env bash
# Recipe ablations for the SmolLM2 draft, one lever at a time against `base`, and the continuation arms each
# training stage of the shipped draft was chosen from (docs/experiments.md). Every arm trains from the same cached
# context features for the same number of steps; its held-out τ is then measured by real greedy decoding
# (`domino bench`: block only, and DFlash mode with the same weights) on the five prompt sets no draft is trained
# on. Resumable: rerun and unfinished arms continue from their newest checkpoint, finished ones are skipped.
# `python examples/ablation_table.py` prints the table.
#   ARMS="base block8" STEPS=600 bash examples/ablate_smollm2.sh
# The `kl` arm (`--loss kl`: KL to the target's top-K next-token distribution instead of cross entropy on its
# tokens) needs features that also hold the target's top-K: FEATURES below hold them; a KL_FEATURES folder
# of its own is extracted first (its time is not in the arm's CPU-h), and with KL_FEATURES=none the arm runs
# the target's forward in every step instead (~8x slower a step, no extraction).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${DOMINO_HF_CACHE:-$HOME/.cache/domino-hf}"
# Stage 2's data: the data job's shards of 2026-12-02, then stage 1's file; one record per prompt is kept, 16,740
# records, 2.77M response tokens. A fixed list, not a glob: the features are indexed by example, so the data must
# not grow under them. Each later list appends files, so the feature folder grows (`domino features` extracts only
# the new records).
STAGE2_DATA="data/regen/a-20261202-0.jsonl.gz data/regen/a-20261202-1.jsonl.gz data/regen/a-20261202-2.jsonl.gz
  data/regen/b-20261202-0.jsonl.gz data/regen/b-20261202-1.jsonl.gz data/regen/b-20261202-2.jsonl.gz
  data/regen/base/smollm2-135m-instruct_sharegpt.jsonl.gz"
# A third pass over mostly the same records (arms warm3, warm3_v16k; not shipped): 17,969 records, 3.03M tokens.
THIRD_PASS_DATA="$STAGE2_DATA data/regen/a-20261202-3.jsonl.gz data/regen/a-20261202-4.jsonl.gz"
# Stage 3: + stream c, the questions SmolLM2 wrote itself and its answers: 20,969 records, 3.63M response tokens.
STAGE3_DATA="$THIRD_PASS_DATA data/regen/c-20261203-0.jsonl.gz"
# Stage 4: + stream b's shards of 2026-12-03 and stream d's (ShareGPT first turns of 769-2,048 tokens: documents
# to summarise or rewrite): 22,874 records (7 repeated prompts dropped).
STAGE4_DATA="$STAGE3_DATA data/regen/b-20261203-0.jsonl.gz data/regen/b-20261203-1.jsonl.gz
  data/regen/d-20261203-0.jsonl.gz data/regen/d-20261203-1.jsonl.gz"
# Stage 5 (the shipped draft): + two more shards: 24,193 records, 4.16M response tokens.
STAGE5_DATA="$STAGE4_DATA data/regen/b-20261203-2.jsonl.gz data/regen/d-20261203-2.jsonl.gz"
# Source answers: ShareGPT's own first replies as context, labelled by the target at the first draft slot
# (`domino regen --responses source`, written below in under a minute; not committed: the package holds them).
SOURCE_ANSWERS="$CACHE/data/source/sharegpt-first.jsonl"
STAGE5_SRC="$STAGE5_DATA $SOURCE_ANSWERS"
# The next stage (for a machine with native bf16 or a GPU): stage 5's data plus the shards written since, except a
# held-out split of the same streams that no draft has seen (HELDOUT: the overfitting measured in
# docs/experiments.md is judged on it; train on it in a later stage, never in this one).
NEXT_DATA="$STAGE5_DATA data/regen/b-20261203-5.jsonl.gz data/regen/d-20261203-5.jsonl.gz"
HELDOUT="data/regen/b-20261203-3.jsonl.gz data/regen/b-20261203-4.jsonl.gz data/regen/d-20261203-3.jsonl.gz
  data/regen/d-20261203-4.jsonl.gz"
case " ${ARMS:-} " in
  *" src6 "*) DATA="${DATA:-$STAGE5_SRC}" ;;   # src6 trains on stage 5's data plus the source answers
  *" warm7 "*|*" noise7 "*) DATA="${DATA:-$NEXT_DATA}" ;;
  *) DATA="${DATA:-$STAGE5_DATA}" ;;          # space-separated JSONL(.gz) files
esac
KL_TOPK="${KL_TOPK:-32}"
# The features hold the target's top-K too, so every arm (kl included) reads the same folder; later stages grew
# it (stage-2 arms train on its first 16,730 records: `DATA="$STAGE2_DATA"` and `FEATURES` of a copy).
FEATURES="${FEATURES:-$CACHE/features/datajob-l1-14-27-top$KL_TOPK}"
OUT="${OUT:-$CACHE/ablations}"
STEPS="${STEPS:-3000}"
SAVE_STEPS="${SAVE_STEPS:-500}"   # each checkpoint also measures τ by real decoding on 4 MT-Bench prompts (the probe)
# bf16 autocast: 1.5x a step on CPUs with native bf16; elsewhere emulated, ~60x slower, so --no_bf16 there
PRECISION="${PRECISION:-$(python -c 'from domino_hf.dtypes import bf16_is_fast; print("--bf16" if bf16_is_fast("cpu") else "--no_bf16")')}"
GROUPING="${GROUPING:---group_by_length}"  # batches of similar lengths: random ones pad this data to 2x its tokens
ARMS="${ARMS:-base init_target kl block8 layers3 gamma_wide}"
KL_FEATURES="${KL_FEATURES:-$FEATURES}"
EVAL_SETS="humaneval,mt_bench,alpaca,qa,sum"
EVAL_PROMPTS="${EVAL_PROMPTS:-8}"   # per set
EVAL_TOKENS="${EVAL_TOKENS:-96}"
EVAL="${EVAL:-1}"   # 0: train only (judge by examples/replay_tau.py first, then bench the arms worth it)

# The draft the continuation arms start from. Each stage's arms started from the draft shipped at the time: to rerun
# one, point SHIPPED at that stage's export (examples/train_smollm2.sh: $CACHE/exports/smollm2-domino-stageN).
SHIPPED="${SHIPPED:-drafts/smollm2-135m-instruct-domino}"
# Stage 5's arms continue the stage-4 draft (examples/train_smollm2.sh exports it there)
STAGE4_DRAFT="${STAGE4_DRAFT:-$CACHE/exports/smollm2-domino-stage4}"
arm_options() {  # the lever each arm changes; everything else is the shipped recipe
  case "$1" in
    base) echo "--block_size 4 --num_layers 2 --init random --lr 1e-3" ;;
    block8) echo "--block_size 8 --num_layers 2 --init random --lr 1e-3" ;;
    init_target) echo "--block_size 4 --num_layers 2 --init target-layers --lr 1e-3" ;;
    layers3) echo "--block_size 4 --num_layers 3 --init random --lr 1e-3" ;;
    gamma_wide) echo "--block_size 4 --num_layers 2 --init random --gamma 8 --lr 1e-3" ;;
    kl) echo "--block_size 4 --num_layers 2 --init random --loss kl --kl_topk $KL_TOPK --lr 1e-3" ;;
    # training in stages: continue the shipped draft (its config and sub-vocabulary) on this stage's data
    warm) echo "--init from:$SHIPPED --lr 3e-4" ;;
    warm_kl) echo "--init from:$SHIPPED --loss kl --kl_topk $KL_TOPK --lr 3e-4" ;;
    # stage 2, second pass: from `warm`, anchors and order drawn afresh (another seed)
    warm2) echo "--init from:$OUT/warm/final --lr 3e-4 --seed 1" ;;
    # a third pass over THIRD_PASS_DATA from the stage-2 draft (`warm2`), and the same with the
    # sub-vocabulary grown from 8,192 to 16,384 tokens (new tokens start with no head correction)
    warm3) echo "--init from:$SHIPPED --lr 3e-4 --seed 2" ;;
    warm3_v16k) echo "--init from:$SHIPPED --lr 3e-4 --seed 2 --draft_vocab_size 16384" ;;
    # stage 3: the same two from the stage-2 draft on STAGE3_DATA (stream c added), another seed
    warm4) echo "--init from:$SHIPPED --lr 3e-4 --seed 3" ;;
    warm4_v16k) echo "--init from:$SHIPPED --lr 3e-4 --seed 3 --draft_vocab_size 16384" ;;
    # stage 4: a pass over STAGE4_DATA from the stage-3 draft (`warm4`), and the same draft
    # deepened to 3 layers first (the new layer starts as identity: `--num_layers` with `--init from:`)
    warm5) echo "--init from:$SHIPPED --lr 3e-4 --seed 4" ;;
    deep5) echo "--init from:$SHIPPED --num_layers 3 --lr 3e-4 --seed 4" ;;
    # stage 5: a pass from the stage-4 draft (`warm5`), and the same deepened to 3 layers with the new
    # layer at 10x the rate (in deep5 it stayed ~10x smaller than the trained ones after 3,000 steps)
    warm6) echo "--init from:$STAGE4_DRAFT --lr 3e-4 --seed 5" ;;
    deep6) echo "--init from:$STAGE4_DRAFT --num_layers 3 --new_layer_lr_scale 10 --lr 3e-4 --seed 5" ;;
    # and warm6 with a regulariser against the measured overfitting (0.4 of τ between answers trained on and
    # unseen prompts of the same source): context features × (1 + 0.1·N(0, 1)) in training
    noise6) echo "--init from:$STAGE4_DRAFT --lr 3e-4 --seed 5 --feature_noise 0.1" ;;
    # and warm6 with the source answers added (ARMS=src6 STEPS=4900: each target answer seen about once, as in
    # warm6's 3,000 steps; the 15,176 source records are extra; run it alone, it reads the folder grown)
    src6) echo "--init from:$STAGE4_DRAFT --lr 3e-4 --seed 5" ;;
    # the next stage: from the shipped draft, one pass, and the same with feature noise; compare them on the
    # five sets and on HELDOUT against their training
    # shards (examples/replay_tau.py --answers), where the overfitting shows
    warm7) echo "--init from:$SHIPPED --lr 3e-4 --seed 6" ;;
    noise7) echo "--init from:$SHIPPED --lr 3e-4 --seed 6 --feature_noise 0.1" ;;
    *) echo "unknown arm $1" >&2; exit 2 ;;
  esac
}

features_for() {  # the --features option of an arm: the kl arms read the target's top-K too
  case "$1" in kl|warm_kl) ;; *) echo "--features $FEATURES"; return ;; esac
  if [ "$KL_FEATURES" = none ]; then return; fi
  if [ "$KL_FEATURES" != "$FEATURES" ]; then
    # shellcheck disable=SC2086
    domino features --target smollm2 --data $DATA --config "$FEATURES/draft_config.json" --kl_topk "$KL_TOPK" \
      --dtype auto --out "$KL_FEATURES" >&2
  fi
  echo "--features $KL_FEATURES"
}

case " $DATA " in *" $SOURCE_ANSWERS "*)
  domino regen --responses source --prompts sharegpt --max_new_tokens 256 --max_prompt_tokens 384 --out "$SOURCE_ANSWERS" ;;
esac
# The context features of every arm, once (resumable: a rerun extracts the next missing shard). The target
# runs in bf16 where the CPU has it natively (as its answers), else fp32; layers 1, 14, 27 of the shipped config.
# shellcheck disable=SC2086
domino features --target smollm2 --data $DATA --config hub_configs/smollm2-135m-instruct-domino.json \
  --kl_topk "$KL_TOPK" --dtype auto --out "$FEATURES"

for arm in $ARMS; do
  run="$OUT/$arm"
  if [ ! -f "$run/final/config.json" ]; then
    mkdir -p "$run"
    features="$(features_for "$arm")"
    # shellcheck disable=SC2046,SC2086
    /usr/bin/time -a -o "$run/train_time" -f "%e %U %S" domino train --target smollm2 --data $DATA $features --seed 0 --draft_vocab_size 8192 \
      $(arm_options "$arm") --out "$run" --max_steps "$STEPS" --batch_size 8 --num_anchors 32 "$PRECISION" "$GROUPING" \
      --save_steps "$SAVE_STEPS" --logging_steps 50 --resume \
      --probe_prompts mt_bench --probe_num 4 --probe_max_new_tokens 48
  fi
  if [ "$EVAL" = 1 ] && [ ! -f "$run/eval/heldout.json" ]; then
    domino bench --target smollm2 --draft "$run/final" --methods autoregressive,domino_no_lookup,dflash,domino \
      --prompts "$EVAL_SETS" --num_prompts "$EVAL_PROMPTS" --max_new_tokens "$EVAL_TOKENS" --out "$run/eval" --name heldout \
      --no_plots --no_progress --overwrite_output_dir
  fi
  case "$arm" in warm7|noise7)  # replayed τ on shards trained on against the held-out split of the same streams
    if [ "$EVAL" = 1 ] && [ ! -f "$run/eval/overfit.md" ]; then
      mkdir -p "$run/eval"
      # shellcheck disable=SC2086
      python examples/replay_tau.py --draft "$run/final" --num_prompts 40 \
        --answers data/regen/b-20261203-2.jsonl.gz data/regen/d-20261203-2.jsonl.gz $HELDOUT > "$run/eval/overfit.md"
    fi ;;
  esac
done
