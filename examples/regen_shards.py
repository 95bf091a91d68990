"""Carry the SmolLM2 data job across machines: committed shards <-> the job's cache files.

Why: `~/.cache/domino-hf` does not survive a change of machine, so the regenerated answers are committed as
gzipped JSONL shards under `data/regen/`, each holding only the records no earlier shard has.

    python examples/regen_shards.py seed    # before the job starts: cache file <- committed shards of its stream
    python examples/regen_shards.py export  # before leaving a machine: new cache records -> a new shard

`domino regen` resumes from its `--out` file (ids already there are skipped), so seeding it with the committed
records resumes the job where the last export stopped. Shards are named
`<stream>-<UTC date>-<n>.jsonl.gz`; `domino train --data data/regen/*.jsonl.gz` reads them directly.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from domino_hf.training.answers import read_existing
from domino_hf.utils import cache_dir

ROOT = Path(__file__).resolve().parent.parent
SHARDS = ROOT / "data" / "regen"
# The --out file of each of examples/regen_smollm2.sh's streams, under $DOMINO_HF_CACHE/data: answers (a, b, c,
# d: the long ShareGPT prompts stream a's cap left out, e: the `summarize` source's documents) and the questions
# stream c answers, which the target wrote itself (`domino self-prompts`; p, kept apart so that
# `data/regen/*.jsonl.gz` stays training data).
STREAMS = {"a": "sharegpt_turns_bf16.jsonl", "b": "mix_b_turns_bf16.jsonl", "c": "self_bf16.jsonl",
           "d": "sharegpt_long_bf16.jsonl", "e": "summarize_bf16.jsonl", "p": "self_prompts.jsonl"}


def shard_folder(stream: str) -> Path:
    return SHARDS / "prompts" if stream == "p" else SHARDS


def shard_lines(stream: str) -> list[str]:
    lines = []
    for path in sorted(shard_folder(stream).glob(f"{stream}-*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            lines += [line for line in fh if line.strip()]
    return lines


def complete_records(path: Path) -> list[tuple[str, dict]]:
    """(line, record) for each whole JSON line of a file a running job may be appending to: read only, so a
    line being written (or cut short by a kill) is skipped, never truncated under the job."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            records.append((line if line.endswith("\n") else line + "\n", json.loads(line)))
        except json.JSONDecodeError:
            continue
    return records


def seed(stream: str) -> None:
    """Before the job starts: append to its cache file the committed records it lacks. `read_existing` first
    cuts off a line left half-written by a kill, so no record is glued onto it."""
    cache = cache_dir("data") / STREAMS[stream]
    committed = shard_lines(stream)
    have = read_existing(cache)
    missing = [line for line in committed if json.loads(line)["id"] not in have]
    with cache.open("a", encoding="utf-8") as fh:
        fh.writelines(missing)
    print(f"{stream}: {len(missing)} committed record(s) added to {cache} ({len(committed)} in shards)")


def export(stream: str, date: str) -> None:
    committed = {json.loads(line)["id"] for line in shard_lines(stream)}
    new = [(line, record) for line, record in complete_records(cache_dir("data") / STREAMS[stream])
           if record["id"] not in committed]
    if not new:
        print(f"{stream}: nothing new")
        return
    folder = shard_folder(stream)
    n = len(list(folder.glob(f"{stream}-{date}-*.jsonl.gz")))
    path = folder / f"{stream}-{date}-{n}.jsonl.gz"
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.writelines(line for line, _ in new)
    tokens = sum(len(record.get("response_ids", ())) for _, record in new)
    print(f"{stream}: {len(new)} record(s), {tokens} response tokens -> {path.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("seed", "export"))
    parser.add_argument("--date", default=None, help="shard date for export (default: today, UTC)")
    args = parser.parse_args()
    from datetime import datetime, timezone

    date = args.date or datetime.now(timezone.utc).strftime("%Y%m%d")
    for stream in STREAMS:
        seed(stream) if args.action == "seed" else export(stream, date)


if __name__ == "__main__":
    main()
