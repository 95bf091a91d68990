#!/usr/bin/env bash
# The whole pipeline on a tiny random target, in about a minute on one CPU core, offline:
#   make target → prompts → domino regen → domino train → domino features + domino train --features
#   → domino export → greedy generate with and without the draft (identical ids), τ and the final losses.
# It is also the smoke test of the `domino` CLI (tests/test_examples.py runs it).
#   bash examples/train_tiny.sh [OUT]   (default runs/tiny, relative to the current directory)
#   TINY_TARGET=--gemma3 DRAFT_ARGS="--draft_vocab_size 128" EXPORT_ARGS="--dtype bfloat16" \
#     bash examples/train_tiny.sh runs/tiny-gemma3
#     the hard case: a Gemma-3-style base model (262k vocabulary, sliding window, no chat template) whose hidden
#     states exceed float16's range (so the draft is exported in bfloat16: a float16 draft cannot read them).
# Rerunning starts over: the script's own outputs under OUT are removed first.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-runs/tiny}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # tiny models: more threads only contend
export TOKENIZERS_PARALLELISM=false
STEPS="${STEPS:-40}"
read -r -a TINY_TARGET <<< "${TINY_TARGET:-}"  # options of make_tiny_target.py
read -r -a DRAFT_ARGS <<< "${DRAFT_ARGS:-}"    # extra draft sizing options for features and train
read -r -a EXPORT_ARGS <<< "${EXPORT_ARGS:-}"  # extra options of domino export
START=$SECONDS
step() { echo "== [$((SECONDS - START))s] $*"; }

rm -rf "$OUT"/{target,prompts.jsonl,data.jsonl,run,features,run_features,draft}

step "tiny random target (char-level tokenizer, 4 layers) ${TINY_TARGET[*]} -> $OUT/target"
python "$HERE/make_tiny_target.py" "$OUT/target" "${TINY_TARGET[@]}"

step "40 distinct prompts -> $OUT/prompts.jsonl"
python - "$OUT/prompts.jsonl" <<'EOF'
import json, random, sys
rng = random.Random(0)
subjects = ["cats", "the sea", "a red kite", "old maps", "rain", "bread", "a quiet town", "stars", "music", "rivers"]
asks = ["Tell me about {}.", "Write a short poem on {}.", "Why do people like {}?", "Describe {} in one line.",
        "List three facts about {}."]
prompts = rng.sample([ask.format(subject) for ask in asks for subject in subjects], 40)  # 40 of the 50, no repeat
with open(sys.argv[1], "w") as f:
    for i, prompt in enumerate(prompts):
        f.write(json.dumps({"id": f"p{i}", "prompt": prompt}) + "\n")
EOF

# The draft (1 layer, block 4) and the training arguments shared by both runs: a few dozen fast steps.
SIZE=(--target "$OUT/target" --data "$OUT/data.jsonl" --num_layers 1 --block_size 4 "${DRAFT_ARGS[@]}")
TRAIN=("${SIZE[@]}" --max_steps "$STEPS" --lr 3e-3 --logging_steps 10 --save_steps 1000)

step "domino regen: the target answers the prompts (greedy, 32 tokens)"
domino regen --target "$OUT/target" --prompts "$OUT/prompts.jsonl" --out "$OUT/data.jsonl" --max_new_tokens 32

step "domino train ($STEPS steps, target forward every step)"
domino train "${TRAIN[@]}" --out "$OUT/run"

# The same run again from cached context features (no target forward while training): the losses must match.
# `features` derives the draft config from the same sizing options and writes it beside the shards.
step "domino features + domino train --features"
domino features "${SIZE[@]}" --out "$OUT/features"
domino train "${TRAIN[@]}" --features "$OUT/features" --out "$OUT/run_features"

step "domino export -> $OUT/draft"
domino export "$OUT/run" --out "$OUT/draft" "${EXPORT_ARGS[@]}"

step "generate with and without the draft; final losses"
python - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from domino_hf.data import chat_input_ids

out = Path(sys.argv[1])
target = AutoModelForCausalLM.from_pretrained(out / "target").eval()
tokenizer = AutoTokenizer.from_pretrained(out / "target")
draft = AutoModel.from_pretrained(out / "draft", trust_remote_code=True).eval()

# Four distinct prompts the draft was trained on, two it never saw (a repeat would be drafted from the suffix cache
# of its own first generation, inflating tau).
seen = list(dict.fromkeys(json.loads(line)["prompt"] for line in (out / "data.jsonl").open()))[:4]
unseen = ["What is a kite made of?", "Write a line about bread and rain."]
accepted = steps = 0
for prompt in seen + unseen:
    ids = torch.tensor([chat_input_ids(tokenizer, [prompt])])  # the chat template, or plain text (base model)
    with torch.no_grad():
        reference = target.generate(ids, max_new_tokens=32, do_sample=False)
        output = target.generate(ids, max_new_tokens=32, do_sample=False, assistant_model=draft)
    assert output.tolist() == reference.tolist(), f"draft changed the greedy output of {prompt!r}"
    stats = draft.last_generation_stats
    accepted, steps = accepted + sum(stats.accepted), steps + stats.num_steps
    print(f"  {'seen  ' if prompt in seen else 'unseen'} tau {stats.tau:.2f}  {prompt!r} -> "
          f"{tokenizer.decode(output[0, ids.shape[1]:], skip_special_tokens=True)!r}")
tau = (accepted + steps) / max(steps, 1)
print(f"greedy outputs identical with and without the draft on {len(seen + unseen)} prompts; "
      f"tau {tau:.2f} tokens per target forward")
assert tau > 1.05, "the draft got (almost) nothing accepted: its proposals do not follow the target"

def logged_losses(run):
    """The first and the last logged training metrics of `run`."""
    history = json.loads((out / run / "final" / "training_summary.json").read_text())["log_history"]
    logged = [h for h in history if "final_loss" in h]
    return logged[0], logged[-1]

print("final losses:")
for run in ("run", "run_features"):
    first, last = logged_losses(run)
    print(f"  {run:<12} step {last['step']}: base_loss {last['base_loss']:.4f} final_loss {last['final_loss']:.4f} "
          f"(step {first['step']}: {first['final_loss']:.4f}), final_acc {last['final_acc']:.3f}, sim_tau {last['sim_tau']:.3f}")
first, plain = logged_losses("run")
cached = logged_losses("run_features")[1]
assert plain["final_loss"] < first["final_loss"], "the loss did not fall"
assert abs(plain["final_loss"] - cached["final_loss"]) < 0.05, "training from cached features diverged"
print("training from cached features matches training with the target (final_loss within 0.05)")
EOF
step "done: draft in $OUT/draft"
