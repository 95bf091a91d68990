"""A target attention implementation registered without a mask function (`AttentionInterface.register` alone) is
refused by name on every Domino path (one prompt, a batch, a draft tree): transformers builds no causal mask for
it, so a verify forward over several new tokens after the cache would give other tokens than plain decoding.
Registered with its mask function (`AttentionMaskInterface.register`), it decodes one prompt losslessly."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_drafted
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from domino_hf.modeling.dispatch_domino import CACHE_ARGUMENT

pytestmark = pytest.mark.usefixtures("single_thread")

UNMASKED = "unmasked_sdpa"  # stock SDPA under another name, no mask function: never given one in this session
MASKED = "masked_sdpa"  # the same, with SDPA's mask function


@pytest.fixture
def attention(fitted_pair):
    """`(target, draft, prompts, use)`: `use(name)` registers stock SDPA under `name` (with SDPA's mask function for
    `MASKED`) and switches the target to it; the target gets `sdpa` back afterwards."""
    target, draft, prompts = fitted_pair("llama")
    AttentionInterface.register(UNMASKED, sdpa_attention_forward)
    AttentionInterface.register(MASKED, sdpa_attention_forward)
    AttentionMaskInterface.register(MASKED, sdpa_mask)

    def use(name):
        target.set_attn_implementation(name)
        assert target.config._attn_implementation == name

    yield target, draft, prompts, use
    target.set_attn_implementation("sdpa")


def test_unmasked_attention_breaks_a_forward_over_the_cache(attention):
    """Why it is refused: one-token steps agree with SDPA, a three-token forward after the cache does not."""
    target, _, prompts, use = attention
    ids = target.generate(prompts[0], do_sample=False, max_new_tokens=4)

    def last_logits(name):
        use(name)
        with torch.no_grad():
            cache = DynamicCache(config=target.config)
            target(ids[:, :-3], **{CACHE_ARGUMENT: cache})
            return target(ids[:, -3:], **{CACHE_ARGUMENT: cache}).logits

    stock, unmasked, masked = last_logits("sdpa"), last_logits(UNMASKED), last_logits(MASKED)
    assert torch.allclose(masked, stock, atol=1e-5)
    assert not torch.allclose(unmasked, stock, atol=1e-3)
    use(UNMASKED)
    assert target.generate(prompts[0], do_sample=False, max_new_tokens=4).tolist() == ids.tolist()  # plain is fine


@pytest.mark.parametrize("path", ["one prompt", "one draft token", "batch", "tree"])
def test_unmasked_attention_is_refused_by_name(attention, path):
    target, draft, prompts, use = attention
    ids = torch.cat(prompts[:2]) if path == "batch" else prompts[0]
    kwargs = {"one draft token": {"num_assistant_tokens": 1}, "tree": {"use_draft_tree": True}}.get(path, {})
    use(UNMASKED)
    fix = rf"AttentionMaskInterface.register\('{UNMASKED}', sdpa_mask\).*attn_implementation='sdpa'"
    with pytest.raises(ValueError, match=rf"attn_implementation='{UNMASKED}' has no mask function.*{fix}"):
        target.generate(ids, do_sample=False, max_new_tokens=8, assistant_model=draft, **kwargs)


@pytest.mark.parametrize("use_draft_tree", [False, True])
def test_attention_registered_with_its_mask_is_lossless(attention, use_draft_tree):
    """With its mask function the user's implementation decodes one prompt token-identically, the draft's tokens
    accepted (a draft tree verifies the chain there: its tree mask goes to known implementations only)."""
    target, draft, prompts, use = attention
    use(MASKED)
    for ids in prompts[:3]:
        plain = target.generate(ids, do_sample=False, max_new_tokens=12)
        out = target.generate(ids, do_sample=False, max_new_tokens=12, assistant_model=draft,
                              use_draft_tree=use_draft_tree)
        assert out.tolist() == plain.tolist()
        assert_drafted(draft.last_generation_stats)
