"""`domino export --format sglang|vllm`: a draft folder that a serving engine loads as it is.

Both engines read the config form of the official Domino / z-lab DFlash checkpoints: `architectures:
["DFlashDraftModel"]`, `model_type: "qwen3"` (the draft's layers are Qwen3 layers, whatever the target: the form
`AutoConfig` parses without `--trust-remote-code`), no `auto_map`, a nested `dflash_config`, `hidden_act`, and
plain weight names (ours already are those). SGLang serves the Domino head (`projector_type: "domino"`, bf16
weights, the full vocabulary, `pure_draft_prefix_len` 1); vLLM's `dflash` method serves head-less drafts only.
Both take slot 0 of a head-less draft as the anchor (`shift_label` false). What an engine cannot serve as the
draft was trained is refused before anything is written, in one line naming the fix (`servable_problem`).

The folder reloads in domino-hf unchanged: `DominoDraftModel.from_pretrained(folder)` reads the same form.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ..utils import looks_like_local_path

logger = logging.getLogger(__name__)

ENGINE_FORMATS = ("sglang", "vllm")
ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}
# The keys of our own config that the engine form keeps: provenance, and the target's special ids.
_KEPT = ("target_hidden_size", "target_model_type", "target_name_or_path", "bos_token_id", "eos_token_id",
         "pad_token_id")


def servable_problem(config, has_head: bool, engine: str, dtype: torch.dtype) -> str | None:
    """Why `engine` cannot serve the draft (`config`, with or without its Domino head) as it was trained, in one
    line with the fix; None when it can."""
    name = ENGINE_NAMES[engine]
    if has_head and engine == "vllm":
        return ("vLLM has no Domino head (its dflash method drafts with the base logits only, and refuses the "
                "head's weights): export with --format sglang, or train a head-less draft (--no_head, with "
                "shift_label false in --config).")
    if config.draft_vocab_ids is not None:
        return (f"{name} drafts over the target's full vocabulary and this draft has a sub-vocabulary of "
                f"{len(config.draft_vocab_ids)} tokens: export a draft trained without --draft_vocab_size.")
    if config.target_hidden_size != config.hidden_size:
        return (f"{name} projects the target's hidden states to the draft's width with its hidden_size, and this "
                f"draft reads target_hidden_size={config.target_hidden_size} != hidden_size={config.hidden_size}.")
    if not has_head and config.shift_label:
        return (f"{name} takes slot 0 of a head-less (DFlash) draft as the anchor, and this draft was trained with "
                "shift_label true (slot 0 drafts), so every proposal would be one slot off: train it with "
                "\"shift_label\": false in --config, or keep the Domino head and serve it with SGLang.")
    if has_head and config.pure_draft_prefix_len != 1:
        return (f"SGLang's Domino path corrects every drafted token after the first (pure_draft_prefix_len 1), "
                f"and this draft was trained with pure_draft_prefix_len={config.pure_draft_prefix_len}: retrain it "
                "with 1, or serve it with domino-hf.")
    if has_head and config.block_size < 2:
        return "SGLang's Domino path needs block_size > 1 (the anchor and at least one draft slot)."
    if has_head and dtype != torch.bfloat16:
        return f"SGLang's Domino path takes bf16 weights only, not {str(dtype).removeprefix('torch.')}: drop --dtype."
    return None


def engine_config(config, has_head: bool) -> dict:
    """The config.json of the engine form (see the module docstring) for `config`."""
    dflash = {"mask_token_id": config.mask_token_id, "target_layer_ids": list(config.target_layer_ids)}
    head = {}
    if has_head:
        dflash.update(projector_type="domino", pure_draft_prefix_len=config.pure_draft_prefix_len,
                      emb_dim=config.correction_rank, gru_hidden_dim=config.gru_hidden_dim,
                      shift_label=config.shift_label)
        head["emb_dim"] = config.correction_rank  # the top-level copy SGLang compares with the nested one
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "dtype": "bfloat16",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "hidden_act": "silu",
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "attention_bias": config.attention_bias,
        "attention_dropout": 0.0,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": config.max_position_embeddings,
        "layer_types": ["full_attention"] * config.num_hidden_layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "block_size": config.block_size,
        "num_target_layers": config.num_target_layers,
        **head,
        "dflash_config": dflash,
        **{key: getattr(config, key) for key in _KEPT},
    }


def write_engine_folder(draft, out: Path, engine: str, dtype: torch.dtype, target: str | None = None) -> None:
    """Write `draft` to `out` in `engine`'s form: config.json, model.safetensors (`dtype`) and a README.md with
    the serving command (for `target`, a Hub id; default: the recorded target when it is one). Refuses
    (ValueError, before writing anything) what `engine` cannot serve."""
    from safetensors.torch import save_file

    has_head = draft.has_domino_head
    problem = servable_problem(draft.config, has_head, engine, dtype)
    if problem:
        raise ValueError(problem)
    head_names = ("prefix_gru.", "embed_proj.")
    weights = {name: tensor.detach().to(dtype).contiguous() for name, tensor in draft.state_dict().items()
               if has_head or not name.startswith(head_names)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = engine_config(draft.config, has_head)
    config["dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "README.md").write_text(engine_card(draft.config, has_head, engine, out.name, target), encoding="utf-8")
    logger.info("Wrote the %s form (%d tensors, %s) to %s", ENGINE_NAMES[engine], len(weights), dtype, out)


def engine_card(config, has_head: bool, engine: str, folder: str, target: str | None = None) -> str:
    """README.md of an engine folder: what it is and the command that serves it (docs/serving.md has more)."""
    name = target or config.target_name_or_path
    # a Hub id as recorded; a local path means nothing on the serving machine (and names the training one's files)
    target = name if name and name.count("/") == 1 and not looks_like_local_path(name) else "TARGET"
    drafts = config.block_size - 1
    if engine == "sglang":
        head = ("--speculative-domino-candidate-pool-size 0 " if has_head else "")
        command = (f"python -m sglang.launch_server --model-path {target} --dtype bfloat16 \\\n"
                   f"    --speculative-algorithm DFLASH --speculative-draft-model-path {folder} \\\n"
                   f"    --speculative-num-draft-tokens {config.block_size} {head}")
    else:
        spec = {"method": "dflash", "model": folder, "num_speculative_tokens": drafts}
        command = f"vllm serve {target} --dtype bfloat16 --speculative-config '{json.dumps(spec)}'"
    kind = "Domino draft (DFlash backbone + Domino head)" if has_head else "head-less DFlash draft"
    return (f"---\ntags:\n- speculative-decoding\n- draft-model\n- domino-hf\n---\n\n"
            f"# {kind} for {target}, exported for {ENGINE_NAMES[engine]}\n\n"
            f"Written by `domino export --format {engine}`. Serve it next to its target:\n\n"
            f"```bash\n{command.rstrip()}\n```\n\n"
            "It drafts "
            f"{drafts} tokens per step there. The same folder loads in domino-hf: "
            "`DominoDraftModel.from_pretrained(folder)`. What holds on the engine and what does not: domino-hf's "
            "docs/serving.md.\n")
