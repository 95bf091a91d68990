"""Misuse raises errors that name the fix; everything that is not a Domino draft stays stock transformers."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    assert_drafted,
    greedy_both,
    isolated_python_prelude,
    make_tiny_draft,
    make_tiny_target,
    tiny_prompts,
    write_published_checkpoint,
)
from transformers import AutoModel
from transformers.generation.candidate_generator import AssistedCandidateGenerator, PromptLookupCandidateGenerator
from transformers.generation.utils import GenerationMixin

from domino_hf import DominoCandidateGenerator, install_generate_hook

pytestmark = pytest.mark.usefixtures("single_thread")

FIT_FIX = "Load the Domino draft trained for this target"


@pytest.fixture(scope="module")
def pair():
    target = make_tiny_target("llama")
    return target, make_tiny_draft(target), tiny_prompts(1)[0]


def test_batch_size_above_one(pair):
    """A batch goes to the batched verify loop; the single-sequence candidate generator, built directly for two rows,
    still refuses them by name; so do a right-padded batch and an attention that takes no explicit mask."""
    from transformers import GenerationConfig

    from domino_hf.modeling.dispatch_domino import resolve_drafting_settings

    target, draft, ids = pair
    assert target.generate(ids.repeat(2, 1), assistant_model=draft, max_new_tokens=4).shape[0] == 2
    config = GenerationConfig(max_length=20)
    with pytest.raises(ValueError, match="supports batch size 1.*Call generate once per prompt"):
        settings = resolve_drafting_settings(draft, config)
        DominoCandidateGenerator(draft, target, config, None, ids.repeat(2, 1), settings)
    mask = torch.ones(2, ids.shape[1], dtype=torch.long)
    mask[1, -2:] = 0
    with pytest.raises(ValueError, match="left-padded prompts.*padding_side='left'"):
        target.generate(ids.repeat(2, 1), attention_mask=mask, assistant_model=draft, max_new_tokens=4)
    attention, target.config._attn_implementation = target.config._attn_implementation, "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="attn_implementation='flash_attention_2'.*'sdpa'"):
            target.generate(ids.repeat(2, 1), assistant_model=draft, max_new_tokens=4)
    finally:
        target.config._attn_implementation = attention


@pytest.mark.parametrize("cache", ["static", "sliding_window", "offloaded_static", "offloaded", "quantized"])
def test_static_cache(pair, cache):
    target, draft, ids = pair
    with pytest.raises(ValueError, match="needs a dynamic cache.*drop `cache_implementation`"):
        target.generate(ids, assistant_model=draft, max_new_tokens=4, cache_implementation=cache)


def test_cache_objects(pair):
    """A cache passed to generate (under the running release's argument name): a DynamicCache drafts losslessly,
    anything else is refused with the fix."""
    from transformers import DynamicCache, StaticCache

    from domino_hf.modeling.dispatch_domino import CACHE_ARGUMENT

    target, draft, ids = pair
    reference = target.generate(ids, do_sample=False, max_new_tokens=12)
    output = target.generate(ids, do_sample=False, max_new_tokens=12, assistant_model=draft,
                             **{CACHE_ARGUMENT: DynamicCache(config=target.config)})
    assert output.tolist() == reference.tolist()
    assert_drafted(draft.last_generation_stats)
    static = StaticCache(config=target.config, max_cache_len=64)
    with pytest.raises(ValueError, match="needs a DynamicCache for the target, got a StaticCache.*DynamicCache()"):
        target.generate(ids, max_new_tokens=4, assistant_model=draft, **{CACHE_ARGUMENT: static})


def test_linear_attention_target_is_refused():
    """A target with linear-attention layers (Qwen3-Next; transformers 5.25 lets such targets into assisted
    decoding) cannot have a verify step rolled back by cropping: refused before anything is drafted."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_value_heads=2, linear_num_key_heads=1,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=16, shared_expert_intermediate_size=16,
        layer_types=["linear_attention", "full_attention"],
    )
    target = Qwen3NextForCausalLM(config).eval()
    draft = make_tiny_draft(make_tiny_target("llama", vocab_size=64, num_hidden_layers=2))
    with pytest.raises(ValueError, match=r"layer types \['linear_attention'\].*without `assistant_model`"):
        target.generate(torch.tensor([[1, 2, 3]]), assistant_model=draft, max_new_tokens=4)


def test_a_dflash_draft_with_speculation_type_goes_to_transformers(tmp_path, pair, stock_generators):
    """`speculation_type="dflash"` with a draft that is not a Domino draft (here a z-lab DFlash checkpoint loaded
    plain) reaches transformers' own DFlash drafting untouched; without it, the plain-loaded checkpoint gets the
    error naming both ways to load it."""
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    target = make_tiny_target("qwen3")
    write_published_checkpoint(tmp_path, make_tiny_draft(target), projector_type=None)
    plain = AutoModel.from_pretrained(tmp_path)
    # transformers' DFlash generator reads these at the top level of the draft's config
    plain.config.target_layer_ids = plain.config.dflash_config["target_layer_ids"]
    plain.config.mask_token_id = plain.config.dflash_config["mask_token_id"]
    ids = tiny_prompts(1)[0]
    with pytest.raises(ValueError, match="loaded as a plain Qwen3Model.*speculation_type=\"dflash\""):
        target.generate(ids, assistant_model=plain, max_new_tokens=4)
    try:  # a plain Qwen3Model has no DFlash forward: transformers' own path fails on it, after our dispatch
        target.generate(ids, assistant_model=plain, max_new_tokens=4, speculation_type="dflash")
    except (TypeError, ValueError):
        pass
    assert stock_generators == [DFlashTokenCandidateGenerator]


@pytest.mark.parametrize(
    "target_overrides, draft_overrides, message",
    [
        (dict(hidden_size=64), {}, "hidden size 32 != target's 64"),
        ({}, dict(hidden_size=64), "draft hidden size 64 != target's 32"),
        (dict(vocab_size=32), {}, "vocabulary 16 != target's LM head 32"),
        (dict(num_hidden_layers=8), {}, "built for 6 target layers, target has 8"),
        # (a config whose own fields disagree is refused at construction: tests/test_config_validation.py)
        ({}, dict(num_target_layers=8, target_layer_ids=[1, 7]),
         r"target_layer_ids \[1, 7\] exceed the target's layers"),
        ({}, dict(vocab_size=32, mask_token_id=16), "mask_token_id 16 outside the target vocabulary"),
    ],
    ids=["hidden_size", "draft_hidden_size", "vocab", "num_target_layers", "target_layer_ids", "mask_token_id"],
)
def test_draft_that_does_not_fit_the_target(pair, target_overrides, draft_overrides, message):
    target, draft, ids = pair
    if draft_overrides:
        draft = make_tiny_draft(target, **draft_overrides)
    if target_overrides:
        target = make_tiny_target("llama", **target_overrides)
    with pytest.raises(ValueError, match=f"does not fit the target model: .*{message}.*{FIT_FIX}"):
        target.generate(ids, assistant_model=draft, max_new_tokens=4)


def test_published_checkpoint_loaded_without_remote_code(tmp_path):
    """Plain `AutoModel` on a published folder gives a Qwen3Model without the drafting code: say how to load it."""
    target = make_tiny_target("qwen3")
    write_published_checkpoint(tmp_path, make_tiny_draft(target))
    plain = AutoModel.from_pretrained(tmp_path)
    assert type(plain).__name__ == "Qwen3Model"
    with pytest.raises(ValueError, match=r"loaded as a plain Qwen3Model.*trust_remote_code=True"):
        target.generate(tiny_prompts(1)[0], assistant_model=plain, max_new_tokens=4)


def test_our_checkpoint_loaded_without_remote_code(tmp_path):
    """Without domino_hf, our model type is unknown to transformers, which refuses and asks for
    `trust_remote_code=True`; with domino_hf imported, `domino_draft` is registered and loads directly."""
    import subprocess
    import sys

    make_tiny_draft(make_tiny_target("llama")).save_pretrained(tmp_path)
    assert type(AutoModel.from_pretrained(tmp_path)).__name__ == "DominoDraftModel"
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'domino_hf': raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from transformers import AutoModel\n"
        f"AutoModel.from_pretrained({str(tmp_path)!r}, trust_remote_code=False)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode != 0 and "trust_remote_code=True" in result.stderr


def test_installing_the_hook_twice_is_harmless(pair):
    from domino_hf.modeling.dispatch_domino import _PATCHED

    target, draft, ids = pair
    hooked = {name: getattr(GenerationMixin, name) for name in _PATCHED}
    install_generate_hook()
    install_generate_hook()
    assert {name: getattr(GenerationMixin, name) for name in _PATCHED} == hooked
    assert all(hasattr(method, "__wrapped__") for method in hooked.values())
    _, stats = greedy_both(target, draft, ids, max_new_tokens=12)
    assert_drafted(stats)


def test_uninstall_restores_the_stock_methods(pair, caplog):
    import logging

    from domino_hf import uninstall_generate_hook
    from domino_hf.modeling.dispatch_domino import _PATCHED

    target, draft, ids = pair
    hooked = {name: getattr(GenerationMixin, name) for name in _PATCHED}
    try:
        uninstall_generate_hook()
        for name in _PATCHED:
            assert getattr(GenerationMixin, name) is hooked[name].__wrapped__
        with caplog.at_level(logging.INFO):
            install_generate_hook()
        assert caplog.text.count("dispatch installed") == 1 and "uninstall_generate_hook" in caplog.text
    finally:
        install_generate_hook()
    _, stats = greedy_both(target, draft, ids, max_new_tokens=12)
    assert_drafted(stats)


@pytest.mark.parametrize("logits_to_keep", [True, False], ids=["target_takes_logits_to_keep", "target_does_not"])
def test_a_domino_draft_after_uninstall_names_the_fix(pair, monkeypatch, logits_to_keep):
    """Without the dispatch, stock transformers takes the draft for an ordinary assistant model: the first thing it
    calls on the draft (`_supports_logits_to_keep`, or `generate` for a target that takes no `logits_to_keep`)
    says the dispatch is uninstalled and how to reinstall it, instead of an AttributeError from deep inside."""
    from domino_hf import uninstall_generate_hook

    target, draft, ids = pair
    if not logits_to_keep:
        monkeypatch.setattr(target, "_supports_logits_to_keep", lambda: False)
    try:
        uninstall_generate_hook()
        with pytest.raises(RuntimeError, match=r"^A Domino draft was passed to generate, but the generate dispatch is "
                           r"uninstalled .*reinstall it with domino_hf\.install_generate_hook\(\)") as error:
            target.generate(ids, max_new_tokens=4, assistant_model=draft)
        assert "\n" not in str(error.value)
    finally:
        install_generate_hook()
    with pytest.raises(TypeError, match="does not generate on its own.*assistant_model=draft"):
        draft.generate(ids)
    _, stats = greedy_both(target, draft, ids, max_new_tokens=12)
    assert_drafted(stats)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_target_on_cpu_is_warned_about_once(dtype, caplog):
    """bf16 and fp16 CPU kernels round a several-token verify forward differently from one-token steps, so the
    output may differ from the target's own: the first call with such a target says so, once, naming fp32."""
    import logging

    target = make_tiny_target("llama").to(dtype)
    draft = make_tiny_draft(target)
    ids = tiny_prompts(1)[0]
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            target.generate(ids, do_sample=False, max_new_tokens=8, assistant_model=draft)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "Domino" in r.getMessage()]
    assert len(warnings) == 1
    assert str(dtype) in warnings[0].getMessage() and "dtype=torch.float32" in warnings[0].getMessage()
    caplog.clear()
    exact = make_tiny_target("llama")
    with caplog.at_level(logging.WARNING):
        exact.generate(ids, do_sample=False, max_new_tokens=8, assistant_model=make_tiny_draft(exact))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_stopping_criteria_are_found_by_name_or_position(pair, monkeypatch):
    """The dispatch binds `_assisted_decoding`'s arguments by signature, not by position."""
    import inspect

    from domino_hf.modeling import dispatch_domino

    seen = []
    original = dispatch_domino._STOPPING_CRITERIA.set
    monkeypatch.setattr(dispatch_domino, "_STOPPING_CRITERIA", type("Spy", (), {
        "set": lambda self, value: seen.append(value) or original(value),
        "reset": lambda self, token: dispatch_domino.contextvars.copy_context(),
        "get": lambda self: seen[-1] if seen else None,
    })())
    stock = GenerationMixin._assisted_decoding.__wrapped__
    names = list(inspect.signature(stock).parameters)
    assert "stopping_criteria" in names
    target, draft, ids = pair
    target.generate(ids, max_new_tokens=6, assistant_model=draft, stop_strings=None)
    assert seen and seen[-1] is not None  # generate passes its StoppingCriteriaList through


@pytest.fixture
def stock_generators(monkeypatch):
    """Records the candidate generator classes generate builds; building a Domino generator fails the test."""
    built = []
    hooked = GenerationMixin._get_candidate_generator

    def spy(self, *args, **kwargs):
        generator = hooked(self, *args, **kwargs)
        built.append(type(generator))
        return generator

    def no_domino(*args, **kwargs):
        raise AssertionError("a Domino generator was built for a non-Domino assistant")

    monkeypatch.setattr(GenerationMixin, "_get_candidate_generator", spy)
    monkeypatch.setattr(DominoCandidateGenerator, "__init__", no_domino)
    return built


def test_plain_assistant_model_is_untouched(pair, stock_generators):
    target, _, ids = pair
    assistant = make_tiny_target("llama", num_hidden_layers=1, seed=3)
    reference = target.generate(ids, do_sample=False, max_new_tokens=16)
    output = target.generate(ids, do_sample=False, max_new_tokens=16, assistant_model=assistant)
    assert output.tolist() == reference.tolist()
    assert stock_generators == [AssistedCandidateGenerator]
    target.generate(ids, do_sample=True, max_new_tokens=8, assistant_model=assistant)  # sampling too


def test_prompt_lookup_is_untouched(pair, stock_generators):
    target, _, ids = pair
    ids = ids.repeat(1, 3)  # repeated n-grams for the lookup to find
    reference = target.generate(ids, do_sample=False, max_new_tokens=16)
    output = target.generate(ids, do_sample=False, max_new_tokens=16, prompt_lookup_num_tokens=3)
    assert output.tolist() == reference.tolist()
    assert stock_generators == [PromptLookupCandidateGenerator]


def test_unsupported_transformers_version_fails_clearly(monkeypatch):
    import transformers
    from transformers.generation.utils import GenerationMixin

    from domino_hf.modeling.dispatch_domino import install_generate_hook

    from domino_hf.modeling.dispatch_domino import is_supported_transformers

    assert all(map(is_supported_transformers, ("5.23.0", "5.24.0", "5.25.0", "5.25.1")))
    monkeypatch.setattr(GenerationMixin, "_domino_original_methods", None)
    for version in ("5.22.1", "5.26.0", "6.0.0.dev0"):
        monkeypatch.setattr(transformers, "__version__", version)
        with pytest.raises(ImportError, match=rf"transformers>=5\.23,<5\.26 \(found {version}\).*pip install"):
            install_generate_hook()


@pytest.mark.integration  # a second interpreter with a pretend transformers release
def test_remote_code_on_an_unsupported_transformers_fails_at_load(tmp_path, pair):
    """A checkpoint's remote code (domino_hf not importable) refuses to load on transformers outside the
    supported range, naming the range, instead of patching internals it was never tested against."""
    import os
    import subprocess
    import sys

    pair[1].save_pretrained(tmp_path / "draft")
    child = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'domino_hf': raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import transformers\n"
        "transformers.__version__ = '5.26.0'\n"
        "from transformers import AutoModel\n"
        f"AutoModel.from_pretrained({str(tmp_path / 'draft')!r}, trust_remote_code=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-I", "-c", isolated_python_prelude() + child], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "UnsupportedTransformersError: Domino drafts support transformers>=5.23,<5.26 (found 5.26.0)" in (
        result.stderr)
