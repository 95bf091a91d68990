#!/usr/bin/env bash
# Stage 1 of the Qwen3-8B recipe (docs/training.md): the target's own answers, through vLLM, on one GPU node.
# NOT RUN in this repository's development (no GPU there); the `domino regen --endpoint` side is tested against
# llama.cpp's server. Resumable: rerun the same command after a kill or a server crash.
#   bash examples/qwen3_8b/regen_vllm.sh [PROMPTS] [OUT]
set -euo pipefail
PROMPTS="${1:-hf:mlabonne/open-perfectblend}"   # the paper's prompt set (1.42M conversations); any JSONL works
OUT="${2:-data/qwen3_8b_regen.jsonl}"
PORT="${PORT:-8000}"
GPUS="${GPUS:-$(nvidia-smi -L | wc -l)}"

# One vLLM server, one engine replica per GPU (data parallel: an 8B model fits on one GPU, so replicas beat
# tensor parallelism for throughput). --max-model-len covers --max_prompt_tokens + --max_new_tokens below.
vllm serve Qwen/Qwen3-8B --served-model-name qwen3-8b --port "$PORT" --dtype bfloat16 \
  --data-parallel-size "$GPUS" --max-model-len 4096 --gpu-memory-utilization 0.90 \
  > "vllm_$PORT.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER' EXIT
until curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null; do
  kill -0 $SERVER || { echo "vLLM exited; see vllm_$PORT.log"; exit 1; }
  sleep 5
done

# Greedy, thinking off (the chat template is applied here by `domino regen`, from Qwen3-8B's tokenizer).
# Enough requests in flight to keep every replica's batch full: ~128 per GPU.
domino regen --target Qwen/Qwen3-8B --endpoint "http://127.0.0.1:$PORT/v1" --model qwen3-8b \
  --prompts "$PROMPTS" --out "$OUT" --max_prompt_tokens 1024 --max_new_tokens 2048 \
  --concurrency $((128 * GPUS))

# SGLang instead of vLLM (same client side):
#   python -m sglang.launch_server --model-path Qwen/Qwen3-8B --served-model-name qwen3-8b --port 30000 --dp "$GPUS"
#   domino regen ... --endpoint http://127.0.0.1:30000/v1 --model qwen3-8b ...
