"""Cheap, exact CPU inference kernels for any 🤗 model: every `nn.Linear` on the fastest GEMM for each forward length.

Why: speculative decoding pays one target forward over k+1 tokens per step. With stock fp32 kernels
(`nn.Linear` → MKL sgemm) a forward over 2–16 tokens costs 1.3–1.6× a 1-token forward on these CPUs, which
eats most of what a draft saves. The same GEMMs on weights reordered once into a packed layout (oneDNN's, or
MKL's packed GEMM) cost much less above a few rows (docs/cpu_kernels.md). Which kernel wins depends on the CPU,
the layer shape and the forward's length, so each layer runs, for each length, the kernel that measured
fastest for its shape on this machine (`calibrate_kernels`).

Contract of `optimize_for_cpu(model)`:

* In place, returns the model; idempotent (a second call repacks nothing). Opt-in, for inference.
* Every plain `nn.Linear` on the CPU in float32 or bfloat16 runs on its kernel table (the LM head included; a
  tied input embedding keeps using the original tensor). Subclasses of `nn.Linear` (quantised
  layers, LoRA wrappers, …) and other dtypes are left alone and counted in one log line, and so are bfloat16
  layers on a CPU where oneDNN has no bf16 path (AVX2-only machines: it needs AVX-512 or AVX-NE-CONVERT).
* The parameters are untouched, so `state_dict`/`save_pretrained` write exactly what they wrote before: the
  packed copies are a plain attribute, never a buffer.
* Always correct, never stale: a packed copy is used only when no gradient is needed and the weight is
  still the tensor (same version, dtype and device) it was packed from; otherwise the stock `F.linear` runs,
  or the call repacks. Training an optimized model therefore trains the real weights;
  `domino train` still undoes the optimisation first (`restore_stock_kernels`) to free the copies.
* On a model that is not on the CPU it does nothing and warns once.
* Memory: one packed copy of a weight per packed kernel its table uses (none where stock wins everywhere).
* Attention and KV cache, for a model that generates (the target): attention on "sdpa" switches to
  `cpu_attention.ATTENTION_NAME` (grouped-query heads inside the call: no copy of the cache per verify), and
  `generate` decodes on a `kv_cache.GrowingCache` (appends in place instead of `torch.cat`). Both through
  transformers' public extension points, on one model instance; plain decoding and every speculative method
  run on them alike. `restore_stock_kernels` and `stock_kernels` undo them too.

Outputs are not bit-identical to stock kernels (another summation order), but as close as two fp32 GEMMs
get (≤ 1e-4 on logits in the tests); the target with optimized kernels is the model you decode with, and
speculative decoding stays exactly lossless against plain decoding *on the same kernels*.

By default (`kernels="auto"`), and with `kernels="invariant"`, the kernel of every length is the length-invariant
one (`exact_kernels`, `EXACT`) where this CPU has it for the model's dtype: each output computed in one fixed order
whatever the forward's length, so a token's logits are bitwise the same in a plain step and in a verify. The
target's attention then runs on `exact_kernels.ATTENTION_NAME`, and a self-check at load proves the whole forward
(`model.domino_length_invariant`); where that cannot hold, one log line says why and the calibrated kernels above
run (with "invariant", it raises). `kernels="fastest"` asks for those directly.
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

from . import exact_kernels
from .cpu_attention import ATTENTION_NAME as GQA_ATTENTION
from .cpu_attention import STOCK_ATTENTION, use_gqa_attention, use_stock_attention
from .kv_cache import GrowingCacheGenerate, use_default_cache, use_growing_cache

logger = logging.getLogger(__name__)

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
# The kernels a layer can run, by id in `PackedLinear.kernel_table`.
STOCK, ONEDNN, MKL, EXACT = 0, 1, 2, 3
KERNEL_NAMES = ("stock MKL", "packed oneDNN", "packed MKL", "length-invariant")
# Forward lengths (rows: tokens × batch rows) at which the kernels are timed: plain steps (1 token a row),
# verifies at batch size 1 (a few tokens) and batches of verifies (B × q). A length between two of them takes
# the choice of the lower one; longer forwards (prefill) take the longest one's.
ROW_CANDIDATES = (1, 2, 3, 4, 5, 6, 8, 12, 16)
STOCK_MARGIN = 0.9  # a packed kernel takes a plain step's length only when ≥ 10% faster: close calls stay stock
PLAIN_ROWS = 2  # forward lengths of plain decoding at batch sizes 1 and 2
MKL_PACKED_ROWS = 64
TIMED_BYTES = 2**30  # the calibration streams at most this much of a model's weights (each kernel's copy)
TIMING_ROUNDS = 3
_warned_devices: set[str] = set()
_dtype_support: dict[tuple[int, torch.dtype], bool] = {}
# (out, in, dtype, threads) -> {rows: kernel} for ROW_CANDIDATES, measured once per process
_kernel_choices: dict[tuple, dict[int, int]] = {}


def _pack(kernel: int, weight: torch.Tensor) -> torch.Tensor:
    if kernel == MKL:
        # MKL picks the packed layout for the rows given here; any row count can use it, and a layout for 64 rows
        # was the fastest from 1 to 16 rows on an AMX Xeon (a 1-row layout is 1.3-1.6x slower from 2 rows)
        return torch.ops.mkl._mkl_reorder_linear_weight(weight, MKL_PACKED_ROWS)
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def packable(dtype: torch.dtype, kernel: int = ONEDNN) -> bool:
    """Whether `kernel` (ONEDNN or MKL) packs weights of `dtype` on this CPU and torch build: asked once, by
    packing a tiny weight (oneDNN's bf16 path refuses CPUs without AVX-512 or AVX-NE-CONVERT; MKL's packed GEMM
    is float32 only, on x86 builds)."""
    if dtype not in PACKABLE_DTYPES or (kernel == MKL and dtype != torch.float32):
        return False
    if (kernel, dtype) not in _dtype_support:
        try:
            _pack(kernel, torch.zeros(16, 16, dtype=dtype))
            _dtype_support[kernel, dtype] = True
        except (RuntimeError, AttributeError, NotImplementedError):  # a build without these ops: stock kernels
            _dtype_support[kernel, dtype] = False
    return _dtype_support[kernel, dtype]


def choose_kernel(seconds: dict[int, float], rows: int) -> int:
    """The kernel for one layer shape at a forward of `rows` rows, from its measured time per kernel: the
    fastest; at plain decoding lengths (`PLAIN_ROWS`) only if it beats the stock kernel by `STOCK_MARGIN`.

    Close calls at 1-2 rows go to stock because those are plain decoding steps, which stock transformers runs
    on stock kernels: with the margin the other way, timing noise on a busy machine left a third of SmolLM2's
    layers packed at 1 row in one run, and plain decoding on "optimized" kernels 15% slower than stock."""
    fastest = min(seconds, key=seconds.get)
    margin = STOCK_MARGIN if rows <= PLAIN_ROWS else 1.0
    return fastest if seconds[fastest] < margin * seconds[STOCK] else STOCK


def kernel_table(choices: int | dict[int, int]) -> tuple[int, ...]:
    """The kernel of a forward of r rows (index r, up to the longest of `ROW_CANDIDATES`): from calibrated
    choices `{rows: kernel}` (a length between two candidates takes the lower one's choice, longer forwards
    the longest one's), or from an int n (stock up to n rows, packed oneDNN beyond)."""
    if isinstance(choices, int):
        return tuple(STOCK if rows <= choices else ONEDNN for rows in range(max(choices, ROW_CANDIDATES[-1]) + 1))
    table = [STOCK]
    for rows in range(1, ROW_CANDIDATES[-1] + 1):
        table.append(choices[rows] if rows in choices else table[-1])
    return tuple(table)


def _layer_key(layer: nn.Linear) -> tuple:
    return (*layer.weight.shape, layer.weight.dtype, torch.get_num_threads())


def _weight_key(weight: torch.Tensor) -> tuple:
    """What a packed copy was made from: the tensor's storage, in-place version, dtype and device."""
    return (weight.data_ptr(), weight._version, weight.dtype, weight.device)


class PackedLinear(nn.Linear):
    """`nn.Linear` whose inference forward runs, for each forward length, the kernel that measured fastest
    for its shape on this CPU: stock MKL, oneDNN or MKL's packed GEMM on a pre-packed copy of the weight.

    Installed by swapping the class of an existing `nn.Linear` (no new parameters, same state dict); the
    stock forward runs whenever a gradient is needed. The copies its kernel table uses are packed at load
    (`pack_for_table`) and again on first use after the weight changes.
    """

    _packed: dict[int, tuple[tuple, torch.Tensor]]  # kernel -> (weight key it was packed from, packed copy)
    kernel_table: tuple[int, ...] = ()  # kernel_table[r]: the kernel of a forward of r rows

    def packed_weight(self, kernel: int) -> torch.Tensor:
        """The weight packed for `kernel`, repacked if the weight changed since (never stale)."""
        key = _weight_key(self.weight)
        entry = self._packed.get(kernel)
        if entry is None or entry[0] != key:
            entry = self._packed[kernel] = (key, _pack(kernel, self.weight.detach()))
        return entry[1]

    def run_kernel(self, x: torch.Tensor, kernel: int, rows: int) -> torch.Tensor:
        weight = self.weight
        packed = exact_kernels.supported(weight.dtype) if kernel == EXACT else packable(weight.dtype, kernel)
        if kernel == STOCK or weight.device.type != "cpu" or x.dtype != weight.dtype or not packed or (
                torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad)):
            return F.linear(x, weight, self.bias)
        if kernel == EXACT:
            return exact_kernels.linear(x, weight, self.bias)
        if kernel == MKL:  # packed MKL GEMM; its last argument is the rows the call computes
            return torch.ops.mkl._mkl_linear(x, self.packed_weight(MKL), weight, self.bias, rows)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(ONEDNN), self.bias, "none", [], "")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(1, x.shape[-1])
        table = self.kernel_table
        return self.run_kernel(x, table[min(rows, len(table) - 1)] if table else STOCK, rows)

    def pack_for_table(self) -> None:
        """Pack the copies the kernel table uses (now, not in the first forward) and free the others."""
        used = {k for k in self.kernel_table if k not in (STOCK, EXACT) and packable(self.weight.dtype, k)}
        for kernel in set(self._packed) - used:
            del self._packed[kernel]
        for kernel in used:
            self.packed_weight(kernel)

    def __getstate__(self):
        # packed tensors cannot be copied or pickled: a deep copy / unpickled module repacks on first use.
        state = self.__dict__.copy()
        state["_packed"] = {}
        return state


def _timed_prefix(layers: list[PackedLinear]) -> list[PackedLinear]:
    """The layers the calibration times: in forward order, up to `TIMED_BYTES` of weights, then one layer of
    each shape not met by then (so a large model is timed on a bounded copy; a decoding step reads its weights
    from memory, and streaming this many of them in order does the same)."""
    timed, seen, total = [], set(), 0
    for layer in layers:
        key = _layer_key(layer)
        size = layer.weight.numel() * layer.weight.element_size()
        if total + size <= TIMED_BYTES or key not in seen:
            timed.append(layer)
            seen.add(key)
            total += size
    return timed


def calibrate_kernels(layers: list[PackedLinear]) -> None:
    """Measure, for each layer shape (and dtype, thread count) not measured yet in this process, which kernel
    is the fastest at each of `ROW_CANDIDATES` rows (`choose_kernel`), into `_kernel_choices`.

    Timed in the model's own forward order, all layers at one length on one kernel in a pass, so each weight is
    read as a decoding step reads it (from memory on a model larger than the CPU's cache, from cache on a tiny
    one); the passes of the kernels alternate and each shape's time is the median over `TIMING_ROUNDS` rounds.
    About 4 s for SmolLM2-135M (its packed copies of the timed layers exist side by side meanwhile).

    Why per length: which GEMM wins depends on the CPU and on the rows. On AVX-512 machines the packed oneDNN
    kernels won from 1 row; on an AMX machine stock MKL is faster for SmolLM2's layers up to 3 rows, MKL's packed
    GEMM from 4, and oneDNN for the LM head from 4 (docs/cpu_kernels.md)."""
    todo = [layer for layer in layers if _layer_key(layer) not in _kernel_choices]
    if not todo:
        return
    timed = [(layer, _layer_key(layer)) for layer in _timed_prefix(todo)]
    kernels = {key: [k for k in (STOCK, ONEDNN, MKL) if k == STOCK or packable(key[2], k)] for _, key in timed}
    choices: dict[tuple, dict[int, int]] = {key: {} for key in kernels}
    with torch.no_grad():
        for rows in ROW_CANDIDATES:
            inputs = {key: torch.randn(rows, key[1], dtype=key[2]) for key in kernels}

            def one_pass(kernel: int) -> dict[tuple, float]:
                seconds = dict.fromkeys(kernels, 0.0)
                for layer, key in timed:
                    if kernel in kernels[key]:
                        start = time.perf_counter()
                        layer.run_kernel(inputs[key], kernel, rows)
                        seconds[key] += time.perf_counter() - start
                return seconds

            warm = sum(sum(one_pass(kernel).values()) for kernel in (STOCK, ONEDNN, MKL))  # packs, warms up
            repeats = max(1, min(25, int(0.01 / max(warm, 1e-7))))  # tiny models: several passes a sample
            samples: dict[tuple, dict[int, list[float]]] = {key: {k: [] for k in kernels[key]} for key in kernels}
            for _ in range(TIMING_ROUNDS):
                for kernel in (STOCK, ONEDNN, MKL):
                    passes = [one_pass(kernel) for _ in range(repeats)]
                    for key in kernels:
                        if kernel in kernels[key]:
                            samples[key][kernel].append(statistics.median(p[key] for p in passes))
            for key in kernels:
                choices[key][rows] = choose_kernel({k: statistics.median(s) for k, s in samples[key].items()}, rows)
    _kernel_choices.update(choices)


def _model_device(model: nn.Module) -> torch.device | None:
    for parameter in model.parameters():
        return parameter.device
    return None


def optimize_for_cpu(model: nn.Module, stock_rows: int | None = None, kernels: str = "auto") -> nn.Module:
    """Run every plain `nn.Linear` of `model` on the length-invariant kernels, or on the fastest of stock MKL,
    packed oneDNN and packed MKL weights for each forward length; see the module doc.

    `kernels`: "invariant" runs the length-invariant kernels (`exact_kernels`: a token's logits bitwise the same in
    a one-token step, a verify, a tree or a padded batch) and raises where this CPU lacks them for the model's dtype
    or, for a model that generates, the self-check fails. "auto" (the default) does so wherever they run (fp32 and
    bf16, targets and drafts: on the CPUs measured they are also the fastest for a plain step and short verifies,
    docs/cpu_kernels.md), falling back to the fastest kernels with one log line. "fastest" never uses them: each
    layer on the fastest of stock MKL, packed oneDNN and packed MKL at each forward length (faster from about 9
    rows on, not length-invariant).

    `stock_rows`: None (the default) measures, per layer shape on this CPU, which kernel is the fastest at each
    forward length (`calibrate_kernels`); an int n keeps the stock kernel for forwards of at most n rows
    (tokens × batch rows; a plain decoding step is one token) and packs oneDNN weights for longer ones, 0 for
    every forward.
    Returns `model` (changed in place). Logs how many layers were packed and how many were skipped (layers
    that are `nn.Linear` subclasses such as quantised or adapter layers, or in a dtype other than
    float32/bfloat16), and which kernel each shape runs at which lengths.
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
    layers, already = [], 0
    skipped: dict[str, int] = {}
    for module in model.modules():
        if type(module) is PackedLinear:
            already += 1
        elif type(module) is nn.Linear and module.weight.device.type == "cpu" and packable(module.weight.dtype):
            module.__class__ = PackedLinear
            module._packed = {}
            layers.append(module)
        elif isinstance(module, nn.Linear):
            reason = type(module).__name__ if type(module) is not nn.Linear else f"{module.weight.dtype}"
            if module.weight.dtype in PACKABLE_DTYPES:
                reason += " (no oneDNN kernels for it on this CPU)"
            skipped[reason] = skipped.get(reason, 0) + 1
    if kernels not in KERNEL_CHOICES:
        raise ValueError(f"optimize_for_cpu: kernels={kernels!r}; choose one of {', '.join(KERNEL_CHOICES)}.")
    every = [m for m in model.modules() if type(m) is PackedLinear]
    invariant = stock_rows is None and _wants_invariant_kernels(model, every, kernels) and _use_invariant_kernels(
        model, every, kernels)
    if not invariant:
        model.domino_length_invariant = False
        if stock_rows is None:
            calibrate_kernels(layers)
        for layer in layers:
            layer.kernel_table = kernel_table(_kernel_choices[_layer_key(layer)] if stock_rows is None else stock_rows)
            layer.pack_for_table()
    if layers or skipped or already:
        detail = ", ".join(f"{n} × {why}" for why, n in sorted(skipped.items()))
        logger.info(
            "optimize_for_cpu: %d linear layer(s) on optimized kernels%s; skipped %d%s.",
            len(layers),
            f" ({already} already)" if already else "",
            sum(skipped.values()),
            f" ({detail})" if detail else "",
        )
    if layers and not invariant:  # the length-invariant kernel runs every length (said above)
        logger.info("optimize_for_cpu: kernels by forward rows on this CPU: %s.", describe_kernels(layers))
    if not invariant:
        _use_fast_attention_and_cache(model)
    return model


KERNEL_CHOICES = ("auto", "invariant", "fastest")
INVARIANT_TABLE = (EXACT,) * (ROW_CANDIDATES[-1] + 1)


def _generates(model: nn.Module) -> bool:
    """A causal LM (a target): its attention and whole forward count; a draft (no output embeddings) only proposes."""
    return callable(getattr(model, "can_generate", None)) and model.can_generate() and callable(
        getattr(model, "get_output_embeddings", None)) and model.get_output_embeddings() is not None


def _wants_invariant_kernels(model: nn.Module, layers: list[PackedLinear], kernels: str) -> bool:
    if kernels != "auto":
        return kernels == "invariant"
    return bool(layers)


def _use_invariant_kernels(model: nn.Module, layers: list[PackedLinear], kernels: str) -> bool:
    """Put `layers` and, for a model that generates, its attention on the length-invariant kernels and prove them
    with `exact_kernels.self_check`; True when they run. Otherwise (another CPU or dtype, no compiler, a failed
    self-check) everything is as before, one log line says why, and with kernels="invariant" it raises."""
    dtypes = {layer.weight.dtype for layer in layers} or {getattr(model, "dtype", torch.float32)}
    dtype = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
    reason = next(filter(None, map(exact_kernels.unavailable_reason, dtypes)), None)
    generates = _generates(model)
    tables = [layer.kernel_table for layer in layers]
    if reason is None:
        for layer in layers:
            layer.kernel_table = INVARIANT_TABLE
            layer.pack_for_table()
        if generates:
            attention = getattr(model.config, "_attn_implementation", None)
            if attention not in exact_kernels.REPLACEABLE_ATTENTION:
                reason = f"attention {attention!r} (sdpa or eager can be replaced)"
            else:
                if attention != exact_kernels.ATTENTION_NAME:  # what restoring the stock attention goes back to
                    model.domino_stock_attention = STOCK_ATTENTION if attention == GQA_ATTENTION else attention
                exact_kernels.register_attention()
                model.set_attn_implementation(exact_kernels.ATTENTION_NAME)
                use_growing_cache(model)
                failure = exact_kernels.self_check(model)
                if failure is not None:
                    reason = f"the self-check failed on {type(model).__name__}: {failure}"
                    model.set_attn_implementation(attention)
                    use_default_cache(model)
    model.domino_length_invariant = reason is None and generates
    if reason is None:
        logger.info("optimize_for_cpu: %d linear layer(s) and %s on the length-invariant kernels (%s)%s.",
                    len(layers), "attention" if generates else "no attention", dtype,
                    "; self-check passed" if generates else "")
        return True
    for layer, table in zip(layers, tables):
        layer.kernel_table = table
    if kernels == "invariant":
        raise RuntimeError(f"optimize_for_cpu: no length-invariant kernels here: {reason}.")
    logger.info("optimize_for_cpu: length-invariant kernels not used (%s); the fastest kernels run instead.", reason)
    return False


def describe_kernels(layers: list[PackedLinear]) -> str:
    """Which kernel each layer shape runs at which forward lengths, e.g.
    `576x1536: stock MKL at 1-3, packed MKL at 4-16+`."""
    shapes = {}
    for layer in layers:
        shapes.setdefault(tuple(layer.weight.shape), layer.kernel_table)
    said = []
    for (out_features, in_features), table in shapes.items():
        runs = []
        for kernel, group in itertools.groupby(range(1, len(table)), key=table.__getitem__):
            rows = list(group)
            runs.append(f"{KERNEL_NAMES[kernel]} at {rows[0]}" + (f"-{rows[-1]}" if len(rows) > 1 else ""))
        said.append(f"{in_features}x{out_features}: {', '.join(runs)}+")
    return "; ".join(said)


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
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == exact_kernels.ATTENTION_NAME:
        model.set_attn_implementation(vars(model).get("domino_stock_attention", STOCK_ATTENTION))
    use_stock_attention(model)
    use_default_cache(model)
    if "domino_length_invariant" in vars(model):
        model.domino_length_invariant = False


def restore_stock_kernels(model: nn.Module) -> nn.Module:
    """Undo `optimize_for_cpu`: plain `nn.Linear` layers again, packed copies freed, stock attention and KV
    cache. Idempotent."""
    _use_stock_attention_and_cache(model)
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__class__ = nn.Linear
            module.__dict__.pop("_packed", None)
            module.__dict__.pop("kernel_table", None)
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
    invariant = vars(model).get("domino_length_invariant")
    for module in layers:
        module.__class__ = nn.Linear
    _use_stock_attention_and_cache(model)
    try:
        yield model
    finally:
        for module in layers:
            module.__class__ = PackedLinear
        if attention == exact_kernels.ATTENTION_NAME:
            model.set_attn_implementation(attention)
        elif attention != getattr(model.config, "_attn_implementation", attention):
            use_gqa_attention(model)
        if growing:
            use_growing_cache(model)
        if invariant is not None:
            model.domino_length_invariant = invariant
