"""`DominoTrainer`: transformers' `Trainer` with the Domino objective.

Why `Trainer`: it already brings `accelerate` (1 CPU process → multi-GPU DDP/FSDP/DeepSpeed), gradient
accumulation, checkpoint/resume with RNG and data position, and logging integrations (TensorBoard, W&B).
We add: the frozen target (kept outside the trained module, never saved), the curriculum λ, Domino metrics,
checkpoints that are loadable drafts, a completion marker so a checkpoint killed mid-write is never resumed,
and an optional τ probe on held-back prompts (`recipe.make_tau_probe`).
"""

from __future__ import annotations

import logging
import os
import time

import torch
from safetensors.torch import load_file
from transformers import Trainer, TrainerCallback

from ..cpu_kernels import is_optimized, restore_stock_kernels
from ..modeling import DominoTargetHead
from .checkpoint import WEIGHTS, checkpoint_folder, mark_complete
from .dataset import LengthGroupedEpochSampler, RegenDataset
from .choices import DEFAULT_TOPK
from .distill import block_soft_labels, next_token_topk, topk_at
from .objective import curriculum_lambda, draft_inputs

logger = logging.getLogger(__name__)


class NonFiniteTraining(RuntimeError):
    """Training produced a non-finite loss or gradient norm: stopped before the optimizer step used it."""


class EpochCallback(TrainerCallback):
    """Tells the dataset the epoch, so anchors are fresh each epoch yet reproducible on resume."""

    def __init__(self, dataset):
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.epoch = int(state.epoch or 0)


class DominoTrainer(Trainer):
    """Trains `DominoObjective(draft)`; `target` is frozen and used for context features and embeddings, and,
    with the objective's `loss="kl"`, for its top-`kl_topk` next-token distributions (`distill.py`) unless the
    batches carry them (cached by `domino features --kl_topk`)."""

    def __init__(self, *args, target=None, use_curriculum: bool = True, tau_probe=None, kl_topk: int = DEFAULT_TOPK,
                 scaled_lr_parameters=(), lr_scale: float = 1.0, feature_noise: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.feature_noise = feature_noise
        self.kl_topk = kl_topk
        self.scaled_lr_parameters = {id(p) for p in scaled_lr_parameters}
        self.lr_scale = lr_scale
        self.target = target.to(self.args.device).eval().requires_grad_(False)
        draft = self.model.draft
        if is_optimized(draft):  # packed copies are inference-only: free them rather than repack every step
            restore_stock_kernels(draft)
            logger.warning("The draft ran optimize_for_cpu kernels; restored stock kernels for training.")
        self.target_head = DominoTargetHead(self.target, draft.config, device=self.args.device)
        self.use_curriculum = use_curriculum
        self.tau_probe = tau_probe
        self._metric_sums: dict[str, float] = {}
        self._metric_count = 0
        self._tokens = 0
        self._window_start = time.perf_counter()

    def create_optimizer(self, model=None):
        """Trainer's optimizer, with `scaled_lr_parameters` moved into groups of their own at `lr_scale` × the
        learning rate (the schedule then scales every group alike). Why: layers added to a trained draft start
        at zero and at the draft's fine-tuning rate stay a small correction for a whole round."""
        optimizer = super().create_optimizer(model)
        if not self.scaled_lr_parameters or self.lr_scale == 1.0:
            return optimizer
        for group in list(optimizer.param_groups):
            scaled = [p for p in group["params"] if id(p) in self.scaled_lr_parameters]
            if scaled:
                group["params"] = [p for p in group["params"] if id(p) not in self.scaled_lr_parameters]
                optimizer.add_param_group({**group, "params": scaled, "lr": group["lr"] * self.lr_scale})
        optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
        return optimizer

    def _get_train_sampler(self, train_dataset=None):
        """`train_sampling_strategy="group_by_length"` from the examples' token counts (Trainer would load every
        example, features included, to count them), ordered by (data seed, epoch)."""
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if self.args.train_sampling_strategy == "group_by_length" and isinstance(dataset, RegenDataset):
            batch = self.args.train_batch_size * self.args.gradient_accumulation_steps
            return LengthGroupedEpochSampler(dataset.lengths(), batch, seed=self.args.data_seed or 0)
        return super()._get_train_sampler(train_dataset)

    @torch.no_grad()
    def _target_inputs(self, inputs):
        """Context hidden states, the embeddings the draft reads, for `loss="kl"` the soft labels ((b, A, n, K)
        target ids and log-probs; else None), and the (b, A, n) labels (source-answer records' replaced by the
        target's, `_source_labels`), all from the frozen target or its cached features."""
        config = self.model.draft.config  # Trainer keeps `self.model` unwrapped (DDP lives in `model_wrapped`)
        context_hidden, final_hidden, block_embeds, label_embeds, positions = draft_inputs(
            self.target, self.target_head, config, inputs["input_ids"], inputs["attention_mask"], inputs["anchors"],
            context_hidden=inputs.get("context_hidden"),  # cached by `domino features`
        )
        target_topk = None
        if self.model.loss == "kl":
            if final_hidden is not None:
                target_topk = block_soft_labels(self.target, final_hidden, positions, self.kl_topk)
            elif "target_topk_ids" in inputs:
                target_topk = topk_at(inputs["target_topk_ids"], inputs["target_topk_logp"], positions)
            else:
                raise ValueError("loss='kl' with cached features needs their top-k: extract them again with "
                                 "`domino features --kl_topk K`, or train without --features.")
        labels = inputs["labels"]
        if "from_source" in inputs and bool(inputs["from_source"].any()):
            labels = self._source_labels(inputs, final_hidden)
        return context_hidden, block_embeds, label_embeds, target_topk, labels

    def _source_labels(self, inputs, final_hidden):
        """(b, A, n) labels where a source-answer record's blocks are trained on the target's own next token at
        the first draft slot alone (`source_answers.py`). Why only there: slot 0 predicts the token after the
        anchor, which the target chooses from the context alone; a later slot's true label would be the target's
        continuation of its own choices, which a source answer does not hold."""
        anchors, labels = inputs["anchors"], inputs["labels"]
        if "target_top1" in inputs:  # cached by `domino features --kl_topk`
            top1 = inputs["target_top1"].gather(1, anchors)  # (b, A) target ids
        elif final_hidden is not None:
            rows = final_hidden.gather(1, anchors[..., None].expand(-1, -1, final_hidden.shape[-1]))  # (b, A, H)
            top1 = next_token_topk(self.target, rows.reshape(-1, rows.shape[-1]), 1)[0].view(anchors.shape)
        else:
            raise ValueError("source-answer records need the target's next tokens: extract the features with "
                             "`domino features --kl_topk K`, or train without --features")
        source = inputs["from_source"][:, None]  # (b, 1)
        first = torch.where(source & (labels[..., 0] != -100), self.target_head.to_draft_index(top1), labels[..., 0])
        rest = labels[..., 1:].masked_fill(source[..., None], -100)
        return torch.cat([first[..., None], rest], dim=-1)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        context_hidden, block_embeds, label_embeds, target_topk, labels = self._target_inputs(inputs)
        if self.feature_noise and model.training:
            context_hidden = self.noisy(context_hidden)
        lam = curriculum_lambda(self.state.global_step, self.state.max_steps) if self.use_curriculum else 0.0
        out = model(
            context_hidden=context_hidden,
            block_embeds=block_embeds,
            label_embeds=label_embeds,
            anchors=inputs["anchors"],
            labels=labels,
            target_head=self.target_head,
            curriculum=lam,
            target_topk=target_topk,
        )
        if not bool(torch.isfinite(out["loss"])):
            self._stop_non_finite("loss", float(out["loss"].detach()), context_hidden)
        for key in ("base_loss", "final_loss", "base_acc", "final_acc", "base_acc_slot0", "sim_tau", "blocks"):
            self._metric_sums[key] = self._metric_sums.get(key, 0.0) + float(out[key])
        self._metric_sums["lambda"] = self._metric_sums.get("lambda", 0.0) + lam
        self._metric_count += 1
        self._tokens += int(inputs["attention_mask"].sum())
        return (out["loss"], out) if return_outputs else out["loss"]

    def noisy(self, context_hidden: torch.Tensor) -> torch.Tensor:
        """Context features × (1 + σ·N(0, 1)), elementwise. Why multiplicative: the target's layers differ in
        scale by orders of magnitude (SmolLM2 has outlier dimensions near 25,000), so one absolute noise level would
        drown some and not touch others. Drawn from torch's global RNG, which Trainer checkpoints: resume is
        exact."""
        noise = torch.randn(context_hidden.shape, device=context_hidden.device)  # (b, L, n_layers·H) float32
        return context_hidden * (1.0 + self.feature_noise * noise).to(context_hidden.dtype)

    def _get_grad_norm(self, model, grad_norm=None):
        """Trainer's pre-clip gradient norm, checked before the optimizer step can write NaN into the draft."""
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        if grad_norm is not None and not bool(torch.isfinite(torch.as_tensor(grad_norm))):
            self._stop_non_finite("gradient norm", float(grad_norm))
        return grad_norm

    def _stop_non_finite(self, what: str, value: float, context_hidden=None):
        """Raise `NonFiniteTraining` with the likely cause: bad context features, or a diverging run."""
        step = self.state.global_step + 1
        if context_hidden is not None and not bool(torch.isfinite(context_hidden).all()):
            cached = getattr(self.train_dataset, "features", None) is not None
            source = "the cached --features" if cached else "the target's forward"
            cause = (f"the context features from {source} hold inf/NaN (e.g. hidden states beyond float16's range); "
                     "extract them again with `domino features` (bfloat16 storage) or train without --features")
        elif self.args.bf16 or self.args.fp16:
            cause = "mixed-precision overflow or divergence; lower --lr or train in float32"
        else:
            cause = "the run diverged; lower --lr"
        raise NonFiniteTraining(f"training stopped at step {step}: non-finite {what} ({value}); likely cause: {cause}.")

    def log(self, logs, start_time=None):
        if self._metric_count and "loss" in logs:
            elapsed = max(time.perf_counter() - self._window_start, 1e-9)
            for key, total in self._metric_sums.items():
                logs[key] = round(total / self._metric_count, 4) if key != "blocks" else None
            logs["blocks_per_s"] = round(self._metric_sums["blocks"] / elapsed, 2)
            logs["tokens_per_s"] = round(self._tokens / elapsed, 1)
            logs = {k: v for k, v in logs.items() if v is not None}
            self._metric_sums, self._metric_count, self._tokens = {}, 0, 0
            self._window_start = time.perf_counter()
        super().log(logs, start_time)

    # ------------------------------------------------------------------ checkpoints = loadable drafts
    def _save(self, output_dir=None, state_dict=None):
        output_dir = output_dir or self.args.output_dir
        os.makedirs(output_dir, exist_ok=True)
        self.accelerator.unwrap_model(self.model).draft.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        draft = self.accelerator.unwrap_model(model or self.model).draft
        state = load_file(os.path.join(resume_from_checkpoint, WEIGHTS))
        draft.load_state_dict(state, strict=True)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            checkpoint = checkpoint_folder(self._get_output_dir(trial=trial), self.state.global_step)
            mark_complete(checkpoint, self.state.global_step)
            if self.tau_probe is not None:
                self.log(self.tau_probe(self.accelerator.unwrap_model(self.model).draft))
