#!/usr/bin/env bash
# Recipe ablations for the SmolLM2 draft (issue 11), one lever at a time against `base`. Every arm trains from
# the same cached context features for the same number of steps; its held-out τ is then measured by real
# greedy decoding (`domino bench`: block only, and DFlash mode with the same weights) on the five prompt sets
# no draft is trained on. Resumable: rerun and unfinished arms continue from their newest checkpoint, finished
# ones are skipped. `python examples/ablation_table.py` prints the table for docs/training.md.
#   ARMS="base block8" STEPS=600 bash examples/ablate_smollm2.sh
# The `kl` arm (`--loss kl`: KL to the target's top-K next-token distribution instead of cross entropy on its
# tokens) needs features that also hold the target's top-K: round 2's FEATURES hold them; a KL_FEATURES folder
# of its own is extracted first (its time is not in the arm's CPU-h), and with KL_FEATURES=none the arm runs
# the target's forward in every step instead (~8x slower a step, no extraction).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${DOMINO_HF_CACHE:-$HOME/.cache/domino-hf}"
# Round 2 (from session 8): the data job's shards committed by the end of session 8, then the shared file; one
# record per prompt is kept, 16,740 records, 2.77M response tokens. A fixed list, not a glob: the features are
# indexed by example, so the data must not grow under them.
ROUND2_DATA="data/regen/a-20261202-0.jsonl.gz data/regen/a-20261202-1.jsonl.gz data/regen/a-20261202-2.jsonl.gz
  data/regen/b-20261202-0.jsonl.gz data/regen/b-20261202-1.jsonl.gz data/regen/b-20261202-2.jsonl.gz
  data/regen/base/smollm2-135m-instruct_sharegpt.jsonl.gz"
# Round 3 (session 12): the shards written since, listed after round 2's so that its feature folder grows
# (`domino features` extracts only the new records): 17,969 records, 3.03M response tokens.
ROUND3_DATA="$ROUND2_DATA data/regen/a-20261202-3.jsonl.gz data/regen/a-20261202-4.jsonl.gz"
# Round 4 (session 13): stream c, the questions SmolLM2 wrote itself and its answers (3,000 records, 598k tokens),
# grown into the same folder: 20,969 records, 3.63M response tokens.
ROUND4_DATA="$ROUND3_DATA data/regen/c-20261203-0.jsonl.gz"
# Round 5 (session 14): stream b's shards of 2026-12-03 and stream d's (ShareGPT first turns of 769-2,048
# tokens: documents to summarise or rewrite), grown into the same folder: 22,874 records (7 repeated prompts dropped).
ROUND5_DATA="$ROUND4_DATA data/regen/b-20261203-0.jsonl.gz data/regen/b-20261203-1.jsonl.gz
  data/regen/d-20261203-0.jsonl.gz data/regen/d-20261203-1.jsonl.gz"
# Round 6 (session 14, measured next session): the two shards written during session 14, grown in.
ROUND6_DATA="$ROUND5_DATA data/regen/b-20261203-2.jsonl.gz data/regen/d-20261203-2.jsonl.gz"
# Source answers (session 15): ShareGPT's own first replies as context, labelled by the target at the first draft
# slot (`domino regen --responses source`, written below in under a minute; not committed: the package holds them).
SOURCE_ANSWERS="$CACHE/data/source/sharegpt-first.jsonl"
ROUND6_SRC="$ROUND6_DATA $SOURCE_ANSWERS"
# Round 7 (session 16, for the next machine with native bf16 or a GPU): round 6's data plus the shards written
# since, except a held-out split of the same streams that no draft has seen (HELDOUT7: the overfitting, measured
# in docs/training.md, session 16, is judged on it; train on it in a later round, never in round 7).
ROUND7_DATA="$ROUND6_DATA data/regen/b-20261203-5.jsonl.gz data/regen/d-20261203-5.jsonl.gz"
HELDOUT7="data/regen/b-20261203-3.jsonl.gz data/regen/b-20261203-4.jsonl.gz data/regen/d-20261203-3.jsonl.gz
  data/regen/d-20261203-4.jsonl.gz"
case " ${ARMS:-} " in
  *" src6 "*) DATA="${DATA:-$ROUND6_SRC}" ;;   # src6 trains on round 6 plus the source answers
  *" warm7 "*|*" noise7 "*) DATA="${DATA:-$ROUND7_DATA}" ;;
  *) DATA="${DATA:-$ROUND6_DATA}" ;;          # space-separated JSONL(.gz) files
esac
KL_TOPK="${KL_TOPK:-32}"
# Round 2's features hold the target's top-K too, so every arm (kl included) reads the same folder; round 3
# grew it (round-2 arms still train on its first 16,730 records: `DATA="$ROUND2_DATA"` and `FEATURES` of a copy).
FEATURES="${FEATURES:-$CACHE/features/round2-l1-14-27-top$KL_TOPK}"
OUT="${OUT:-$CACHE/ablations-round6}"
STEPS="${STEPS:-3000}"
SAVE_STEPS="${SAVE_STEPS:-500}"   # each checkpoint also measures τ by real decoding on 4 MT-Bench prompts (the probe)
# bf16 autocast: 1.5x a step on CPUs with native bf16; elsewhere emulated, ~60x slower, so --no-bf16 there
PRECISION="${PRECISION:-$(python -c 'from domino_hf.dtypes import bf16_is_fast; print("--bf16" if bf16_is_fast("cpu") else "--no-bf16")')}"
GROUPING="${GROUPING:---group-by-length}"  # batches of similar lengths: random ones pad this data to 2x its tokens
ARMS="${ARMS:-base init_target kl block8 layers3 gamma_wide}"
KL_FEATURES="${KL_FEATURES:-$FEATURES}"
EVAL_SETS="humaneval,mt_bench,alpaca,qa,sum"
EVAL_PROMPTS="${EVAL_PROMPTS:-8}"   # per set
EVAL_TOKENS="${EVAL_TOKENS:-96}"
EVAL="${EVAL:-1}"   # 0: train only (judge by examples/replay_tau.py first, then bench the arms worth it)

SHIPPED=drafts/smollm2-135m-instruct-domino
# Round 6's arms continue the round-5 draft (shipped until session 15; round 6's `warm6` ships since)
ROUND5_DRAFT="${ROUND5_DRAFT:-$CACHE/ablations-round5/warm5/final}"
arm_options() {  # the lever each arm changes; everything else is the shipped recipe
  case "$1" in
    base) echo "--block-size 4 --num-layers 2 --init random --lr 1e-3" ;;
    block8) echo "--block-size 8 --num-layers 2 --init random --lr 1e-3" ;;
    init_target) echo "--block-size 4 --num-layers 2 --init target-layers --lr 1e-3" ;;
    layers3) echo "--block-size 4 --num-layers 3 --init random --lr 1e-3" ;;
    gamma_wide) echo "--block-size 4 --num-layers 2 --init random --gamma 8 --lr 1e-3" ;;
    kl) echo "--block-size 4 --num-layers 2 --init random --loss kl --kl-topk $KL_TOPK --lr 1e-3" ;;
    # training in rounds: continue the shipped draft (its config and sub-vocabulary) on this round's data
    warm) echo "--init from:$SHIPPED --lr 3e-4" ;;
    warm_kl) echo "--init from:$SHIPPED --loss kl --kl-topk $KL_TOPK --lr 3e-4" ;;
    # round 2, second pass: from round 2's `warm`, anchors and order drawn afresh (another seed)
    warm2) echo "--init from:$CACHE/ablations-round2/warm/final --lr 3e-4 --seed 1" ;;
    # round 3: a pass over round 3's data from the shipped draft (round 2's `warm2`), and the same with the
    # sub-vocabulary grown from 8,192 to 16,384 tokens (new tokens start with no head correction)
    warm3) echo "--init from:$SHIPPED --lr 3e-4 --seed 2" ;;
    warm3_v16k) echo "--init from:$SHIPPED --lr 3e-4 --seed 2 --draft-vocab-size 16384" ;;
    # round 4: the same two from the shipped draft on round 4's data (stream c added), another seed
    warm4) echo "--init from:$SHIPPED --lr 3e-4 --seed 3" ;;
    warm4_v16k) echo "--init from:$SHIPPED --lr 3e-4 --seed 3 --draft-vocab-size 16384" ;;
    # round 5: a pass over round 5's data from the shipped draft (round 4's `warm4`), and the same draft
    # deepened to 3 layers first (the new layer starts as identity: `--num-layers` with `--init from:`)
    warm5) echo "--init from:$SHIPPED --lr 3e-4 --seed 4" ;;
    deep5) echo "--init from:$SHIPPED --num-layers 3 --lr 3e-4 --seed 4" ;;
    # round 6: a pass from the round-5 draft (`warm5`), and the same deepened to 3 layers with the new
    # layer at 10x the rate (in deep5 it stayed ~10x smaller than the trained ones after 3,000 steps)
    warm6) echo "--init from:$ROUND5_DRAFT --lr 3e-4 --seed 5" ;;
    deep6) echo "--init from:$ROUND5_DRAFT --num-layers 3 --new-layer-lr-scale 10 --lr 3e-4 --seed 5" ;;
    # and warm6 with a regulariser against the measured overfitting (0.4 of τ between answers trained on and
    # unseen prompts of the same source): context features × (1 + 0.1·N(0, 1)) in training
    noise6) echo "--init from:$ROUND5_DRAFT --lr 3e-4 --seed 5 --feature-noise 0.1" ;;
    # and warm6 with the source answers added (ARMS=src6 STEPS=4900: each target answer seen about once, as in
    # warm6's 3,000 steps; the 15,176 source records are extra; run it alone, it reads round 6's folder grown)
    src6) echo "--init from:$ROUND5_DRAFT --lr 3e-4 --seed 5" ;;
    # round 7 (the round-6 arms were lost with session 15's machine): from the shipped round-6 draft, one pass,
    # and the same with feature noise; compare them on the five sets and on HELDOUT7 against their training
    # shards (examples/replay_tau.py --answers), where the overfitting shows
    warm7) echo "--init from:$SHIPPED --lr 3e-4 --seed 6" ;;
    noise7) echo "--init from:$SHIPPED --lr 3e-4 --seed 6 --feature-noise 0.1" ;;
    *) echo "unknown arm $1" >&2; exit 2 ;;
  esac
}

features_for() {  # the --features option of an arm: the kl arms read the target's top-K too
  case "$1" in kl|warm_kl) ;; *) echo "--features $FEATURES"; return ;; esac
  if [ "$KL_FEATURES" = none ]; then return; fi
  if [ "$KL_FEATURES" != "$FEATURES" ]; then
    # shellcheck disable=SC2086
    domino features --target smollm2 --data $DATA --config "$FEATURES/draft_config.json" --kl-topk "$KL_TOPK" \
      --dtype auto --out "$KL_FEATURES" >&2
  fi
  echo "--features $KL_FEATURES"
}

case " $DATA " in *" $SOURCE_ANSWERS "*)
  domino regen --responses source --prompts sharegpt --max-new-tokens 256 --max-prompt-tokens 384 --out "$SOURCE_ANSWERS" ;;
esac
# The context features of every arm, once (resumable: a rerun extracts the next missing shard). The target
# runs in bf16 where the CPU has it natively (as its answers), else fp32; layers 1, 14, 27 of the shipped config.
# shellcheck disable=SC2086
domino features --target smollm2 --data $DATA --config hub_configs/smollm2-135m-instruct-domino.json \
  --kl-topk "$KL_TOPK" --dtype auto --out "$FEATURES"

for arm in $ARMS; do
  run="$OUT/$arm"
  if [ ! -f "$run/final/config.json" ]; then
    mkdir -p "$run"
    features="$(features_for "$arm")"
    # shellcheck disable=SC2046,SC2086
    /usr/bin/time -a -o "$run/train_time" -f "%e %U %S" domino train --target smollm2 --data $DATA $features --seed 0 --draft-vocab-size 8192 \
      $(arm_options "$arm") --out "$run" --max-steps "$STEPS" --batch-size 8 --num-anchors 32 "$PRECISION" "$GROUPING" \
      --save-steps "$SAVE_STEPS" --logging-steps 50 --resume \
      --probe-prompts mt_bench --probe-num 4 --probe-max-new-tokens 48
  fi
  if [ "$EVAL" = 1 ] && [ ! -f "$run/eval/heldout.json" ]; then
    domino bench --target smollm2 --draft "$run/final" --methods autoregressive,domino_no_lookup,dflash,domino \
      --prompts "$EVAL_SETS" --num-prompts "$EVAL_PROMPTS" --max-new-tokens "$EVAL_TOKENS" --out "$run/eval" --name heldout \
      --no-plots --no-progress --overwrite_output_dir
  fi
  case "$arm" in warm7|noise7)  # replayed τ on shards trained on against the held-out split of the same streams
    if [ "$EVAL" = 1 ] && [ ! -f "$run/eval/overfit.md" ]; then
      mkdir -p "$run/eval"
      # shellcheck disable=SC2086
      python examples/replay_tau.py --draft "$run/final" --num-prompts 40 \
        --answers data/regen/b-20261203-2.jsonl.gz data/regen/d-20261203-2.jsonl.gz $HELDOUT7 > "$run/eval/overfit.md"
    fi ;;
  esac
done
