"""`DominoConfig` refuses bad values on construction, on load and when set later, naming the field and the range;
`for_target` sizes the head to the target and copies the token ids that 🤗 pipelines compare."""

from __future__ import annotations

import json

import pytest
from conftest import make_tiny_target, write_published_checkpoint
from transformers import AutoConfig, AutoModel, LlamaConfig, Qwen3Config

from domino_hf import DominoConfig, DominoConfigError, DominoDraftModel
from domino_hf.modeling.configuration_domino import head_sizes_for

# field, bad value, words the error must contain (field name and the allowed range)
BAD = [
    ("block_size", 0, "block_size must be an integer >= 1, got 0"),
    ("block_size", -2, "block_size must be an integer >= 1, got -2"),
    ("block_size", 2.5, "block_size must be an integer >= 1"),
    ("target_layer_ids", [], "target_layer_ids must be a non-empty list of distinct layer ids >= 0"),
    ("target_layer_ids", [1, -1], "target_layer_ids must be a non-empty list"),
    ("target_layer_ids", [3, 3], "target_layer_ids must be a non-empty list of distinct"),
    ("target_layer_ids", [1, 36], r"target_layer_ids must be layer ids below num_target_layers \(36\)"),
    ("draft_confidence_threshold", 2.0, r"draft_confidence_threshold must be a probability in \[0, 1\]"),
    ("draft_confidence_threshold", -0.1, r"draft_confidence_threshold must be a probability in \[0, 1\]"),
    ("draft_confidence_threshold", float("nan"), r"draft_confidence_threshold must be a probability"),
    ("gru_hidden_dim", 0, "gru_hidden_dim must be an integer >= 1"),
    ("correction_rank", -1, "correction_rank must be an integer >= 1"),
    ("num_hidden_layers", 0, "num_hidden_layers must be an integer >= 1"),
    ("hidden_size", "4096", "hidden_size must be an integer >= 1"),
    ("head_dim", 7, "head_dim must be an even integer >= 2"),
    ("num_key_value_heads", 5, r"num_attention_heads must be a multiple of num_key_value_heads \(5\)"),
    ("mask_token_id", -1, "mask_token_id must be a token id >= 0"),
    ("mask_token_id", 151936, r"mask_token_id must be a token id in \[0, vocab_size\) = \[0, 151936\)"),
    ("draft_vocab_ids", [], "draft_vocab_ids must be None .* or a non-empty list"),
    ("draft_vocab_ids", [5, 5], "draft_vocab_ids must be None .* distinct"),
    ("draft_vocab_ids", [1, 200000], r"draft_vocab_ids must be token ids in \[0, vocab_size\)"),
    ("max_draft_tokens", 0, r"max_draft_tokens must be None \(no cap\) or an integer >= 1"),
    ("pure_draft_prefix_len", -1, "pure_draft_prefix_len must be an integer >= 0"),
    ("pure_draft_prefix_len", 17, r"pure_draft_prefix_len must be an integer in \[0, 16\]"),
    ("rms_norm_eps", 0, "rms_norm_eps must be a number > 0"),
    ("rope_theta", -1.0, "rope_theta must be a number > 0"),
    ("eos_token_id", -1, "eos_token_id must be None, a token id >= 0 or a list"),
]


@pytest.mark.parametrize("field, value, message", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_construction_names_the_field_and_range(field, value, message):
    with pytest.raises(DominoConfigError, match=message):
        DominoConfig(**{field: value})
    assert issubclass(DominoConfigError, ValueError)


def test_dflash_layout_needs_an_anchor_slot_and_a_draft_slot():
    assert DominoConfig(block_size=1).num_draft_tokens == 1
    with pytest.raises(DominoConfigError, match="block_size must be at least 2 with shift_label=False"):
        DominoConfig(block_size=1, shift_label=False)


@pytest.mark.parametrize("field, value, message", [b for b in BAD if b[0] in ("block_size", "target_layer_ids")][:4])
def test_load_of_a_bad_config_json_names_the_file(tmp_path, field, value, message):
    DominoConfig().save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw[field] = value
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DominoConfigError, match=f"^{tmp_path}: DominoConfig.{message}"):
        DominoConfig.from_pretrained(tmp_path)
    with pytest.raises(DominoConfigError, match=message):  # the Auto classes read the file the same way
        AutoConfig.from_pretrained(tmp_path)


def test_a_draft_folder_with_a_bad_value_does_not_load(tmp_path):
    """The user-reported case: block_size -2 used to load and fail inside generate with a negative dimension."""
    target = make_tiny_target("llama")
    DominoDraftModel.from_target(target, block_size=4, gru_hidden_dim=8, correction_rank=8).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["block_size"] = -2
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DominoConfigError, match="block_size must be an integer >= 1, got -2"):
        AutoModel.from_pretrained(tmp_path)


def test_a_config_json_without_target_layer_ids_says_the_key_is_missing(tmp_path):
    """The error names the missing key and the fix, not default ids the file never held."""
    target = make_tiny_target("llama")  # 6 layers: the default ids (for 36) do not fit
    DominoDraftModel.from_target(target, block_size=4, gru_hidden_dim=8, correction_rank=8).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["target_layer_ids"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    for load in (DominoDraftModel.from_pretrained, AutoModel.from_pretrained):
        with pytest.raises(DominoConfigError, match=r"DominoConfig\.target_layer_ids is missing: the target layers "
                           r".*num_target_layers=6\)\. Add to config\.json") as error:
            load(tmp_path)
        assert "[1, 9, 17, 25, 33]" not in str(error.value) and "\n" not in str(error.value)


def test_setting_a_bad_value_later_raises_and_keeps_the_old_one():
    """Drafting keys on a config (the layout of checkpoints saved before they moved to generation_config.json)
    are still checked when set, as the architecture fields are."""
    config = DominoConfig()
    assert "draft_confidence_threshold" not in vars(config)  # the architecture only, unless given
    config.draft_confidence_threshold = 0.3
    config.max_draft_tokens = 2
    with pytest.raises(DominoConfigError, match=r"draft_confidence_threshold must be a probability in \[0, 1\]"):
        config.draft_confidence_threshold = 2.0
    with pytest.raises(DominoConfigError, match="block_size must be an integer >= 1"):
        config.block_size = 0
    assert (config.draft_confidence_threshold, config.block_size, config.max_draft_tokens) == (0.3, 16, 2)


def test_published_dialect_still_loads(tmp_path):
    target = make_tiny_target("qwen3")
    draft = DominoDraftModel.from_target(target, block_size=4, gru_hidden_dim=16, correction_rank=8)
    write_published_checkpoint(tmp_path, draft)
    config = DominoConfig.from_pretrained(tmp_path)
    assert (config.gru_hidden_dim, config.correction_rank, config.block_size) == (16, 8, 4)
    assert config.use_domino_head and config.target_layer_ids == draft.config.target_layer_ids


@pytest.mark.parametrize(
    "hidden, gru, rank",
    [(4096, 1024, 256), (2560, 1024, 256), (2048, 1024, 256), (576, 256, 256), (256, 128, 128), (64, 32, 32),
     (3, 1, 1)],
)
def test_head_sizes_rule(hidden, gru, rank):
    assert head_sizes_for(hidden) == {"gru_hidden_dim": gru, "correction_rank": rank}


def test_for_target_sizes_the_head_and_copies_token_ids():
    qwen3_8b = Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=128, vocab_size=151936, eos_token_id=151645)
    config = DominoConfig.for_target(qwen3_8b)
    assert (config.gru_hidden_dim, config.correction_rank) == (1024, 256)  # the published Qwen3 sizes
    assert config.eos_token_id == 151645 and config.bos_token_id == qwen3_8b.bos_token_id
    tiny = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                       vocab_size=100, bos_token_id=1, eos_token_id=[2, 3], pad_token_id=0)
    config = DominoConfig.for_target(tiny)
    assert (config.gru_hidden_dim, config.correction_rank) == (32, 32)  # not 1024 / 256 for a 64-wide target
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, [2, 3], 0)
    assert DominoConfig.for_target(tiny, gru_hidden_dim=48).gru_hidden_dim == 48  # overrides still win


def test_train_sizes_a_derived_draft_by_the_same_rule(tiny_llama):
    from domino_hf.training.recipe import build_draft

    target, tokenizer = tiny_llama  # 32 wide
    draft = build_draft(target, tokenizer)
    assert (draft.config.gru_hidden_dim, draft.config.correction_rank) == (16, 16)
    assert draft.config.eos_token_id == target.config.eos_token_id == tokenizer.eos_token_id


def test_saved_config_holds_configuration_only(tmp_path):
    """The validation switch set after construction is not written to config.json (it leaked into the shipped
    draft's config once)."""
    config = DominoConfig()
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not [key for key in saved if key.startswith("_checked")]
    with pytest.raises(DominoConfigError):  # still validated after a round trip
        DominoConfig.from_pretrained(tmp_path).block_size = 0
