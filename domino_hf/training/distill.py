"""`domino train --loss kl`: the draft learns the target's next-token distribution, not only its argmax.

With `--loss ce` (the default) draft token j of the anchor at a is trained by cross entropy on the token the
target wrote there, x_{a+1+j} (its greedy answer). With `--loss kl` its label is the target's own next-token
distribution at position a+j (`draft_label_positions`), truncated to the K most probable tokens
(`--kl_topk`), and the loss is the KL divergence from it to the draft's distribution. Why it may help: a
greedy answer says which token wins, not by how much nor what comes second; the distribution also says where
the target hesitates (a near-tie costs the draft little there), and it is what speculative sampling accepts
against. Whether it helps is an ablation (`examples/ablate_smollm2.sh`, arm `kl`).

The soft label, exactly (both sources below give the same, up to the float16 storage of the log-probs):
  1. the target's log-probabilities over its whole vocabulary (LM head, bias, soft-capping: `target_logits`);
  2. its K most probable tokens (`next_token_topk`);
  3. those outside the draft's sub-vocabulary (`--draft_vocab_size`) dropped;
  4. the rest renormalised at temperature T (`--kl_temperature`): p_i ∝ exp(log p_target,i / T). The top-K set
     does not depend on T, so this is also the target's distribution at T, truncated and renormalised.
Loss of a slot: T² · KL(p ‖ softmax(draft logits / T)), the draft's distribution over its whole (sub-)
vocabulary; T² keeps the gradient scale of T = 1 (Hinton et al.'s distillation). A slot whose K tokens all lie
outside the draft vocabulary has no soft label and no loss (under `ce`, a label outside it has none either).

Sources: without `--features`, the final hidden states of the target forward the trainer runs anyway, through
the LM head at the label positions only (`block_soft_labels`); with `--features`, the top-K that
`domino features --kl_topk K` stored for every response position (`topk_at`; storage in `features.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..modeling.target_domino import target_logits

_CHUNK_LOGITS = 2**26  # full-vocabulary logits are made this many values (256 MB of fp32) at a time


@torch.no_grad()
def next_token_topk(target, final_hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, H) final hidden states -> (P, K) target ids and (P, K) float32 log-probabilities of the target's K
    most probable next tokens, most probable first. Logits are made a chunk of rows at a time, so memory stays
    bounded whatever the vocabulary (262k for Gemma 3)."""
    vocab = target.get_output_embeddings().weight.shape[0]
    k = min(k, vocab)
    ids, logps = [final_hidden.new_zeros(0, k, dtype=torch.long)], [final_hidden.new_zeros(0, k, dtype=torch.float)]
    for chunk in final_hidden.split(max(1, _CHUNK_LOGITS // vocab)):
        top = torch.log_softmax(target_logits(target, chunk).float(), dim=-1).topk(k, dim=-1)
        ids.append(top.indices)
        logps.append(top.values)
    return torch.cat(ids), torch.cat(logps)


def block_soft_labels(target, final_hidden: torch.Tensor, positions: torch.Tensor, k: int):
    """On the fly: (b, L, H) final hidden states of the target's forward and (b, A, n) label positions ->
    (b, A, n, K) target ids and log-probs. Only the label positions go through the LM head."""
    b, num_anchors, n = positions.shape
    rows = final_hidden.gather(1, positions.reshape(b, -1, 1).expand(-1, -1, final_hidden.shape[-1]))  # (b, A·n, H)
    ids, logp = next_token_topk(target, rows.reshape(b * num_anchors * n, -1), k)
    return ids.view(b, num_anchors, n, -1), logp.view(b, num_anchors, n, -1)


def topk_at(ids: torch.Tensor, logp: torch.Tensor, positions: torch.Tensor):
    """From cached features: (b, L, K) per-position top-K ids and log-probs and (b, A, n) label positions ->
    (b, A, n, K) each."""
    b, num_anchors, n = positions.shape
    index = positions.reshape(b, -1, 1).expand(-1, -1, ids.shape[-1])  # (b, A·n, K)
    return ids.gather(1, index).view(b, num_anchors, n, -1), logp.gather(1, index).view(b, num_anchors, n, -1)


@dataclass
class SoftLabels:
    """The renormalised soft labels of every slot (…, K); unused entries have index 0, p 0 and log_p 0."""

    index: torch.Tensor  # (…, K) draft-vocabulary indices
    p: torch.Tensor  # (…, K) probabilities, summing to 1 over the used entries of a labelled slot
    log_p: torch.Tensor  # (…, K)
    present: torch.Tensor  # (…) bool: the slot has a soft label (one of its K tokens is in the draft vocabulary)

    @classmethod
    @torch.no_grad()
    def make(cls, draft_index: torch.Tensor, logp: torch.Tensor, temperature: float = 1.0) -> "SoftLabels":
        """(…, K) draft-vocabulary indices of the target's top-K (-1 outside the sub-vocabulary) and their
        log-probs (-inf = no entry, e.g. padding) -> the labels of steps 3–4 of the module docstring."""
        keep = (draft_index >= 0) & torch.isfinite(logp)
        present = keep.any(dim=-1)
        scaled = torch.where(keep, logp.float() / temperature, float("-inf"))
        scaled = torch.where(present[..., None], scaled, 0.0)  # a slot without label: no NaN from all -inf
        log_p = torch.log_softmax(scaled, dim=-1)
        return cls(index=draft_index.clamp_min(0), p=log_p.exp() * keep, log_p=torch.where(keep, log_p, 0.0),
                   present=present)

    def kl(self, logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """(…, V') draft logits -> (…) T² · KL(p ‖ softmax(logits / T)) per slot (0 for a slot without label)."""
        log_q = torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, self.index)  # (…, K)
        return (self.p * (self.log_p - log_q)).sum(dim=-1) * temperature**2
