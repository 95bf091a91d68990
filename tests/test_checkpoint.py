"""Checkpoints: our Hub format (remote code, loadable where domino_hf is not installed) and the published
Domino / z-lab DFlash dialect, each loading without missing or unexpected weights and generating losslessly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    assert_drafted,
    domino_drafted,
    greedy_both,
    isolated_python_prelude,
    make_tiny_draft,
    make_tiny_target,
    tiny_prompts,
    write_published_checkpoint,
)
from safetensors.torch import load_file

import domino_hf
from domino_hf import DominoDraftModel

from domino_hf.modeling import REMOTE_CODE_FILES as REMOTE_CODE

pytestmark = pytest.mark.usefixtures("single_thread")

MODELING_DIR = Path(domino_hf.modeling.__file__).parent

# Runs in a fresh interpreter (`python -I`, cwd outside the repo) where importing domino_hf fails.
CHILD = r"""
import importlib.abc, json, sys

class BlockDominoHf(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "domino_hf" or name.startswith("domino_hf."):
            raise ModuleNotFoundError(f"{name} is blocked in this test")

sys.meta_path.insert(0, BlockDominoHf())
import torch
from transformers import AutoModel, AutoModelForCausalLM

torch.set_num_threads(1)
draft_dir, target_dir, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
draft = AutoModel.from_pretrained(draft_dir, trust_remote_code=True).eval()
ids = torch.tensor([prompt])
reference = target.generate(ids, do_sample=False, max_new_tokens=20)
output = target.generate(ids, do_sample=False, max_new_tokens=20, assistant_model=draft)
stats = draft.last_generation_stats
batch = torch.tensor([prompt, [0, 0] + prompt[2:]])  # two rows, the second left-padded
mask = torch.ones_like(batch)
mask[1, :2] = 0
batch_reference = target.generate(input_ids=batch, attention_mask=mask, do_sample=False, max_new_tokens=12)
batch_output = target.generate(input_ids=batch, attention_mask=mask, do_sample=False, max_new_tokens=12,
                               assistant_model=draft)
try:
    import domino_hf  # noqa: F401
    blocked = False
except ImportError:
    blocked = True
print("RESULT " + json.dumps(dict(
    reference=reference[0].tolist(), output=output[0].tolist(), module=type(draft).__module__,
    batch_reference=batch_reference.tolist(), batch_output=batch_output.tolist(),
    batch_rows=len(draft.last_generation_stats.per_row),
    drafted=sum(stats.drafted), accepted=sum(stats.accepted), blocked=blocked,
    transformers=__import__("transformers").__version__,
    imported=sorted(m for m in sys.modules if m.startswith("domino_hf")),
)))
"""


def test_save_pretrained_writes_a_hub_ready_folder(tmp_path):
    target = make_tiny_target("qwen3")
    draft = make_tiny_draft(target)
    draft.save_pretrained(tmp_path)
    assert {"config.json", "generation_config.json", "model.safetensors", *REMOTE_CODE} <= set(os.listdir(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "domino_draft" and config["architectures"] == ["DominoDraftModel"]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_domino.DominoConfig",
        "AutoModel": "modeling_domino.DominoDraftModel",
    }
    for name in REMOTE_CODE:  # the very files the library runs
        assert (tmp_path / name).read_bytes() == (MODELING_DIR / name).read_bytes()
    saved = load_file(tmp_path / "model.safetensors")
    assert not any("embed_tokens" in k or "lm_head" in k for k in saved)  # the draft owns neither

    loaded, info = DominoDraftModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    for name, tensor in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert_drafted(greedy_both(target, loaded.eval(), tiny_prompts(1)[0], max_new_tokens=20)[1])


@pytest.mark.integration  # a second interpreter that cannot import domino_hf loads the checkpoint
def test_remote_code_checkpoint_works_without_domino_hf(tmp_path, fitted_pair):
    """`AutoModel.from_pretrained(folder, trust_remote_code=True)` in a Python that cannot import domino_hf."""
    target, draft, prompts = fitted_pair("qwen3")
    draft.save_pretrained(tmp_path / "draft")
    target.save_pretrained(tmp_path / "target")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    prompt = prompts[0][0].tolist()
    run = subprocess.run(
        [sys.executable, "-I", "-c", isolated_python_prelude() + CHILD, str(tmp_path / "draft"),
         str(tmp_path / "target"), json.dumps(prompt)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["blocked"] and not result["imported"]
    assert result["module"].startswith("transformers_modules.")
    assert result["output"] == result["reference"]
    assert result["batch_output"] == result["batch_reference"] and result["batch_rows"] == 2  # the batched loop
    assert result["reference"] == target.generate(prompts[0], do_sample=False, max_new_tokens=20)[0].tolist()
    assert result["drafted"] > 0 and result["accepted"] > 0
    import transformers

    assert result["transformers"] == transformers.__version__  # the release under test, not another one


def test_remote_code_draft_next_to_domino_hf(tmp_path):
    """The remote-code copy loaded in a process that also imported domino_hf: both install the dispatch (the
    first wins) and either serves the other's drafts."""
    from transformers import AutoModel

    target = make_tiny_target("llama")
    make_tiny_draft(target).save_pretrained(tmp_path)
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    # With domino_hf imported, `AutoModel` resolves `domino_draft` to the registered (identical) class; load the
    # checkpoint's own remote-code class explicitly, as a process without domino_hf would.
    assert type(AutoModel.from_pretrained(tmp_path, trust_remote_code=True)) is DominoDraftModel
    remote_class = get_class_from_dynamic_module("modeling_domino.DominoDraftModel", str(tmp_path))
    draft = remote_class.from_pretrained(tmp_path).eval()
    assert type(draft) is not DominoDraftModel and type(draft).__module__.startswith("transformers_modules.")
    assert_drafted(greedy_both(target, draft, tiny_prompts(1)[0], max_new_tokens=20)[1])
    # Whichever copy installed the dispatch, each draft drafts with the dispatch and generator shipped beside its
    # class (the stats of the call come from that generator's module).
    from domino_hf.modeling.dispatch_domino import _draft_dispatch

    remote_package = type(draft).__module__.rpartition(".")[0]
    assert _draft_dispatch(draft).__name__ == f"{remote_package}.dispatch_domino"
    assert type(draft.last_generation_stats).__module__ == f"{remote_package}.generation_domino"
    local = make_tiny_draft(target)
    assert _draft_dispatch(local).__name__ == "domino_hf.modeling.dispatch_domino"
    assert_drafted(greedy_both(target, local, tiny_prompts(1)[0], max_new_tokens=20)[1])
    assert type(local.last_generation_stats).__module__ == "domino_hf.modeling.generation_domino"


def test_remote_code_older_than_the_running_transformers_says_to_re_export(tmp_path):
    """A checkpoint whose remote code was written for releases before the running one (its dispatch's
    `MAX_TRANSFORMERS`) is never run with a generator written for other internals. This release's remote code
    refuses at load, naming its range; remote code from before that load-time check (emulated by removing it) is
    refused by the dispatch at generate, naming how to load or re-export the draft. domino_hf's own class still
    drafts with the same weights."""
    import transformers
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    from domino_hf.modeling.dispatch_domino import MAX_TRANSFORMERS, UnsupportedTransformersError, _release

    target = make_tiny_target("llama")
    running = _release(transformers.__version__)
    for name, load_check in (("old", True), ("older", False)):
        folder = tmp_path / name
        make_tiny_draft(target).save_pretrained(folder)
        dispatch = (folder / "dispatch_domino.py").read_text()
        assert f"MAX_TRANSFORMERS = {MAX_TRANSFORMERS}" in dispatch
        (folder / "dispatch_domino.py").write_text(dispatch.replace(f"MAX_TRANSFORMERS = {MAX_TRANSFORMERS}",
                                                                    f"MAX_TRANSFORMERS = {running}"))
        if not load_check:
            modeling = (folder / "modeling_domino.py").read_text()
            check = "        check_transformers_version(transformers.__version__)"
            assert check in modeling
            (folder / "modeling_domino.py").write_text(modeling.replace(check, "        pass"))
        remote_class = get_class_from_dynamic_module("modeling_domino.DominoDraftModel", str(folder))
        if load_check:
            with pytest.raises(UnsupportedTransformersError.__base__, match=r"support transformers>=5\.23,<"):
                remote_class.from_pretrained(folder)
            continue
        old = remote_class.from_pretrained(folder).eval()
        with pytest.raises(ValueError, match=r"remote code .* predates the installed .*domino export PATH --out"):
            target.generate(tiny_prompts(1)[0], assistant_model=old, max_new_tokens=8)
        assert_drafted(greedy_both(target, DominoDraftModel.from_pretrained(folder).eval(), tiny_prompts(1)[0],
                                   max_new_tokens=20)[1])


@pytest.mark.parametrize("projector_type", ["domino", "causal_v5"])
def test_published_domino_dialect(tmp_path, projector_type):
    target = make_tiny_target("qwen3")
    draft = make_tiny_draft(target, target_layer_ids=[1, 3, 4])
    write_published_checkpoint(tmp_path, draft, projector_type=projector_type)
    names = set(load_file(tmp_path / "model.safetensors"))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= names
    assert {"prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight", "embed_proj.2.weight"} <= names

    loaded, info = DominoDraftModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    config = loaded.config
    assert config.model_type == "domino_draft" and config.use_domino_head and config.shift_label
    assert config.target_layer_ids == [1, 3, 4] and config.mask_token_id == draft.config.mask_token_id
    assert (config.gru_hidden_dim, config.correction_rank, config.block_size) == (32, 16, 4)
    assert loaded.dtype == torch.bfloat16  # the checkpoint's torch_dtype: a bf16 draft drafting for an fp32 target
    for name, tensor in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.to(torch.bfloat16)), name
    for ids in tiny_prompts(2):
        _, stats = greedy_both(target, loaded.eval(), ids, max_new_tokens=20)
        assert_drafted(stats)
        assert max(domino_drafted(stats)) == 4  # shift_label: every slot drafts


def test_published_dflash_dialect(tmp_path):
    """z-lab DFlash checkpoints: no head weights, slot 0 is the anchor (shift_label false)."""
    target = make_tiny_target("qwen3")
    draft = make_tiny_draft(target, use_domino_head=False, shift_label=False)
    write_published_checkpoint(tmp_path, draft, projector_type=None, dtype="float32")
    assert not any(k.startswith(("prefix_gru", "embed_proj")) for k in load_file(tmp_path / "model.safetensors"))

    loaded, info = DominoDraftModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not loaded.config.use_domino_head and not loaded.config.shift_label and not loaded.has_domino_head
    assert loaded.config.num_draft_tokens == 3
    for ids in tiny_prompts(2):
        _, stats = greedy_both(target, loaded.eval(), ids, max_new_tokens=20)
        assert_drafted(stats)
        assert max(domino_drafted(stats)) == 3


def test_shipped_draft_carries_the_current_remote_code():
    """The shipped draft's remote-code files are byte-identical to `modeling/` (they never drift)."""
    from domino_hf.utils import project_root

    shipped = project_root() / "drafts" / "smollm2-135m-instruct-domino"
    for name in REMOTE_CODE:
        assert (shipped / name).read_bytes() == (project_root() / "modeling" / name).read_bytes(), name


# A published config key that would make the draft compute otherwise than this class does is refused by name, one
# line each (SGLang and vLLM compute these; domino-hf's draft class does not).
UNCOMPUTED_KEYS = {
    "sliding layers": ({"layer_types": ["sliding_attention"], "sliding_window": 8}, r"full attention"),
    "qwen3 sliding switch": ({"use_sliding_window": True, "sliding_window": 8}, r"use_sliding_window .*full attention"),
    "yarn": ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
             r"rope scaling 'yarn'.*default RoPE only"),
    "rope_parameters yarn": ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}},
                             r"rope scaling 'yarn'"),
    "activation": ({"hidden_act": "gelu"}, r"hidden_act 'gelu'.*SiLU only"),
    "projector": ({"dflash_config": {"projector_type": "causal_v6"}}, r"projector_type 'causal_v6'"),
    "no shift_label": ({"dflash_config": {"shift_label": None}}, r"Domino head but no shift_label"),
    "no pure_draft_prefix_len": ({"dflash_config": {"pure_draft_prefix_len": None}},
                                 r"Domino head but no pure_draft_prefix_len"),
    "two emb_dim": ({"emb_dim": 8}, r"emb_dim differs between dflash_config \(16\) and the top-level config \(8\)"),
    "attention sink": ({"dflash_config": {"attention_sink_bias": True}}, r"dflash_config.attention_sink_bias=True"),
}


def edit_published_config(folder, edits: dict) -> None:
    """Apply `edits` to a published config.json; a None inside `dflash_config` removes that key."""
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    for key, value in edits.items():
        if key == "dflash_config":
            config[key].update(value)
            config[key] = {k: v for k, v in config[key].items() if v is not None}
        else:
            config[key] = value
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("kind", sorted(UNCOMPUTED_KEYS))
def test_published_keys_this_class_does_not_compute_are_refused(tmp_path, kind):
    edits, message = UNCOMPUTED_KEYS[kind]
    write_published_checkpoint(tmp_path, make_tiny_draft(make_tiny_target("qwen3")))
    edit_published_config(tmp_path, edits)
    with pytest.raises(ValueError, match=message) as caught:
        DominoDraftModel.from_pretrained(tmp_path)
    assert "\n" not in str(caught.value)


def test_published_keys_computed_as_here_are_honoured(tmp_path):
    """Full-attention layer types, a window Qwen3 leaves off, default RoPE given as rope_parameters, SiLU, and a
    pure_draft_prefix_len other than 1 (which SGLang refuses, and domino-hf computes)."""
    target = make_tiny_target("qwen3")
    write_published_checkpoint(tmp_path, make_tiny_draft(target))
    edit_published_config(tmp_path, {
        "layer_types": ["full_attention"], "sliding_window": 8, "use_sliding_window": False, "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "dflash_config": {"pure_draft_prefix_len": 2},
    })
    loaded = DominoDraftModel.from_pretrained(tmp_path).eval()
    assert loaded.config.rope_theta == 5e5 and loaded.config.pure_draft_prefix_len == 2
    assert not {"layer_types", "sliding_window", "hidden_act", "rope_parameters"} & set(loaded.config.to_dict())
    assert_drafted(greedy_both(target, loaded, tiny_prompts(1)[0], max_new_tokens=12)[1])
