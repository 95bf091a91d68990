"""`optimize_for_cpu`: linears on packed oneDNN and MKL weights match stock kernels, keep generation lossless,
and stay invisible to saving, copying and training."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from conftest import greedy_both, make_tiny_draft, make_tiny_target, tiny_prompts
from torch import nn

from domino_hf import is_optimized, optimize_for_cpu, restore_stock_kernels, stock_kernels
from domino_hf.cpu_kernels import PackedLinear

pytestmark = pytest.mark.usefixtures("single_thread")


def packed_layers(model) -> int:
    return sum(type(m) is PackedLinear for m in model.modules())


@pytest.mark.parametrize(
    "arch, overrides",
    [
        ("llama", {"tie_word_embeddings": True}),
        ("qwen3", {"tie_word_embeddings": False}),
        ("qwen2", {}),  # q/k/v projections with a bias
        ("gemma3", {}),  # soft-capped logits, scaled embeddings, tied head
    ],
)
def test_logits_match_stock_kernels(arch, overrides):
    target = make_tiny_target(arch, vocab_size=64, **overrides)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = target(ids).logits
        optimize_for_cpu(target)
        optimized = target(ids).logits
    linears = sum(isinstance(m, nn.Linear) for m in target.modules())
    assert packed_layers(target) == linears > 0
    assert (optimized - reference).abs().max() <= 1e-4
    if overrides.get("tie_word_embeddings") or arch == "gemma3":
        assert target.get_output_embeddings().weight is target.get_input_embeddings().weight


@pytest.mark.parametrize("stock_rows", [0, 2, None])  # packed from 1 token, from 3, as calibrated here
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_greedy_identity_plain_and_domino_on_an_optimized_target(arch, stock_rows):
    target = optimize_for_cpu(make_tiny_target(arch, vocab_size=32), stock_rows=stock_rows)
    draft = optimize_for_cpu(make_tiny_draft(target), stock_rows=stock_rows)
    assert is_optimized(target) and is_optimized(draft)
    for ids in tiny_prompts(3, vocab_size=32):
        greedy_both(target, draft, ids, max_new_tokens=20)


def test_idempotent_and_restorable(caplog):
    target = make_tiny_target("llama", vocab_size=32)
    with caplog.at_level(logging.INFO, logger="domino_hf.cpu_kernels"):
        optimize_for_cpu(target)
        first = {name: dict(m._packed) for name, m in target.named_modules() if type(m) is PackedLinear}
        assert optimize_for_cpu(target) is target
    second = {name: m._packed for name, m in target.named_modules() if type(m) is PackedLinear}
    assert all(first[name][k] is second[name][k] for name in first for k in first[name])  # nothing repacked
    assert "already" in caplog.text
    restore_stock_kernels(target)
    restore_stock_kernels(target)
    assert not is_optimized(target)
    assert all(type(m) is nn.Linear for m in target.modules() if isinstance(m, nn.Linear))


def test_save_copy_and_pickle_never_carry_packed_tensors(tmp_path):
    target = make_tiny_target("qwen3", vocab_size=32)
    stock_state = {k: v.clone() for k, v in target.state_dict().items()}
    optimize_for_cpu(target)
    assert target.state_dict().keys() == stock_state.keys()
    target.save_pretrained(tmp_path / "saved")
    reloaded = type(target).from_pretrained(tmp_path / "saved").eval()
    assert not is_optimized(reloaded)
    for key, value in reloaded.state_dict().items():
        assert torch.equal(value, stock_state[key]), key
    clone = copy.deepcopy(target)
    assert is_optimized(clone)
    ids = torch.arange(10)[None]
    with torch.no_grad():
        assert (clone(ids).logits - target(ids).logits).abs().max() == 0


def test_in_place_weight_changes_are_never_stale():
    layer = optimize_for_cpu(nn.Sequential(nn.Linear(8, 8)), stock_rows=0).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        layer[0].weight.mul_(2.0)  # e.g. an optimizer step or load_state_dict
        expected = torch.nn.functional.linear(x, layer[0].weight, layer[0].bias)
        assert torch.allclose(layer(x), expected, atol=1e-6)


def test_few_token_forwards_keep_the_stock_kernel_where_it_is_faster(monkeypatch):
    import domino_hf.cpu_kernels as kernels

    layer = optimize_for_cpu(nn.Sequential(nn.Linear(16, 32)), stock_rows=2).eval()
    stock_calls = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(kernels.F, "linear", lambda *a: stock_calls.append(a[0].shape) or linear(*a))
    with torch.no_grad():
        for shape in [(1, 16), (1, 2, 16), (3, 16), (1, 5, 16)]:
            x = torch.randn(shape)
            torch.testing.assert_close(layer(x), linear(x, layer[0].weight, layer[0].bias), atol=1e-5, rtol=1e-5)
    assert stock_calls == [(1, 16), (1, 2, 16)]  # tokens ≤ stock_rows: stock; more: packed
    assert set(layer[0]._packed) == {kernels.ONEDNN}  # only the copies the table uses
    restore_stock_kernels(layer)
    assert "kernel_table" not in layer[0].__dict__ and "_packed" not in layer[0].__dict__


def test_calibration_times_each_shape_once_per_process(monkeypatch):
    import domino_hf.cpu_kernels as kernels

    monkeypatch.setattr(kernels, "_kernel_choices", {})
    model = optimize_for_cpu(nn.Sequential(nn.Linear(40, 24), nn.Linear(24, 40), nn.Linear(40, 24)),
                             kernels="fastest").eval()
    key = (24, 40, torch.float32, torch.get_num_threads())
    assert set(kernels._kernel_choices) == {key, (40, 24, torch.float32, torch.get_num_threads())}
    assert set(kernels._kernel_choices[key]) == set(kernels.ROW_CANDIDATES)
    assert model[0].kernel_table == model[2].kernel_table == kernels.kernel_table(kernels._kernel_choices[key])
    for layer in model:  # packed copies kept for the kernels each table uses, and only those
        assert set(layer._packed) == set(layer.kernel_table) - {kernels.STOCK}
    monkeypatch.setattr(kernels.time, "perf_counter", lambda: pytest.fail("timed again"))
    optimize_for_cpu(nn.Sequential(nn.Linear(40, 24)), kernels="fastest")


def test_a_large_model_is_timed_on_a_bounded_prefix(monkeypatch):
    import domino_hf.cpu_kernels as kernels

    layers = [nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 64), nn.Linear(32, 32)]
    monkeypatch.setattr(kernels, "TIMED_BYTES", 2 * 32 * 32 * 4)  # room for two of the square weights
    timed = kernels._timed_prefix(layers)
    # in forward order up to the budget, then one layer of each shape not met yet (the 64 x 32 one)
    assert timed == [layers[0], layers[1], layers[3]]


def test_calibrated_lengths_pick_the_kernel_per_forward_length(monkeypatch):
    import domino_hf.cpu_kernels as kernels

    stock, onednn, mkl = kernels.STOCK, kernels.ONEDNN, kernels.MKL
    # stock at 1-3 and 5 rows, packed at 4 and from 6: a length between candidates takes the lower one's choice
    table = kernels.kernel_table({1: stock, 2: stock, 3: stock, 4: mkl, 5: stock, 6: onednn, 8: mkl, 12: mkl, 16: mkl})
    assert table == (stock, stock, stock, stock, mkl, stock, onednn, onednn) + (mkl,) * 9
    assert kernels.kernel_table(20)[20] == stock and kernels.kernel_table(0)[1] == onednn
    assert kernels.kernel_table(2)[:4] == (stock, stock, stock, onednn)
    layer = optimize_for_cpu(nn.Sequential(nn.Linear(16, 32)), stock_rows=0).eval()
    layer[0].kernel_table = table
    assert kernels.describe_kernels([layer[0]]) == (
        "16x32: stock MKL at 1-3, packed MKL at 4, stock MKL at 5, packed oneDNN at 6-7, packed MKL at 8-16+")
    calls = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(kernels.F, "linear", lambda *a: calls.append(("stock", a[0].shape)) or linear(*a))
    mkl_linear = torch.ops.mkl._mkl_linear
    monkeypatch.setattr(kernels.torch.ops.mkl, "_mkl_linear", lambda *a: calls.append(("mkl", a[0].shape, a[-1]))
                        or mkl_linear(*a), raising=False)
    with torch.no_grad():
        for shape in [(1, 1, 16), (2, 2, 16), (5, 16), (1, 6, 16), (40, 16)]:
            x = torch.randn(shape)
            torch.testing.assert_close(layer(x), linear(x, layer[0].weight, layer[0].bias), atol=1e-5, rtol=1e-5)
    # rows = tokens × batch rows: 1 and 5 stock; 4 and 40 (longer than measured: the longest one's) packed MKL
    # with the row count the call computes; 6 oneDNN
    assert calls == [("stock", (1, 1, 16)), ("mkl", (2, 2, 16), 4), ("stock", (5, 16)), ("mkl", (40, 16), 40)]


@pytest.mark.parametrize(("seconds", "rows", "expected"), [
    ({0: 1.0, 1: 0.95, 2: 0.97}, 1, 0),  # close calls at plain decoding lengths stay stock
    ({0: 1.0, 1: 0.8, 2: 0.85}, 1, 1),  # packed clearly faster
    ({0: 1.0, 1: 0.95, 2: 0.97}, 4, 1),  # verify lengths: the fastest
    ({0: 1.0, 1: 1.2, 2: 0.99}, 8, 2),
    ({0: 1.0, 1: 1.2}, 8, 0),  # a dtype without MKL's packed GEMM: two kernels
])
def test_calibration_hands_plain_steps_to_packed_only_when_clearly_faster(seconds, rows, expected):
    import domino_hf.cpu_kernels as kernels

    assert kernels.choose_kernel(seconds, rows) == expected


@pytest.mark.parametrize("kernel", ["ONEDNN", "MKL"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_greedy_identity_on_each_packed_kernel(arch, kernel):
    import domino_hf.cpu_kernels as kernels

    target = optimize_for_cpu(make_tiny_target(arch, vocab_size=32), stock_rows=0)
    draft = make_tiny_draft(target)
    for module in target.modules():  # every forward length of every layer on this kernel
        if type(module) is PackedLinear:
            module.kernel_table = (getattr(kernels, kernel),) * (kernels.ROW_CANDIDATES[-1] + 1)
    ids = torch.arange(12)[None] % 32
    with torch.no_grad():
        optimized = target(ids).logits
        with stock_kernels(target):
            reference = target(ids).logits
    assert (optimized - reference).abs().max() <= 1e-4
    for ids in tiny_prompts(3, vocab_size=32):
        greedy_both(target, draft, ids, max_new_tokens=20)


def test_gradients_flow_through_the_stock_path():
    model = optimize_for_cpu(nn.Sequential(nn.Linear(8, 4)))
    reference = copy.deepcopy(model)
    restore_stock_kernels(reference)
    x = torch.randn(5, 8)
    model(x).square().sum().backward()
    reference(x).square().sum().backward()
    assert torch.equal(model[0].weight.grad, reference[0].weight.grad)


def test_stock_kernels_context_switches_back():
    target = optimize_for_cpu(make_tiny_target("llama", vocab_size=32))
    with stock_kernels(target):
        assert not is_optimized(target)
    assert is_optimized(target)


def test_training_restores_stock_kernels_on_the_draft(tmp_path, caplog):
    from transformers import TrainingArguments

    from domino_hf.training.objective import DominoObjective
    from domino_hf.training.trainer import DominoTrainer

    target = make_tiny_target("llama", vocab_size=32)
    draft = optimize_for_cpu(make_tiny_draft(target))
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with caplog.at_level(logging.WARNING):
        DominoTrainer(model=DominoObjective(draft), args=args, target=target, train_dataset=[])
    assert not is_optimized(draft)
    assert "restored stock kernels" in caplog.text


def test_skipped_layers_are_counted_and_other_devices_warned(caplog):
    class CustomLinear(nn.Linear):  # stands in for a quantised or adapter layer
        pass

    model = nn.Sequential(nn.Linear(4, 4), CustomLinear(4, 4), nn.Linear(4, 4).to(torch.float16))
    with caplog.at_level(logging.INFO, logger="domino_hf.cpu_kernels"):
        optimize_for_cpu(model)
    assert packed_layers(model) == 1
    assert "skipped 2" in caplog.text and "CustomLinear" in caplog.text and "float16" in caplog.text

    meta = make_tiny_target("llama", vocab_size=32).to("meta")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="domino_hf.cpu_kernels"):
        optimize_for_cpu(meta)
        optimize_for_cpu(meta)
    assert not is_optimized(meta)
    assert caplog.text.count("not the CPU") == 1


def test_bf16_layers_stay_stock_where_onednn_has_no_bf16_path(monkeypatch, caplog):
    """AVX2-only CPUs: oneDNN refuses to pack bf16 weights; those layers keep stock kernels and say why."""
    from domino_hf import cpu_kernels

    assert isinstance(cpu_kernels.packable(torch.bfloat16), bool)  # the real probe, whatever this CPU is
    assert cpu_kernels.packable(torch.float32) and not cpu_kernels.packable(torch.float16)
    monkeypatch.setitem(cpu_kernels._dtype_support, (cpu_kernels.ONEDNN, torch.bfloat16), False)
    draft_target = make_tiny_target("llama", vocab_size=32)
    draft = make_tiny_draft(draft_target).to(torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="domino_hf.cpu_kernels"):
        optimize_for_cpu(draft, kernels="fastest")
    assert packed_layers(draft) == 0 and "no oneDNN kernels for it on this CPU" in caplog.text
    optimize_for_cpu(draft_target, kernels="fastest")
    ids = tiny_prompts(1, vocab_size=32)[0]
    greedy_both(draft_target, draft, ids, max_new_tokens=8)  # a bf16 draft on stock kernels: still lossless


def test_a_packed_layer_cast_to_an_unpackable_dtype_runs_stock(monkeypatch):
    """Optimized in fp32, then `.to(bfloat16)` on a CPU without oneDNN bf16: the forward falls back, never repacks."""
    from domino_hf import cpu_kernels

    monkeypatch.setitem(cpu_kernels._dtype_support, (cpu_kernels.ONEDNN, torch.bfloat16), False)
    layer = optimize_for_cpu(nn.Sequential(nn.Linear(8, 8)), kernels="fastest")[0]
    assert type(layer) is PackedLinear
    layer.to(torch.bfloat16)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
