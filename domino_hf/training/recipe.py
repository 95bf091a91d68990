"""The training recipe and the `domino train` subcommand: from a target and regenerated data to a trained draft.

Runs unchanged as one CPU process (`domino train …`) or N processes (`accelerate launch -m domino_hf.train …`,
`torchrun --nproc_per_node N -m domino_hf.train …`): `Trainer` picks up the distributed environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass

import torch
from transformers import TrainingArguments

from ..cli_common import HelpFormatter, add_target_arguments, target_kwargs
from ..dtypes import warn_if_emulated
from ..data import add_chat_template_argument
from ..modeling import DominoConfig, DominoDraftModel
from ..modeling.configuration_domino import target_token_ids
from ..modeling.generation_domino import acceptance_length
from .dataset import AnchorCollator, RegenDataset, build_draft_vocab, load_training_data
from .decontaminate import BenchmarkFilter
from .distill import DEFAULT_TOPK, LOSSES
from .features import CONFIG, FeatureStore, NonFiniteFeatures
from .grow import grow_draft_layers, grow_draft_vocab
from .objective import DominoObjective
from .checkpoint import FINAL, SUMMARY, last_complete_checkpoint
from .trainer import DominoTrainer, EpochCallback, NonFiniteTraining

logger = logging.getLogger(__name__)

BIG_VOCAB = 65536  # above this, training on the full vocabulary is mostly vocabulary work: suggest a sub-vocabulary


@dataclass
class TrainSettings:
    """The recipe (REFERENCE: AdamW lr 6e-4, wd 0, clip 1.0, cosine, 4% warmup, λ 1→0 over the run)."""

    output_dir: str
    epochs: float = 3.0
    max_steps: int = -1
    batch_size: int = 4
    grad_accum: int = 1
    learning_rate: float = 6e-4
    warmup_ratio: float = 0.04
    num_anchors: int = 32
    gamma: float | None = None
    curriculum: bool = True
    loss: str = "ce"  # "kl": to the target's top-`kl_topk` next-token distribution at `kl_temperature` (distill.py)
    kl_topk: int = DEFAULT_TOPK
    kl_temperature: float = 1.0
    logging_steps: int = 10
    save_steps: int = 200
    save_total_limit: int = 2
    seed: int = 0
    report_to: str = "none"
    resume: bool | str = False  # True: the newest complete checkpoint in output_dir; a str: that checkpoint
    bf16: bool | None = None  # None: on when a GPU supports it
    group_by_length: bool = False  # batches of similar lengths (LengthGroupedEpochSampler): less padding
    scaled_lr_layers: tuple[int, ...] = ()  # draft layers trained at `layer_lr_scale` × the learning rate
    layer_lr_scale: float = 1.0
    weight_decay: float = 0.0  # AdamW's, on every draft weight
    feature_noise: float = 0.0  # σ of the multiplicative noise on the context features (DominoTrainer)

    def __post_init__(self):
        if not (self.weight_decay >= 0 and 0 <= self.feature_noise < 1):
            raise ValueError(f"weight_decay must be >= 0 and feature_noise in [0, 1) (got {self.weight_decay} and "
                             f"{self.feature_noise})")


def init_from_target_layers(draft: DominoDraftModel, target) -> int:
    """Copy the target's last decoder layers into the draft layers where shapes match; returns tensors copied."""
    target_layers = target.base_model.layers
    copied = 0
    for draft_layer, source in zip(draft.layers, target_layers[-len(draft.layers) :]):
        source_state = source.state_dict()
        for name, tensor in draft_layer.state_dict().items():
            if name in source_state and source_state[name].shape == tensor.shape:
                tensor.copy_(source_state[name])
                copied += 1
    return copied


def build_config(target, tokenizer, config_path=None, **overrides) -> DominoConfig:
    """The draft config for `target`: from a config JSON (e.g. `hub_configs/…json`, or the `draft_config.json`
    that `domino features` writes) or derived from the target; `overrides` that are not None win."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if not config_path:
        return DominoConfig.for_target(target.config, tokenizer, **overrides)
    with open(config_path, encoding="utf-8") as handle:
        fields = json.load(handle)
    fields.update(overrides)
    for key, value in target_token_ids(target.config).items():  # what 🤗 pipelines compare with the target's
        fields.setdefault(key, value)
    config = DominoConfig(**fields)
    # provenance is the target actually trained with, whatever the config file was written for
    config.target_name_or_path = target.config._name_or_path or config.target_name_or_path
    return config


def build_draft(target, tokenizer, config_path=None, init="random", config=None, **overrides) -> DominoDraftModel:
    """A fresh draft for `target` with `config`, or `build_config(target, tokenizer, config_path, **overrides)`.
    `init="from:<draft folder>"` continues from an existing draft instead (same architecture, e.g. a second
    training stage on more data)."""
    if init.startswith("from:"):
        draft = DominoDraftModel.from_pretrained(init[len("from:") :], dtype=torch.float32)
        logger.info("Continuing from the draft in %s", init[len("from:") :])
        return draft
    torch.manual_seed(0)
    draft = DominoDraftModel(config or build_config(target, tokenizer, config_path, **overrides))
    if init == "target-layers":
        logger.info(
            "Initialised %d draft tensors from the target's last layers", init_from_target_layers(draft, target),
        )
    return draft


def train_draft(target, draft: DominoDraftModel, dataset: RegenDataset, settings: TrainSettings, tau_probe=None):
    """Train `draft` in place on `dataset`; checkpoints under `settings.output_dir`, final draft in `…/final`."""
    on_gpu = torch.cuda.is_available()
    bf16 = settings.bf16 if settings.bf16 is not None else (on_gpu and torch.cuda.is_bf16_supported())
    if bf16 and not on_gpu:
        warn_if_emulated("--bf16", "Train with --no-bf16.")
    args = TrainingArguments(
        output_dir=settings.output_dir,
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.grad_accum,
        learning_rate=settings.learning_rate,
        weight_decay=settings.weight_decay,
        max_grad_norm=1.0,
        lr_scheduler_type="cosine",
        warmup_steps=settings.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps
        logging_steps=settings.logging_steps,
        save_steps=settings.save_steps,
        save_total_limit=settings.save_total_limit,
        seed=settings.seed,
        data_seed=settings.seed,
        report_to=settings.report_to,
        remove_unused_columns=False,
        train_sampling_strategy="group_by_length" if settings.group_by_length else "random",
        dataloader_num_workers=0,
        bf16=bf16,
        use_cpu=not on_gpu,
        ddp_find_unused_parameters=False,  # the head always takes part in the loss (weight 0 while λ = 1)
        ddp_backend="gloo" if not on_gpu and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        disable_tqdm=False,
    )
    trainer = DominoTrainer(
        model=DominoObjective(draft, gamma=settings.gamma, loss=settings.loss, kl_temperature=settings.kl_temperature),
        args=args,
        train_dataset=dataset,
        data_collator=AnchorCollator(draft.config, settings.num_anchors, seed=settings.seed),
        target=target,
        use_curriculum=settings.curriculum,
        tau_probe=tau_probe,
        kl_topk=settings.kl_topk,
        callbacks=[EpochCallback(dataset)],
        scaled_lr_parameters=[p for i in settings.scaled_lr_layers for p in draft.layers[i].parameters()],
        lr_scale=settings.layer_lr_scale,
        feature_noise=settings.feature_noise,
    )
    resume = last_complete_checkpoint(settings.output_dir) if settings.resume is True else settings.resume or None
    if resume:
        logger.info("Resuming from %s", resume)
    trainer.train(resume_from_checkpoint=resume)
    final = os.path.join(settings.output_dir, FINAL)
    if trainer.args.should_save:
        draft.save_pretrained(final)
        with open(os.path.join(final, SUMMARY), "w", encoding="utf-8") as handle:
            summary = {"log_history": trainer.state.log_history, "examples": len(dataset), "skipped": dataset.skipped,
                       "response_tokens": dataset.num_response_tokens(), "settings": settings.__dict__}
            json.dump(summary, handle, indent=1)
    trainer.accelerator.wait_for_everyone()  # no process moves on (or exits) before final/ is written
    return trainer


# ------------------------------------------------------------------------------------------------- CLI
def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="Train a Domino draft for a target on regenerated data.",
        description="Train a Domino draft (DFlash backbone + Domino head) with teacher forcing and the "
        "base-anchored curriculum. Single process here; `accelerate launch -m domino_hf.train …` for many GPUs. "
        "Options also answer to the 🤗 Trainer scripts' names (--output_dir, --learning_rate, …).",
        formatter_class=HelpFormatter,
    )
    add_train_arguments(parser)
    parser.set_defaults(func=run)


def add_draft_arguments(parser: argparse.ArgumentParser) -> None:
    """The draft's sizing options, shared by `domino train` and `domino features` (which writes the config)."""
    draft = parser.add_argument_group("draft architecture")
    draft.add_argument(
        "--config", "--config_name", dest="config", default=None,
        help="Draft config JSON (e.g. hub_configs/…json); else the one beside --features, else derived from the "
             "target (head sized by `head_sizes_for`).",
    )
    draft.add_argument(
        "--num-layers", type=int, default=None,
        help="Draft decoder layers (default 1 when derived). With --init from:DIR, a larger number deepens that "
             "draft (the new layers start as identity).",
    )
    draft.add_argument(
        "--new-layer-lr-scale", type=float, default=1.0,
        help="Learning-rate multiplier for the layers --num-layers adds to an --init from: draft (they start at "
             "zero output and at a fine-tuning rate barely move in a round).",
    )
    draft.add_argument("--block-size", type=int, default=None, help="Slots per parallel draft block (default 16).")
    draft.add_argument(
        "--draft-vocab-size", type=int, default=None,
        help="Restrict drafting to the K most frequent response tokens of the data (FR-Spec); coverage is reported.",
    )
    draft.add_argument("--no-head", action="store_true", help="Ablation: no Domino head (pure DFlash draft).")
    return draft


def config_from_args(args, target, tokenizer, dataset) -> DominoConfig:
    """The draft config the sizing options of `add_draft_arguments` ask for (sub-vocabulary from `dataset`)."""
    overrides = {"num_hidden_layers": args.num_layers, "block_size": args.block_size}
    if args.no_head:
        overrides["use_domino_head"] = False
    if args.draft_vocab_size:
        eos = target.generation_config.eos_token_id
        always = tuple(eos if isinstance(eos, list) else [eos]) if eos is not None else ()
        ids, coverage = build_draft_vocab(dataset, args.draft_vocab_size, always)
        logger.info(
            "Draft sub-vocabulary: %d tokens cover %.2f%% of the data's response tokens", len(ids), 100 * coverage,
        )
        if len(ids) < args.draft_vocab_size:
            logger.warning(
                "--draft-vocab-size %d: the draft's sub-vocabulary has only %d tokens, every distinct token of the "
                "data's responses (and EOS): fewer than asked. More training data gives it more.",
                args.draft_vocab_size, len(ids),
            )
        overrides["draft_vocab_ids"] = ids
    config = build_config(target, tokenizer, args.config, **overrides)
    if config.draft_vocab_ids is None and config.vocab_size > BIG_VOCAB:
        ids, coverage = build_draft_vocab(dataset, BIG_VOCAB // 2)
        logger.warning(
            "The draft predicts over all %d tokens of the vocabulary: its LM-head rows, head correction and cross "
            "entropy then take most of each training step (docs/training.md). --draft-vocab-size %d would cover "
            "%.2f%% of this data's response tokens.", config.vocab_size, BIG_VOCAB // 2, 100 * coverage,
        )
    return config


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    add_target_arguments(target)
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data", "--train_file", dest="data", nargs="+", required=True,
        help="JSONL file(s) written by `domino regen`.",
    )
    data.add_argument(
        "--max-length", "--max_seq_length", dest="max_length", type=int, default=3072,
        help="Truncate prompt+response to this many tokens.",
    )
    data.add_argument("--limit", type=int, default=None, help="Use only the first N examples.")
    data.add_argument(
        "--features", default=None,
        help="Context features cached by `domino features` (no target forward while training).",
    )
    draft = add_draft_arguments(parser)
    draft.add_argument(
        "--init", default="random",
        help="Draft initialisation: `random`, `target-layers` (copy the target's last layers), or `from:DIR` to "
             "continue from a trained draft.",
    )
    recipe = parser.add_argument_group("recipe")
    recipe.add_argument(
        "--out", "--output_dir", dest="out", required=True,
        help="Run folder: checkpoints, logs, and the final draft in OUT/final.",
    )
    recipe.add_argument(
        "--epochs", "--num_train_epochs", dest="epochs", type=float, default=3.0,
        help="Passes over the data (paper: 3–6).",
    )
    recipe.add_argument(
        "--max-steps", "--max_steps", dest="max_steps", type=int, default=-1,
        help="Stop after N optimizer steps (overrides --epochs when > 0).",
    )
    recipe.add_argument(
        "--batch-size", "--per_device_train_batch_size", dest="batch_size", type=int, default=4,
        help="Sequences per device per step.",
    )
    recipe.add_argument(
        "--grad-accum", "--gradient_accumulation_steps", dest="grad_accum", type=int, default=1,
        help="Gradient accumulation steps (global batch = devices × batch × accum).",
    )
    recipe.add_argument(
        "--lr", "--learning_rate", dest="lr", type=float, default=6e-4,
        help="Peak AdamW learning rate (cosine schedule, 4%% warmup).",
    )
    recipe.add_argument(
        "--num-anchors", "--num_anchors", dest="num_anchors", type=int, default=32,
        help="Random anchors (blocks) per sequence, inside the response.",
    )
    recipe.add_argument(
        "--gamma", type=float, default=None, help="Position-weight decay γ in exp(-k/γ) (default by block size).",
    )
    recipe.add_argument("--no-curriculum", action="store_true", help="Ablation: train on the final loss only (λ = 0).")
    recipe.add_argument(
        "--loss", choices=LOSSES, default="ce",
        help="ce: cross entropy on the target's own tokens (the paper's); kl: KL divergence from the target's "
             "next-token distribution (its --kl-topk most probable tokens, renormalised over the draft vocabulary), "
             "from its forward in each step or from --features extracted with `domino features --kl-topk`.",
    )
    recipe.add_argument(
        "--kl-topk", type=int, default=DEFAULT_TOPK, metavar="K",
        help="With --loss kl: how many of the target's most probable next tokens make the soft label.",
    )
    recipe.add_argument(
        "--kl-temperature", type=float, default=1.0, metavar="T",
        help="With --loss kl: both distributions at temperature T, the loss scaled by T².",
    )
    recipe.add_argument(
        "--weight-decay", "--weight_decay", dest="weight_decay", type=float, default=0.0,
        help="AdamW weight decay (the paper's recipe: 0).",
    )
    recipe.add_argument(
        "--feature-noise", type=float, default=0.0, metavar="SIGMA",
        help="Regulariser: multiply each context feature by (1 + SIGMA·N(0, 1)) in training, so that the draft "
             "cannot key on exact hidden-state values of the answers it has seen (0 = off; e.g. 0.1).",
    )
    recipe.add_argument("--seed", type=int, default=0, help="Seed for init, data order and anchors.")
    recipe.add_argument(
        "--group-by-length", "--group_by_length", dest="group_by_length", action="store_true",
        help="Batch examples of similar length (transformers' grouping, ordered by seed and epoch): far less "
             "padding on data of mixed lengths (1.2x a step on SmolLM2's round-2 data, docs/training.md).",
    )
    run_group = parser.add_argument_group("run")
    run_group.add_argument(
        "--resume", action="store_const", const=True, default=False,
        help="Continue from the newest complete checkpoint in --out.",
    )
    run_group.add_argument(
        "--resume_from_checkpoint", dest="resume", nargs="?", const=True, metavar="CHECKPOINT",
        help="Continue from CHECKPOINT (a checkpoint-N folder), or without a value from the newest complete one in "
             "--out.",
    )
    run_group.add_argument(
        "--save-steps", "--save_steps", dest="save_steps", type=int, default=200,
        help="Checkpoint every N steps (atomic; resumable).",
    )
    run_group.add_argument(
        "--logging-steps", "--logging_steps", dest="logging_steps", type=int, default=10,
        help="Log losses/accuracies/throughput every N steps.",
    )
    run_group.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=None,
        help="bf16 mixed precision (fp32 master weights). Default: on with a GPU that supports it; on a CPU with "
             "native bf16 (AMX, AVX512-BF16) --bf16 trains ~1.5x faster (docs/training.md), on other CPUs many "
             "times slower.",
    )
    run_group.add_argument(
        "--report-to", "--report_to", dest="report_to", default="none",
        help="Trainer integrations: none, tensorboard, wandb, …",
    )
    run_group.add_argument(
        "--probe-prompts", default=None,
        help="Held-back prompt source; at each checkpoint, measure τ by real greedy decoding on a few of them "
             "(probe_tau) and the draft's own τ replayed on those answers (probe_replay_tau).",
    )
    run_group.add_argument("--probe-num", type=int, default=6, help="Prompts in the τ probe.")
    run_group.add_argument("--probe-max-new-tokens", type=int, default=64, help="New tokens per probe prompt.")
    add_chat_template_argument(run_group)


def run(args) -> int:
    from ..targets import load_target
    from ..utils import require_paths

    if args.loss == "kl" and not (args.kl_topk >= 1 and args.kl_temperature > 0):
        logger.error("--kl-topk must be >= 1 and --kl-temperature > 0 (got %s and %s)", args.kl_topk,
                     args.kl_temperature)
        return 2
    if not args.new_layer_lr_scale > 0 or (args.new_layer_lr_scale != 1.0 and not args.init.startswith("from:")):
        logger.error("--new-layer-lr-scale %s: it must be > 0, and it applies only to the layers --num-layers adds "
                     "to an --init from:DIR draft", args.new_layer_lr_scale)
        return 2
    try:  # the settings validate themselves; checked here before the (slower) target load
        TrainSettings(output_dir=args.out, weight_decay=args.weight_decay, feature_noise=args.feature_noise)
    except ValueError as err:
        logger.error("%s (--weight-decay, --feature-noise)", err)
        return 2
    try:  # missing inputs fail before the (slower) target load
        require_paths(data=args.data, config=args.config, features=args.features,
                      resume_from_checkpoint=args.resume if isinstance(args.resume, str) else None)
        if args.features and args.loss == "kl":
            FeatureStore(args.features).require_topk(args.kl_topk)
        target, tokenizer = load_target(args.target, **target_kwargs(args))
        dataset = load_training_data(args.data, args.max_length, target.config.get_text_config().vocab_size, args.limit,
                                     exclude=BenchmarkFilter.for_benchmarks())
    except (OSError, ImportError, RuntimeError, ValueError) as err:  # missing/empty file, package, model; no Hub
        logger.error("%s", err)
        return 2
    if args.features and not args.config and os.path.exists(os.path.join(args.features, CONFIG)):
        args.config = os.path.join(args.features, CONFIG)  # the config the features were extracted for
        logger.info("Draft config from %s", args.config)
    config = None if args.init.startswith("from:") else config_from_args(args, target, tokenizer, dataset)
    draft = build_draft(target, tokenizer, init=args.init, config=config)
    resized = args.draft_vocab_size and args.draft_vocab_size != draft.config.draft_vocab_size
    deepened = args.num_layers and args.num_layers != draft.config.num_hidden_layers
    new_layers = ()
    if args.new_layer_lr_scale != 1.0 and not deepened:
        logger.error("--new-layer-lr-scale %s: it applies only to the layers --num-layers adds to an --init from:DIR "
                     "draft, and --num-layers %s adds none to this %d-layer draft", args.new_layer_lr_scale,
                     args.num_layers, draft.config.num_hidden_layers)
        return 2
    if args.init.startswith("from:") and (resized or deepened):  # grows, or names why it cannot
        try:
            if deepened:
                new_layers = tuple(range(draft.config.num_hidden_layers, args.num_layers))
                added = grow_draft_layers(draft, args.num_layers)
                logger.info("Draft deepened by %d layer(s) to %d (new layers add nothing until trained)",
                            added, args.num_layers)
            if resized:
                coverage = grow_draft_vocab(draft, dataset, args.draft_vocab_size)
                logger.info("Draft sub-vocabulary grown to %d tokens: they cover %.2f%% of the data's response "
                            "tokens", draft.config.draft_vocab_size, 100 * coverage)
        except ValueError as err:
            logger.error("%s", err)
            return 2
    try:
        if args.features:
            dataset.use_features(FeatureStore(args.features, draft.config.target_layer_ids),
                                 kl_topk=args.kl_topk if args.loss == "kl" else 0)
        probe = None
        if args.probe_prompts:
            prompts = probe_prompts(tokenizer, args.probe_prompts, args.probe_num, args.chat_template)
            probe = make_tau_probe(target, prompts, args.probe_max_new_tokens)
    except (OSError, ImportError, ValueError) as err:  # features of other layers, probe prompts missing
        logger.error("%s", err)
        return 2
    settings = TrainSettings(
        output_dir=args.out, epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size,
        grad_accum=args.grad_accum, learning_rate=args.lr, num_anchors=args.num_anchors, gamma=args.gamma,
        curriculum=not args.no_curriculum, logging_steps=args.logging_steps, save_steps=args.save_steps,
        seed=args.seed, report_to=args.report_to, resume=args.resume, loss=args.loss, kl_topk=args.kl_topk,
        kl_temperature=args.kl_temperature, bf16=args.bf16, group_by_length=args.group_by_length,
        scaled_lr_layers=new_layers, layer_lr_scale=args.new_layer_lr_scale, weight_decay=args.weight_decay,
        feature_noise=args.feature_noise,
    )
    try:
        trainer = train_draft(target, draft, dataset, settings, tau_probe=probe)
    except (NonFiniteTraining, NonFiniteFeatures) as err:
        logger.error("%s", err)
        return 3
    trainer.accelerator.end_training()  # trackers, and the process group of a multi-process run
    logger.info("Final draft written to %s", os.path.join(args.out, FINAL))
    return 0


def probe_prompts(tokenizer, source, num_prompts, chat_template="auto") -> list[torch.Tensor]:
    """The first `num_prompts` prompts of `source`, chat-templated: (1, P) id tensors for `make_tau_probe`."""
    from ..data import chat_input_ids, read_prompts

    records = read_prompts(source, limit=num_prompts).records
    return [torch.tensor([chat_input_ids(tokenizer, r.turns[:1], chat_template=chat_template)]) for r in records]


def make_tau_probe(target, prompts: list[torch.Tensor], max_new_tokens: int):
    """A callable draft -> {"probe_tau", "probe_replay_tau"} on held-back (1, P) `prompts`.

    `probe_tau`: real greedy decoding with the target, as shipped (lookup spans, back-off). `probe_replay_tau`:
    the draft's own τ, drafting every step (`teacher_forced.py`), replayed on the answers that decoding just
    produced, which are the target's greedy ones (decoding is lossless): one more forward per prompt. The
    first moves with the decoding policies, the second only with the draft's weights."""
    from .teacher_forced import replay_answer

    @torch.no_grad()
    def probe(draft) -> dict[str, float]:
        was_training = draft.training
        draft.eval()
        accepted, replayed = [], []
        for input_ids in prompts:
            input_ids = input_ids.to(target.device)
            output = target.generate(input_ids, assistant_model=draft, max_new_tokens=max_new_tokens, do_sample=False)
            accepted += draft.last_generation_stats.accepted
            answer = output[0, input_ids.shape[1]:].tolist()
            replayed += replay_answer(draft, target, input_ids[0].tolist(), answer).accepted
        draft.train(was_training)
        return {"probe_tau": round(acceptance_length(accepted) or 0.0, 4),
                "probe_replay_tau": round(acceptance_length(replayed) or 0.0, 4)}

    return probe


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m domino_hf.train", formatter_class=HelpFormatter,
                                     description="Train a Domino draft (see `domino train --help`).")
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args)
