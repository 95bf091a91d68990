"""Carry the SmolLM2 data job (issue #11) across machines: committed shards <-> the job's cache files.

Why: a session's `~/.cache/domino-hf` does not survive a change of machine (sessions 6 and 7 both started
empty), so the regenerated answers are committed as gzipped JSONL shards under `data/regen/`, each holding
only the records no earlier shard has.

    python examples/regen_shards.py seed    # before the job starts: cache file <- committed shards of its stream
    python examples/regen_shards.py export  # at the end of a session: new cache records -> a new shard

`domino regen` resumes from its `--out` file (ids already there are skipped), so seeding it with the committed
records resumes the job where the last exported session stopped. Shards are named
`<stream>-<UTC date>-<n>.jsonl.gz`; `domino train --data data/regen/*.jsonl.gz` reads them directly.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARDS = ROOT / "data" / "regen"
CACHE = Path.home() / ".cache" / "domino-hf" / "data"
STREAMS = {"a": "sharegpt_turns_bf16.jsonl", "b": "mix_b_turns_bf16.jsonl"}  # one per run_regen process


def shard_lines(stream: str) -> list[str]:
    lines = []
    for path in sorted(SHARDS.glob(f"{stream}-*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            lines += [line for line in fh if line.strip()]
    return lines


def complete_lines(path: Path) -> list[str]:
    """The file's whole JSON lines (a line cut short by a kill is left to `domino regen` to repair)."""
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            json.loads(line)
        except json.JSONDecodeError:
            continue
        lines.append(line if line.endswith("\n") else line + "\n")
    return lines


def seed(stream: str) -> None:
    cache = CACHE / STREAMS[stream]
    committed = shard_lines(stream)
    have = {json.loads(line)["id"] for line in complete_lines(cache)}
    missing = [line for line in committed if json.loads(line)["id"] not in have]
    cache.parent.mkdir(parents=True, exist_ok=True)
    with cache.open("a", encoding="utf-8") as fh:
        fh.writelines(missing)
    print(f"{stream}: {len(missing)} committed record(s) added to {cache} ({len(committed)} in shards)")


def export(stream: str, date: str) -> None:
    committed = {json.loads(line)["id"] for line in shard_lines(stream)}
    new = [line for line in complete_lines(CACHE / STREAMS[stream]) if json.loads(line)["id"] not in committed]
    if not new:
        print(f"{stream}: nothing new")
        return
    n = len(list(SHARDS.glob(f"{stream}-{date}-*.jsonl.gz")))
    path = SHARDS / f"{stream}-{date}-{n}.jsonl.gz"
    SHARDS.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.writelines(new)
    tokens = sum(len(json.loads(line)["response_ids"]) for line in new)
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
