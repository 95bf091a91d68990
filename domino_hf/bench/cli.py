"""`domino bench`: speculative decoding benchmark on the 🤗 Transformers backend.

Exit codes: 0 = done; 1 = a method's greedy output differed from autoregressive decoding (not lossless);
2 = bad arguments or a missing model.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from ..cli_common import RawDescriptionHelpFormatter, add_target_arguments, target_kwargs
from ..dtypes import DTYPE_NAMES, cpu_has_native_bf16, dtype_name, torch_dtype
from ..data import add_chat_template_argument, check_chat_template, check_prompt_source
from ..utils import git_tracked, looks_like_local_path
from .runner import AR, BenchConfig, BenchPrompt

logger = logging.getLogger(__name__)

DRAFT_METHODS = ("dflash", "domino_no_lookup", "domino")

DESCRIPTION = """\
Benchmark speculative decoding on the 🤗 Transformers backend, the way the literature reports it.

All methods run in one process on the same loaded target, interleaved prompt by prompt:
  autoregressive  plain `generate` (the baseline: τ = 1, speedup = 1)
  prompt_lookup   transformers' prompt lookup decoding (`prompt_lookup_num_tokens`)
  assisted        a classic small draft model (only with --assistant)
  dflash          the Domino checkpoint with its head switched off and no context lookup (plain DFlash)
  domino_no_lookup  the Domino block alone (head on, `prompt_lookup_num_tokens=0`)
                  (both draft every step, `draft_backoff=False`: the draft's τ as the field measures it)
  domino          the Domino checkpoint as shipped: the Domino block or a span looked up in the context,
                  paused where it does not pay (the draft's `draft_backoff`)

Reported per method (and per prompt set): τ (tokens per target forward, bonus included), per-position
acceptance, the acceptance-length histogram, decode speedup vs autoregressive (prefill excluded, medians
over prompts × repeats), end-to-end tokens/s, and a token-by-token lossless check of greedy outputs.
With --profile (the default on CPU), each verify step's time split into target verify, draft backbone,
base LM head, head rollout and loop overhead.
Writes <out>/<name>.json, <name>.md and <name>_*.png, and prints the tables."""

EPILOG = """\
examples (D: a Domino draft folder or Hub id; in a domino-hf checkout drafts/smollm2-135m-instruct-domino):
  domino bench --draft D                              # 10 HumanEval + 10 MT-Bench prompts, greedy
  domino bench --draft D --prompts alpaca,qa --num-prompts 10 --repeats 3
  domino bench --draft D --temperature 1.0 --seed 0   # sampling (lossless check n/a)
  domino bench --draft me/smollm2-domino --methods autoregressive,domino
  domino bench --methods autoregressive,prompt_lookup --prompts my_prompts.jsonl --out runs/today
  domino bench --draft D --humaneval-pass1 --pass1-samples 5   # + HumanEval pass@1 at T>0 (slow)

prompt sets: humaneval, mt_bench (first turn), alpaca, sum, qa, copy_heavy, translation, rag_qa, math_word,
sharegpt, or a JSONL path."""


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models")
    add_target_arguments(models)
    models.add_argument(
        "--draft",
        metavar="PATH_OR_REPO",
        default=None,
        help="Domino draft folder or Hub id, loaded with `AutoModel.from_pretrained(..., trust_remote_code=True)`; "
        "needed by the dflash, domino_no_lookup and domino methods (the draft shipped with domino-hf's sources is "
        "drafts/smollm2-135m-instruct-domino)",
    )
    models.add_argument(
        "--confidence-threshold",
        metavar="P",
        type=float,
        default=None,
        help="override the draft's adaptive draft length (`draft_confidence_threshold`; 0 = always the whole "
        "block) for the dflash and domino methods (default: the draft's own setting)",
    )
    models.add_argument(
        "--max-draft-tokens",
        metavar="K",
        type=int,
        default=None,
        help="override the draft's cap on tokens proposed per step (`max_draft_tokens`) for dflash and domino",
    )
    models.add_argument(
        "--assistant",
        metavar="NAME_OR_PATH",
        default=None,
        help="small causal LM for the `assisted` method (same tokenizer as the target)",
    )
    models.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPE_NAMES,
        help="dtype of the target (and assistant); greedy identity needs float32 on CPU (default: %(default)s)",
    )
    models.add_argument(
        "--draft-dtype",
        default="auto",
        choices=("auto", *DTYPE_NAMES),
        help="dtype of the Domino draft. Drafting only proposes tokens, so a cheaper draft precision keeps the "
        "output exact. auto = bfloat16 for a float32 target on a CPU with native bf16 matmuls (avx512_bf16 / "
        "amx_bf16), else the target's dtype (default: %(default)s)",
    )
    models.add_argument(
        "--target-kernels",
        default="auto",
        choices=("auto", "stock", "optimized"),
        help="matmul kernels of the target and draft for every method: `optimized` runs every nn.Linear on "
        "pre-packed oneDNN weights (domino_hf.optimize_for_cpu; CPU only) and adds plain decoding on stock "
        "kernels as a second baseline; auto = optimized on CPU, stock elsewhere (default: %(default)s)",
    )
    models.add_argument(
        "--device",
        metavar="DEVICE",
        default="cpu",
        help="cpu, cuda, cuda:N or auto (default: %(default)s)",
    )

    run = parser.add_argument_group("what to run")
    run.add_argument(
        "--methods",
        metavar="LIST",
        type=_csv,
        default=None,
        help="comma-separated subset of autoregressive,prompt_lookup,assisted,dflash,domino_no_lookup,domino "
        "(default: all but assisted, + assisted with --assistant)",
    )
    run.add_argument(
        "--prompts",
        metavar="LIST",
        type=_csv,
        default=["humaneval", "mt_bench"],
        help="comma-separated prompt sets or JSONL paths (default: humaneval,mt_bench)",
    )
    # Defaults sized so that plain `domino bench` (SmolLM2-135M, 4 methods) finishes in minutes on 2 CPU cores.
    run.add_argument("--num-prompts", metavar="N", type=int, default=10, help="prompts per set (default: %(default)s)")
    run.add_argument(
        "--max-new-tokens", metavar="N", type=int, default=128, help="new tokens per prompt (default: %(default)s)"
    )
    run.add_argument(
        "--temperature",
        metavar="T",
        type=float,
        default=0.0,
        help="0 = greedy; > 0 = pure sampling, seeded per prompt (default: %(default)s)",
    )
    run.add_argument(
        "--seed",
        metavar="N",
        type=int,
        default=0,
        help="base seed of the sampling runs (default: %(default)s)",
    )
    run.add_argument(
        "--repeats",
        metavar="N",
        type=int,
        default=1,
        help="timed runs per prompt and method (default: %(default)s)",
    )
    run.add_argument(
        "--warmup",
        metavar="N",
        type=int,
        default=1,
        help="untimed runs per method before timing (default: %(default)s)",
    )
    run.add_argument(
        "--prompt-lookup-tokens",
        metavar="N",
        type=int,
        default=10,
        help="`prompt_lookup_num_tokens` for prompt_lookup (default: %(default)s)",
    )
    run.add_argument(
        "--system",
        metavar="TEXT",
        default=None,
        help="system prompt for the chat template (default: none)",
    )
    add_chat_template_argument(run)  # the format the draft was trained on (`domino regen --chat-template`)
    run.add_argument(
        "--threads",
        metavar="N",
        type=int,
        default=None,
        help="torch intra-op threads, recorded in the JSON config (default: $OMP_NUM_THREADS when set, else the CPU "
        "cores this process may use). "
        "On a machine shared with other jobs, fewer threads than cores gives steadier timings",
    )
    run.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="per-step time split (target verify, backbone, LM head, head rollout, loop overhead) as a table and "
        "<name>_profile.png (default: on for CPU; off on CUDA, where it synchronises the device around every "
        "timed phase and so slows the speed it reports)",
    )

    task = parser.add_argument_group("HumanEval pass@1 at T > 0 (opt-in, slow)")
    task.add_argument(
        "--humaneval-pass1",
        action="store_true",
        help="also compare pass@1 of autoregressive vs domino sampling, executing the samples",
    )
    task.add_argument(
        "--pass1-problems",
        metavar="N",
        type=int,
        default=20,
        help="HumanEval problems (default: %(default)s)",
    )
    task.add_argument(
        "--pass1-samples",
        metavar="N",
        type=int,
        default=5,
        help="samples per problem and method (default: %(default)s)",
    )
    task.add_argument(
        "--pass1-temperature",
        metavar="T",
        type=float,
        default=1.0,
        help="sampling temperature of the pass@1 check (default: %(default)s)",
    )
    task.add_argument(
        "--pass1-max-new-tokens", metavar="N", type=int, default=256, help="tokens per sample (default: %(default)s)"
    )

    out = parser.add_argument_group("output")
    out.add_argument("--out", "--output_dir", dest="out", metavar="DIR", default="runs/bench",
                     help="output folder (default: %(default)s)")
    out.add_argument("--overwrite_output_dir", "--overwrite-output-dir", dest="overwrite_output_dir",
                     action="store_true",
                     help="allow replacing a report that git tracks (e.g. the committed docs/bench)")
    out.add_argument(
        "--name",
        metavar="STEM",
        default=None,
        help="file stem (default: `bench`, or `bench_T<temperature>` when sampling)",
    )
    out.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    out.add_argument("--no-progress", action="store_true", help="no progress bars")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark Domino against autoregressive, prompt lookup, assisted and DFlash decoding",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


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


def refuse_tracked_overwrite(out: Path, names: list[str], overwrite: bool) -> None:
    """A report file that git tracks (the committed docs/bench) is replaced only with --overwrite_output_dir."""
    tracked = [name for name in names if git_tracked(out / name)]
    if tracked and not overwrite:
        raise UsageError(
            f"--out {out}: {', '.join(tracked)} is tracked by git (a committed report). Write elsewhere "
            "(default runs/bench, or --name STEM) or pass --overwrite_output_dir to replace it."
        )


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_draft_dtype(name: str, target_dtype, device: str):
    """`--draft-dtype`: an explicit dtype, or `auto` (see its help)."""
    import torch

    if name != "auto":
        return torch_dtype(name)
    if device == "cpu" and target_dtype == torch.float32 and cpu_has_native_bf16():
        return torch.bfloat16
    return target_dtype


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
    from ..data import chat_input_ids, read_prompts

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


def choose_methods(requested: list[str] | None, assistant: str | None) -> list[str]:
    from .runner import ALL_METHODS

    if requested is None:
        return [m for m in ALL_METHODS if m != "assisted" or assistant]
    unknown = [m for m in requested if m not in ALL_METHODS]
    if unknown:
        raise UsageError(f"--methods: unknown {unknown}; choose from {','.join(ALL_METHODS)}.")
    if "assisted" in requested and not assistant:
        raise UsageError(
            "--methods assisted needs --assistant NAME_OR_PATH (a small model sharing the target's tokenizer)."
        )
    return requested


def load_target(name: str, dtype, device, **hub_options):
    from ..targets import load_target as _load

    try:
        return _load(name, dtype=dtype, device=device, **hub_options)
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


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UsageError as err:
        logger.error("%s", err)
        return 2


def _run(args: argparse.Namespace) -> int:
    import torch

    from .report import markdown, write_report
    from .runner import run_benchmark

    dtype = torch_dtype(args.dtype)
    device = resolve_device(args.device)
    methods = choose_methods(args.methods, args.assistant)
    needs_draft = any(m in DRAFT_METHODS for m in methods) or args.humaneval_pass1
    draft_name = resolve_draft(args.draft, methods) if needs_draft else None
    try:
        for source in args.prompts:
            check_prompt_source(source)
    except FileNotFoundError as err:
        raise UsageError(f"--prompts: {err}") from None
    try:
        check_chat_template(args.chat_template)
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None
    stem = args.name or ("bench" if args.temperature <= 0 else f"bench_T{args.temperature:g}")
    refuse_tracked_overwrite(Path(args.out), [f"{stem}.json", f"{stem}.md"], args.overwrite_output_dir)
    threads = args.threads or default_threads()  # after the argument checks: a usage error changes nothing
    torch.set_num_threads(threads)
    if args.dtype != "float32" and args.temperature <= 0:
        logger.warning("Greedy identity is only expected in float32: %s can flip near-tied argmaxes.", args.dtype)

    target, tokenizer = load_target(args.target, dtype, device, **target_kwargs(args))
    draft_dtype = resolve_draft_dtype(args.draft_dtype, dtype, device)
    draft = load_draft(draft_name, draft_dtype, device) if draft_name else None
    drafting = {}  # the draft's own drafting defaults (its generation_config), as this run overrides them
    if draft is not None:
        from ..modeling.configuration_domino import draft_level_settings

        if args.confidence_threshold is not None:
            draft.generation_config.draft_confidence_threshold = args.confidence_threshold
        if args.max_draft_tokens is not None:
            draft.generation_config.max_draft_tokens = args.max_draft_tokens
        drafting = draft_level_settings(draft.generation_config, draft.config)
    assistant = load_assistant(args.assistant, dtype, device) if args.assistant else None
    kernels = args.target_kernels if args.target_kernels != "auto" else ("optimized" if device == "cpu" else "stock")
    if kernels == "optimized":
        from ..cpu_kernels import optimize_for_cpu

        for model in (target, draft, assistant):
            if model is not None:
                optimize_for_cpu(model)
    prompts = build_prompts(tokenizer, args.prompts, args.num_prompts, args.system, args.chat_template)
    config = BenchConfig(
        methods=tuple(methods),
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        repeats=args.repeats,
        warmup=args.warmup,
        seed=args.seed,
        prompt_lookup_tokens=args.prompt_lookup_tokens,
        profile=args.profile,
        progress=not args.no_progress,
        extra={
            "target": args.target,
            "draft": draft_name,
            "assistant": args.assistant,
            "dtype": args.dtype,
            "draft_dtype": dtype_name(draft_dtype) if draft is not None else None,
            "device": device,
            "sources": args.prompts,
            "system": args.system,
            "chat_template": args.chat_template,
            "threads": threads,
            # transformers >= 5.25 swaps some layers for Hub kernels at load unless USE_HUB_KERNELS=0: on a GPU that
            # moves the stock baseline, so the report says whether it happened.
            "target_hub_kernels": bool(getattr(target, "use_kernels", False)),
            "confidence_threshold": drafting.get("draft_confidence_threshold"),
            "max_draft_tokens": drafting.get("max_draft_tokens"),
        },
    )
    result = run_benchmark(target, prompts, config, draft=draft, assistant=assistant)
    if args.humaneval_pass1:
        from .humaneval import humaneval_pass1

        result["humaneval_pass1"] = humaneval_pass1(
            target,
            tokenizer,
            draft,
            num_problems=args.pass1_problems,
            samples=args.pass1_samples,
            temperature=args.pass1_temperature,
            max_new_tokens=args.pass1_max_new_tokens,
            seed=args.seed,
            progress=not args.no_progress,
        )
    paths = write_report(result, args.out, stem=stem, plots=not args.no_plots)
    print(markdown(result))
    print(f"\nwritten: {', '.join(str(p) for p in paths.values())}")
    failed = [m for m, v in result["methods"].items() if v["lossless"] is False]
    if failed:
        logger.error("NOT LOSSLESS: %s produced different greedy tokens than %s decoding.", ", ".join(failed), AR)
        return 1
    return 0
