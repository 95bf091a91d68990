"""Cheap, exact CPU inference kernels for any 🤗 model: every `nn.Linear` on weights pre-packed for oneDNN.

Why: speculative decoding pays one target forward over k+1 tokens per step. With stock fp32 kernels
(`nn.Linear` → MKL sgemm) a forward over 2–16 tokens costs 1.3–1.6× a 1-token forward on these CPUs, which
eats most of what a draft saves. The same GEMMs on oneDNN with the weights reordered once into its blocked
layout cost about the same for 1 to 8 rows (docs/cpu_kernels.md). Which kernel wins for a 1-token step
depends on the CPU and on the forward's length, so each layer shape keeps the stock kernel for the forward
lengths where it measured faster on this one (`calibrate_stock_rows`).

Contract of `optimize_for_cpu(model)`:

* In place, returns the model; idempotent (a second call repacks nothing). Opt-in, for inference.
* Every plain `nn.Linear` on the CPU in float32 or bfloat16 gets a packed copy of its weight (the LM head
  included; a tied input embedding keeps using the original tensor). Subclasses of `nn.Linear` (quantised
  layers, LoRA wrappers, …) and other dtypes are left alone and counted in one log line, and so are bfloat16
  layers on a CPU where oneDNN has no bf16 path (AVX2-only machines: it needs AVX-512 or AVX-NE-CONVERT).
* The parameters are untouched, so `state_dict`/`save_pretrained` write exactly what they wrote before: the
  packed copy is a plain attribute, never a buffer.
* Always correct, never stale: the packed copy is used only when no gradient is needed and the weight is
  still the tensor (same version, dtype and device) it was packed from; otherwise the stock `F.linear` runs,
  and the next inference call repacks. Training an optimized model therefore trains the real weights;
  `domino train` still undoes the optimisation first (`restore_stock_kernels`) to free the copies.
* On a model that is not on the CPU it does nothing and warns once.
* Memory: one packed copy per weight (+ the model's Linear weights in resident memory, measured in the docs).
* Attention and KV cache, for a model that generates (the target): attention on "sdpa" switches to
  `cpu_attention.ATTENTION_NAME` (grouped-query heads inside the call: no copy of the cache per verify), and
  `generate` decodes on a `kv_cache.GrowingCache` (appends in place instead of `torch.cat`). Both through
  transformers' public extension points, on one model instance; plain decoding and every speculative method
  run on them alike. `restore_stock_kernels` and `stock_kernels` undo them too.

Outputs are not bit-identical to stock kernels (another summation order), but as close as two fp32 GEMMs
get (≤ 1e-4 on logits in the tests); the target with optimized kernels is the model you decode with, and
speculative decoding stays exactly lossless against plain decoding *on the same kernels*.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import statistics
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_attention import use_gqa_attention, use_stock_attention
from .kv_cache import GrowingCacheGenerate, use_default_cache, use_growing_cache

logger = logging.getLogger(__name__)

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
# Forward lengths (rows: tokens × batch rows) at which the two kernels are timed: plain steps (1 token a row),
# verifies at batch size 1 (a few tokens) and batches of verifies (B × q). A length between two of them takes
# the choice of the lower one; longer forwards always run packed.
ROW_CANDIDATES = (1, 2, 3, 4, 5, 6, 8, 12, 16)
COLD_BYTES = 64 * 2**20  # timed weights span more than a CPU cache
STOCK_MARGIN = 0.9  # packed kernels take a forward length only when ≥ 10% faster there: close calls stay stock
_warned_devices: set[str] = set()
_dtype_support: dict[torch.dtype, bool] = {}
_stock_rows: dict[tuple, tuple[int, ...]] = {}  # (out, in, dtype, threads) -> calibrated stock lengths


def packable(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of `dtype` on this CPU: asked once, by packing a tiny weight (its bf16 path
    refuses CPUs without AVX-512 or AVX-NE-CONVERT)."""
    if dtype not in PACKABLE_DTYPES:
        return False
    if dtype not in _dtype_support:
        try:
            torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), None)
            _dtype_support[dtype] = True
        except (RuntimeError, AttributeError):  # also a torch build without these oneDNN ops: stock kernels
            _dtype_support[dtype] = False
    return _dtype_support[dtype]


def _median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def calibrate_stock_rows(weight: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[int, ...]:
    """The forward lengths (rows, from `ROW_CANDIDATES`) at which the stock kernel stays on this CPU for a
    weight of this shape and dtype, at the current thread count: the packed kernel takes a length where it is
    faster by `STOCK_MARGIN`. Timed once per process and shape (interleaved medians, about a second for
    SmolLM2's LM head, well under for the other layers).

    Close calls go to stock because 1-2-row forwards are plain decoding steps, which stock transformers runs
    on stock kernels: with the margin the other way, timing noise on a busy machine left a third of SmolLM2's
    layers packed at 1 row in one run, and plain decoding on "optimized" kernels 15% slower than stock.

    Why per length: which GEMM wins depends on the CPU and on the rows. On the AVX-512 machines of
    docs/cpu_kernels.md the packed kernels won from 1 row; on an AMX machine MKL is faster for every layer of
    SmolLM2 up to 3 or 4 rows and for some at 5 and more, while packed wins from 2 rows for the LM head."""
    key = (*weight.shape, weight.dtype, torch.get_num_threads())
    if key not in _stock_rows:
        # A decoding step reads each weight from memory, not from cache: time on enough copies to flush it.
        copies = max(1, min(64, COLD_BYTES // max(1, weight.numel() * weight.element_size())))
        stock_rows = []
        with torch.no_grad():
            weights = [weight.detach().clone() for _ in range(copies)]
            packed_weights = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
            for rows in ROW_CANDIDATES:
                x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
                stock_cycle, packed_cycle = itertools.cycle(weights), itertools.cycle(packed_weights)

                def stock(x=x, cycle=stock_cycle):
                    return F.linear(x, next(cycle), bias)

                def packed(x=x, cycle=packed_cycle):
                    return torch.ops.mkldnn._linear_pointwise(x, next(cycle), bias, "none", [], "")

                stock(), packed()  # warm-up
                one = _median_seconds(stock, 3) + _median_seconds(packed, 3)
                repeats = max(3, min(25, int(0.02 / max(one, 1e-7))))  # ~40 ms per row count at most
                stock_s, packed_s = [], []
                for _ in range(3):  # interleaved rounds: a drift of a shared machine hits both
                    stock_s.append(_median_seconds(stock, repeats))
                    packed_s.append(_median_seconds(packed, repeats))
                if statistics.median(packed_s) >= STOCK_MARGIN * statistics.median(stock_s):
                    stock_rows.append(rows)
        _stock_rows[key] = tuple(stock_rows)
    return _stock_rows[key]


def stock_table(stock_rows: int | tuple[int, ...]) -> tuple[bool, ...]:
    """Whether a forward of r rows (index r, up to the longest of `ROW_CANDIDATES`) runs the stock kernel:
    from calibrated lengths (a length between two candidates takes the lower one's choice), or from an int n
    (stock up to n rows)."""
    if isinstance(stock_rows, int):
        return tuple(0 < rows <= stock_rows for rows in range(max(stock_rows, ROW_CANDIDATES[-1]) + 1))
    table = [False]
    for rows in range(1, ROW_CANDIDATES[-1] + 1):
        table.append(rows in stock_rows if rows in ROW_CANDIDATES else table[-1])
    return tuple(table)


def _weight_key(weight: torch.Tensor) -> tuple:
    """What the packed copy was made from: the tensor's storage, in-place version, dtype and device."""
    return (weight.data_ptr(), weight._version, weight.dtype, weight.device)


class PackedLinear(nn.Linear):
    """`nn.Linear` whose inference forward runs oneDNN on a pre-packed copy of the weight.

    Installed by swapping the class of an existing `nn.Linear` (no new parameters, same state dict); the
    stock forward runs whenever a gradient is needed, and for inputs of the lengths (rows: tokens × batch)
    where the stock kernel is the faster one on this CPU (`calibrate_stock_rows`, `stock_table`).
    """

    _packed_weight: torch.Tensor | None
    _packed_key: tuple | None
    stock_table: tuple[bool, ...] = ()  # stock_table[r]: a forward of r rows runs the stock kernel

    def repack(self) -> None:
        weight = self.weight.detach()
        self._packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self._packed_key = _weight_key(self.weight)

    def _can_use_packed(self, x: torch.Tensor) -> bool:
        weight = self.weight
        if weight.device.type != "cpu" or not packable(weight.dtype) or x.dtype != weight.dtype:
            return False
        return not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(1, x.shape[-1])
        if (rows < len(self.stock_table) and self.stock_table[rows]) or not self._can_use_packed(x):
            return F.linear(x, self.weight, self.bias)
        if self._packed_key != _weight_key(self.weight):
            self.repack()
        return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight, self.bias, "none", [], "")

    def __getstate__(self):
        # oneDNN tensors cannot be copied or pickled: a deep copy / unpickled module repacks on first use.
        state = self.__dict__.copy()
        state["_packed_weight"], state["_packed_key"] = None, None
        return state


def _model_device(model: nn.Module) -> torch.device | None:
    for parameter in model.parameters():
        return parameter.device
    return None


def optimize_for_cpu(model: nn.Module, stock_rows: int | None = None) -> nn.Module:
    """Run every plain `nn.Linear` of `model` on pre-packed oneDNN weights; see the module doc.

    `stock_rows`: forwards of at most this many rows (tokens × batch rows) keep the stock kernels (a plain
    decoding step is one token); None measures, per layer shape on this CPU, at which lengths the stock kernel
    is the faster (`calibrate_stock_rows`); 0 packs every forward.
    Returns `model` (changed in place). Logs how many layers were packed and how many were skipped (layers
    that are `nn.Linear` subclasses such as quantised or adapter layers, or in a dtype other than
    float32/bfloat16).
    """
    device = _model_device(model)
    if device is None:
        return model
    if device.type != "cpu":
        name = type(model).__name__
        if name not in _warned_devices:
            _warned_devices.add(name)
            logger.warning("optimize_for_cpu: %s is on %s, not the CPU; leaving its kernels unchanged.", name, device)
        return model
    if not torch.backends.mkldnn.is_available():
        logger.warning("optimize_for_cpu: this PyTorch build has no oneDNN (mkldnn); leaving kernels unchanged.")
        return model
    packed = already = 0
    skipped: dict[str, int] = {}
    rows_used: dict[int | tuple[int, ...], int] = {}
    with torch.no_grad():
        for module in model.modules():
            if type(module) is PackedLinear:
                already += 1
            elif type(module) is nn.Linear and module.weight.device.type == "cpu" and packable(module.weight.dtype):
                module.__class__ = PackedLinear
                module.repack()
                lengths = calibrate_stock_rows(module.weight, module.bias) if stock_rows is None else stock_rows
                module.stock_table = stock_table(lengths)
                rows_used[lengths] = rows_used.get(lengths, 0) + 1
                packed += 1
            elif isinstance(module, nn.Linear):
                reason = type(module).__name__ if type(module) is not nn.Linear else f"{module.weight.dtype}"
                if module.weight.dtype in PACKABLE_DTYPES:
                    reason += " (no oneDNN kernels for it on this CPU)"
                skipped[reason] = skipped.get(reason, 0) + 1
    if packed or skipped or already:
        detail = ", ".join(f"{n} × {why}" for why, n in sorted(skipped.items()))
        logger.info(
            "optimize_for_cpu: %d linear layer(s) on pre-packed oneDNN weights%s; skipped %d%s.",
            packed,
            f" ({already} already)" if already else "",
            sum(skipped.values()),
            f" ({detail})" if detail else "",
        )
    stock_where = [(lengths, n) for lengths, n in rows_used.items() if lengths]
    if stock_where:
        def said(lengths):
            return f"up to {lengths}" if isinstance(lengths, int) else "at " + ", ".join(map(str, lengths))
        logger.info("optimize_for_cpu: stock kernels where faster on this CPU: %s.", "; ".join(
            f"{n} layer(s) {said(lengths)} row(s)" for lengths, n in stock_where))
    _use_fast_attention_and_cache(model)
    return model


def _use_fast_attention_and_cache(model: nn.Module) -> tuple[bool, bool]:
    """Grouped-query attention without repeated heads and the growing KV cache, for a model that generates."""
    can_generate = getattr(model, "can_generate", None)
    if not callable(can_generate) or not can_generate():
        return False, False
    attention, cache = use_gqa_attention(model), use_growing_cache(model)
    logger.info("optimize_for_cpu: %s; %s.",
                "grouped-query attention without repeated heads" if attention else "attention unchanged",
                "generate appends to a growing KV cache in place" if cache else "KV cache unchanged")
    return attention, cache


def _use_stock_attention_and_cache(model: nn.Module) -> None:
    use_stock_attention(model)
    use_default_cache(model)


def restore_stock_kernels(model: nn.Module) -> nn.Module:
    """Undo `optimize_for_cpu`: plain `nn.Linear` layers again, packed copies freed, stock attention and KV
    cache. Idempotent."""
    _use_stock_attention_and_cache(model)
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__class__ = nn.Linear
            module.__dict__.pop("_packed_weight", None)
            module.__dict__.pop("_packed_key", None)
            module.__dict__.pop("stock_table", None)
    return model


def is_optimized(model: nn.Module) -> bool:
    """Whether any layer of `model` runs on packed weights."""
    return any(type(m) is PackedLinear for m in model.modules())


@contextlib.contextmanager
def stock_kernels(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily run an optimized model on the stock kernels (the packed copies are kept for afterwards),
    stock attention and the stock KV cache included.

    The benchmark uses it to time stock transformers decoding interleaved with the optimized methods on one
    loaded model.
    """
    layers = [m for m in model.modules() if type(m) is PackedLinear]
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    growing = isinstance(model.__dict__.get("generate"), GrowingCacheGenerate)
    for module in layers:
        module.__class__ = nn.Linear
    _use_stock_attention_and_cache(model)
    try:
        yield model
    finally:
        for module in layers:
            module.__class__ = PackedLinear
        if attention != getattr(model.config, "_attn_implementation", attention):
            use_gqa_attention(model)
        if growing:
            use_growing_cache(model)
