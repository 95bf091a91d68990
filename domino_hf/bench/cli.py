"""`domino bench`'s command line: the options, parsed into a `pipeline.BenchRequest` and run by
`pipeline.run_bench`; the tables are printed. The parser imports neither torch nor transformers (help and usage
errors come at once); the pipeline loads when the command runs.

Exit codes: 0 = done; 1 = a method's greedy output differed from autoregressive decoding (not lossless);
2 = bad arguments or a missing model.
"""

from __future__ import annotations

import argparse
import logging

from ..cli_common import (
    BooleanFlag,
    RawDescriptionHelpFormatter,
    add_command,
    add_chat_template_argument,
    add_target_arguments,
    target_kwargs,
)
from ..benchmark_sets import SUITES
from ..dtypes import DTYPE_NAMES

logger = logging.getLogger(__name__)

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
                  paused where it does not pay (the draft's `draft_backoff`); without the cross-request store
                  (`use_suffix_cache=False`, as every method but domino_cache)
  domino_tree     `domino` verifying a draft tree per step (`use_draft_tree=True`; one prompt at a time:
                  n/a at --batch_size B > 1, where a batch runs domino's chain)
  domino_cache    `domino` that also drafts from a cross-request store of earlier prompts and outputs (its
                  own `SuffixCache`, emptied after the warm-up); meant for --suite repeated

Reported per method (and per prompt set): τ (tokens per target forward, bonus included), per-position
acceptance, the acceptance-length histogram, decode speedup vs autoregressive (prefill excluded, medians
over prompts × repeats), end-to-end tokens/s, and a token-by-token lossless check of greedy outputs.
With --profile (the default on CPU), each verify step's time split into target verify, draft backbone,
base LM head, head rollout and loop overhead.
With --batch_size, the prompts are decoded in left-padded batches of each size listed (methods that take a
batch only), and the report adds per batch size: tokens/s, per-row latency, τ per row-verify, speedups against plain
batched decoding, a lossless check of every row, and a throughput plot. 1 in the list is the one-prompt-per-call
benchmark above: --batch_size 1,4 gives both, --batch_size 4 the batches alone.
A report gives a rough estimate, and says so, below 10 prompts or 64 new tokens a prompt; with --repeats 2 or more
it gives each speedup's range over the repeats.
Writes <out>/<name>.json, <name>.md and <name>_*.png, and prints the tables; an existing report there is replaced
only with --overwrite_output_dir.

--suite repeated measures workloads that repeat themselves, where `domino_cache` has something to find: an
evaluation run (one few-shot preamble, 20 questions), refinement loops ("improve your answer") and edit loops
(a function edited turn after turn). Every turn of a record runs, chained: its prompt holds the conversation so
far with plain decoding's answers. Each workload starts with empty stores; the report adds the share of steps
drafted from the store and its size and cost (lookup, add, per step). One-off prompts give the store nothing."""

EPILOG = """\
examples (D: a Domino draft folder or Hub id; in a domino-hf checkout drafts/smollm2-135m-instruct-domino):
  domino bench --draft D                              # 10 HumanEval + 10 MT-Bench prompts, greedy
  domino bench --draft D --prompts alpaca,qa --num_prompts 10 --repeats 3
  domino bench --draft D --temperature 1.0 --seed 0   # sampling (lossless check n/a)
  domino bench --draft me/smollm2-domino --methods autoregressive,domino
  domino bench --methods autoregressive,prompt_lookup --prompts my_prompts.jsonl --out runs/today
  domino bench --draft D --humaneval_pass1 --pass1_samples 5   # + HumanEval pass@1 at T>0 (slow)
  domino bench --draft D --suite repeated             # repeated_eval, refine_loop, edit_loop, chained turns
  domino bench --draft D --suite repeated --prompts refine_loop,mt_bench --temperature 0.7
  domino bench --draft D --batch_size 1,2,4,8          # + left-padded batches: throughput, latency, τ per B

prompt sets: humaneval, mt_bench (first turn; every turn with --suite repeated), alpaca, sum, qa, copy_heavy,
translation, rag_qa, math_word, long_qa, long_sum, long_chat, repeated_eval, refine_loop, edit_loop, sharegpt,
or a JSONL path."""


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _batch_sizes(value: str) -> list[int]:
    """`--batch_size 1,2,4,8`: positive integers, ascending and once each; anything else is a one-line error."""
    sizes = []
    for item in value.split(","):
        item = item.strip()
        if not (item.isascii() and item.isdigit()) or int(item) < 1:
            shown = repr(item) if item else "an empty item"
            raise argparse.ArgumentTypeError(f"{shown} is not a batch size: give positive integers, e.g. 1,2,4,8")
        sizes.append(int(item))
    return sorted(set(sizes))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models")
    add_target_arguments(models)
    models.add_argument(
        "--draft",
        metavar="PATH_OR_REPO",
        default=None,
        help="Domino draft folder or Hub id, loaded with `AutoModel.from_pretrained(..., trust_remote_code=True)`; "
        "needed by the dflash, domino_no_lookup, domino, domino_tree and domino_cache methods (the draft shipped with "
        "domino-hf's sources is drafts/smollm2-135m-instruct-domino)",
    )
    models.add_argument(
        "--confidence_threshold",
        metavar="P",
        type=float,
        default=None,
        help="override the draft's adaptive draft length (`draft_confidence_threshold`; 0 = always the whole "
        "block) for the dflash and domino methods (default: the draft's own setting)",
    )
    models.add_argument(
        "--max_draft_tokens",
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
        default="auto",
        choices=("auto", *DTYPE_NAMES),
        help="dtype of the target (and assistant). auto = bfloat16 where the length-invariant bf16 kernels run (a CPU "
        "target on optimized kernels, a CPU with AVX512-BF16; self-checked at load, so greedy decoding is exact), "
        "else float32, saying why; elsewhere half precision can flip near-tied greedy tokens (default: %(default)s)",
    )
    models.add_argument(
        "--draft_dtype",
        default="auto",
        choices=("auto", *DTYPE_NAMES),
        help="dtype of the Domino draft. Drafting only proposes tokens, so a cheaper draft precision keeps the "
        "output exact. auto = bfloat16 for a float32 target on a CPU with native bf16 matmuls (avx512_bf16 / "
        "amx_bf16), else the target's dtype (a bfloat16 target: bfloat16) (default: %(default)s)",
    )
    models.add_argument(
        "--target_kernels",
        default="auto",
        choices=("auto", "stock", "optimized"),
        help="matmul kernels of the target and draft for every method: `optimized` runs every nn.Linear on "
        "the fastest of stock MKL and pre-packed oneDNN or MKL weights for each forward length "
        "(domino_hf.optimize_for_cpu; CPU only) and adds plain decoding on stock "
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
        help="comma-separated subset of autoregressive,prompt_lookup,assisted,dflash,domino_no_lookup,domino,"
        "domino_tree,domino_cache and the reference rows autoregressive_stock_fp32 (a float32 copy of the target on "
        "stock kernels, beside a bfloat16 target), llama_cpp (llama.cpp on the smollm2 target's GGUF) (default: all "
        "but assisted, domino_tree and domino_cache, + assisted with --assistant; with --suite repeated: "
        "autoregressive,prompt_lookup,domino,domino_cache; and the reference rows where they can run)",
    )
    run.add_argument(
        "--suite",
        choices=SUITES,
        default=None,
        help="repeated: run every turn of each record chained (each prompt holds the earlier turns and plain "
        "decoding's answers), a store of its own per store-using method emptied before each workload, and report "
        "the store's size and cost (default: each record's first turn, one independent call per prompt)",
    )
    run.add_argument(
        "--prompts",
        metavar="LIST",
        type=_csv,
        default=None,
        help="comma-separated prompt sets or JSONL paths (default: humaneval,mt_bench; with --suite repeated: "
        "repeated_eval,refine_loop,edit_loop)",
    )
    # Defaults sized so that plain `domino bench` (SmolLM2-135M, 4 methods) finishes in minutes on 2 CPU cores.
    run.add_argument("--num_prompts", metavar="N", type=int, default=None,
                     help="prompts (records) per set (default: 10; with --suite repeated: all)")
    run.add_argument(
        "--max_new_tokens", metavar="N", type=int, default=128, help="new tokens per prompt (default: %(default)s)"
    )
    run.add_argument(
        "--batch_size",
        metavar="LIST",
        type=_batch_sizes,
        default="1",  # a string default goes through `type`: [1]
        help="comma-separated batch sizes: at each B > 1 the prompts (sorted by length, longest first) are decoded in "
        "left-padded batches of B by every method that takes a batch (plain decoding, its stock-kernel baseline, "
        "dflash, domino_no_lookup, domino, domino_cache; prompt_lookup, assisted and domino_tree are n/a), interleaved "
        "batch by batch, and the report adds tokens/s, per-row latency, τ, speedups and a lossless check per B, and a "
        "throughput plot; 1 = one prompt per call, the benchmark as without this option, its tables only when 1 is "
        "listed: 1,4 gives both, 4 the batches alone (default: %(default)s)",
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
        "--prompt_lookup_tokens",
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
    add_chat_template_argument(run)  # the format the draft was trained on (`domino regen --chat_template`)
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
        action=BooleanFlag,
        default=None,
        help="per-step time split (target verify, backbone, LM head, head rollout, loop overhead) as a table and "
        "<name>_profile.png (default: on for CPU; off on CUDA, where it synchronises the device around every "
        "timed phase and so slows the speed it reports)",
    )

    task = parser.add_argument_group("HumanEval pass@1 at T > 0 (opt-in, slow)")
    task.add_argument(
        "--humaneval_pass1",
        action="store_true",
        help="also compare pass@1 of autoregressive vs domino sampling, executing the samples",
    )
    task.add_argument(
        "--pass1_problems",
        metavar="N",
        type=int,
        default=20,
        help="HumanEval problems (default: %(default)s)",
    )
    task.add_argument(
        "--pass1_samples",
        metavar="N",
        type=int,
        default=5,
        help="samples per problem and method (default: %(default)s)",
    )
    task.add_argument(
        "--pass1_temperature",
        metavar="T",
        type=float,
        default=1.0,
        help="sampling temperature of the pass@1 check (default: %(default)s)",
    )
    task.add_argument(
        "--pass1_max_new_tokens", metavar="N", type=int, default=256, help="tokens per sample (default: %(default)s)"
    )

    out = parser.add_argument_group("output")
    out.add_argument("--out", "--output_dir", dest="out", metavar="DIR", default="runs/bench",
                     help="output folder (default: %(default)s)")
    out.add_argument("--overwrite_output_dir", dest="overwrite_output_dir",
                     action="store_true",
                     help="replace the report <name>.json / <name>.md already in --out (an earlier run's, or the "
                     "committed docs/bench); without it such a run is refused before anything loads")
    out.add_argument(
        "--name",
        metavar="STEM",
        default=None,
        help="file stem (default: `bench`, `repeated` with --suite repeated, + `_T<temperature>` when sampling)",
    )
    out.add_argument("--no_plots", action="store_true", help="skip the PNG plots")
    out.add_argument("--no_progress", action="store_true", help="no progress bars")


def register(subparsers) -> None:
    parser = add_command(
        subparsers, "bench",
        help="benchmark Domino against autoregressive, prompt lookup, assisted and DFlash decoding",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def bench_request(args: argparse.Namespace):
    """The `pipeline.BenchRequest` that `domino bench`'s options describe."""
    from .pipeline import BenchRequest
    from .runner import BenchConfig

    return BenchRequest(
        target=args.target, target_options=target_kwargs(args), draft=args.draft,
        confidence_threshold=args.confidence_threshold, max_draft_tokens=args.max_draft_tokens,
        assistant=args.assistant, dtype=args.dtype, draft_dtype=args.draft_dtype, target_kernels=args.target_kernels,
        device=args.device, methods=args.methods, prompts=args.prompts, num_prompts=args.num_prompts, suite=args.suite,
        system=args.system, chat_template=args.chat_template, threads=args.threads, batch_sizes=args.batch_size,
        config=BenchConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                           repeats=args.repeats, warmup=args.warmup, prompt_lookup_tokens=args.prompt_lookup_tokens,
                           profile=args.profile, progress=not args.no_progress),
        humaneval_pass1=args.humaneval_pass1, pass1_problems=args.pass1_problems, pass1_samples=args.pass1_samples,
        pass1_temperature=args.pass1_temperature, pass1_max_new_tokens=args.pass1_max_new_tokens, out=args.out,
        overwrite_output_dir=args.overwrite_output_dir, name=args.name, plots=not args.no_plots,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of `domino bench`; returns the exit code (see the module doc)."""
    from .pipeline import UsageError, run_bench
    from .report import lossless_failures, markdown
    from .stats import AR

    try:
        result, paths = run_bench(bench_request(args))
    except UsageError as err:
        logger.error("%s", err)
        return 2
    print(markdown(result))
    print(f"\nwritten: {', '.join(str(p) for p in paths.values())}")
    failed = lossless_failures(result)
    if failed:
        logger.error("NOT LOSSLESS: %s produced different greedy tokens than %s decoding.", ", ".join(failed), AR)
        return 1
    return 0
