"""`domino export --format sglang|vllm`, checked with SGLang's own code from its released wheel (`engine_wheels.py`):
its config parser, its weight-name mapping and its Domino runtime validator accept the exports of tiny drafts (with
a head, head-less), its greedy Domino rollout proposes what the product proposes, and what it cannot serve is
refused before anything is written. The exports reload in the product unchanged."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import make_tiny_draft, make_tiny_target, write_published_checkpoint
from engine_wheels import SGLANG_VERSION, definitions, module, wheel
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, GenerationConfig, LogitsProcessorList

from domino_hf import DominoDraftModel
from domino_hf.modeling.configuration_domino import DraftingSettings
from domino_hf.modeling.generation_domino import DominoCandidateGenerator
from domino_hf.modeling.target_domino import draft_slots
from domino_hf.training.export import export_draft

SGL = "sglang/srt/"


@pytest.fixture(scope="module")
def sglang():
    """SGLang's parser, weight loader and Domino runtime (validator, greedy rollout), from the pinned wheel."""
    path = wheel("sglang", SGLANG_VERSION)
    utils = definitions(path, SGL + "speculative/dflash_utils.py", [
        "DEFAULT_DFLASH_MASK_TOKEN", "_cfg_get", "_get_text_config", "_get_dflash_config", "_parse_optional_int",
        "is_nemotron_35_draft_config", "build_target_layer_ids", "DFlashDraftConfig", "parse_dflash_draft_config",
        "get_dflash_layer_types", "get_dflash_attention_sliding_window_size"])
    loader = definitions(path, SGL + "model_loader/weight_utils.py", ["default_weight_loader"])
    model = definitions(path, SGL + "models/dflash.py", [], ["DFlashDraftModel.load_weights"],
                        extra={"default_weight_loader": loader.default_weight_loader})
    domino = module(path, SGL + "speculative/domino_utils.py")
    return utils, model.load_weights, domino


def norm(size: int) -> nn.Module:
    """An RMSNorm's parameter: `weight` (size,)."""
    holder = nn.Module()
    holder.weight = nn.Parameter(torch.empty(size))
    return holder


class SGLangDraft(nn.Module):
    """A stand-in `self` for SGLang's `DFlashDraftModel.load_weights` at TP=1: the parameters its `__init__` makes,
    by its names and shapes (models/dflash.py), in `dtype` and filled with NaN. The q/k/v and gate/up
    projections are fused as in its QKVParallelLinear / MergedColumnParallelLinear, whose TP=1 loader places each
    shard in its rows (`weight_loader(param, tensor, shard_id)`, stood in for here); every other parameter loads
    through SGLang's own `default_weight_loader`. The GRU and projector are built as its `__init__` builds them."""

    def __init__(self, config, parsed, dtype):
        super().__init__()
        hidden, heads, kv, head_dim = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, \
            config.head_dim
        self.config, self.projector_type, self.is_nemotron_35_draft = config, parsed.projector_type, False
        self.num_context_features = len(parsed.target_layer_ids)
        self.fc = nn.Linear(self.num_context_features * hidden, hidden, bias=False)
        self.hidden_norm, self.norm = norm(hidden), norm(hidden)
        self.layers = nn.ModuleList()
        for _ in range(config.num_hidden_layers):
            layer = nn.Module()
            layer.input_layernorm, layer.post_attention_layernorm = norm(hidden), norm(hidden)
            layer.self_attn = nn.Module()
            layer.self_attn.qkv_proj = self.fused({"q": heads * head_dim, "k": kv * head_dim, "v": kv * head_dim},
                                                  hidden)
            layer.self_attn.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
            layer.self_attn.q_norm, layer.self_attn.k_norm = norm(head_dim), norm(head_dim)
            layer.mlp = nn.Module()
            layer.mlp.gate_up_proj = self.fused({0: config.intermediate_size, 1: config.intermediate_size}, hidden)
            layer.mlp.down_proj = nn.Linear(config.intermediate_size, hidden, bias=False)
            self.layers.append(layer)
        if parsed.is_domino:
            self.prefix_gru = nn.GRU(input_size=hidden, hidden_size=parsed.gru_hidden_dim, num_layers=1,
                                     batch_first=True, bias=False)
            self.embed_proj = nn.Sequential(nn.Linear(hidden + parsed.gru_hidden_dim, parsed.emb_dim, bias=False),
                                            nn.SiLU(), nn.Linear(parsed.emb_dim, config.vocab_size, bias=False))
        self.to(dtype)
        for param in self.parameters():
            param.data.fill_(float("nan"))

    @staticmethod
    def fused(shards: dict, hidden: int) -> nn.Module:
        holder = nn.Module()
        holder.weight = nn.Parameter(torch.empty(sum(shards.values()), hidden))
        offsets, start = {}, 0
        for shard, rows in shards.items():
            offsets[shard], start = (start, rows), start + rows

        def weight_loader(param, loaded, shard_id):
            start, rows = offsets[shard_id]
            assert loaded.shape == (rows, hidden), (shard_id, loaded.shape)
            param.data[start : start + rows].copy_(loaded)

        holder.weight.weight_loader = weight_loader
        return holder


def load_in_sglang(sglang, folder, target=None):
    """Run SGLang's steps on an exported folder: `AutoConfig` (no remote code) and its parser, its loader on every
    tensor of model.safetensors, and (with a head and `target`) its Domino runtime validator. Returns the parsed
    config and the loaded stand-in model."""
    utils, load_weights, domino = sglang
    config = AutoConfig.from_pretrained(folder)  # what SGLang's ModelConfig reads, without --trust-remote-code
    assert config.architectures == ["DFlashDraftModel"] and config.hidden_act == "silu"
    parsed = utils.parse_dflash_draft_config(draft_hf_config=config)
    assert utils.get_dflash_attention_sliding_window_size(config) is None  # full attention in every layer
    tensors = load_file(folder / "model.safetensors")
    dtype = config.dtype or next(iter(tensors.values())).dtype  # SGLang's --dtype auto: the config's
    model = SGLangDraft(config, parsed, dtype)
    load_weights(model, tensors.items())
    for name, param in model.named_parameters():
        assert not param.isnan().any(), f"SGLang's loader left {name} unset"
    fused = 3 + 2  # q/k/v and gate/up: five tensors into two parameters per layer
    assert len(tensors) == len(list(model.parameters())) + (fused - 2) * config.num_hidden_layers, sorted(tensors)
    if parsed.is_domino and target is not None:
        validate(domino, model, target, config)
    return parsed, model


def validate(domino, model, target, config):
    """SGLang's `validate_domino_runtime` as its DFLASH worker calls it at TP=1, with the target's embedding and
    LM head in bf16. The device argument says CUDA, where SGLang runs it; the check reads shapes and dtypes only."""
    embedding = copy.deepcopy(target.get_input_embeddings()).to(torch.bfloat16)
    head = copy.deepcopy(target.get_output_embeddings()).to(torch.bfloat16)
    domino.validate_domino_runtime(
        device=torch.device("cuda"), tp_size=1, tp_rank=0, target_vocab_size=target.config.vocab_size,
        draft_vocab_size=config.vocab_size, hidden_size=config.hidden_size, target_embedding=embedding,
        lm_head=head, prefix_gru=model.prefix_gru, embed_proj=model.embed_proj,
    )


def exported(tmp_path, draft, fmt="sglang", **options):
    draft.save_pretrained(tmp_path / "draft")
    return export_draft(tmp_path / "draft", tmp_path / fmt, format=fmt, **options)


ROUND_TRIP = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "target_layer_ids", "num_target_layers",
              "target_hidden_size", "block_size", "mask_token_id", "shift_label", "use_domino_head", "gru_hidden_dim",
              "correction_rank", "pure_draft_prefix_len", "draft_vocab_ids", "target_model_type")


def assert_reloads_unchanged(folder, draft, fields=ROUND_TRIP):
    loaded, info = DominoDraftModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    head_sizes = ("gru_hidden_dim", "correction_rank", "pure_draft_prefix_len")
    for field in fields:
        if field in head_sizes and not draft.config.use_domino_head:
            continue  # a head-less draft has none: the sizes are the class defaults
        assert getattr(loaded.config, field) == getattr(draft.config, field), field
    assert loaded.dtype == torch.bfloat16
    for name, tensor in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.to(torch.bfloat16)), name
    return loaded


@pytest.mark.parametrize("shift_label", [True, False])
def test_sglang_export_with_a_head_passes_sglangs_parser_loader_and_validator(sglang, tmp_path, shift_label):
    target = make_tiny_target("qwen3")
    draft = make_tiny_draft(target, target_layer_ids=[1, 3, 4], shift_label=shift_label)
    out = exported(tmp_path, draft)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    raw = json.loads((out / "config.json").read_text())
    assert "auto_map" not in raw and raw["model_type"] == "qwen3" and raw["dtype"] == "bfloat16"
    assert raw["emb_dim"] == raw["dflash_config"]["emb_dim"] == draft.config.correction_rank
    parsed, model = load_in_sglang(sglang, out, target)
    assert parsed.is_domino and parsed.shift_label is shift_label and parsed.pure_draft_prefix_len == 1
    assert (parsed.block_size, parsed.target_layer_ids, parsed.mask_token_id) == (4, [1, 3, 4], 15)
    state = draft.state_dict()
    qkv = torch.cat([state[f"layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]).to(torch.bfloat16)
    assert torch.equal(model.layers[0].self_attn.qkv_proj.weight.data, qkv)  # the fused rows in SGLang's order
    assert torch.equal(model.embed_proj[2].weight.data, state["embed_proj.2.weight"].to(torch.bfloat16))
    assert "--speculative-algorithm DFLASH" in (out / "README.md").read_text()
    assert_reloads_unchanged(out, draft)


@pytest.mark.parametrize("shift_label", [True, False])
def test_sglangs_greedy_domino_rollout_proposes_what_the_product_proposes(sglang, tmp_path, shift_label):
    """SGLang's `domino_greedy_rollout` (CPU, full-vocabulary correction: candidate pool 0) on the exported weights
    against the product's greedy rollout on the same weights, slot hidden states and anchor."""
    domino = sglang[2]
    target = make_tiny_target("qwen3")
    draft = make_tiny_draft(target, target_layer_ids=[1, 3, 4], shift_label=shift_label)
    out = exported(tmp_path, draft)
    _, model = load_in_sglang(sglang, out, target)
    model.float()
    product = DominoDraftModel.from_pretrained(out, dtype=torch.float32).eval()
    block = draft.config.block_size
    for seed in range(8):
        torch.manual_seed(seed)
        prompt = torch.randint(0, 16, (1, 5))
        block_hidden = torch.randn(1, block, draft.config.hidden_size)
        with torch.no_grad():
            theirs = domino.domino_greedy_rollout(
                draft_hidden=block_hidden, bonus_tokens=prompt[:, -1], target_embedding=target.get_input_embeddings(),
                lm_head_weight=target.get_output_embeddings().weight, prefix_gru=model.prefix_gru,
                embed_proj=model.embed_proj, vocab_size=16, shift_label=shift_label, candidate_pool_size=0,
                in_cuda_graph=False,
            )
            generator = DominoCandidateGenerator(product, target, GenerationConfig(do_sample=False, max_length=64),
                                                 LogitsProcessorList(), prompt, DraftingSettings())
            slots = draft_slots(block_hidden[0], product.config)
            ours = generator._rollout(slots, generator.head.logits(slots), prompt, greedy=True).ids
        # SGLang proposes block_size - 1 tokens; with shift_label the product drafts one more, the last slot
        assert theirs.shape == (1, block - 1)
        assert theirs[0].tolist() == ours[0, : block - 1].tolist(), seed


def test_headless_exports_pass_sglangs_parser_and_loader(sglang, tmp_path):
    target = make_tiny_target("qwen3")
    draft = make_tiny_draft(target, use_domino_head=False, shift_label=False)
    for fmt in ("sglang", "vllm"):
        out = exported(tmp_path / fmt, draft, fmt=fmt)
        raw = json.loads((out / "config.json").read_text())
        assert "projector_type" not in raw["dflash_config"] and "emb_dim" not in raw
        assert not any(name.startswith(("prefix_gru", "embed_proj")) for name in load_file(out / "model.safetensors"))
        parsed, _ = load_in_sglang(sglang, out)
        assert not parsed.is_domino
        assert_reloads_unchanged(out, draft)
    assert "method" in (out / "README.md").read_text() and "dflash" in (out / "README.md").read_text()


def test_official_layout_fixture_loads_in_sglangs_parser_and_the_product(sglang, tmp_path):
    target = make_tiny_target("qwen3")
    draft = make_tiny_draft(target, target_layer_ids=[1, 3, 4])
    write_published_checkpoint(tmp_path, draft)
    parsed, _ = load_in_sglang(sglang, tmp_path, target)
    assert parsed.is_domino and parsed.emb_dim == draft.config.correction_rank
    assert_reloads_unchanged(tmp_path, draft, [f for f in ROUND_TRIP if f != "target_model_type"])  # not recorded


def test_the_hub_folder_with_head_is_what_sglang_refused(sglang, tmp_path):
    """SGLang's loader refuses head weights under a config without a Domino projector (what a Hub folder's config
    with the official keys bolted on looked like to it): the engine form is needed."""
    target = make_tiny_target("qwen3")
    out = exported(tmp_path, make_tiny_draft(target))
    raw = json.loads((out / "config.json").read_text())
    del raw["dflash_config"]["projector_type"]
    (out / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="contains Domino projector weights but projector_type=None"):
        load_in_sglang(sglang, out)


# ------------------------------------------------------------------------------------------------ refused kinds
REFUSED = {
    "sub-vocabulary": (dict(draft_vocab_ids=list(range(0, 16, 2))), {}, "sub-vocabulary of 8 tokens"),
    "pure_draft_prefix_len": (dict(pure_draft_prefix_len=2), {}, "pure_draft_prefix_len=2"),
    "head-less shift_label": (dict(use_domino_head=False, shift_label=True), {}, "one slot off"),
    "float16": ({}, dict(dtype="float16"), "bf16 weights only"),
}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_sglang_export_refuses_what_sglang_cannot_serve(sglang, tmp_path, kind):
    """Refused by name with the fix, in one line, before anything is written; where SGLang's own code would stop
    the same config (or its validator the same weights), it does."""
    overrides, options, message = REFUSED[kind]
    target = make_tiny_target("qwen3")
    draft = make_tiny_draft(target, **overrides)
    with pytest.raises(ValueError, match=message) as caught:
        exported(tmp_path, draft, **options)
    assert "\n" not in str(caught.value) and not (tmp_path / "sglang").exists()
    utils, _, domino = sglang
    from domino_hf.training.engine_export import engine_config

    config = engine_config(draft.config, draft.has_domino_head)
    if kind == "pure_draft_prefix_len":
        with pytest.raises(ValueError, match="requires pure_draft_prefix_len=1"):
            utils.parse_dflash_draft_config(draft_hf_config=config)
    if kind in ("sub-vocabulary", "float16"):  # SGLang's runtime validator stops these weights
        (tmp_path / "forced").mkdir()
        (tmp_path / "forced" / "config.json").write_text(json.dumps(config))
        dtype = torch.float16 if kind == "float16" else torch.bfloat16
        parsed = utils.parse_dflash_draft_config(draft_hf_config=config)
        model = SGLangDraft(AutoConfig.from_pretrained(tmp_path / "forced"), parsed, dtype)
        if kind == "sub-vocabulary":
            model.embed_proj[2] = nn.Linear(parsed.emb_dim, 8, bias=False).to(dtype)
        with pytest.raises(ValueError, match="BF16|projector output vocab size"):
            validate(domino, model, target, AutoConfig.from_pretrained(tmp_path / "forced"))


def test_vllm_export_refuses_a_domino_head_in_one_line(tmp_path):
    target = make_tiny_target("qwen3")
    with pytest.raises(ValueError, match=r"vLLM has no Domino head .*--format sglang.*head-less") as caught:
        exported(tmp_path, make_tiny_draft(target), fmt="vllm")
    assert "\n" not in str(caught.value) and not (tmp_path / "vllm").exists()


def test_cli_format_and_published_dialect_alias(tmp_path, capsys):
    from domino_hf.cli import build_parser

    parser = build_parser("export")
    assert parser.parse_args(["export", "run", "--out", "x", "--format", "sglang"]).format == "sglang"
    assert parser.parse_args(["export", "run", "--out", "x", "--published_dialect"]).format == "sglang"
    assert parser.parse_args(["export", "run", "--out", "x"]).format == "hub"
