"""Trains a tiny draft on a tiny target; run directly (1 process) or with torchrun (N processes, gloo).

Used by tests/test_training.py to check that N processes train the same model as 1 process on the same
global batch. argv: DATA OUT PER_DEVICE_BATCH STEPS
"""

import sys

import torch

from domino_hf.training.dataset import RegenDataset
from domino_hf.training.recipe import TrainSettings, build_draft, train_draft


def tiny_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.3,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def main(data, out, batch_size, steps):
    torch.set_num_threads(1)
    target = tiny_target()
    draft = build_draft(target, None, num_hidden_layers=1, block_size=4, gru_hidden_dim=16, correction_rank=8)
    dataset = RegenDataset.from_jsonl(data)
    settings = TrainSettings(output_dir=out, max_steps=steps, batch_size=batch_size, num_anchors=64,
                             learning_rate=3e-3, save_steps=10_000, logging_steps=1)
    train_draft(target, draft, dataset, settings).accelerator.end_training()  # as `domino train` ends a run


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
