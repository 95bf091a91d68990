"""The benchmark loop: every method on every prompt, interleaved, on one loaded target.

Contract of `run_benchmark`: the target (and draft / assistant) are already loaded on their device; prompts
arrive tokenized (`BenchPrompt.input_ids`, chat template applied by the caller). For each prompt and repeat
all methods run back to back, in an order rotated per prompt, so slow drifts of a shared machine (other
jobs, thermal state) hit every method alike instead of whichever method happened to run last. Each method
gets `warmup` untimed calls first (allocator, kernels and lazy imports settle there).

When the target runs `domino_hf.optimize_for_cpu` kernels, every method uses them, and one more method,
`autoregressive_stock_kernels`, times plain decoding on stock kernels in the same interleaved loop: speedups are
against plain decoding on the same kernels, `speedup_vs_stock` against stock transformers.

Sampling runs reseed torch with the same seed for every method of a given (prompt, repeat): the draws of the
target are then comparable, though a drafting method consumes extra random numbers, so sampled outputs
differ between methods by design. Greedy outputs must be identical to autoregressive decoding token by
token; any difference is reported as `lossless: false`.

Profiling (`BenchConfig.profile`, the per-step time split of `stats.profile_method`) must not change the
speed it measures. On CPU it costs a few `perf_counter` calls per step, so it is on by default. On CUDA every
timed phase has to synchronise the device, which removes the CPU/GPU overlap that the speed numbers include,
so there it is off unless asked for, and then the forward probes do not synchronise either.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, field

import torch
from transformers import GenerationConfig

from ..cpu_kernels import is_optimized, stock_kernels
from ..modeling.dispatch_domino import profile_drafting
from ..modeling.generation_domino import acceptance_length
from .instrument import (
    ForwardProbe,
    RunRecord,
    TimingStreamer,
    chunks_per_forward,
    steps_from_probe,
    streamed_late,
)
from .stats import AR, AR_STOCK, summarize

logger = logging.getLogger(__name__)

ALL_METHODS = (AR, "prompt_lookup", "assisted", "dflash", "domino_no_lookup", "domino", "domino_tree", "domino_cache")
# What runs when no method is named: all of the above but `assisted` (it needs an assistant), `domino_tree` (asked for
# by name) and `domino_cache`, whose cross-request store only has something to find in a repeated workload
# (`workloads.py`).
DEFAULT_METHODS = tuple(m for m in ALL_METHODS if m not in ("assisted", "domino_tree", "domino_cache"))


@dataclass
class BenchPrompt:
    """One tokenized prompt: `prompt_set` groups the per-set breakdown; `input_ids` includes the template."""

    prompt_set: str
    prompt_id: str
    input_ids: list[int]

    @property
    def label(self) -> str:
        return f"{self.prompt_set}/{self.prompt_id}"


@dataclass
class BenchConfig:
    methods: tuple[str, ...] = (AR, "prompt_lookup", "dflash", "domino")
    max_new_tokens: int = 128
    temperature: float = 0.0
    repeats: int = 1
    warmup: int = 1
    seed: int = 0
    prompt_lookup_tokens: int = 10
    profile: bool | None = None  # per-step time split; None = on for CPU, off for CUDA (see the module doc)
    progress: bool = True
    extra: dict = field(default_factory=dict)  # recorded verbatim in the JSON `config` (names, paths, …)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


# ------------------------------------------------------------------------------------------------ methods
class Method:
    """A decoding method = generation-config fields + extra `generate` kwargs + an optional switch."""

    name = AR
    drafter: torch.nn.Module | None = None  # module whose forward counts as draft time
    # the model that generates when it is not the target (a reference copy): its forwards are probed as the target's
    generator: torch.nn.Module | None = None

    def config_fields(self) -> dict:
        return {}

    def generate_kwargs(self) -> dict:
        return {}

    @contextlib.contextmanager
    def active(self):
        yield

    def reset(self) -> None:
        """Forget what earlier calls left behind (a cross-request store); called after the warm-up."""

    def generate(self, target, input_ids, generation_config, streamer, attention_mask=None) -> torch.Tensor:
        """One `generate` call on `input_ids` ((B, L); `attention_mask` marks a batch's left padding, all ones
        when None)."""
        fields = self.config_fields()
        if fields:
            generation_config = copy.deepcopy(generation_config)
            for key, value in fields.items():  # setattr: `update` skips fields 🤗 does not define (draft_backoff)
                setattr(generation_config, key, value)
        return target.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids) if attention_mask is None else attention_mask,
            generation_config=generation_config,
            streamer=streamer,
            **self.generate_kwargs(),
        )

    def steps_from_stats(self) -> tuple[list[int], list[int]] | None:
        """(drafted, accepted) per step as the drafter itself recorded them, when it does."""
        return None

    def step_sources(self) -> list[str]:
        """Where each step's proposal came from (domino / lookup / cache / none), when the drafter records it."""
        return []

    def phase_timings(self) -> dict[str, float] | None:
        """Seconds per drafting phase as the drafter timed them (backbone, lm_head, head_rollout), if it did."""
        return None


class Autoregressive(Method):
    name = AR


class StockAutoregressive(Method):
    """Plain decoding with the target's layers switched back to stock kernels for the call (added by
    `run_benchmark` when the target runs `optimize_for_cpu` kernels): the baseline of `speedup_vs_stock`."""

    name = AR_STOCK

    def __init__(self, target):
        self.target = target

    @contextlib.contextmanager
    def active(self):
        with stock_kernels(self.target):
            yield


class PromptLookup(Method):
    name = "prompt_lookup"

    def __init__(self, num_tokens: int):
        self.num_tokens = num_tokens

    def config_fields(self):
        return {"prompt_lookup_num_tokens": self.num_tokens}


class Assisted(Method):
    """A classic assistant: its forwards (probed from outside) are its draft time, `draft_other`."""

    name = "assisted"

    def __init__(self, assistant):
        self.drafter = assistant

    def generate_kwargs(self):
        return {"assistant_model": self.drafter}


class DominoMethod(Method):
    """One Domino checkpoint, five ways: `domino` as shipped (head on, context lookup at the draft's default),
    `domino_no_lookup` (the Domino block alone), `dflash` (head off, no lookup: plain DFlash drafting),
    `domino_tree` (`domino` verifying a draft tree per step: `use_draft_tree=True` per call; single prompts only:
    batches are n/a in `batched.py`) and `domino_cache` (`domino` that also
    drafts from a cross-request `SuffixCache` of its own, passed per call as `suffix_cache=` and emptied by `reset`).

    The two draft-only methods measure the draft as the field does: it drafts every step (`draft_backoff=False`),
    so their τ is the draft's and their head gain compares like with like; `domino` keeps the draft's own
    no-fit fallback, as a user gets it. The lookup is switched per call (`prompt_lookup_num_tokens=0`), and so is the
    tree (`use_draft_tree`); the head through `config.use_domino_head`; the cross-request store through
    `use_suffix_cache`, which the other methods pass as False: the draft's own default store would carry one
    prompt's answer (the warm-up's too) into the next. With `profile`, the draft times its own phases
    (`profile_drafting`, into the stats' `timings`); the head switch is restored after every call, so the caller's
    draft leaves the benchmark as it came in.
    """

    def __init__(self, draft, name: str, profile: bool = False):
        self.drafter = draft
        self.name = name
        self.use_head = name != "dflash"
        self.lookup = name in ("domino", "domino_tree", "domino_cache")
        self.tree = name == "domino_tree"
        self.profile = profile
        self.suffix_cache = None
        if name == "domino_cache":
            from ..modeling import SuffixCache

            self.suffix_cache = SuffixCache()

    def config_fields(self):
        if self.tree:
            return {"use_draft_tree": True}
        return {} if self.lookup else {"prompt_lookup_num_tokens": 0, "draft_backoff": False}

    def generate_kwargs(self):
        if self.suffix_cache is None:
            return {"assistant_model": self.drafter, "use_suffix_cache": False}
        return {"assistant_model": self.drafter, "use_suffix_cache": True, "suffix_cache": self.suffix_cache}

    def reset(self) -> None:
        if self.suffix_cache is not None:
            self.suffix_cache.clear()

    @contextlib.contextmanager
    def active(self):
        config = self.drafter.config
        saved = config.use_domino_head
        config.use_domino_head = self.use_head
        self.drafter.last_generation_stats = None
        try:
            with profile_drafting(self.drafter) if self.profile else contextlib.nullcontext():
                yield
        finally:
            config.use_domino_head = saved

    def steps_from_stats(self):
        stats = getattr(self.drafter, "last_generation_stats", None)
        return None if stats is None else (list(stats.drafted), list(stats.accepted))

    def step_sources(self):
        stats = getattr(self.drafter, "last_generation_stats", None)
        return [] if stats is None else list(stats.sources)

    def phase_timings(self):
        stats = getattr(self.drafter, "last_generation_stats", None)
        timings = getattr(stats, "timings", None)
        return dict(timings) if self.profile and timings is not None else None


def build_methods(
    names, draft=None, assistant=None, prompt_lookup_tokens: int = 10, profile: bool = False
) -> list[Method]:
    """Instantiate the requested methods (`ALL_METHODS` names); raise a ValueError naming what is missing for one
    that can't run."""
    unknown = [n for n in names if n not in ALL_METHODS]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}; choose from {', '.join(ALL_METHODS)}.")
    methods = []
    for name in names:
        if name == AR:
            methods.append(Autoregressive())
        elif name == "prompt_lookup":
            methods.append(PromptLookup(prompt_lookup_tokens))
        elif name == "assisted":
            if assistant is None:
                raise ValueError("Method 'assisted' needs a small assistant model (`--assistant NAME_OR_PATH`).")
            methods.append(Assisted(assistant))
        else:
            if draft is None:
                raise ValueError(f"Method '{name}' needs a Domino draft (`--draft PATH_OR_REPO`).")
            if name != "dflash" and not hasattr(draft, "prefix_gru"):
                raise ValueError(
                    f"Method '{name}' needs a draft with a Domino head; this checkpoint has none (a DFlash "
                    "draft?). Benchmark it as 'dflash'."
                )
            methods.append(DominoMethod(draft, name, profile=profile))
    if AR not in names:
        logger.warning("No 'autoregressive' baseline: speedups and the lossless check are unavailable.")
    return methods


def make_generation_config(target, max_new_tokens: int, temperature: float) -> GenerationConfig:
    """A clean config (no repetition penalty, top-k or top-p inherited from the checkpoint), the target's
    special tokens. Sampling is pure temperature sampling of the target distribution."""
    base = target.generation_config
    eos = base.eos_token_id
    pad = base.pad_token_id if base.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    sampling = dict(temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else {}
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=base.bos_token_id,
        **sampling,
    )


# ------------------------------------------------------------------------------------------------ running
class Probes:
    """Forward probes on the target and on assistants (a Domino draft times its own phases instead).

    They synchronise CUDA only when profiling: the step counts they give need no synchronisation.
    """

    def __init__(self, target, drafters, profile: bool, generators=()):
        self.profile = profile
        sync = profile and target.device.type == "cuda"
        self.target = ForwardProbe(target, synchronize=sync)
        self.drafters = {id(m): ForwardProbe(m, synchronize=sync) for m in drafters if m is not None}
        self.generators = {id(m): ForwardProbe(m, synchronize=sync) for m in generators if m is not None}

    def of(self, method: Method) -> ForwardProbe:
        """The probe on the model that generates for `method`: its own `generator`, else the target."""
        return self.generators.get(id(method.generator), self.target)

    def _all(self) -> list[ForwardProbe]:
        return [self.target, *self.drafters.values(), *self.generators.values()]

    def reset(self):
        for probe in self._all():
            probe.reset()

    def remove(self):
        for probe in self._all():
            probe.remove()


def run_once(target, method: Method, prompt: BenchPrompt, repeat: int, generation_config, probes, seed) -> RunRecord:
    """One timed generate call; see `instrument.py` for what is measured."""
    input_ids = torch.tensor([prompt.input_ids], dtype=torch.long, device=target.device)
    streamer = TimingStreamer()
    probes.reset()
    if seed is not None:
        torch.manual_seed(seed)
    with method.active():
        t0 = time.perf_counter()
        output = method.generate(target, input_ids, generation_config, streamer)
        t1 = time.perf_counter()
        stats_steps = method.steps_from_stats()
        sources = method.step_sources()
        phases = method.phase_timings()
    output_ids = output[0, input_ids.shape[1] :].tolist()
    chunks = streamer.chunks
    calls = probes.of(method).calls
    t_first = chunks[0][0] if chunks else t1
    if streamed_late(calls, chunks):  # the draft-tree loop streams after each step: decode from the prefill's end
        t_first = calls[0].end
    t_last = chunks[-1][0] if chunks else t1
    sizes = chunks_per_forward(calls, chunks)
    if calls:
        probe_drafted, probe_accepted = steps_from_probe(calls, sizes)
    else:  # another engine generated (llama.cpp): one step per streamed chunk after the first, nothing drafted
        probe_drafted, probe_accepted = [0] * len(sizes[1:]), [max(n - 1, 0) for n in sizes[1:]]
    drafted, accepted = probe_drafted, probe_accepted
    tau_from_stats = None
    if stats_steps is not None:
        drafted, accepted = stats_steps
        tau_from_stats = acceptance_length(accepted)
        if (drafted, accepted) != (probe_drafted, probe_accepted):
            logger.warning(
                "%s: the draft's own step counts differ from the target-forward counts (%d vs %d steps).",
                method.name,
                len(accepted),
                len(probe_accepted),
            )
    draft_probe = probes.drafters.get(id(method.drafter)) if method.drafter is not None else None
    return RunRecord(
        method=method.name,
        prompt_set=prompt.prompt_set,
        prompt_id=prompt.prompt_id,
        repeat=repeat,
        prompt_tokens=len(prompt.input_ids),
        output_ids=output_ids,
        first_chunk=sizes[0] if sizes else 0,
        drafted=drafted,
        accepted=accepted,
        total_s=t1 - t0,
        prefill_s=t_first - t0,
        decode_s=t_last - t_first,
        target_prefill_s=(calls[0].end - calls[0].start) if calls else 0.0,
        target_decode_s=sum(c.end - c.start for c in calls[1:]),
        draft_decode_s=draft_probe.time_between(t_first, t_last) if draft_probe else 0.0,
        tau_from_stats=tau_from_stats,
        draft_phases=phases or {},
        profiled=probes.profile,
        sources=sources,
    )


def environment() -> dict:
    import transformers

    from .. import __version__
    from ..dtypes import KERNEL_FLAGS, cpu_info

    cpu = cpu_info()
    return {
        "cpu": cpu["model"],
        "cpu_features": [flag for flag in KERNEL_FLAGS if flag in cpu["flags"]],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "domino_hf": __version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def run_benchmark(target, prompts: list[BenchPrompt], config: BenchConfig, draft=None, assistant=None,
                  references: list[Method] = ()) -> dict:
    """Run every method of `config` on every prompt, and the `references` (`references.py`: reference rows that
    generate on another model or engine) after them; return the JSON-ready result (see `report.py`).

    Keys: `config`, `methods`, `by_set` (when several prompt sets), `profile` (when profiling), `mismatches`,
    `runs`.
    """
    if not prompts:
        raise ValueError("No prompts to benchmark.")
    profile = resolve_profile(config.profile, target.device)
    methods, kernels = prepare_methods(target, config, draft, assistant, profile, references)
    generation_config = make_generation_config(target, config.max_new_tokens, config.temperature)
    probes = Probes(target, [assistant], profile, [m.generator for m in methods])
    try:
        runs = run_interleaved(target, methods, prompts, config, generation_config, probes, run_once)
    finally:
        probes.remove()

    names = [m.name for m in methods]
    record = config_record(config, prompts, profile)
    record["target_kernels"] = kernels
    result = {"config": record, **summarize(runs, names, config.greedy, profile)}
    result["runs"] = [r.summary() for r in runs]
    log_mismatches(result)
    return result


def run_interleaved(target, methods: list[Method], items: list, config: BenchConfig, generation_config, probes,
                    run, desc: str = "bench") -> list:
    """Warm up on `items[0]`, then run every method on every item (a prompt, or a batch of prompts) `config.repeats`
    times, the methods' order rotated per item and repeat; `run(target, method, item, repeat, generation_config,
    probes, seed)` times one call (`run_once`). Sampling seeds depend on the item and the repeat only."""
    from tqdm.auto import tqdm

    warm_up(target, methods, items[0], config, generation_config, probes, run)
    records = []
    with tqdm(total=len(methods) * len(items) * config.repeats, desc=desc, unit="run",
              disable=not config.progress) as bar:
        for p, item in enumerate(items):
            for repeat in range(config.repeats):
                seed = None if config.greedy else config.seed + 1000 * p + repeat
                shift = (p + repeat) % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    records.append(run(target, method, item, repeat, generation_config, probes, seed))
                    bar.set_postfix_str(f"{item.label} {method.name}")
                    bar.update()
    return records


def prepare_methods(target, config: BenchConfig, draft=None, assistant=None, profile: bool = False,
                    references: list[Method] = ()) -> tuple[list[Method], str]:
    """The methods of `config` and the target's kernels (`optimized` / `stock`); on optimized kernels, with
    `autoregressive` asked for, plain decoding on stock kernels (in the target's dtype: the same model object) is
    appended as the second baseline, then the `references`.

    Args:
        target (`PreTrainedModel`): the loaded target.
        config (`BenchConfig`): names the methods and the prompt lookup length.
        draft (`DominoDraftModel`, *optional*) / assistant (`PreTrainedModel`, *optional*): their models.
        profile (`bool`): whether the Domino methods time their drafting phases.
    """
    methods = build_methods(config.methods, draft, assistant, config.prompt_lookup_tokens, profile)
    kernels = "optimized" if is_optimized(target) else "stock"
    if kernels == "optimized" and AR in config.methods:
        methods.append(StockAutoregressive(target))
    return methods + list(references), kernels


def warm_up(target, methods: list[Method], prompt: BenchPrompt, config: BenchConfig, generation_config,
            probes, run=None) -> None:
    """`config.warmup` untimed calls per method on `prompt` (a batch of prompts when `run` times batches), then
    every method's `reset` (a store the warm-up filled starts the timed runs empty)."""
    run = run or run_once
    for method in methods:
        for w in range(config.warmup):
            run(target, method, prompt, -1, generation_config, probes, config.seed + w)
        method.reset()


def log_mismatches(result: dict) -> None:
    """One error line per method whose greedy output differed from autoregressive decoding."""
    for name, found in result["mismatches"].items():
        first = found[0]
        logger.error(
            "LOSSLESS CHECK FAILED: '%s' differs from autoregressive decoding in %d run(s); first: prompt %s/%s "
            "at new token %d (expected %s, got %s).",
            name,
            result["methods"][name]["mismatched_runs"],
            first["set"],
            first["prompt_id"],
            first["position"],
            first["expected"],
            first["got"],
        )


def resolve_profile(profile: bool | None, device: torch.device) -> bool:
    """`None` (auto): profile on CPU, where it costs nothing measurable; not on CUDA, where it synchronises."""
    if profile is None:
        return device.type != "cuda"
    if profile and device.type == "cuda":
        logger.warning(
            "Profiling on CUDA synchronises the device around every timed phase: the speed numbers of this run "
            "include that cost. Compare speedups from a run without --profile."
        )
    return bool(profile)


def config_record(config: BenchConfig, prompts: list[BenchPrompt], profile: bool) -> dict:
    record = {k: v for k, v in asdict(config).items() if k not in ("extra", "progress")}
    record["profile"] = profile
    record["methods"] = list(config.methods)
    record["greedy"] = config.greedy
    sets: dict[str, int] = {}
    for prompt in prompts:
        sets[prompt.prompt_set] = sets.get(prompt.prompt_set, 0) + 1
    record["prompt_sets"] = sets
    record["num_prompts"] = len(prompts)
    record["environment"] = environment()
    record.update(config.extra)
    return record
