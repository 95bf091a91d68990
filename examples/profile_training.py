"""Where a training step's seconds go on a big-vocabulary target (docs/training.md, "Throughput levers").

    python examples/profile_training.py [--vocab 262144] [--draft-vocab-size K] [--features] [--steps 4]

Builds a random-weight target shaped like Gemma-3-270M (18 layers, hidden 640, 262,144-row tied LM head,
sliding-window layers; timing needs no trained weights), random regen-style data (32 prompt + 64 response
tokens per example), and runs `domino train`'s real trainer for a few steps with timers
around its phases: the target's forward (skipped with --features: the features are made in memory), the draft
backbone, the vocabulary-sized part of the objective (LM-head rows, Domino-head correction, cross entropy), the
backward pass and the optimizer step. The first step is warm-up and not counted. Prints one JSON line with
the wall seconds (`*_s`) and, robust to other processes on a shared machine, this process's CPU seconds over
all its threads (`*_cpu_s`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, TrainerCallback

import domino_hf.training.recipe as train_module
from domino_hf.modeling.target_domino import target_context_features
from domino_hf.training.dataset import RegenDataset, RegenExample
from domino_hf.training.recipe import TrainSettings, build_draft, train_draft
from domino_hf.training.trainer import DominoTrainer

SECONDS: dict[str, list[float]] = defaultdict(list)  # wall seconds; "<name>_cpu": CPU seconds of this process


def now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def record(name: str, start: tuple[float, float]) -> None:
    wall, cpu = now()
    SECONDS[name].append(wall - start[0])
    SECONDS[name + "_cpu"].append(cpu - start[1])


class Clock:
    """Adds the wall and CPU time of a `with` block to SECONDS."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.start = now()

    def __exit__(self, *exc):
        record(self.name, self.start)


class TimedTrainer(DominoTrainer):
    def _target_inputs(self, inputs):
        with Clock("target_forward_and_embeddings"):
            return super()._target_inputs(inputs)

    def compute_loss(self, model, inputs, *args, **kwargs):
        with Clock("compute_loss"):
            return super().compute_loss(model, inputs, *args, **kwargs)

    def training_step(self, *args, **kwargs):
        with Clock("training_step"):
            return super().training_step(*args, **kwargs)


class StepClock(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        self.start = now()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.optimizer_start = now()

    def on_optimizer_step(self, args, state, control, **kwargs):
        record("optimizer_step", self.optimizer_start)

    def on_step_end(self, args, state, control, **kwargs):
        record("step", self.start)


def gemma3_270m_shape(vocab_size: int, layers: int) -> Gemma3ForCausalLM:
    config = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=640, intermediate_size=2048, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                              sliding_window=512, max_position_embeddings=32768)
    torch.manual_seed(0)
    return Gemma3ForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=262144)
    parser.add_argument("--layers", type=int, default=18, help="Target layers (Gemma-3-270M: 18).")
    parser.add_argument("--draft-vocab-size", type=int, default=0, help="0: the full vocabulary.")
    parser.add_argument("--features", action="store_true", help="Train from precomputed context features.")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--num-anchors", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()

    target = gemma3_270m_shape(args.vocab, args.layers)
    generator = torch.Generator().manual_seed(0)
    examples = [RegenExample(torch.randint(10, args.vocab, (32,), generator=generator).tolist(),
                             torch.randint(10, 4096, (64,), generator=generator).tolist())  # a Zipf-ish head of ids
                for _ in range(args.batch_size * (args.steps + 1))]
    dataset = RegenDataset(examples=examples, source="random")
    overrides = {"num_hidden_layers": 1, "block_size": args.block_size}
    if args.draft_vocab_size:
        overrides["draft_vocab_ids"] = list(range(args.draft_vocab_size))
    draft = build_draft(target, None, **overrides)
    if args.features:  # what `domino features` would have stored: computed once here, outside the timing
        cache = {}
        with torch.no_grad():
            for i, example in enumerate(examples):
                ids = torch.tensor([example.prompt_ids + example.response_ids])
                features = target_context_features(target, ids, None, draft.config.target_layer_ids)
                cache[i] = features[0].to(torch.bfloat16)
        dataset.features = type("Store", (), {"get": lambda self, index, length: cache[index]})()

    backbone = []
    draft.register_forward_pre_hook(lambda *a: backbone.append(now()))
    draft.register_forward_hook(lambda *a: record("draft_backbone", backbone.pop()))
    train_module.DominoTrainer = TimedTrainer
    with tempfile.TemporaryDirectory() as out:
        settings = TrainSettings(output_dir=out, max_steps=args.steps + 1, batch_size=args.batch_size,
                                 num_anchors=args.num_anchors, logging_steps=1000, save_steps=100000)
        trainer_steps = StepClock()
        original = DominoTrainer.__init__

        def init(self, *a, **k):
            original(self, *a, **k)
            self.add_callback(trainer_steps)

        TimedTrainer.__init__ = init
        train_draft(target, draft, dataset, settings)

    def mean(name):
        values = SECONDS[name][1:]  # step 1 is warm-up
        return statistics.mean(values) if values else 0.0

    result = {"vocab": args.vocab, "draft_vocab": args.draft_vocab_size or args.vocab, "features": args.features,
              "threads": torch.get_num_threads(), "steps_timed": len(SECONDS["step"]) - 1,
              "draft_parameters_M": round(sum(p.numel() for p in draft.parameters()) / 1e6, 1)}
    for suffix in ("", "_cpu"):
        target_s = mean("target_forward_and_embeddings" + suffix)
        result.update({
            f"step{suffix}_s": round(mean("step" + suffix), 3),
            f"target_forward_and_embeddings{suffix}_s": round(target_s, 3),
            f"draft_backbone_forward{suffix}_s": round(mean("draft_backbone" + suffix), 3),
            f"vocab_sized_forward{suffix}_s": round(
                mean("compute_loss" + suffix) - target_s - mean("draft_backbone" + suffix), 3
            ),
            f"backward{suffix}_s": round(mean("training_step" + suffix) - mean("compute_loss" + suffix), 3),
            f"optimizer_step{suffix}_s": round(mean("optimizer_step" + suffix), 3),
        })
    result["step_spread_s"] = [round(min(SECONDS["step"][1:]), 3), round(max(SECONDS["step"][1:]), 3)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
