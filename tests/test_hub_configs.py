"""The shipped draft configs (`hub_configs/*.json`) build the published sizes (REFERENCE §1), on the meta device."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, Qwen3Config

from domino_hf import DominoConfig, DominoDraftModel
from domino_hf.modeling.configuration_domino import spread_target_layers
from domino_hf.modeling.target_domino import check_draft_fits_target

HUB_CONFIGS = Path(__file__).resolve().parent.parent / "hub_configs"

QWEN3 = dict(vocab_size=151936, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
TARGETS = {
    "qwen3-8b-domino-b16.json": Qwen3Config(hidden_size=4096, intermediate_size=12288, rope_theta=1e6, **QWEN3),
    "qwen3-4b-domino-b16.json": Qwen3Config(hidden_size=2560, intermediate_size=9728, rope_theta=1e6, **QWEN3),
    "smollm2-135m-instruct-domino.json": LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
    ),
}


def load(name) -> DominoConfig:
    return DominoConfig.from_json_file(HUB_CONFIGS / name)


def counts(config):
    """(total, head, W2) parameter counts of a draft built on the meta device."""
    with torch.device("meta"):
        model = DominoDraftModel(config)
    total = sum(p.numel() for p in model.parameters())
    head = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("prefix_gru", "embed_proj")))
    return total, head, model.embed_proj[2].weight.numel()


def test_every_config_is_listed():
    assert sorted(p.name for p in HUB_CONFIGS.glob("*.json")) == sorted(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_config_fits_its_target(name):
    config = load(name)
    raw = json.loads((HUB_CONFIGS / name).read_text())
    assert raw["model_type"] == "domino_draft" and config.model_type == "domino_draft"
    assert set(raw) - {"model_type", "architectures"} <= set(config.to_dict())  # no field silently dropped
    target_config = TARGETS[name]
    target = SimpleNamespace(
        config=target_config,
        get_output_embeddings=lambda: SimpleNamespace(
            weight=torch.empty(target_config.vocab_size, target_config.hidden_size, device="meta")
        ),
    )
    check_draft_fits_target(config, target)
    # the same choices `DominoConfig.for_target` makes for this target
    num_context = len(config.target_layer_ids)
    derived = DominoConfig.for_target(
        target_config, num_hidden_layers=config.num_hidden_layers, num_context_layers=num_context,
    )
    for field in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "rms_norm_eps", "rope_theta", "target_layer_ids", "num_target_layers", "vocab_size"):
        assert getattr(config, field) == getattr(derived, field), field
    assert config.target_layer_ids == spread_target_layers(target_config.num_hidden_layers, num_context)


def test_qwen3_8b_sizes():
    config = load("qwen3-8b-domino-b16.json")
    assert (config.num_hidden_layers, config.block_size, config.mask_token_id) == (5, 16, 151669)
    assert config.target_layer_ids == [1, 9, 17, 25, 33]
    total, head, w2 = counts(config)
    assert head == pytest.approx(56e6, rel=0.02)  # "+56M parameters on the 8B draft"
    assert head / (total - head) == pytest.approx(0.053, abs=0.002)  # "+5.3%"
    assert w2 / head == pytest.approx(0.70, abs=0.01)  # "~70% of it W2"


def test_qwen3_4b_sizes():
    total, head, _ = counts(load("qwen3-4b-domino-b16.json"))
    assert total == pytest.approx(588e6, rel=0.01)  # "588M parameters in all, head included"


def test_smollm2_sizes():
    config = load("smollm2-135m-instruct-domino.json")
    # The shipped draft's shape (see drafts/…/README.md for why: short blocks and a small GRU pay on 2 CPU cores).
    assert (config.num_hidden_layers, config.block_size, config.mask_token_id) == (2, 4, 16)
    assert (config.gru_hidden_dim, config.correction_rank, config.target_layer_ids) == (256, 256, [1, 14, 27])
    total, head, _ = counts(config)
    assert 0 < head < total
