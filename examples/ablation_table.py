"""Print the recipe-ablation table of `examples/ablate_smollm2.sh` as Markdown (for docs/experiments.md).

Per arm: held-out τ of the block alone (`domino_no_lookup`) over the five prompt sets and per set, slot-1
acceptance, the head's gain over DFlash mode with the same weights, τ as shipped (block or context span, where
measured), and the training cost in CPU-hours (user + system time of `domino train`, summed over resumed
runs).

    python examples/ablation_table.py [--dir ~/.cache/domino-hf/ablations]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SETS = ("humaneval", "mt_bench", "alpaca", "qa", "sum")


def cpu_hours(run: Path) -> float:
    """Sum of user + system seconds over every `domino train` invocation of the arm, in hours."""
    path = run / "train_time"
    if not path.exists():
        return float("nan")
    total = 0.0
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3 and not line.startswith("Command"):
            total += float(fields[1]) + float(fields[2])
    return total / 3600


def row(run: Path) -> str | None:
    path = run / "eval" / "heldout.json"
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    block, dflash = report["methods"]["domino_no_lookup"], report["methods"]["dflash"]
    per_set = [report["by_set"].get(name, {}).get("domino_no_lookup", {}).get("tau", float("nan")) for name in SETS]
    slot1 = (block["per_position_acceptance"] or [float("nan")])[0]
    gain = block["tau"] / dflash["tau"] - 1
    hybrid = report["methods"].get("domino", {}).get("tau")  # as shipped: the block or a context span
    cells = [run.name, f"{block['tau']:.2f}", *(f"{t:.2f}" for t in per_set), f"{slot1:.2f}", f"{gain:+.0%}",
             f"{hybrid:.2f}" if hybrid else "–"]
    return "| " + " | ".join(cells + [f"{cpu_hours(run):.1f}"]) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "domino-hf" / "ablations")
    args = parser.parse_args()
    header = ["arm", "τ (5 sets)", *SETS, "slot-1 acc.", "head gain", "τ as shipped", "CPU-h"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for run in sorted(p for p in args.dir.iterdir() if p.is_dir()):
        line = row(run)
        if line:
            print(line)


if __name__ == "__main__":
    main()
