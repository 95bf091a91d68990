"""The training recipe: from a target and regenerated data to a trained draft.

Runs unchanged as one CPU process (`domino train …`) or N processes (`accelerate launch -m domino_hf.train …`,
`torchrun --nproc_per_node N -m domino_hf.train …`): `Trainer` picks up the distributed environment.
`run_training` does what `domino train` asks for (`train_cli.py` only parses the options into a `TrainJob`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments

from .. import targets
from ..chat import chat_input_ids
from ..data import read_prompts
from ..dtypes import warn_if_emulated
from ..modeling import DominoConfig, DominoDraftModel
from ..modeling.configuration_domino import target_token_ids
from ..modeling.generation_domino import acceptance_length
from ..utils import require_paths
from .checkpoint import FINAL, SUMMARY, last_complete_checkpoint
from .dataset import AnchorCollator, RegenDataset, build_draft_vocab, load_training_data
from .decontaminate import BenchmarkFilter
from .choices import BIG_VOCAB, CONFIG, DEFAULT_DRAFT_VOCAB, DEFAULT_TOPK
from .features import FeatureStore
from .grow import grow_draft_layers, grow_draft_vocab
from .objective import DominoObjective
from .teacher_forced import replay_answer
from .trainer import DominoTrainer, EpochCallback

logger = logging.getLogger(__name__)



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
    save_total_limit: int | None = 2  # None: keep every checkpoint
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
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ValueError(f"save_total_limit must be >= 1, or None to keep every checkpoint (got "
                             f"{self.save_total_limit})")


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
        warn_if_emulated("--bf16", "Train with --no_bf16.")
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


def draft_config(target, tokenizer, dataset, config_path=None, num_layers=None, block_size=None,
                 draft_vocab_size=None, use_head=True) -> DominoConfig:
    """The draft config for `target` that `domino train` and `domino features` size: from `config_path` or derived
    (`build_config`), with `num_layers` / `block_size` when given, no Domino head unless `use_head`, and a
    sub-vocabulary of the `draft_vocab_size` most frequent response tokens of `dataset` (its coverage logged).

    `draft_vocab_size=None` (the default) gives a vocabulary of over `BIG_VOCAB` tokens, which would make training
    mostly vocabulary work, a sub-vocabulary of `DEFAULT_DRAFT_VOCAB` tokens, said in one log line; 0 keeps the
    whole vocabulary; a config that has a sub-vocabulary keeps it unless `draft_vocab_size` is given."""
    overrides = {"num_hidden_layers": num_layers, "block_size": block_size}
    if not use_head:
        overrides["use_domino_head"] = False
    config = build_config(target, tokenizer, config_path, **overrides)
    by_default = draft_vocab_size is None and config.draft_vocab_ids is None and config.vocab_size > BIG_VOCAB
    size = DEFAULT_DRAFT_VOCAB if by_default else draft_vocab_size
    if not size:
        return config
    eos = target.generation_config.eos_token_id
    always = tuple(eos if isinstance(eos, list) else [eos]) if eos is not None else ()
    ids, coverage = build_draft_vocab(dataset, size, always)
    if by_default:
        logger.info(
            "The target's vocabulary has %d tokens: the draft predicts over a sub-vocabulary of %d, the most frequent "
            "tokens of the data's responses (%.2f%% of them), the default above %d tokens (docs/training.md); "
            "--draft_vocab_size N sets another size, 0 the whole vocabulary.",
            config.vocab_size, len(ids), 100 * coverage, BIG_VOCAB,
        )
    else:
        logger.info(
            "Draft sub-vocabulary: %d tokens cover %.2f%% of the data's response tokens", len(ids), 100 * coverage,
        )
        if len(ids) < size:
            logger.warning(
                "--draft_vocab_size %d: the draft's sub-vocabulary has only %d tokens, every distinct token of the "
                "data's responses (and EOS): fewer than asked. More training data gives it more.", size, len(ids),
            )
    return build_config(target, tokenizer, config_path, **overrides, draft_vocab_ids=ids)


class TrainSetupError(Exception):
    """A bad option or a missing input, found before training starts (`domino train` exits 2 with the message)."""


@dataclass
class TrainJob:
    """What `domino train` is asked to do: the target, the data, the draft's sizing and initialisation, the
    recipe (`settings`) and the optional τ probe. Options are named as on the command line."""

    target: str
    data: list[str]
    settings: TrainSettings
    target_options: dict = field(default_factory=dict)  # load_target's trust_remote_code, revision, token
    max_length: int = 3072
    limit: int | None = None
    features: str | None = None
    config: str | None = None
    num_layers: int | None = None
    block_size: int | None = None
    draft_vocab_size: int | None = None
    use_head: bool = True
    init: str = "random"
    new_layer_lr_scale: float = 1.0
    probe_prompts: str | None = None
    probe_num: int = 6
    probe_max_new_tokens: int = 64
    chat_template: str = "auto"


def check_job(job: TrainJob) -> None:
    """The checks that need nothing loaded: a `TrainSetupError` before the (slower) target load."""
    settings = job.settings
    if settings.loss == "kl" and not (settings.kl_topk >= 1 and settings.kl_temperature > 0):
        raise TrainSetupError(f"--kl_topk must be >= 1 and --kl_temperature > 0 (got {settings.kl_topk} and "
                              f"{settings.kl_temperature})")
    if not job.new_layer_lr_scale > 0 or (job.new_layer_lr_scale != 1.0 and not job.init.startswith("from:")):
        raise TrainSetupError(f"--new_layer_lr_scale {job.new_layer_lr_scale}: it must be > 0, and it applies only to "
                              "the layers --num_layers adds to an --init from:DIR draft")
    try:
        require_paths(data=job.data, config=job.config, features=job.features,
                      resume_from_checkpoint=settings.resume if isinstance(settings.resume, str) else None)
        if job.features and settings.loss == "kl":
            FeatureStore(job.features).require_topk(settings.kl_topk)
    except (OSError, ImportError, RuntimeError, ValueError) as err:
        raise TrainSetupError(str(err)) from err


def run_training(job: TrainJob):
    """Load the target and the data, build (or continue, deepen, widen) the draft, and train it as `job` says;
    returns the trainer. Raises `TrainSetupError` on bad options or inputs, before any training step; the
    non-finite errors of `train_draft` otherwise."""
    check_job(job)
    settings = job.settings
    try:  # missing inputs fail before the (slower) target load
        target, tokenizer = targets.load_target(job.target, **job.target_options)
        dataset = load_training_data(job.data, job.max_length, target.config.get_text_config().vocab_size, job.limit,
                                     exclude=BenchmarkFilter.for_benchmarks())
    except (OSError, ImportError, RuntimeError, ValueError) as err:  # missing/empty file, package, model; no Hub
        raise TrainSetupError(str(err)) from err
    config_path = job.config
    if job.features and not config_path and os.path.exists(os.path.join(job.features, CONFIG)):
        config_path = os.path.join(job.features, CONFIG)  # the config the features were extracted for
        logger.info("Draft config from %s", config_path)
    config = None if job.init.startswith("from:") else draft_config(
        target, tokenizer, dataset, config_path, job.num_layers, job.block_size, job.draft_vocab_size, job.use_head)
    draft = build_draft(target, tokenizer, init=job.init, config=config)
    new_layers = _grow(job, draft, dataset)
    try:
        if job.features:
            dataset.use_features(FeatureStore(job.features, draft.config.target_layer_ids),
                                 kl_topk=settings.kl_topk if settings.loss == "kl" else 0)
        probe = None
        if job.probe_prompts:
            prompts = probe_prompts(tokenizer, job.probe_prompts, job.probe_num, job.chat_template)
            probe = make_tau_probe(target, prompts, job.probe_max_new_tokens)
    except (OSError, ImportError, ValueError) as err:  # features of other layers, probe prompts missing
        raise TrainSetupError(str(err)) from err
    settings = dataclasses.replace(settings, scaled_lr_layers=new_layers, layer_lr_scale=job.new_layer_lr_scale)
    return train_draft(target, draft, dataset, settings, tau_probe=probe)


def _grow(job: TrainJob, draft: DominoDraftModel, dataset: RegenDataset) -> tuple[int, ...]:
    """Deepen or widen an `--init from:` draft as `job` asks (or say why it cannot); the new layers' indices."""
    resized = job.draft_vocab_size and job.draft_vocab_size != draft.config.draft_vocab_size
    deepened = job.num_layers and job.num_layers != draft.config.num_hidden_layers
    new_layers = ()
    if job.new_layer_lr_scale != 1.0 and not deepened:
        raise TrainSetupError(
            f"--new_layer_lr_scale {job.new_layer_lr_scale}: it applies only to the layers --num_layers adds to an "
            f"--init from:DIR draft, and --num_layers {job.num_layers} adds none to this "
            f"{draft.config.num_hidden_layers}-layer draft")
    if job.init.startswith("from:") and (resized or deepened):  # grows, or names why it cannot
        try:
            if deepened:
                new_layers = tuple(range(draft.config.num_hidden_layers, job.num_layers))
                added = grow_draft_layers(draft, job.num_layers)
                logger.info("Draft deepened by %d layer(s) to %d (new layers add nothing until trained)",
                            added, job.num_layers)
            if resized:
                coverage = grow_draft_vocab(draft, dataset, job.draft_vocab_size)
                logger.info("Draft sub-vocabulary grown to %d tokens: they cover %.2f%% of the data's response "
                            "tokens", draft.config.draft_vocab_size, 100 * coverage)
        except ValueError as err:
            raise TrainSetupError(str(err)) from err
    return new_layers


def probe_prompts(tokenizer, source, num_prompts, chat_template="auto") -> list[torch.Tensor]:
    """The first `num_prompts` prompts of `source`, chat-templated: (1, P) id tensors for `make_tau_probe`."""
    records = read_prompts(source, limit=num_prompts).records
    return [torch.tensor([chat_input_ids(tokenizer, r.turns[:1], chat_template=chat_template)]) for r in records]


def make_tau_probe(target, prompts: list[torch.Tensor], max_new_tokens: int):
    """A callable draft -> {"probe_tau", "probe_replay_tau"} on held-back (1, P) `prompts`.

    `probe_tau`: real greedy decoding with the target, as shipped (lookup spans, back-off). `probe_replay_tau`:
    the draft's own τ, drafting every step (`teacher_forced.py`), replayed on the answers that decoding just
    produced, which are the target's greedy ones (decoding is lossless): one more forward per prompt. The
    first moves with the decoding policies, the second only with the draft's weights."""
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
