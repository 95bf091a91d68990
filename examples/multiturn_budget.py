"""How many later ShareGPT turns `domino regen --turns all` can answer under a prompt cap, and their answer tokens.

    python examples/multiturn_budget.py ANSWERS.jsonl [--caps 384,768,1024] [--target smollm2]

Nothing is generated. `regen`'s own turn planner (`domino_hf.training.turns.TurnPlan`) is replayed over the
`sharegpt` prompts with the answers a run would have as history: the target's real turn-1 answers where
ANSWERS (a `--turns first` regen output, only read) has them, and for every other turn one of those answers
drawn by the turn's id (seeded), so later turns get answers of the target's real length distribution.
Prints one JSON line per cap: usable turn-1 prompts, usable later turns (out of all later turns), the later
turns per turn number, and the later turns' answer tokens under that assumption.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter

import torch

from domino_hf.data import read_prompts
from domino_hf.targets import load_target_tokenizer
from domino_hf.training.turns import Answered, TurnPlan


def read_rows(path: str) -> list[dict]:
    """The complete lines of a regen file that another process may be appending to (never repaired here)."""
    rows = []
    with open(path, "rb") as handle:
        for line in handle:
            if line.endswith(b"\n") and line.strip():
                rows.append(json.loads(line))
    return rows


def replay(tokenizer, prompts, rows: list[dict], cap: int) -> dict:
    """Run the planner to the end, answering every pending turn from `rows`; returns the counts."""
    answers = {row["id"]: Answered(row["prompt"], row["response"]) for row in rows}
    pool = [(row["response"], len(row["response_ids"])) for row in rows]
    plan = TurnPlan(tokenizer, prompts, answers, cap, turns="all")
    per_turn: Counter[int] = Counter()
    later_tokens = 0
    for todo in plan:
        written = []
        for item in todo:
            response, length = pool[random.Random(item.id).randrange(len(pool))]
            written.append({"id": item.id, "prompt": item.prompt, "response": response})
            per_turn[item.turn] += 1
            later_tokens += length if item.turn > 1 else 0
        plan.answered(written)
    later_total = sum(max(len(record.turns) - 1, 0) for record in plan.records)
    return {
        "cap": cap,
        "turn1_usable": plan.counts["skipped_existing"] + per_turn[1],
        "later_usable": sum(n for turn, n in per_turn.items() if turn > 1),
        "later_total": later_total,
        "later_answer_tokens": later_tokens,
        "later_by_turn": {turn: per_turn[turn] for turn in sorted(per_turn) if turn > 1 and turn <= 8},
        "skipped_too_long": plan.counts["skipped_too_long"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("answers", help="A `domino regen --prompts sharegpt` output (read only).")
    parser.add_argument("--caps", default="384,768,1024", help="Comma-separated --max-prompt-tokens values.")
    parser.add_argument("--target", default="smollm2", help="Whose tokenizer and chat template (default: smollm2).")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer, _ = load_target_tokenizer(args.target)
    prompts = read_prompts("sharegpt")
    rows = read_rows(args.answers)
    print(json.dumps({"conversations": len(prompts), "user_turns": sum(len(r.turns) for r in prompts),
                      "answers_read": len(rows),
                      "mean_answer_tokens": round(sum(len(r["response_ids"]) for r in rows) / len(rows), 1)}))
    for cap in map(int, args.caps.split(",")):
        print(json.dumps(replay(tokenizer, prompts, rows, cap)), flush=True)


if __name__ == "__main__":
    main()
