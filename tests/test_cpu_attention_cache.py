"""The CPU attention and KV cache `optimize_for_cpu` installs: grouped-query attention without repeated heads
equals stock SDPA, the growing cache returns exactly what `DynamicCache` returns through appends and crops
(sliding windows included), and greedy decoding stays identical to plain decoding on the same kernels for
every architecture, at short and long contexts, with a Domino draft and with prompt lookup."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
from conftest import make_tiny_draft, make_tiny_target
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
from transformers.integrations.sdpa_attention import repeat_kv

from domino_hf import optimize_for_cpu, restore_stock_kernels, stock_kernels
from domino_hf import cpu_attention
from domino_hf.cpu_attention import ATTENTION_NAME, gqa_attention_forward
from domino_hf.kv_cache import GrowingCache, GrowingCacheGenerate, GrowingLayer, GrowingSlidingWindowLayer
from domino_hf.modeling.dispatch_domino import CACHE_ARGUMENT

pytestmark = pytest.mark.usefixtures("single_thread")

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma3")
WINDOWED = {"mistral": {"sliding_window": 16}}  # gemma3 gets a window of 8 from make_tiny_target


class Heads:
    def __init__(self, groups: int):
        self.num_key_value_groups = groups
        self.is_causal = True
        self.training = False


def reference_attention(query, key, value, mask, groups, scale):
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("q_len", [1, 5, 9])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "padded"])
def test_grouped_query_attention_equals_repeated_heads(q_len, mask_kind):
    generator = torch.Generator().manual_seed(q_len)
    batch, kv_heads, groups, past, dim = 2, 3, 3, 40, 16
    kv_len = past + q_len
    query = torch.randn(batch, kv_heads * groups, q_len, dim, generator=generator)
    key, value = (torch.randn(batch, kv_heads, kv_len, dim, generator=generator) for _ in range(2))
    causal = torch.arange(q_len)[:, None] + past >= torch.arange(kv_len)[None]
    mask = causal.expand(batch, 1, q_len, kv_len).clone()
    if mask_kind == "padded":
        mask[0, :, :, :7] = False  # left padding of the first row
    if mask_kind == "additive":
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    out, weights = gqa_attention_forward(Heads(groups), query, key, value, mask, scaling=0.3)
    expected = reference_attention(query, key, value, mask, groups, 0.3)
    assert weights is None and out.shape == expected.shape == (batch, q_len, kv_heads * groups, dim)
    assert (out - expected).abs().max() <= 1e-5


def test_calls_it_cannot_pack_go_to_stock_sdpa(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_attention, "_stock_sdpa", lambda: lambda *a, **k: calls.append(k) or ("stock", None))
    query, key = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    assert gqa_attention_forward(Heads(2), query, key, key, None)[0] == "stock"  # no mask: SDPA's own GQA
    assert gqa_attention_forward(Heads(1), torch.randn(1, 2, 3, 8), key, key, mask)[0] == "stock"  # no groups
    assert gqa_attention_forward(Heads(2), query, key, key, mask, dropout=0.1)[0] == "stock"
    assert gqa_attention_forward(Heads(2), query, key, key, mask, softcap=30.0)[0] == "stock"
    assert gqa_attention_forward(Heads(2), query, key, key, mask.expand(1, 4, 3, 3))[0] == "stock"
    assert len(calls) == 5
    assert gqa_attention_forward(Heads(2), query, key, key, mask)[0].shape == (1, 3, 4, 8)  # packed
    assert len(calls) == 5


def states(n: int, seed: int, heads: int = 2, dim: int = 4):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, n, dim, generator=generator), torch.randn(1, heads, n, dim, generator=generator)


# (tokens appended, tokens cropped afterwards): a prefill, verifies with rejections, plain steps
SCHEDULE = [(30, 0), (5, 3), (1, 0), (9, 9), (9, 4), (1, 0), (1, 0), (300, 0), (5, 5), (5, 1)] + [(1, 0)] * 40


@pytest.mark.parametrize("window", [None, 8, 64])
def test_growing_layers_return_what_dynamic_layers_return(window):
    if window is None:
        stock, growing = DynamicLayer(), GrowingLayer()
    else:
        stock, growing = DynamicSlidingWindowLayer(window), GrowingSlidingWindowLayer(window)
        stock.activate_past_recording()  # the stock layer can only roll back while recording
    for step, (new, crop) in enumerate(SCHEDULE):
        keys, values = states(new, step)
        expected, got = stock.update(keys, values), growing.update(keys, values)
        assert all(torch.equal(e, g) for e, g in zip(expected, got)), step
        assert growing.get_seq_length() == stock.get_seq_length()
        assert growing.get_mask_sizes(3) == stock.get_mask_sizes(3)
        if crop:
            stock.crop(-crop)
            growing.crop(-crop)
        assert growing.get_seq_length() == stock.get_seq_length()
    held = sum(new - crop for new, crop in SCHEDULE)
    capacity = growing._key_buffer.shape[-2]  # bounded: geometric growth, or about twice the window + a verify
    assert capacity <= (2 * held + 256 if window is None else 2 * (window + 300) + 256)


def test_appends_reuse_the_buffer():
    layer = GrowingLayer()
    buffers = set()
    for step in range(2000):
        layer.update(*states(1, step))
        buffers.add(layer.keys.untyped_storage().data_ptr())
    assert len(buffers) <= 6  # geometric growth: a handful of buffers for 2,000 appends, not one per token
    assert layer.get_seq_length() == 2000


def test_sliding_crop_beyond_what_was_kept_is_refused():
    layer = GrowingSlidingWindowLayer(8)
    layer.update(*states(40, 0))
    for step in range(300):
        layer.update(*states(1, step))
    with pytest.raises(RuntimeError, match="only the tokens of the last forward"):
        layer.crop(-200)
    with pytest.raises(ValueError, match="negative"):
        layer.crop(3)


def test_replaced_states_are_adopted():
    """Beam and batch operations replace a layer's tensors: the next append builds on them."""
    stock, growing = DynamicCache(), GrowingCache()
    for cache in (stock, growing):
        cache.update(*states(6, 0, heads=2), 0)
        cache.batch_repeat_interleave(3)
        cache.reorder_cache(torch.tensor([2, 0, 1]))
    keys, values = states(2, 1, heads=2)
    keys, values = keys.expand(3, -1, -1, -1), values.expand(3, -1, -1, -1)
    expected, got = stock.update(keys, values, 0), growing.update(keys, values, 0)
    assert all(torch.equal(e, g) for e, g in zip(expected, got))
    growing.reset()
    assert growing.get_seq_length() == 0
    assert torch.equal(growing.update(*states(3, 2), 0)[0], states(3, 2)[0])


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_logits_match_the_stock_cache_and_attention(arch):
    target = make_tiny_target(arch, vocab_size=64, **WINDOWED.get(arch, {}))
    ids = torch.randint(0, 64, (1, 60), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = target(ids).logits
        optimize_for_cpu(target, stock_rows=0)
        assert target.config._attn_implementation == ATTENTION_NAME
        cache, chunks, position = GrowingCache(config=target.config), [], 0
        for size in (20, 5, 1, 9, 1, 5, 9, 1, 9):
            junk = torch.randint(0, 64, (1, size))
            target(junk, **{CACHE_ARGUMENT: cache})  # a rejected verify, rolled back
            cache.crop(-size)
            chunks.append(target(ids[:, position : position + size], **{CACHE_ARGUMENT: cache}).logits)
            position += size
    assert (torch.cat(chunks, 1) - reference).abs().max() <= 1e-4


class Counter:
    def __init__(self, monkeypatch):
        self.caches = self.packed = 0
        init, packed = GrowingCache.__init__, cpu_attention.F.scaled_dot_product_attention

        def counting_init(cache, *args, **kwargs):
            self.caches += 1
            init(cache, *args, **kwargs)

        def counting_sdpa(*args, **kwargs):
            self.packed += 1
            return packed(*args, **kwargs)

        monkeypatch.setattr(GrowingCache, "__init__", counting_init)
        monkeypatch.setattr(cpu_attention.F, "scaled_dot_product_attention", counting_sdpa)


def lookup_friendly_prompt(length: int, vocab: int, seed: int) -> torch.Tensor:
    """A prompt that repeats a random phrase, so that prompt lookup finds spans to propose."""
    phrase = torch.randint(0, vocab, (23,), generator=torch.Generator().manual_seed(seed))
    return phrase.repeat(length // 23 + 1)[:length][None]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompt_length", [6, 300])
def test_greedy_identity_on_the_optimized_attention_and_cache(arch, prompt_length, monkeypatch):
    target = make_tiny_target(arch, vocab_size=64, **WINDOWED.get(arch, {}))
    ids = lookup_friendly_prompt(prompt_length, 64, seed=prompt_length)
    stock = target.generate(ids, do_sample=False, max_new_tokens=30)
    optimize_for_cpu(target, stock_rows=0)
    draft = optimize_for_cpu(make_tiny_draft(target), stock_rows=0)
    counter = Counter(monkeypatch)
    plain = target.generate(ids, do_sample=False, max_new_tokens=30)
    with_draft = target.generate(ids, do_sample=False, max_new_tokens=30, assistant_model=draft)
    lookup = target.generate(ids, do_sample=False, max_new_tokens=30, prompt_lookup_num_tokens=5)
    assert with_draft.tolist() == plain.tolist() == lookup.tolist()
    assert counter.caches == 3 and counter.packed > 0  # all three decoded on the growing cache, packed heads
    assert draft.last_generation_stats.num_steps > 0
    with stock_kernels(target):
        assert target.generate(ids, do_sample=False, max_new_tokens=30).tolist() == stock.tolist()
    assert counter.caches == 3


def test_installed_per_instance_and_undone(tmp_path):
    target = make_tiny_target("qwen3", vocab_size=32)
    optimize_for_cpu(target, kernels="fastest")
    assert isinstance(target.__dict__["generate"], GrowingCacheGenerate)
    assert target.config._attn_implementation == ATTENTION_NAME
    assert make_tiny_target("qwen3", vocab_size=32).config._attn_implementation == "sdpa"  # others untouched
    clone = copy.deepcopy(target)
    assert clone.generate.model is clone
    assert pickle.loads(pickle.dumps(target)).generate.model is not target
    target.save_pretrained(tmp_path)
    assert ATTENTION_NAME not in json.loads((tmp_path / "config.json").read_text()).values()
    with stock_kernels(target):
        assert "generate" not in target.__dict__ and target.config._attn_implementation == "sdpa"
    assert isinstance(target.__dict__["generate"], GrowingCacheGenerate)
    restore_stock_kernels(target)
    assert "generate" not in target.__dict__ and target.config._attn_implementation == "sdpa"


def test_generate_keeps_a_cache_the_caller_asked_for():
    target = optimize_for_cpu(make_tiny_target("llama", vocab_size=32))
    ids = torch.arange(8)[None]
    cache = DynamicCache(config=target.config)
    out = target.generate(ids, do_sample=False, max_new_tokens=5, return_dict_in_generate=True,
                          **{CACHE_ARGUMENT: cache})
    assert getattr(out, "cache", None) is cache or getattr(out, "past_key_values", None) is cache
    assert type(cache) is DynamicCache
    out = target.generate(ids, do_sample=False, max_new_tokens=5, return_dict_in_generate=True)
    assert isinstance(getattr(out, "cache", None) or getattr(out, "past_key_values", None), GrowingCache)
    out = target.generate(ids, do_sample=False, max_new_tokens=5, return_dict_in_generate=True, num_beams=2)
    assert type(getattr(out, "cache", None) or getattr(out, "past_key_values", None)) is DynamicCache
