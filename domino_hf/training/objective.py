"""The Domino training objective: DFlash block drafting + teacher-forced Domino head, base-anchored curriculum.

Shapes: b = sequences, L = sequence length, A = anchors per sequence, B = block size, n = draft tokens per
block, H = hidden size, V' = draft vocabulary.

For an anchor at position a, its block is `[x_a, MASK, …]` at positions a … a+B-1; it sees the target's
context features of positions < a and the other slots of its own block, never another block. Draft token j
(j = 0 … n-1) predicts x_{a+1+j}; the GRU has read the ground-truth [x_a … x_{a+j}] (teacher forcing).
Its loss is the cross entropy on x_{a+1+j} (`loss="ce"`, the paper's), or the KL divergence from the target's
next-token distribution at a+j (`loss="kl"`, `distill.py`); both weighted by position, the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..modeling.target_domino import block_position_ids, draft_label_positions, draft_slots, target_features
from .choices import LOSSES
from .distill import SoftLabels


def position_weights(num_draft: int, gamma: float | None = None) -> torch.Tensor:
    """w_k = exp(-k/γ) for draft positions k = 0 … n-1 (γ = 7 for 16 drafts, 5 for 10, 4 for 8, as published;
    other sizes interpolate: γ ≈ n / 2.3 … ). Normalisation happens in the loss over valid labels."""
    if gamma is None:
        gamma = {16: 7.0, 10: 5.0, 8: 4.0}.get(num_draft, max(1.0, num_draft * 0.45))
    return torch.exp(-torch.arange(num_draft, dtype=torch.float32) / gamma)


def curriculum_lambda(step: int, total_steps: int) -> float:
    """Base-anchored curriculum: λ goes linearly from 1 (base loss only) to 0 (final loss only) over the run."""
    if total_steps <= 1:
        return 0.0
    return max(0.0, 1.0 - step / (total_steps - 1))


def block_attention_mask(anchors: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """(b, A) anchor positions -> boolean (b, 1, A·B, L + A·B) mask, True = may attend.

    A query of block i sees context positions < anchors[i] and the B slots of block i (both directions)."""
    b, num_anchors = anchors.shape
    device = anchors.device
    context = torch.arange(seq_len, device=device)[None, None, :] < anchors[:, :, None]  # (b, A, L)
    context = context.repeat_interleave(block_size, dim=1)  # (b, A·B, L)
    block_id = torch.arange(num_anchors * block_size, device=device) // block_size
    same_block = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)  # (b, A·B, A·B)
    return torch.cat([context, same_block], dim=-1)[:, None]


@torch.no_grad()
def draft_inputs(target, target_head, config, input_ids, attention_mask, anchors, context_hidden=None):
    """What the objective reads besides the labels, from the frozen target (or its cached `context_hidden`).

    Returns `(context_hidden, final_hidden, block_embeds, label_embeds, positions)`: (b, L, n_layers·H) context
    features; (b, L, H) the target's final hidden states, None when the features were cached; (b, A·B, H)
    embeddings of every block `[x_a, MASK…]`; (b, A, n, H) embeddings of [x_a … x_{a+n-1}] for the GRU, None
    without a Domino head; (b, A, n) those positions, where the target's next-token distributions are the
    soft labels of `loss="kl"`."""
    b, num_anchors = anchors.shape
    positions = draft_label_positions(anchors, config.num_draft_tokens).clamp_max(input_ids.shape[1] - 1)
    final_hidden = None
    if context_hidden is None:
        context_hidden, final_hidden = target_features(target, input_ids, attention_mask, config.target_layer_ids)
    context_hidden = context_hidden.to(target_head.weight.dtype)
    block_embeds = target_head.block_embeds(input_ids.gather(1, anchors))  # (b, A, B, H)
    block_embeds = block_embeds.reshape(b, num_anchors * config.block_size, -1)
    label_embeds = None
    if config.use_domino_head:
        label_embeds = target_head.embed(input_ids.gather(1, positions.reshape(b, -1)))
        label_embeds = label_embeds.reshape(b, num_anchors, config.num_draft_tokens, -1)
    return context_hidden, final_hidden, block_embeds, label_embeds, positions


def accepted_runs(final_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(b, A, n, V') teacher-forced logits and (b, A, n) labels -> (b, A) the leading run of correct drafts per
    block: what greedy verification accepts at that anchor (the bonus token not counted). Training logs
    `sim_tau` = its mean over anchors + 1, which overstates decoding's τ (`teacher_forced.py` says why)."""
    hit = (final_logits.argmax(-1) == labels) & (labels != -100)
    return torch.cumprod(hit.long(), dim=-1).sum(-1)


class DominoObjective(nn.Module):
    """Wraps the draft so that one `forward` returns the loss (what DDP/FSDP wrap and what Trainer saves).

    The frozen target's pieces arrive as inputs (context hidden states, embeddings, the LM-head rows of the
    draft vocabulary), so no target weight is ever part of this module or of its checkpoints.

    `loss`: "ce" (cross entropy on the target's tokens) or "kl" (to its top-K distribution, at `kl_temperature`;
    `forward` then needs `target_topk`). `base_loss` and `final_loss` are of that kind; the accuracies are
    always against the target's tokens.
    """

    def __init__(self, draft, gamma: float | None = None, loss: str = "ce", kl_temperature: float = 1.0):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}: choose one of {', '.join(LOSSES)}")
        if not kl_temperature > 0:
            raise ValueError(f"--kl_temperature must be > 0 (got {kl_temperature})")
        self.draft = draft
        self.loss = loss
        self.kl_temperature = kl_temperature
        self.register_buffer("weights", position_weights(draft.config.num_draft_tokens, gamma), persistent=False)

    def logits(self, context_hidden, block_embeds, label_embeds, anchors, target_head):
        """(base, final) draft logits over the draft vocabulary, each (b, A, n, V') float32: the backbone's slots
        through the target's LM-head rows, then (with a Domino head and `label_embeds`) plus the teacher-forced
        correction; without them `final` is `base`. Arguments as in `forward`."""
        config = self.draft.config
        b, seq_len, _ = context_hidden.shape
        num_anchors = anchors.shape[1]
        block, n = config.block_size, config.num_draft_tokens
        positions = block_position_ids(anchors, block).reshape(b, -1)  # (b, A·B)
        hidden = self.draft(
            block_embeds=block_embeds,
            block_position_ids=positions,
            target_hidden_states=context_hidden,
            context_position_ids=torch.arange(seq_len, device=anchors.device)[None].expand(b, -1),
            attention_mask=block_attention_mask(anchors, seq_len, block),
        ).last_hidden_state  # (b, A·B, H)
        slots = draft_slots(hidden.view(b, num_anchors, block, -1), config)  # (b, A, n, H)
        base_logits = target_head.logits(slots)  # (b, A, n, V') float32
        if not (self.draft.has_domino_head and label_embeds is not None):
            return base_logits, base_logits
        states = self.draft.causal_states(label_embeds.reshape(b * num_anchors, n, -1))  # (b·A, n, Hg)
        correction = self.draft.correction(slots, states.view(b, num_anchors, n, -1)).float()
        keep = (torch.arange(n, device=slots.device) >= config.pure_draft_prefix_len).to(correction.dtype)[:, None]
        return base_logits, base_logits + correction * keep

    def forward(
        self,
        context_hidden: torch.Tensor,
        block_embeds: torch.Tensor,
        label_embeds: torch.Tensor | None,
        anchors: torch.Tensor,
        labels: torch.Tensor,
        target_head,
        curriculum: float,
        target_topk: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        r"""
        Args:
            context_hidden: (b, L, n_layers·H) target hidden states of `target_layer_ids`.
            block_embeds: (b, A·B, H) target embeddings of every block `[x_a, MASK…]`.
            label_embeds: (b, A, n, H) target embeddings of [x_a … x_{a+n-1}] for the GRU, or None (no head).
            anchors: (b, A) anchor positions.
            labels: (b, A, n) draft-vocabulary indices of x_{a+1+j}; -100 = no label (past the end, padding,
                unused anchor); -1 = a real token outside the sub-vocabulary (a miss, no loss).
            target_head: the `DominoTargetHead` drafting uses: base logits come from its `logits` (LM-head rows
                of the draft vocabulary, bias and soft-capping included), so training and drafting see the same.
            curriculum: λ in (1-λ)·L_final + λ·L_base.
            target_topk: with `loss="kl"`, (b, A, n, K) target ids of the target's K most probable next tokens
                at position a+j and (b, A, n, K) their log-probs (-inf = no entry), from `distill.py`.
        """
        base_logits, final_logits = self.logits(context_hidden, block_embeds, label_embeds, anchors, target_head)

        if self.loss == "kl":
            if target_topk is None:
                raise ValueError("loss='kl' needs the target's top-k next tokens (target_topk)")
            soft = SoftLabels.make(target_head.to_draft_index(target_topk[0]), target_topk[1], self.kl_temperature)
            trainable = (labels != -100) & soft.present  # (b, A, n)

            def slot_loss(logits):  # (b, A, n)
                return soft.kl(logits, self.kl_temperature)
        else:
            trainable = labels >= 0  # (b, A, n)
            safe = labels.clamp_min(0)

            def slot_loss(logits):  # (b, A, n)
                ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), safe.reshape(-1), reduction="none")
                return ce.view_as(labels)
        weight = self.weights.to(labels.device)[None, None, :] * trainable
        denom = weight.sum().clamp_min(1e-6)

        def weighted(logits):
            return (slot_loss(logits) * weight).sum() / denom

        base_loss = weighted(base_logits)
        final_loss = weighted(final_logits) if final_logits is not base_logits else base_loss
        loss = (1.0 - curriculum) * final_loss + curriculum * base_loss

        with torch.no_grad():
            present = labels != -100
            base_hit = (base_logits.argmax(-1) == labels) & present
            final_hit = (final_logits.argmax(-1) == labels) & present
            run = accepted_runs(final_logits, labels).float()  # (b, A)
            used = present[..., 0]
            metrics = {
                "base_acc": base_hit.sum() / present.sum().clamp_min(1),
                "final_acc": final_hit.sum() / present.sum().clamp_min(1),
                "base_acc_slot0": base_hit[..., 0].sum() / used.sum().clamp_min(1),
                "sim_tau": (run * used).sum() / used.sum().clamp_min(1) + 1.0,
                "blocks": used.sum().float(),
            }
        return {"loss": loss, "base_loss": base_loss.detach(), "final_loss": final_loss.detach(), **metrics}

