"""Reference rows of `domino bench`: decoding that is timed beside the methods but not lossless-checked.

* `autoregressive_stock_fp32` (`StockFloat32Autoregressive`): plain decoding by a second copy of the target in
  float32 on transformers' stock kernels, timed beside a bfloat16 target. Its `speedup_vs_stock_fp32` column says what
  bf16 on the product's kernels gains over stock transformers in fp32. Its tokens are another dtype's, so they are
  not compared with the bf16 target's.
* `llama_cpp` (`LlamaCppMethod`): llama.cpp (llama-cpp-python) decoding the packaged target's own Q4_1 GGUF on the
  same prompt token ids, with the benchmark's threads, greedily (or at its temperature): the CPU anchor. Another
  engine on the quantised weights (transformers runs them dequantised), so its tokens are not compared either.
  Its decode time is taken as the other methods' is: from the first generated token (prefill excluded) to the last.

Both run in the single-prompt table (and in the repeated-workload suite), one prompt per call; at batch sizes
above 1 they are not applicable.
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from .runner import Method
from .stats import AR_STOCK, AR_STOCK_FP32, LLAMA_CPP

logger = logging.getLogger(__name__)

LLAMA_CPP_TARGETS = ("smollm2",)  # targets whose GGUF llama.cpp can read (`targets.smollm2_gguf`)
LLAMA_CPP_FIX = ('pip install "domino-hf[serve]" (llama-cpp-python; on CPUs with AMX build it for AVX2: '
                 'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON")')


class StockFloat32Autoregressive(Method):
    """Plain decoding by `model`, a float32 copy of the target on stock kernels (not the target itself)."""

    name = AR_STOCK_FP32

    def __init__(self, model):
        self.generator = model

    def generate(self, target, input_ids, generation_config, streamer, attention_mask=None) -> torch.Tensor:
        return super().generate(self.generator, input_ids, generation_config, streamer, attention_mask)


class LlamaCppMethod(Method):
    """Decoding by a `llama_cpp.Llama`, one prompt at a time, from the benchmark's own prompt token ids.

    Greedy at temperature 0 (its sampler's greedy choice), else pure temperature sampling seeded per call; stops at
    one of the generation config's EOS tokens (kept, as transformers keeps it) or after `max_new_tokens`. Every
    token is streamed as it comes, so the streamer times it as it times a plain decoding step."""

    name = LLAMA_CPP

    def __init__(self, llama, seed: int = 0):
        self.llama = llama
        self.seed = seed

    def generate(self, target, input_ids, generation_config, streamer, attention_mask=None) -> torch.Tensor:
        if input_ids.shape[0] != 1 or (attention_mask is not None and not bool(attention_mask.all())):
            raise ValueError("llama_cpp decodes one prompt at a time (no batches, no padding).")
        prompt = input_ids[0].tolist()
        eos = generation_config.eos_token_id
        eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        temperature = float(generation_config.temperature or 0.0) if generation_config.do_sample else 0.0
        if temperature > 0:
            self.llama.set_seed(int(torch.initial_seed()) % 2**31)
        if streamer is not None:
            streamer.put(input_ids.cpu())  # the prompt first, as transformers streams it
        self.llama.reset()  # no prefix of an earlier call reused: each call prefills its whole prompt
        new: list[int] = []
        for token in self.llama.generate(prompt, temp=temperature, top_k=1 if temperature <= 0 else 0, top_p=1.0,
                                         min_p=0.0, repeat_penalty=1.0, reset=True):
            new.append(int(token))
            if streamer is not None:
                streamer.put(torch.tensor([token]))
            if token in eos or len(new) >= generation_config.max_new_tokens:
                break
        if streamer is not None:
            streamer.end()
        return torch.tensor([prompt + new], dtype=torch.long)


def llama_cpp_unavailable(target: str, device: str) -> str | None:
    """Why the llama_cpp row cannot run for `target` on `device` (not the packaged GGUF target, not the CPU,
    llama-cpp-python not installed), or None when it can."""
    if target.lower() not in LLAMA_CPP_TARGETS:
        return f"it reads the packaged target's GGUF (--target {' or '.join(LLAMA_CPP_TARGETS)}), not {target!r}"
    if device != "cpu":
        return f"it is the CPU anchor (--device cpu), not {device}"
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed ({LLAMA_CPP_FIX})"
    return None


def load_llama_cpp(threads: int, n_ctx: int, seed: int = 0) -> LlamaCppMethod | None:
    """The llama_cpp row on the packaged SmolLM2's GGUF with `threads` threads and a context of `n_ctx` tokens
    (0: the model's own); None, with one warning line, where llama.cpp fails to load it."""
    from .. import targets

    try:
        import llama_cpp

        llama = llama_cpp.Llama(model_path=str(targets.smollm2_gguf()), n_threads=threads, n_threads_batch=threads,
                                n_ctx=n_ctx, seed=seed, verbose=False)
    except Exception as error:  # a broken build, a missing GGUF: the benchmark goes on without the anchor
        logger.warning("llama_cpp row skipped: llama.cpp could not load the GGUF (%s: %s).", type(error).__name__,
                       error)
        return None
    logger.info("llama_cpp row: llama-cpp-python %s on %s, %d threads, context %d.",
                getattr(llama_cpp, "__version__", "?"), targets.SMOLLM2_GGUF, threads, llama.n_ctx())
    return LlamaCppMethod(llama, seed=seed)


def llama_cpp_version() -> str | None:
    """The installed llama-cpp-python's version, for the report (None when not installed)."""
    try:
        from importlib.metadata import version

        return version("llama-cpp-python")
    except Exception:
        return None


# How the report marks the rows it does not lossless-check, and what it says about them.
NOT_CHECKED = {AR_STOCK: "n/a (other kernels)", AR_STOCK_FP32: "n/a (float32 copy)", LLAMA_CPP: "n/a (llama.cpp)"}
FP32_NOTE = (f" vs stock fp32 = the same ratio against `{AR_STOCK_FP32}`: a float32 copy of the target decoding on "
             "stock transformers kernels, timed in the same run (for the autoregressive row: plain decoding in this "
             "dtype on these kernels against stock transformers in fp32).")
LLAMA_CPP_NOTE = (f" `{LLAMA_CPP}` = llama.cpp (llama-cpp-python {{version}}) decoding the same GGUF file on the same "
                  "prompt tokens with the same threads, timed the same way: a reference for this CPU, not "
                  "lossless-checked (another engine, on the Q4_1 weights without dequantisation).")


def reference_notes(config: dict, methods: dict) -> str:
    """The report's sentences on the reference rows that ran."""
    return (FP32_NOTE * (AR_STOCK_FP32 in methods)
            + LLAMA_CPP_NOTE.format(version=config.get("llama_cpp") or "?") * (LLAMA_CPP in methods))
