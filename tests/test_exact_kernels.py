"""The length-invariant CPU kernels (`domino_hf.exact_kernels`): a token's logits are bitwise the same in a one-token
step, a k-token verify, uneven chunks, a draft tree's mask and a left-padded batch, in fp32 and bf16, on the five
test architectures; generation on them is lossless in bf16 too; where they cannot run, the calibrated kernels do,
said in one line."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from conftest import TINY_ARCHS, greedy_both, make_tiny_draft, make_tiny_target

from domino_hf import exact_kernels, optimize_for_cpu
from domino_hf.cpu_kernels import EXACT, INVARIANT_TABLE, PackedLinear
from domino_hf.modeling.dispatch_domino import CACHE_ARGUMENT

pytestmark = pytest.mark.usefixtures("single_thread")

FP32_REASON = exact_kernels.unavailable_reason(torch.float32)
BF16_REASON = FP32_REASON or exact_kernels.unavailable_reason(torch.bfloat16)
needs_fp32 = pytest.mark.skipif(FP32_REASON is not None, reason=f"no length-invariant kernels here: {FP32_REASON}")
DTYPES = [
    pytest.param(torch.float32, marks=needs_fp32),
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(BF16_REASON is not None, reason=f"no bf16: {BF16_REASON}")),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_features, out_features", [(64, 48), (37, 5), (96, 131), (576, 1536)])
def test_linear_rows_are_bitwise_the_same_in_any_call(dtype, in_features, out_features):
    generator = torch.Generator().manual_seed(in_features)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
    bias = torch.randn(out_features, generator=generator).to(dtype)
    x = torch.randn(33, in_features, generator=generator).to(dtype)
    whole = exact_kernels.linear(x, weight, bias)
    for start, stop in [(0, 1), (5, 6), (3, 7), (1, 18), (30, 33), (0, 32)]:
        assert torch.equal(exact_kernels.linear(x[start:stop], weight, bias), whole[start:stop])
    other = x.clone()
    other[::2] = torch.randn(17, in_features, generator=generator).to(dtype)  # what the other rows hold
    assert torch.equal(exact_kernels.linear(other, weight, bias)[1::2], whole[1::2])
    reference = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert (whole.float() - reference).abs().max() <= tolerance * reference.abs().max()


def _attention(query, key, value, mask):
    return exact_kernels.exact_attention_forward(torch.nn.Module(), query, key, value, mask)[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_a_query_sees_only_its_keys_in_key_order(dtype):
    """A query's output equals its output alone with the cache cut at its causal limit, under a causal mask, a
    draft tree's mask (ancestors only), a sliding window and left padding; and matches stock SDPA."""
    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, context, new, dim = 2, 4, 2, 21, 6, 16

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    query, key, value = randn(batch, heads, new, dim), randn(batch, kv_heads, context + new, dim), randn(
        batch, kv_heads, context + new, dim)
    keys = context + new
    causal = torch.ones(new, keys, dtype=torch.bool).tril(context)[None, None].repeat(batch, 1, 1, 1)
    causal[1, :, :, :4] = False  # row 1 is left-padded by 4
    out = _attention(query, key, value, causal)
    for i in range(new):
        limit = context + i + 1
        alone = _attention(query[:, :, i:i + 1], key[:, :, :limit], value[:, :, :limit], causal[:, :, i:i + 1, :limit])
        assert torch.equal(alone[:, 0], out[:, i])
    # a tree: node 3's parent is node 1, whose parent is node 0; node 2 is node 0's other child
    parents = [-1, 0, 0, 1, 2, 3]
    tree = torch.zeros(new, keys, dtype=torch.bool)
    tree[:, :context] = True
    for node in range(new):
        walk = node
        while walk >= 0:
            tree[node, context + walk] = True
            walk = parents[walk]
    tree_out = _attention(query[:1], key[:1], value[:1], tree[None, None])
    path = [0, 1, 3]  # node 3 verified as the chain 0 → 1 → 3 in plain decoding
    chain_keys = torch.cat([key[:1, :, :context], key[:1, :, [context + n for n in path]]], dim=2)
    chain_values = torch.cat([value[:1, :, :context], value[:1, :, [context + n for n in path]]], dim=2)
    chain = _attention(query[:1, :, path], chain_keys, chain_values, None)
    assert torch.equal(chain[:, -1], tree_out[:, 3])
    window = causal & (torch.arange(keys)[None, None, None] > torch.arange(new)[None, None, :, None] + context - 8)
    windowed = _attention(query, key, value, window)
    last = _attention(query[:, :, -1:], key, value, window[:, :, -1:])
    assert torch.equal(last[:, 0], windowed[:, -1])
    reference = torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float().repeat_interleave(2, 1), value.float().repeat_interleave(2, 1), attn_mask=causal)
    assert (out.float() - reference.transpose(1, 2)).abs().max() <= (1e-5 if dtype == torch.float32 else 2e-2)


def _forward(model, ids, cache, **kwargs):
    return model(ids, use_cache=True, **{CACHE_ARGUMENT: cache}, **kwargs).logits


def _cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_logits_are_bitwise_the_same_at_every_forward_length(arch, dtype):
    """One forward over 40 tokens, one-token steps, a 32-token verify and uneven chunks after a prefill, and the
    rows of a left-padded batch: every token's logits bitwise equal."""
    target = make_tiny_target(arch, vocab_size=64).to(dtype)
    optimize_for_cpu(target, kernels="invariant")
    assert target.domino_length_invariant and target.config._attn_implementation == exact_kernels.ATTENTION_NAME
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (1, 40), generator=generator)
    with torch.no_grad():
        whole = _forward(target, ids, _cache(target))
        for sizes in ([1] * 32, [32], [3, 9, 1, 16, 3], [7, 25]):
            cache, start = _cache(target), 8
            parts = [_forward(target, ids[:, :8], cache)]
            for size in sizes:
                parts.append(_forward(target, ids[:, start:start + size], cache))
                start += size
            assert torch.equal(torch.cat(parts, dim=1), whole), sizes
        rows = [ids[0, :40], ids[0, :33], torch.randint(0, 64, (25,), generator=generator)]
        batch = torch.zeros(3, 40, dtype=torch.long)
        mask = torch.zeros(3, 40, dtype=torch.long)
        for row, tokens in enumerate(rows):
            batch[row, 40 - len(tokens):], mask[row, 40 - len(tokens):] = tokens, 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        batched = _forward(target, batch, _cache(target), attention_mask=mask, position_ids=positions)
        for row, tokens in enumerate(rows):
            alone = _forward(target, tokens[None], _cache(target))
            assert torch.equal(batched[row, 40 - len(tokens):], alone[0]), row


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_generation_is_lossless_on_them_in_every_path(fitted_pair, arch, dtype, caplog):
    """Greedy Domino output equals plain decoding on the same (bf16 included) target: one prompt, a draft tree,
    and a left-padded batch; the bf16 inexactness warning is not given."""
    target, draft, prompts = fitted_pair(arch)
    target = optimize_for_cpu(copy.deepcopy(target).to(dtype), kernels="invariant")
    draft = optimize_for_cpu(draft.to(dtype))
    assert target.domino_length_invariant
    tree = copy.deepcopy(draft)
    tree.generation_config.use_draft_tree = True
    for ids in prompts[:3]:
        greedy_both(target, draft, ids, max_new_tokens=24)
        greedy_both(target, tree, ids, max_new_tokens=24)
    batch = torch.cat([prompts[3], prompts[4]])
    mask = torch.ones_like(batch)
    batch[1, :2], mask[1, :2] = 0, 0
    reference = target.generate(batch, attention_mask=mask, do_sample=False, max_new_tokens=20)
    output = target.generate(batch, attention_mask=mask, do_sample=False, max_new_tokens=20, assistant_model=draft)
    assert output.tolist() == reference.tolist()
    assert "rounds differently" not in caplog.text


needs_bf16 = pytest.mark.skipif(BF16_REASON is not None, reason=f"no bf16: {BF16_REASON}")


def test_by_default_targets_and_drafts_of_both_dtypes_take_them():
    """Where they run, "auto" puts fp32 and bf16 targets (self-checked) and drafts (linear layers only) on them;
    "fastest" never does."""
    if exact_kernels.unavailable_reason(torch.float32) is not None:
        pytest.skip(f"no length-invariant kernels: {exact_kernels.unavailable_reason(torch.float32)}")
    fp32 = optimize_for_cpu(make_tiny_target("llama", vocab_size=32))
    assert fp32.domino_length_invariant
    assert all(m.kernel_table == INVARIANT_TABLE for m in fp32.modules() if type(m) is PackedLinear)
    fastest = optimize_for_cpu(make_tiny_target("llama", vocab_size=32), kernels="fastest")
    assert not fastest.domino_length_invariant
    assert all(EXACT not in m.kernel_table for m in fastest.modules() if type(m) is PackedLinear)
    draft = optimize_for_cpu(make_tiny_draft(fp32))
    assert all(m.kernel_table == INVARIANT_TABLE for m in draft.modules() if type(m) is PackedLinear)
    assert not draft.domino_length_invariant  # no attention of its own to prove: it only proposes
    if BF16_REASON is None:
        bf16 = optimize_for_cpu(make_tiny_target("llama", vocab_size=32).to(torch.bfloat16))
        assert bf16.domino_length_invariant


@needs_bf16
def test_a_failing_self_check_keeps_the_fastest_kernels(monkeypatch, caplog):
    """Negative control: a linear kernel whose result depends on the rows in the call fails the self-check;
    optimize_for_cpu then says so in one line and runs the calibrated kernels ("invariant" raises)."""
    monkeypatch.setattr(exact_kernels, "linear", lambda x, w, b: torch.nn.functional.linear(x, w, b) * (
        1 + 2**-5 * (x.numel() // x.shape[-1] > 1)))  # exact in bf16
    target = make_tiny_target("llama", vocab_size=32).to(torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="domino_hf.cpu_kernels"):
        optimize_for_cpu(target)
    assert "self-check failed" in caplog.text and "the fastest kernels run instead" in caplog.text
    assert not target.domino_length_invariant and target.config._attn_implementation != exact_kernels.ATTENTION_NAME
    assert all(EXACT not in m.kernel_table for m in target.modules() if type(m) is PackedLinear)
    with pytest.raises(RuntimeError, match="self-check failed"):
        optimize_for_cpu(make_tiny_target("llama", vocab_size=32), kernels="invariant")


@needs_fp32
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_stock_kernels_give_back_the_attention_the_model_had(attention):
    from domino_hf import restore_stock_kernels, stock_kernels

    target = make_tiny_target("llama", vocab_size=32, attn_implementation=attention)
    optimize_for_cpu(target, kernels="invariant")
    assert target.config._attn_implementation == exact_kernels.ATTENTION_NAME
    with stock_kernels(target):
        assert target.config._attn_implementation == attention and not target.domino_length_invariant
    assert target.config._attn_implementation == exact_kernels.ATTENTION_NAME and target.domino_length_invariant
    restore_stock_kernels(target)
    assert target.config._attn_implementation == attention and not target.domino_length_invariant


def test_a_cpu_without_the_instructions_says_why_in_one_line(monkeypatch, caplog):
    monkeypatch.setattr(exact_kernels, "cpu_info", lambda: {"model": "x", "flags": ["avx2", "fma"]})
    assert "avx512f" in exact_kernels.unsupported_reason(torch.float32)
    target = make_tiny_target("llama", vocab_size=32).to(torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="domino_hf.cpu_kernels"):
        optimize_for_cpu(target)
    said = [r.message for r in caplog.records if "length-invariant kernels not used" in r.message]
    assert len(said) == 1 and "avx512f" in said[0]
    assert not target.domino_length_invariant
    with pytest.raises(RuntimeError, match="avx512f"):
        optimize_for_cpu(make_tiny_target("llama", vocab_size=32), kernels="invariant")
    with pytest.raises(ValueError, match="kernels="):
        optimize_for_cpu(make_tiny_target("llama", vocab_size=32), kernels="fast")


def test_a_lock_left_by_a_killed_build_is_cleared_and_a_fresh_one_kept(tmp_path, caplog):
    """torch's builder waits while its lock file exists: a build killed mid-way must not hang every later load."""
    import os
    import time

    from domino_hf.exact_kernels import STALE_LOCK_SECONDS, _clear_stale_lock

    fresh, stale = tmp_path / "fresh" / "lock", tmp_path / "stale" / "lock"
    for lock in (fresh, stale):
        lock.parent.mkdir()
        lock.touch()
    old = time.time() - STALE_LOCK_SECONDS - 5
    os.utime(stale, (old, old))
    with caplog.at_level("WARNING", logger="domino_hf.exact_kernels"):
        _clear_stale_lock(stale)
        _clear_stale_lock(fresh)
        _clear_stale_lock(tmp_path / "none" / "lock")
    assert not stale.exists() and fresh.exists()
    assert "did not finish" in caplog.text
