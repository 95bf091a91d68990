"""lm-evaluation-harness with a Domino draft: `--model domino`, scores unchanged, τ reported.

    domino lm-eval --model domino --model_args pretrained=TARGET,draft=DRAFT --tasks TASKS [lm-eval's options]
    lm_eval.simple_evaluate(model=DominoLM(pretrained=TARGET, draft=DRAFT), tasks=[...])

`DominoLM` is lm-eval's `HFLM` with one change: `generate_until` requests go through
`generate(assistant_model=draft)`, in the batches `hf` makes (`--batch_size`): a left-padded batch of two or more
prompts runs the draft's batched verify loop, whose every row is token-identical to plain batched decoding (its
padding included), so the samples are those of `hf` at the same batch size. Loglikelihood requests need no draft
and run exactly as `hf` runs them. Speculative decoding is lossless, so the scores are those of plain decoding;
what changes is the time generation takes.

Per task, the draft's acceptance length τ (bonus token included), the share of verify steps per source (the
Domino block, a span looked up in the context, a span from the suffix cache of earlier generations, a plain
step), the decode tokens/s and the wall time of
generation are kept in `DominoLM.stats`; `add_domino_stats(results, lm)` writes them into a results dict, under
`results["domino"]` and as `domino_*` rows of each task (so lm-eval's printed table shows τ next to the scores).
`domino lm-eval` does that for every run.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from .eval_cli import require_lm_eval

logger = logging.getLogger(__name__)

require_lm_eval()  # without lm-eval: one line naming the extra, not lm_eval's own ImportError
import torch  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

SOURCES = ("domino", "lookup", "cache", "none")
# The most recent DominoLM: lm-eval builds the model from `--model domino` inside `simple_evaluate` and drops it
# before returning, so `domino lm-eval` finds its numbers here.
_LATEST: list = []


@register_model("domino")
class DominoLM(HFLM):
    """lm-eval's `HFLM` with a Domino draft for `generate_until` (see the module doc).

    Args:
        pretrained (`str` or `PreTrainedModel`): the target, as for `hf` (a folder or Hub id; `smollm2` is the
            offline SmolLM2-135M-Instruct, Q4_1 GGUF dequantised), or a loaded model.
        draft (`str` or `DominoDraftModel`, *optional*): the Domino draft, a folder or Hub id (domino-hf's format
            or the published Domino checkpoints', loaded with `DominoDraftModel.from_pretrained`) or a loaded
            draft. Without one, generation is plain decoding (on the same kernels).
        draft_dtype (`str`, *optional*): the draft's dtype (default: the target's).
        prompt_lookup_num_tokens (`int`, *optional*): the draft's context-lookup span (0: the Domino block only).
        use_suffix_cache (`bool`, *optional*): draft from the suffix cache of earlier generations (default: the
            draft's setting; unset, on for greedy requests and off for sampled ones). An evaluation run's requests
            share their few-shot preamble and answer format, so the draft's own store fills with them as the run
            goes; scores are unchanged either way.
        optimize_cpu (`bool`, defaults to `True`): on CPU, pack target and draft weights with `optimize_for_cpu`
            (as `domino bench` does); `False` keeps transformers' stock kernels.
        dtype (`str`, defaults to `"float32"` on CPU, else `"auto"`): the target's dtype; fp32 keeps CPU greedy
            decoding exact.
        **kwargs: everything else `HFLM` takes (`batch_size`, `device`, `max_length`, `trust_remote_code`, …).
    """

    def __init__(self, pretrained, draft=None, draft_dtype: str | None = None,
                 prompt_lookup_num_tokens: int | None = None, use_suffix_cache: bool | None = None,
                 optimize_cpu: bool = True, **kwargs):
        device = str(kwargs.get("device") or "cuda")
        if device.startswith("cuda") and not torch.cuda.is_available():
            device = "cpu"  # lm-eval's default device on a machine without a GPU (HFLM falls back the same way)
        kwargs["device"] = device
        on_cpu = str(device).startswith("cpu")
        if kwargs.get("dtype") in (None, "auto") and on_cpu:
            kwargs["dtype"] = "float32"
        from .targets import is_packaged_name, load_target

        if isinstance(pretrained, str) and is_packaged_name(pretrained):

            target, tokenizer = load_target(pretrained, dtype=_dtype(kwargs["dtype"]), device=device)
            kwargs.setdefault("tokenizer", tokenizer)
            pretrained = target
        super().__init__(pretrained=pretrained, **kwargs)
        self.draft_name = draft if isinstance(draft, str) else getattr(getattr(draft, "config", None), "_name_or_path",
                                                                      None)
        self.draft = _load_draft(draft, draft_dtype, self.model) if draft is not None else None
        self.prompt_lookup_num_tokens = None if prompt_lookup_num_tokens is None else int(prompt_lookup_num_tokens)
        self.use_suffix_cache = None if use_suffix_cache is None else _as_bool(use_suffix_cache)
        if optimize_cpu and on_cpu:
            from .cpu_kernels import optimize_for_cpu

            for model in (self.model, self.draft):
                if model is not None:
                    optimize_for_cpu(model)
            logger.info("domino lm-eval: target%s on optimize_for_cpu kernels (optimize_cpu=False keeps the stock "
                        "ones)", " and draft" if self.draft is not None else "")
        self.stats: dict[str, dict[str, Any]] = {}
        self._task = None
        _LATEST[:] = [self]

    # ------------------------------------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """HFLM's `generate_until`, task by task so that each task's generation is timed and its τ recorded."""
        by_task: dict[str, list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            by_task[getattr(request, "task_name", None) or "all"].append(index)
        answers: list[str | None] = [None] * len(requests)
        for task, indices in by_task.items():
            self._task = self.stats.setdefault(task, _new_stats())
            start = time.perf_counter()
            outputs = super().generate_until([requests[i] for i in indices], disable_tqdm=disable_tqdm)
            self._task["generation_s"] += time.perf_counter() - start
            for i, output in zip(indices, outputs):
                answers[i] = output
        self._task = None
        return answers

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs) -> torch.Tensor:
        """HFLM's one `generate` call for the whole (left-padded) batch, with the draft as `assistant_model`: for
        two or more rows the draft's batched verify loop, which returns what plain batched decoding returns."""
        if self.draft is not None:
            generation_kwargs["assistant_model"] = self.draft
            if self.prompt_lookup_num_tokens is not None:
                generation_kwargs["prompt_lookup_num_tokens"] = self.prompt_lookup_num_tokens
            if self.use_suffix_cache is not None:
                generation_kwargs["use_suffix_cache"] = self.use_suffix_cache
        start = time.perf_counter()
        out = super()._model_generate(context, max_length, stop, **generation_kwargs)
        self._record(self._generated_tokens(out[:, context.shape[1]:]), time.perf_counter() - start)
        return out

    def _generated_tokens(self, new: torch.Tensor) -> int:
        """Tokens the rows of a batch generated, `new` being the (B, T) columns after the prompts: each row up to
        its first EOS (kept), after which plain batched decoding writes pad tokens; a row without one, all T
        (lm-eval's stop sequences end the batch only once every row has one, so no row is padded for them)."""
        eos = self.model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if not eos or new.shape[1] == 0:
            return new.numel()
        ended = torch.isin(new, torch.tensor(eos, device=new.device))
        lengths = torch.where(ended.any(dim=1), ended.int().argmax(dim=1) + 1, new.shape[1])
        return int(lengths.sum())

    def _record(self, new_tokens: int, seconds: float) -> None:
        if self._task is None:
            return
        self._task["new_tokens"] += new_tokens
        self._task["decode_s"] += seconds
        stats = getattr(self.draft, "last_generation_stats", None)
        if stats is not None:
            self._task["accepted"] += list(stats.accepted)
            for source in stats.sources:
                self._task["sources"][source] += 1


def _new_stats() -> dict[str, Any]:
    return {"accepted": [], "sources": defaultdict(int), "new_tokens": 0, "decode_s": 0.0, "generation_s": 0.0}


def summary(stats: dict[str, Any]) -> dict[str, Any]:
    """One task's numbers: τ (tokens per target verify, bonus included), source shares, tokens/s, wall time."""
    from .modeling.generation_domino import acceptance_length

    steps = sum(stats["sources"].values())
    return {
        "tau": acceptance_length(stats["accepted"]),
        "verify_steps": len(stats["accepted"]),
        "source_share": {s: (stats["sources"][s] / steps if steps else None) for s in SOURCES},
        "new_tokens": stats["new_tokens"],
        "decode_tokens_per_s": stats["new_tokens"] / stats["decode_s"] if stats["decode_s"] else None,
        "generation_s": stats["generation_s"],
    }


def add_domino_stats(results: dict, lm: DominoLM) -> dict:
    """Write `lm`'s per-task numbers into lm-eval's `results`: `results["domino"][task]`, and `domino_tau`,
    `domino_tokens_per_s`, `domino_generation_s` rows under each task's metrics (printed by lm-eval's table)."""
    numbers = {task: summary(stats) for task, stats in lm.stats.items()}
    results["domino"] = {"draft": lm.draft_name, "tasks": numbers}
    for task, row in numbers.items():
        metrics = results.get("results", {}).get(task)
        if metrics is None:
            continue
        if row["tau"] is not None:
            metrics["domino_tau,none"] = row["tau"]
        if row["decode_tokens_per_s"] is not None:
            metrics["domino_tokens_per_s,none"] = row["decode_tokens_per_s"]
        metrics["domino_generation_s,none"] = row["generation_s"]
    return results


def _as_bool(value) -> bool:
    """A flag from `--model_args` (lm-eval passes strings such as "False") or Python."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false", "1", "0"):
        raise ValueError(f"use_suffix_cache must be True or False, got {value!r}.")
    return text in ("true", "1")


def _dtype(name):
    from .dtypes import torch_dtype

    return name if isinstance(name, torch.dtype) else torch_dtype(str(name))


def _load_draft(draft, draft_dtype, target):
    """A loaded draft on the target's device, or a folder or Hub id loaded with `targets.load_draft` (domino_hf's
    own class: domino-hf's format or the published Domino checkpoints' dialect)."""
    if not isinstance(draft, str):
        return draft.to(target.device).eval()
    from .targets import load_draft

    return load_draft(draft, target, _dtype(draft_dtype) if draft_dtype else None)


def evaluate_with_stats(evaluate, *args, **kwargs) -> dict | None:
    """`evaluate(*args, **kwargs)` (lm-eval's `simple_evaluate`, which builds the model from `--model domino`),
    with the draft's per-task numbers of the `DominoLM` it built written into the results (`add_domino_stats`):
    what `domino lm-eval` runs (`eval_cli.py`)."""
    _LATEST.clear()
    results = evaluate(*args, **kwargs)
    if results is not None and _LATEST:
        add_domino_stats(results, _LATEST[0])
    _LATEST.clear()
    return results
