"""Regeneration throughput: `domino regen` through llama.cpp's server against 🤗 batched `generate`.

Answers the first N ShareGPT prompts with the offline SmolLM2-135M-Instruct (Q4_1 GGUF; dequantised to fp32 for
🤗, run as Q4_1 by llama.cpp) in several ways, prints answers/s and tokens/s for each, then the greedy agreement
of each run with the 🤗 fp32 one: the share of identical answers and where the others first differ.

    python examples/regen_endpoint_bench.py --out /tmp/regen-bench [--num-prompts 50 --max-new-tokens 256]

Each run is a real `domino regen` command (the server, when there is one, is started first and not timed);
the throughput is the one `regen` logs, over its generation loop only. Needs the `serve` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from test_regen_endpoint import LlamaServer  # noqa: E402  (the tests' server launcher)

LOG_LINE = re.compile(r"wrote (\d+) answers \((\d+) finished, (\d+) tokens, ([\d.]+) tok/s\)")


def regen(args: argparse.Namespace, out: Path, prompts: Path, *extra: str, threads: int = 1) -> dict:
    """Run `domino regen` to completion (torch on `threads` threads); its counts and throughput, from its summary
    log line."""
    cmd = [sys.executable, "-m", "domino_hf.cli", "regen", "--prompts", str(prompts), "--out", str(out),
           "--max-new-tokens", str(args.max_new_tokens), "--max-prompt-tokens", str(args.max_prompt_tokens), *extra]
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    match = LOG_LINE.search(done.stderr)
    answers, finished, tokens, tok_s = int(match[1]), int(match[2]), int(match[3]), float(match[4])
    seconds = tokens / tok_s
    return {"answers": answers, "finished": finished, "tokens": tokens, "seconds": seconds,
            "wall_s": time.perf_counter() - start}


def run_pair(args: argparse.Namespace, halves: list[Path], report) -> None:
    """Two single-thread servers, one client each on half of the prompts: llama-cpp-python serves one request
    at a time, so this is its only way to work on two requests at once."""
    servers = [LlamaServer(n_ctx=args.max_prompt_tokens + args.max_new_tokens, n_threads=1) for _ in halves]
    try:
        procs, outs = [], []
        start = time.perf_counter()
        for server, half in zip(servers, halves):
            out = args.out / f"llama_2x1_{half.stem}.jsonl"
            out.unlink(missing_ok=True)
            outs.append(out)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "domino_hf.cli", "regen", "--prompts", str(half), "--out", str(out),
                 "--max-new-tokens", str(args.max_new_tokens), "--max-prompt-tokens", str(args.max_prompt_tokens),
                 "--endpoint", server.url, "--concurrency", "1"], stderr=subprocess.PIPE, text=True))
        parts = []
        for proc in procs:
            match = LOG_LINE.search(proc.communicate()[1])
            parts.append((int(match[1]), int(match[3]), int(match[3]) / float(match[4])))
        wall = time.perf_counter() - start
        merged = args.out / "llama_2x1.jsonl"
        merged.write_text("".join(out.read_text() for out in outs))
        report("2 llama.cpp servers × 1 thread, one client each (half the prompts)",
               {"answers": sum(p[0] for p in parts), "tokens": sum(p[1] for p in parts),
                "seconds": max(p[2] for p in parts), "wall_s": wall})
    finally:
        for server in servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--num-prompts", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-tokens", type=int, default=384)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument("--concurrency", default="1,4", help="comma-separated --concurrency values to try")
    parser.add_argument("--threads", default="1,2", help="comma-separated llama.cpp --n_threads values to try")
    parser.add_argument("--stages", default="hf,server,pair",
                        help="what to run: `hf` (🤗 generate), `server` (one llama.cpp server), `pair` (two servers); "
                        "the agreement table uses whatever outputs --out already holds")
    parser.add_argument("--hf-threads", default="1", help="comma-separated torch thread counts for 🤗 bf16")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from domino_hf.data import read_prompts

    records = read_prompts("sharegpt", limit=args.num_prompts).records
    prompts = args.out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": r.id, "prompt": r.turns[0]}) + "\n" for r in records))
    halves = [args.out / f"half{i}.jsonl" for i in (0, 1)]
    for i, half in enumerate(halves):
        half.write_text("".join(json.dumps({"id": r.id, "prompt": r.turns[0]}) + "\n" for r in records[i::2]))

    results: dict[str, dict] = {}

    def report(name: str, result: dict) -> None:
        results[name] = result
        print(f"| {name} | {result['answers']} | {result['tokens']} | {result['answers'] / result['seconds']:.2f} | "
              f"{result['tokens'] / result['seconds']:.1f} |", flush=True)

    print("| run | answers | tokens | answers/s | tokens/s |\n|---|---|---|---|---|")
    stages = args.stages.split(",")
    hf_threads = [int(t) for t in args.hf_threads.split(",")]
    hf_runs = [("bfloat16", t) for t in hf_threads] + [("float32", hf_threads[0])] if "hf" in stages else []
    for dtype, threads in hf_runs:
        out = args.out / f"hf_{dtype}{'' if dtype == 'float32' else f'_t{threads}'}.jsonl"
        out.unlink(missing_ok=True)
        report(f"HF generate {dtype}, batch {args.hf_batch_size}, {threads} thread(s)",
               regen(args, out, prompts, "--dtype", dtype, "--batch-size", str(args.hf_batch_size), "--device", "cpu",
                     threads=threads))
    for threads in map(int, args.threads.split(",")) if "server" in stages else []:
        server = LlamaServer(n_ctx=args.max_prompt_tokens + args.max_new_tokens, n_threads=threads)
        try:
            for concurrency in map(int, args.concurrency.split(",")):
                out = args.out / f"llama_t{threads}_c{concurrency}.jsonl"
                out.unlink(missing_ok=True)
                report(f"llama.cpp server, {threads} thread(s), --concurrency {concurrency}",
                       regen(args, out, prompts, "--endpoint", server.url, "--concurrency", str(concurrency)))
        finally:
            server.stop()
    if "pair" in stages:
        run_pair(args, halves, report)

    reference = {r["id"]: r for r in map(json.loads, (args.out / "hf_float32.jsonl").read_text().splitlines())}
    print("\n| run vs HF fp32 | identical ids | identical text | first divergence (token index): "
          "min / quartiles / max |\n|---|---|---|---|")
    for path in sorted(args.out.glob("*.jsonl")):
        if path.stem in ("prompts", "hf_float32") or path.stem.startswith(("half", "llama_2x1_")):
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        same_ids = same_text = 0
        divergence = []
        for row in rows:
            ref = reference[row["id"]]
            a, b = row["response_ids"], ref["response_ids"]
            same_ids += a == b
            same_text += row["response"] == ref["response"]
            if a != b:
                divergence.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
        quartiles = statistics.quantiles(divergence, n=4) if len(divergence) > 1 else divergence
        spread = (f"{min(divergence)} / {' / '.join(f'{q:g}' for q in quartiles)} / {max(divergence)}"
                  if divergence else "-")
        print(f"| {path.stem} | {same_ids}/{len(rows)} | {same_text}/{len(rows)} | {spread} |")
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
