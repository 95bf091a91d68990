"""`domino regen`'s command line: the options, turned into one `RegenOptions` and handed to the way of answering
they ask for: the target here (`regen.regenerate`), a serving engine (`endpoint.regenerate_via_endpoint`), or the
source's own replies (`source_answers.write_source_answers`). The parser imports neither torch nor transformers
(help and usage errors come at once); the target loads through `targets` when the command runs.
"""

from __future__ import annotations

import argparse
import logging
import os

from ..cli_common import (
    HelpFormatter,
    add_command,
    add_chat_template_argument,
    add_device_argument,
    add_target_arguments,
    target_device,
    target_kwargs,
)
from ..data import read_prompts
from ..dtypes import DTYPE_CHOICES, resolve_dtype
from ..utils import require_paths
from .answers import RegenOptions
from .endpoint import EndpointClient, EndpointRegen, regenerate_via_endpoint
from .source_answers import write_source_answers
from .turns import TURN_CHOICES

RESPONSE_CHOICES = ("target", "source")  # who writes the answers: `--responses` (source_answers.py)

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `domino regen` to the CLI."""
    parser = add_command(
        subparsers, "regen",
        help="Have the target answer prompts: the training data for a draft.",
        description="Have the target model answer prompts and append the answers (with token ids) to a JSONL "
        "file, the training data for a Domino draft. Rerunning with the same --out resumes: ids already "
        "answered are skipped and a line cut short by a kill is rewritten.",
        formatter_class=HelpFormatter,
    )
    add = parser.add_argument
    add_target_arguments(parser)
    add("--prompts", default="sharegpt", metavar="SOURCE",
        help="Prompt source: a JSONL/JSON file, `sharegpt`, `humaneval`, `mt_bench`, `alpaca`, `sum`, `qa`, "
        "`hf:<dataset>[:split]`, a training source built offline (`dm-math`, `chatterbot`, `translate`, "
        "`python-docs`, `python-code`; benchmark-filtered), or a comma-separated mix, interleaved record by record "
        "(`sharegpt,dm-math`); see --turns for which user turns are answered (default: %(default)s).")
    add("--responses", default="target", choices=RESPONSE_CHOICES,
        help="`target`: the target answers; `source`: the source's own assistant reply is the answer (ShareGPT "
        "`conversations`, chat `messages`; first turns only; no generation, only the tokenizer is loaded), rows "
        "marked `response_from: source`: context for `domino train`, which labels them with the target's own next "
        "token at the first draft slot (docs/training.md, 'Source answers as extra context') (default: %(default)s).")
    add("--turns", default="first", choices=TURN_CHOICES,
        help="`first` answers the first user turn of each record (id = the record's id); `all` also answers the "
        "later turns of multi-turn records, turn by turn, each after the target's own earlier answers (never the "
        "source's), with ids `<id>#t2`, `<id>#t3`, …; the turn-1 rows are the same as with `first`, so an "
        "existing output is extended, not redone. A turn over --max_prompt_tokens ends its conversation "
        "(default: %(default)s).")
    add(
        "--out", "--output_file", dest="out", required=True, metavar="FILE",
        help="Output JSONL file, appended to and created if missing.",
    )
    add("--batch_size", "--per_device_batch_size", dest="batch_size", type=int, default=24, metavar="N",
        help="Prompts generated together, left-padded (default: %(default)s).")
    add("--max_new_tokens", type=int, default=128, metavar="N",
        help="Maximum tokens per answer; answers that hit it are written with finished=false "
        "(default: %(default)s).")
    add("--max_prompt_tokens", type=int, default=256, metavar="N",
        help="Skip (and count) prompts longer than N chat-templated tokens; with --turns all, such a turn ends its "
        "conversation (default: %(default)s).")
    add("--min_prompt_tokens", type=int, default=0, metavar="N",
        help="Skip (and count) prompts shorter than N chat-templated tokens, e.g. to add the long prompts an earlier "
        "run's --max_prompt_tokens left out without redoing the rest; with --turns all, such a turn ends its "
        "conversation (default: %(default)s).")
    add("--temperature", type=float, default=0.0, metavar="T",
        help="0 decodes greedily; above 0 samples from the full tempered distribution (default: %(default)s).")
    add("--seed", type=int, default=0, help="Random seed, used when sampling (default: %(default)s).")
    add("--limit", type=int, default=None, metavar="N",
        help="Use only the first N prompts of the source; a rerun with the same N resumes (default: all).")
    add("--system", default=None, metavar="TEXT",
        help="System prompt (default: none, so the chat template's own default applies).")
    add_chat_template_argument(parser)
    add("--stop", action="append", default=None, metavar="TEXT",
        help="End an answer at this text too (repeatable), e.g. --stop $'\\n\\n' for one paragraph of a base model "
        "(default: EOS only).")
    add("--dtype", default="float32", choices=DTYPE_CHOICES,
        help="Dtype of the target weights; float32 gives exact, reproducible greedy answers on CPU; auto = "
        "bfloat16 where it is fast (a GPU, or a CPU with avx512_bf16/AMX), else float32 (default: %(default)s).")
    add_device_argument(parser)
    add("--draft", default=None, metavar="PATH_OR_REPO",
        help="A Domino draft of the target (a folder or Hub id, loaded with DominoDraftModel.from_pretrained in the "
        "target's dtype; on CPU on optimize_for_cpu kernels): every batch is generated with "
        "generate(assistant_model=draft), the draft's batched speculative decoding, which gives the greedy answers "
        "of plain decoding in fewer target forwards; the draft's tau is logged. Sampled answers (--temperature > 0) "
        "follow the same distribution, but a seed need not repeat them (default: none, plain batched decoding).")
    add_endpoint_arguments(parser)
    parser.set_defaults(func=run)


def add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """The `domino regen` options that switch it to a serving engine."""
    group = parser.add_argument_group(
        "serving engine", "Get the answers from an OpenAI-compatible server (vLLM, SGLang, llama.cpp) instead of "
        "loading the target here; --target then only supplies the tokenizer and chat template, and --batch_size, "
        "--dtype and --device do not apply.")
    add = group.add_argument
    add("--endpoint", default=None, metavar="URL",
        help="API root of the server, e.g. http://127.0.0.1:8000/v1 (default: generate locally).")
    add("--model", default=None, metavar="NAME",
        help="Served model name, as listed by the server's /v1/models (default: the only one served).")
    add("--concurrency", type=int, default=8, metavar="N",
        help="Requests in flight at once (default: %(default)s).")
    add("--request_timeout", type=float, default=600.0, metavar="S",
        help="Seconds to wait for one answer before retrying it (default: %(default)s).")
    add("--retries", type=int, default=5, metavar="N",
        help="Retries of a request after a timeout, a dropped connection, HTTP 429 or 5xx, with exponential "
        "backoff from 0.5 s (default: %(default)s). The API key, if the server wants one, is read from "
        "OPENAI_API_KEY.")


def regen_options(args: argparse.Namespace) -> RegenOptions:
    """The `RegenOptions` that `domino regen`'s options ask for."""
    return RegenOptions(
        max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
        min_prompt_tokens=args.min_prompt_tokens, limit=args.limit, system=args.system,
        chat_template=args.chat_template, turns=args.turns, temperature=args.temperature, seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of `domino regen`; returns the exit code."""
    if args.draft and (args.endpoint or args.responses == "source"):
        logger.error("--draft drafts for the target generating here, not with %s: drop one of the two",
                     "--endpoint" if args.endpoint else "--responses source")
        return 2
    if args.endpoint:
        return _run_endpoint(args)
    if args.responses == "source":
        return _run_source_answers(args)
    from .. import targets
    from .regen import regenerate

    device = target_device(args)
    try:  # read the prompts first: a bad source fails before the (slower) model load
        prompts = read_prompts(args.prompts, limit=args.limit)
        if args.chat_template not in ("auto", "none"):
            require_paths(chat_template=args.chat_template)
        model, tokenizer = targets.load_target(args.target, dtype=resolve_dtype(args.dtype, device), device=device,
                                               **target_kwargs(args))
        draft = _load_draft(args.draft, model) if args.draft else None
    except (OSError, ImportError, RuntimeError, ValueError) as err:  # missing file/package/model, Hub, id clash
        logger.error("%s", err)
        return 2
    regenerate(model, tokenizer, prompts, args.out, regen_options(args), batch_size=args.batch_size, stop=args.stop,
               draft=draft)
    return 0


def _load_draft(name: str, target):
    """`--draft`: the draft in the target's dtype, on its device; on CPU the draft's linear layers run on
    `optimize_for_cpu` kernels (the target keeps its own, so its answers are those it gives without the draft)."""
    from .. import targets

    draft = targets.load_draft(name, target)
    if target.device.type == "cpu":
        from ..cpu_kernels import optimize_for_cpu

        optimize_for_cpu(draft)
    logger.info("regen: drafting with %s (%s, %s)", name, str(draft.dtype).removeprefix("torch."), target.device)
    return draft


def _run_source_answers(args: argparse.Namespace) -> int:
    """`domino regen --responses source`: the source's replies as answers, nothing generated."""
    if args.turns != "first":
        logger.error("--responses source answers first turns only (a later turn's history would be the source's "
                     "replies, never the target's); drop --turns %s", args.turns)
        return 2
    try:
        from .. import targets

        prompts = read_prompts(args.prompts, limit=args.limit)
        tokenizer, _ = targets.load_target_tokenizer(args.target, **target_kwargs(args))
        write_source_answers(tokenizer, prompts, args.out, regen_options(args))
    except (OSError, ImportError, RuntimeError, ValueError) as err:
        logger.error("%s", err)
        return 2
    return 0


def _run_endpoint(args: argparse.Namespace) -> int:
    """`domino regen --endpoint …`; returns the exit code (2 with a one-line error on any server problem)."""
    if args.concurrency < 1 or args.max_new_tokens < 1:
        logger.error("--concurrency and --max_new_tokens must be positive")
        return 2
    if args.stop:
        logger.error("--stop is not supported with --endpoint: regenerate without it, or without --endpoint")
        return 2
    try:
        from .. import targets

        prompts = read_prompts(args.prompts, limit=args.limit)
        tokenizer, generation_config = targets.load_target_tokenizer(args.target)
        client = EndpointClient(args.endpoint, timeout=args.request_timeout, retries=args.retries,
                                api_key=os.environ.get("OPENAI_API_KEY"))
        engine = EndpointRegen(client, tokenizer, generation_config, model=args.model, options=regen_options(args))
        regenerate_via_endpoint(engine, prompts, args.out, concurrency=args.concurrency)
    except (OSError, ImportError, RuntimeError, ValueError) as err:  # EndpointError is a RuntimeError
        logger.error("%s", err)
        return 2
    return 0
