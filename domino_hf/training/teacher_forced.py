"""τ without decoding: greedy speculative decoding replayed on the target's own answer, teacher-forced.

Why: training logs `sim_tau`, the mean over random anchors of (accepted run + 1). Decoding does not visit the
positions of an answer uniformly: a step that accepts k drafts skips the next k positions, so the stretches the
draft gets wrong are visited more often than those it gets right, and the anchor mean overstates τ (by 0.1–0.4
on the SmolLM2 draft: docs/training.md). Given the target's greedy answer x_P … x_{L-1} (P prompt tokens),
greedy decoding with a draft that proposes its whole block every step is deterministic: the step whose bonus
token is x_p accepts `runs[p]` drafts and hands over to p + runs[p] + 1. One target forward and one draft
forward over every anchor give every `runs[p]`, so the replay costs no sequential decoding and equals what
`generate(assistant_model=draft)` accepts step by step (tested), as long as nothing else decides which steps
draft: lookup spans, the back-off and an adaptive draft length are decoding policies on top of the draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..modeling import DominoTargetHead
from ..modeling.generation_domino import acceptance_length
from .dataset import AnchorCollator
from .objective import DominoObjective, accepted_runs, draft_inputs


@dataclass
class Replay:
    """One answer replayed. `runs[i]`: the accepted run at anchor P + i, for every response position that has a
    next token (at most what leaves room for the step's bonus token inside the answer). `steps`: the anchors
    decoding visits, in order. τ is `acceptance_length` of the accepted runs, as everywhere: decoded tokens (the
    answer less its first token, which the prefill produces) per verify step."""

    runs: list[int]
    steps: list[int]

    @property
    def accepted(self) -> list[int]:
        """Draft tokens accepted at each step, as `DominoGenerationStats.accepted` records them."""
        return [self.runs[step] for step in self.steps]

    @property
    def tau(self) -> float:
        return acceptance_length(self.accepted) or 0.0

    @property
    def anchor_mean_tau(self) -> float:
        """Training's `sim_tau` over every anchor of the answer: the biased estimate, for comparison."""
        return 1.0 + sum(self.runs) / max(1, len(self.runs))


def replay_steps(runs: list[int]) -> list[int]:
    """The anchors (offsets into `runs`) greedy decoding visits: from 0, each step moves on by its run + 1."""
    steps, position = [], 0
    while position < len(runs):
        steps.append(position)
        position += runs[position] + 1
    return steps


@torch.no_grad()
def replay_answer(draft, target, prompt_ids: list[int], response_ids: list[int], target_head=None) -> Replay:
    """Replay greedy decoding of `draft` on `target`'s answer `response_ids` to `prompt_ids` (both token id
    lists; the answer should be the target's own greedy one, else the replay answers a different question:
    how often the draft would match that text). The draft and target run in their own dtypes."""
    if len(response_ids) < 2:
        return Replay(runs=[], steps=[])
    config = draft.config
    device = next(target.parameters()).device
    target_head = target_head or DominoTargetHead(target, config, device=device)
    collator = AnchorCollator(config, num_anchors=len(response_ids) - 1)  # every anchor, in order
    batch = collator([{"prompt_ids": list(prompt_ids), "response_ids": list(response_ids), "index": 0, "epoch": 0}])
    batch = {key: value.to(device) for key, value in batch.items()}
    context_hidden, _, block_embeds, label_embeds, _ = draft_inputs(
        target, target_head, config, batch["input_ids"], batch["attention_mask"], batch["anchors"]
    )
    dtype = next(draft.parameters()).dtype
    _, final_logits = DominoObjective(draft).logits(
        context_hidden.to(dtype), block_embeds.to(dtype),
        None if label_embeds is None else label_embeds.to(dtype), batch["anchors"], target_head,
    )
    runs = accepted_runs(final_logits, batch["labels"])[0].tolist()  # (R-1,)
    # the bonus token must fit in the answer too: at its last token a step has no room for drafts
    runs = [min(run, len(runs) - 1 - i) for i, run in enumerate(runs)]
    return Replay(runs=runs, steps=replay_steps(runs))
