"""What `domino bench` does, without its command line: check a `BenchRequest`, load the models it names, build
its prompts, run the benchmark (`runner.run_benchmark`, or with `suite="repeated"` the chained repeated-workload
suite of `workloads.run_repeated`) and write the report (`report.write_report`).

Everything the user fixes with an option is a `UsageError`, raised before any model loads where it can be.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import exact_kernels, targets
from ..chat import chat_input_ids, check_chat_template
from ..cpu_kernels import optimize_for_cpu
from ..benchmark_sets import REPEATED_SETS, SUITES
from ..data import check_prompt_source, read_prompts
from ..dtypes import dtype_name, resolve_draft_dtype, torch_dtype
from ..modeling.configuration_domino import draft_level_settings
from ..utils import git_tracked, looks_like_local_path
from .batched import run_batch_sizes
from .humaneval import humaneval_pass1
from .references import StockFloat32Autoregressive, llama_cpp_unavailable, llama_cpp_version, load_llama_cpp
from .report import write_report
from .runner import ALL_METHODS, AR, DEFAULT_METHODS, BenchConfig, BenchPrompt, run_benchmark
from .stats import AR_STOCK_FP32, LLAMA_CPP
from .workloads import read_conversations, run_repeated

logger = logging.getLogger(__name__)

DRAFT_METHODS = ("dflash", "domino_no_lookup", "domino", "domino_tree", "domino_cache")
DEFAULT_PROMPTS = ("humaneval", "mt_bench")
DEFAULT_NUM_PROMPTS = 10
# The suite's methods when none are named: the baselines and Domino without and with its cross-request store.
REPEATED_METHODS = (AR, "prompt_lookup", "domino", "domino_cache")
# Reference rows `--methods` may name (`references.py`): by default each runs where it can (the fp32 copy beside a
# bfloat16 target, llama.cpp on the packaged target's GGUF when llama-cpp-python is installed).
REFERENCE_CHOICES = (AR_STOCK_FP32, LLAMA_CPP)


@dataclass
class BenchRequest:
    """A benchmark as `domino bench` describes it by names (its options, same meanings and defaults); `config`
    holds the decoding and timing settings, its methods and `extra` filled in by `run_bench`."""

    target: str = "smollm2"
    target_options: dict[str, Any] = field(default_factory=dict)  # load_target's trust_remote_code, revision, token
    draft: str | None = None
    confidence_threshold: float | None = None
    max_draft_tokens: int | None = None
    assistant: str | None = None
    dtype: str = "auto"  # see `resolve_bench_dtype`
    draft_dtype: str = "auto"
    target_kernels: str = "auto"
    device: str = "cpu"
    methods: list[str] | None = None
    prompts: list[str] | None = None  # None: humaneval,mt_bench, or with `suite="repeated"` its three workloads
    num_prompts: int | None = None  # None: 10 per set, or with a suite every record
    suite: str | None = None  # "repeated": every turn chained, stores per method (`workloads.py`)
    system: str | None = None
    chat_template: str = "auto"
    threads: int | None = None
    config: BenchConfig = field(default_factory=BenchConfig)
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # [1]: one prompt per call, as without batching
    humaneval_pass1: bool = False
    pass1_problems: int = 20
    pass1_samples: int = 5
    pass1_temperature: float = 1.0
    pass1_max_new_tokens: int = 256
    out: str = "runs/bench"
    overwrite_output_dir: bool = False
    name: str | None = None
    plots: bool = True

    def __post_init__(self):
        if self.prompts is None:
            self.prompts = list(REPEATED_SETS if self.suite else DEFAULT_PROMPTS)
        if self.num_prompts is None and not self.suite:
            self.num_prompts = DEFAULT_NUM_PROMPTS

    @property
    def stem(self) -> str:
        """The report files' stem: `name`, else `bench` (`repeated` for the suite), or `<that>_T<temperature>`
        when sampling."""
        temperature = self.config.temperature
        base = "repeated" if self.suite else "bench"
        return self.name or (base if temperature <= 0 else f"{base}_T{temperature:g}")


class UsageError(Exception):
    """A problem the user fixes with a flag; reported without a traceback (exit code 2)."""


def resolve_draft(draft: str | None, methods: list[str]) -> str:
    """The draft to load (`--draft`, a folder or a Hub id); none given, or a missing local folder, is a clear
    error."""
    if draft is None:
        raise UsageError(
            f"--methods {','.join(methods)} needs a Domino draft: pass --draft PATH_OR_HUB_ID (in a domino-hf "
            "checkout: --draft drafts/smollm2-135m-instruct-domino; train your own with `domino train` and "
            "`domino export`), or benchmark without one: --methods autoregressive,prompt_lookup."
        )
    looks_local = looks_like_local_path(draft) or Path(draft).expanduser().exists() or draft.count("/") != 1
    if looks_local and not Path(draft).expanduser().is_dir():
        raise UsageError(f"--draft {draft}: no such folder (give a local draft folder or a Hub id `owner/name`).")
    return str(Path(draft).expanduser()) if looks_local else draft


def refuse_overwrite(out: Path, names: list[str], overwrite: bool) -> None:
    """An existing report (any of `names` in `out`: an earlier run's, or the committed docs/bench) is replaced only
    with --overwrite_output_dir, as the 🤗 Trainer scripts treat their --output_dir."""
    existing = [name for name in names if (out / name).exists()]
    if existing and not overwrite:
        tracked = [name for name in existing if git_tracked(out / name)]
        what = "tracked by git (a committed report)" if tracked else "from an earlier run"
        raise UsageError(
            f"--out {out}: {', '.join(existing)} is already there, {what}. Write elsewhere (--out DIR, or --name "
            "STEM) or pass --overwrite_output_dir to replace it."
        )


def resolve_device(device: str) -> str:
    """`--device`: `auto` is cuda when one is available, else cpu."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_draft(name: str, dtype, device):
    from transformers import AutoModel

    try:
        draft = AutoModel.from_pretrained(name, trust_remote_code=True, dtype=dtype)
    except OSError as err:
        raise UsageError(f"Could not load the draft {name!r}: {err}") from err
    return draft.to(device).eval()


def load_assistant(name: str, dtype, device):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(name, dtype=dtype).to(device).eval()
    except OSError as err:
        raise UsageError(f"Could not load the assistant {name!r}: {err}") from err


def build_prompts(tokenizer, sources: list[str], limit: int, system: str | None = None,
                  chat_template: str = "auto") -> list[BenchPrompt]:
    """Read each source and format its first user turn (MT-Bench: turn 1) as `chat_template` says (`auto`: the
    tokenizer's chat template, plain text without one; `none`; or a Jinja file)."""
    prompts = []
    for source in sources:
        prompt_set = read_prompts(source, limit)
        name = Path(source).stem if Path(source).suffix else source
        if prompt_set.skipped:
            logger.warning("%s: skipped %d malformed record(s)", source, prompt_set.skipped)
        if not prompt_set.records:
            raise UsageError(f"Prompt source {source!r} has no usable prompts.")
        for record in prompt_set.records:
            ids = chat_input_ids(tokenizer, record.turns[:1], system=system or record.meta.get("system"),
                                 chat_template=chat_template)
            prompts.append(BenchPrompt(name, record.id, ids))
    return prompts


def choose_methods(requested: list[str] | None, assistant: str | None, suite: str | None = None) -> list[str]:
    """The methods to run: `requested` checked, else the default (the suite's own with `suite`)."""
    if requested is None:
        if suite:
            return list(REPEATED_METHODS)
        return [m for m in ALL_METHODS if m in DEFAULT_METHODS or (m == "assisted" and assistant)]
    unknown = [m for m in requested if m not in ALL_METHODS + REFERENCE_CHOICES]
    if unknown:
        raise UsageError(f"--methods: unknown {unknown}; choose from {','.join(ALL_METHODS + REFERENCE_CHOICES)}.")
    if "assisted" in requested and not assistant:
        raise UsageError(
            "--methods assisted needs --assistant NAME_OR_PATH (a small model sharing the target's tokenizer)."
        )
    return requested


def check_batch_sizes(sizes, suite: str | None = None) -> list[int]:
    """`--batch_size`'s sizes, ascending and once each; anything but positive integers, or a batch size above 1
    with a suite (its turns chain one conversation at a time), is a `UsageError`."""
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    if bad or not sizes:
        raise UsageError(f"--batch_size: batch sizes are positive integers (e.g. 1,2,4,8), got {bad or 'none'}.")
    if suite and max(sizes) > 1:
        raise UsageError(f"--batch_size with --suite {suite}: the suite chains each conversation's turns one call "
                         "at a time; drop --batch_size, or benchmark batches on one-off prompts (no --suite).")
    return sorted(set(sizes))


def load_target(name: str, dtype, device, **hub_options):
    """`targets.load_target`, a missing folder, package or Hub model being a `UsageError`."""
    try:
        return targets.load_target(name, dtype=dtype, device=device, **hub_options)
    except (OSError, ImportError) as err:  # a missing folder, package or Hub model
        raise UsageError(str(err)) from err


def cpu_cores() -> int:
    """Cores this process may run on (its affinity mask), which can be fewer than the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """$OMP_NUM_THREADS when it is a positive integer (what torch itself obeys: two benchmarks started with
    OMP_NUM_THREADS=1 on a 2-core machine must not each spin two threads), else `cpu_cores()`."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return cpu_cores()


def resolve_bench_dtype(name: str, device: str, kernels: str) -> tuple[str, str | None]:
    """`--dtype` as a dtype name and, for `auto`, why: bfloat16 where the length-invariant bf16 kernels run (a CPU
    target on optimized kernels, a CPU with AVX512-BF16, the kernels compiled), so that greedy decoding in bf16 is
    exact; float32 elsewhere. An explicit name is kept as given (no reason)."""
    if name != "auto":
        return name, None
    if device != "cpu":
        why = f"the length-invariant bf16 kernels run on the CPU, not on {device}"
    elif kernels != "optimized":
        why = f"--target_kernels {kernels} runs stock kernels, not the length-invariant ones"
    else:
        why = exact_kernels.unavailable_reason(torch.bfloat16)
    if why is None:
        return "bfloat16", "auto: greedy bf16 decoding is exact on this CPU's length-invariant kernels"
    return "float32", f"auto: bfloat16 would not be exact here, as {why}"


def greedy_identity_warning(dtype: str, temperature: float, target) -> str | None:
    """The caution for a greedy run whose target is in half precision without length-invariant kernels (its
    k-token verify and its one-token steps may round differently and flip a near-tied argmax); None otherwise: in
    float32, when sampling, or on a target whose self-check proved the kernels (`domino_length_invariant`)."""
    if dtype == "float32" or temperature > 0 or getattr(target, "domino_length_invariant", False):
        return None
    return (f"Greedy identity is only expected in float32 or on the length-invariant kernels, which this {dtype} "
            "target does not run: a verify can flip a near-tied argmax (see `lossless` in the report).")


def check_references(asked: list[str] | None, target: str, device: str, dtype: str) -> None:
    """A reference row named in --methods that cannot mean anything here is a `UsageError` (before any load):
    the float32 copy beside a float32 target, llama.cpp on a target without the packaged GGUF or off the CPU.
    llama-cpp-python not being installed is not: that row is skipped with one line (`reference_rows`)."""
    if not asked:
        return
    if AR_STOCK_FP32 in asked and dtype == "float32":
        raise UsageError(f"--methods {AR_STOCK_FP32}: the target already runs float32, so its stock baseline is "
                         "autoregressive_stock_kernels; use --dtype bfloat16 (or auto on a CPU with AVX512-BF16).")
    why = llama_cpp_unavailable(target, device) if LLAMA_CPP in asked else None
    if why and "not installed" not in why:
        raise UsageError(f"--methods {LLAMA_CPP}: {why}.")


def reference_rows(asked: list[str] | None, request: BenchRequest, device: str, dtype: str, methods: list[str],
                   threads: int, context: int) -> list:
    """The reference rows to time (`references.py`). `asked`: those named in --methods, or None (no --methods):
    then the float32 copy runs beside a non-float32 target with `autoregressive` (a second load of the target), and
    llama.cpp where it can (`references.llama_cpp_unavailable`); one line says why a row is left out."""
    rows = []
    fp32 = AR_STOCK_FP32 in asked if asked is not None else dtype != "float32" and AR in methods
    if fp32 and dtype == "float32":  # --dtype auto fell back to float32 after loading
        logger.info("%s row left out: the target runs float32 (its stock baseline is autoregressive_stock_kernels).",
                    AR_STOCK_FP32)
    elif fp32:
        copy, _ = load_target(request.target, torch.float32, device, **request.target_options)
        rows.append(StockFloat32Autoregressive(copy))
    if asked is None or LLAMA_CPP in asked:
        why = llama_cpp_unavailable(request.target, device)
        if why is not None:
            (logger.warning if asked else logger.info)("%s row skipped: %s.", LLAMA_CPP, why)
        else:
            row = load_llama_cpp(threads, context, seed=request.config.seed)
            rows += [row] if row is not None else []
    return rows


def run_bench(request: BenchRequest) -> tuple[dict, dict]:
    """Run the benchmark `request` describes and write its report; `(result, written paths)`.

    The methods, the draft, the prompt sources, the chat template and the report's place are checked before any
    model loads; a problem there, or a model that cannot be loaded, is a `UsageError`."""
    device = resolve_device(request.device)
    if request.dtype != "auto":
        torch_dtype(request.dtype)  # an unknown name fails here, before anything loads
    if request.suite is not None and request.suite not in SUITES:
        raise UsageError(f"--suite {request.suite}: unknown; choose from {', '.join(SUITES)}.")
    methods = choose_methods(request.methods, request.assistant, request.suite)
    asked = [m for m in methods if m in REFERENCE_CHOICES] if request.methods is not None else None
    methods = [m for m in methods if m not in REFERENCE_CHOICES]
    kernels = request.target_kernels
    if kernels == "auto":
        kernels = "optimized" if device == "cpu" else "stock"
    batch_sizes = check_batch_sizes(request.batch_sizes, request.suite)
    if "domino_cache" in methods and not request.suite and request.config.repeats > 1:
        raise UsageError(
            "--methods domino_cache with --repeats > 1 outside a suite: a repeat would find its own earlier answer in "
            "the store. Use --repeats 1, or --suite repeated (each repeat reruns the suite with emptied stores)."
        )
    needs_draft = any(m in DRAFT_METHODS for m in methods) or request.humaneval_pass1
    draft_name = resolve_draft(request.draft, methods) if needs_draft else None
    try:
        for source in request.prompts:
            check_prompt_source(source)
    except FileNotFoundError as err:
        raise UsageError(f"--prompts: {err}") from None
    try:
        check_chat_template(request.chat_template)
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None
    stem = request.stem
    refuse_overwrite(Path(request.out), [f"{stem}.json", f"{stem}.md"], request.overwrite_output_dir)
    dtype_label, dtype_note = resolve_bench_dtype(request.dtype, device, kernels)  # may compile the kernels
    check_references(asked, request.target, device, dtype_label)
    threads = request.threads or default_threads()  # after the argument checks: a usage error changes nothing
    torch.set_num_threads(threads)
    if dtype_note:
        logger.info("--dtype auto: %s (%s).", dtype_label, dtype_note)

    target, tokenizer = load_target(request.target, torch_dtype(dtype_label), device, **request.target_options)
    if kernels == "optimized":
        optimize_for_cpu(target)
    if dtype_note and dtype_label != "float32" and not getattr(target, "domino_length_invariant", False):
        dtype_note = ("auto: bfloat16 would not be exact here, as the length-invariant kernels did not hold for "
                      "this target (the line above says why)")
        logger.warning("--dtype auto: %s; float32 instead.", dtype_note)
        dtype_label, target = "float32", None
        target, tokenizer = load_target(request.target, torch.float32, device, **request.target_options)
        if kernels == "optimized":
            optimize_for_cpu(target)
    dtype = torch_dtype(dtype_label)
    warning = greedy_identity_warning(dtype_label, request.config.temperature, target)
    if warning:
        logger.warning("%s", warning)
    draft_dtype = resolve_draft_dtype(request.draft_dtype, dtype, device)
    draft = load_draft(draft_name, draft_dtype, device) if draft_name else None
    drafting = {}  # the draft's own drafting defaults (its generation_config), as this run overrides them
    if draft is not None:
        if request.confidence_threshold is not None:
            draft.generation_config.draft_confidence_threshold = request.confidence_threshold
        if request.max_draft_tokens is not None:
            draft.generation_config.max_draft_tokens = request.max_draft_tokens
        drafting = draft_level_settings(draft.generation_config, draft.config)
    assistant = load_assistant(request.assistant, dtype, device) if request.assistant else None
    if kernels == "optimized":
        for model in (draft, assistant):
            if model is not None:
                optimize_for_cpu(model)
    if request.suite:
        conversations = read_conversations(request.prompts, request.num_prompts)
        if not conversations:
            raise UsageError(f"--prompts {','.join(request.prompts)}: no usable conversations.")
    else:
        prompts = build_prompts(tokenizer, request.prompts, request.num_prompts, request.system,
                                request.chat_template)
    context = 0 if request.suite else max(len(p.input_ids) for p in prompts) + request.config.max_new_tokens + 1
    references = reference_rows(asked, request, device, dtype_label, methods, threads, context)
    config = dataclasses.replace(
        request.config,
        methods=tuple(methods),
        extra={
            "target": request.target,
            "draft": draft_name,
            "assistant": request.assistant,
            "dtype": dtype_label,
            "dtype_note": dtype_note,
            "length_invariant": bool(getattr(target, "domino_length_invariant", False)),
            "llama_cpp": llama_cpp_version() if any(m.name == LLAMA_CPP for m in references) else None,
            "draft_dtype": dtype_name(draft_dtype) if draft is not None else None,
            "device": device,
            "sources": request.prompts,
            "suite": request.suite,
            "system": request.system,
            "chat_template": request.chat_template,
            "threads": threads,
            # transformers >= 5.25 swaps some layers for Hub kernels at load unless USE_HUB_KERNELS=0: on a GPU that
            # moves the stock baseline, so the report says whether it happened.
            "target_hub_kernels": bool(getattr(target, "use_kernels", False)),
            "confidence_threshold": drafting.get("draft_confidence_threshold"),
            "max_draft_tokens": drafting.get("max_draft_tokens"),
        },
    )
    if request.suite:
        result = run_repeated(target, tokenizer, conversations, config, draft=draft, assistant=assistant,
                              system=request.system, chat_template=request.chat_template, references=references)
    elif batch_sizes == [1]:
        result = run_benchmark(target, prompts, config, draft=draft, assistant=assistant, references=references)
    else:
        result = run_batch_sizes(target, prompts, config, batch_sizes, draft=draft, assistant=assistant,
                                 pad_token_id=tokenizer.pad_token_id, references=references)
    if request.humaneval_pass1:
        result["humaneval_pass1"] = humaneval_pass1(
            target,
            tokenizer,
            draft,
            num_problems=request.pass1_problems,
            samples=request.pass1_samples,
            temperature=request.pass1_temperature,
            max_new_tokens=request.pass1_max_new_tokens,
            seed=config.seed,
            progress=config.progress,
        )
    paths = write_report(result, request.out, stem=stem, plots=request.plots)
    return result, paths
