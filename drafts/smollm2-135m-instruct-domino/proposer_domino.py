# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""The proposer: every verify loop drafts through `DominoProposer` (transformers' loop through the candidate
generator, the batched loop, the tree step).

Remote-code file (torch + transformers only). It owns the drafting pipeline, over rows:

    anchors + new context ──► backbone (one draft forward over every row's [anchor, MASK, …]) ──► slot states H
        ──► target LM head ──► base logits (b, n, V')                                             (`backbone`)
    slot by slot: base_j + correction(H_j, GRU state) ──► processors ──► argmax, draw or forced token
        ──► GRU step on the token's gates; stop before a stop criterion or below the confidence threshold
                                                                                                   (`rollout`)
    the head branched into a tree of the likeliest paths (one row)                                    (`tree`)
    context and suffix-cache spans, cut at the row's room and at a stop criterion         (`find_spans`)
    a span's q: one-hot (the span is fixed given the context)                            (`span_proposal`)

A `Proposal` is what a loop verifies as a chain per row: token ids, the draft's processed logits they were drawn
from (q, when sampling), each token's draft probability, the source and what it expects to gain (a tree is a
`DraftTree`, its nodes' path probabilities its expectation). The
proposer holds no per-call state besides the call's processors, criteria and span sources; each loop keeps its own
caches and passes their inputs in. Nothing here reads the target's answer: every choice is made from the draft's
distributions, so speculative sampling stays exact.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from .hybrid_domino import ContextLookup, Span, SuffixLookup, chain_expected
from .target_domino import DominoHeadTables, DominoTargetHead, block_position_ids, draft_slots
from .tree_domino import DraftTree, reindexed


@dataclass
class Proposal:
    """What a loop sends to the target's verify.

    Args:
        ids (`torch.LongTensor` of shape `(b, k)`): target ids per row.
        logits (`torch.Tensor` of shape `(b, k, V)`, *optional*): the processed logits each token was drawn from
            (the draft's q); one-hot for a span; None where nothing needs them (greedy).
        probs (`torch.Tensor` of shape `(b, k)`, *optional*): the draft's probability of each token, when scored.
        source (`str`): `"domino"` (the draft's block), `"lookup"` or `"cache"` (a span).
        expected (`torch.Tensor` of shape `(b, k + 1)`, *optional*): what the proposal expects to gain: the
            accepted tokens expected if its first 0 … k tokens are verified, from the draft's own per-slot
            probabilities of a pass that draws nothing (`chain_expected`); None where unknown (a span's value is
            its `SourceChooser`'s, from the span's history). The policy weighs proposals by it; a drawn token
            never enters it.
    """

    ids: torch.Tensor
    logits: torch.Tensor | None = None
    probs: torch.Tensor | None = None
    source: str = "domino"
    expected: torch.Tensor | None = None

    def __iter__(self):  # unpacks as (ids, logits, probs)
        return iter((self.ids, self.logits, self.probs))


def probe_copy(criterion):
    """A copy of a stopping criterion whose list, dict and set attributes are its own (a shallow copy would share
    them, and with them any state the criterion updates when called); everything else, a tokenizer included, is
    shared."""
    probe = copy.copy(criterion)
    for name, value in vars(criterion).items():
        if isinstance(value, (list, dict, set)):
            setattr(probe, name, copy.copy(value))
    return probe


def span_sources(settings, suffix_cache, eos_token_id, vocab_size: int, logits_processor=None) -> list:
    """The call's span sources as (name, source): the context lookup (`context_lookup_tokens` > 0) and the suffix
    cache (when the call has one), each cutting its spans at EOS and, given `logits_processor`, before a token the
    processors forbid."""
    options = dict(eos_token_id=eos_token_id, logits_processor=logits_processor, vocab_size=vocab_size)
    sources = []
    if settings.context_lookup_tokens > 0:
        sources.append(("lookup", ContextLookup(settings.context_lookup_tokens, settings.context_lookup_ngram,
                                                **options)))
    if suffix_cache is not None:
        sources.append(("cache", SuffixLookup(suffix_cache, settings.suffix_cache_max_span, **options)))
    return sources


class DominoProposer:
    """Drafts for every verify loop: the backbone, the head's rollout over rows, trees, spans and their cuts.

    Args:
        draft ([`DominoDraftModel`]): the draft.
        target (`PreTrainedModel`): the target; the draft borrows its embedding and LM head.
        stopping_criteria (`list`, *optional*): criteria a proposal must never run past (stop strings, user
            criteria that the loop does not check inside an accepted block); asked through copies (`stops`).
        span_sources (`list`, *optional*): (name, source) pairs (`span_sources`) the spans are looked up in.
    """

    def __init__(self, draft, target, stopping_criteria=None, span_sources=()):
        self.draft, self.config = draft, draft.config
        self.head = DominoTargetHead.cached(draft, target)
        # Head tables once per call (weights do not change while generating), not per step.
        self.tables = DominoHeadTables.cached(draft, target, self.head) if draft.has_domino_head else None
        self.stopping = list(stopping_criteria or [])
        self.span_sources = list(span_sources)

    # ------------------------------------------------------------------------------------------ backbone
    def backbone(self, anchors, anchor_positions, context, context_positions, attention_mask, cache, n: int,
                 lap=lambda phase: None):
        """One draft forward over every row's block `[anchor, MASK, …]`, absorbing `context` (b, m, F) target
        features (or None) into `cache` at `context_positions` (b, m): slot states (b, n, H) and base logits
        (b, n, V') of the first `n` slots. `anchors` (b,) ids at `anchor_positions` (b,)."""
        device = self.draft.device
        out = self.draft(
            block_embeds=self.head.block_embeds(anchors).to(device),  # (b, B, E)
            block_position_ids=block_position_ids(anchor_positions.to(device), self.config.block_size),  # (b, B)
            target_hidden_states=None if context is None else context.to(device),
            context_position_ids=context_positions,
            attention_mask=attention_mask,
            past_key_values=cache,
        )
        slots = draft_slots(out.last_hidden_state, self.config)[:, :n]  # (b, n, H)
        lap("backbone")
        base = self.head.logits(slots)  # (b, n, V')
        lap("lm_head")
        return slots, base

    # ------------------------------------------------------------------------------------------ the head
    def _head_start(self, slots, anchors):
        """The head's per-slot part W1_H·H (…, n, r) and its GRU state after each row's anchor (b, Hg); None
        without a Domino head."""
        if self.tables is None:
            return None, None
        draft = self.draft
        state = slots.new_zeros(len(anchors), self.config.gru_hidden_dim)
        state = draft.gru_step(state, draft.head_input_gates(self.head.embed(anchors.to(slots.device))))
        return draft.correction_hidden_part(slots), state

    def _slot_logits(self, base, hidden_part, state, j: int):
        """Slot j's logits (R, V'): its base logits (R, V'), plus the head's correction past the pure prefix."""
        if self.tables is None or j < self.config.pure_draft_prefix_len:
            return base
        return torch.add(base, self.draft.correction_from_parts(hidden_part, state))  # promotes to fp32

    def _step_gru(self, state, index, token):
        """The GRU state after each row's drafted token: `index` (R,) draft-vocabulary indices (-1 off the
        sub-vocabulary), `token` (R,) target ids."""
        return self.draft.gru_step(state, self.tables.input_gates(self.draft, index, token))

    def sample(self, full_logits):
        """One draw per row from softmax(full_logits) (b, V) -> (b,). With a sub-vocabulary every other logit is
        normally −inf (probability 0), so drawing over the sub-vocabulary's columns is the same distribution
        with V/V' times fewer random numbers; a processor that put mass outside it falls back to the full draw."""
        ids = self.head.draft_vocab_ids
        if ids is not None:
            ids = ids.to(full_logits.device)
            sub_logits = full_logits[:, ids]  # (b, V')
            if int(torch.isfinite(full_logits).sum()) == int(torch.isfinite(sub_logits).sum()):
                return ids[torch.multinomial(sub_logits.softmax(dim=-1), num_samples=1)[:, 0]]
        return torch.multinomial(full_logits.softmax(dim=-1), num_samples=1)[:, 0]

    def rollout(self, slots, base, anchors, mode: str = "score", forced=None, process=None, threshold: float = 0.0,
                stop=None, with_probs: bool = False) -> Proposal:
        """The draft's block for every row, slot by slot.

        Args:
            slots (`torch.Tensor` of shape `(b, n, H)`), base (`(b, n, V')`): the backbone's slot states and
                base logits.
            anchors (`torch.LongTensor` of shape `(b,)`): each row's last verified token.
            mode (`str`): `"score"` the raw logits' argmax (no processor, no draw); `"greedy"` the processed
                logits' argmax; `"sample"` a draw from the processed logits (`sample`).
            forced (`torch.LongTensor` of shape `(b, k)`, *optional*): teacher-force these tokens (scoring a span).
            process (`callable`, *optional*): `process(full_logits (b, V), ids (b, j) or None)` -> the processed
                logits of slot j after the tokens drafted so far; needed by `"greedy"` and `"sample"`.
            threshold (`float`): stop before the slot where every row's chain probability times the slot's top
                probability falls below it (decided from the slot's distribution, never from its draw).
            stop (`callable`, *optional*): `stop(ids (b, j + 1))`: whether slot j's token would complete a stop;
                the block then ends before it (the target's own token must be the one that stops).
            with_probs (`bool`): also return each token's probability in `"greedy"` and `"sample"` modes.

        Returns:
            [`Proposal`]: ids (b, k), the processed logits (b, k, V) unless `mode` is `"score"` or `forced`, each
            token's probability (b, k) when scored (`"score"`, `forced`, a threshold or `with_probs`), and then,
            unless the tokens were drawn (`"sample"`), the accepted tokens expected (b, k + 1) (`chain_expected`).
        """
        b, n = base.shape[:2]
        n = n if forced is None else forced.shape[1]
        hidden_part, state = self._head_start(slots, anchors)
        scored = mode == "score" or forced is not None or threshold > 0 or with_probs
        ids, probs, processed, chain = [], [], [], None
        for j in range(n):
            logits = self._slot_logits(base[:, j], None if hidden_part is None else hidden_part[:, j], state, j)
            full = None
            if mode != "score":
                full = process(self.head.to_full_vocab(logits), torch.stack(ids, dim=1) if ids else None)
            dist = (full if full is not None else logits).softmax(dim=-1) if scored else None
            if threshold > 0:
                top = dist.max(dim=-1).values
                if bool(((top if chain is None else chain * top) < threshold).all()):
                    break
            if forced is not None:
                token = forced[:, j].to(logits.device)
                index = self.head.to_draft_index(token)
            elif full is None:
                index = logits.argmax(dim=-1)
                token = self.head.to_target_ids(index)
            else:
                token = self.sample(full) if mode == "sample" else full.argmax(dim=-1)
                index = self.head.to_draft_index(token)
            if stop is not None and stop(torch.stack(ids + [token], dim=1)):
                break
            if dist is not None:
                if full is not None:
                    p = dist.gather(1, token[:, None])[:, 0]
                else:  # sub-vocabulary columns: a token outside them has probability 0
                    p = dist.gather(1, index.clamp(min=0)[:, None])[:, 0] * (index >= 0)
                chain = p if chain is None else chain * p
                probs.append(p)
            ids.append(token)
            processed.append(full)
            if self.tables is not None and j + 1 < n:
                state = self._step_gru(state, index, token)
        keep = mode != "score" and forced is None
        probs = (torch.stack(probs, dim=1).float() if ids else base.new_zeros(b, 0).float()) if scored else None
        expected = chain_expected(probs) if scored and mode != "sample" else None
        if not ids:
            return Proposal(anchors.new_zeros(b, 0), None, probs, expected=expected)
        return Proposal(torch.stack(ids, dim=1), torch.stack(processed, dim=1) if keep else None, probs,
                        expected=expected)

    def tree(self, slots, base, anchor, width: int, top_k: int) -> DraftTree:
        """The draft's tree for one row: `slots` (n, H) slot states, `base` (n, V') base logits, `anchor` (1,)
        target id. Each depth d keeps the `width` children (each frontier node's `top_k` likeliest tokens) with
        the highest path probability and steps the GRU along them. Nodes sorted by path probability (highest
        first, ancestors first on ties)."""
        hidden_part, states = self._head_start(slots, anchor)  # (n, r), (F, Hg)
        path = torch.ones(1)  # (F,) frontier path probabilities
        frontier = torch.full((1,), -1, dtype=torch.long)  # (F,) node index of each frontier entry
        tokens, parents, depths, probs = [], [], [], []
        for d in range(base.shape[0]):
            wide = len(frontier)
            part = None if hidden_part is None else hidden_part[d : d + 1].expand(wide, -1)
            logits = self._slot_logits(base[d : d + 1].expand(wide, -1), part, states, d)  # (F, V')
            top = logits.float().softmax(dim=-1).topk(min(top_k, logits.shape[-1]), dim=-1)  # (F, k)
            child = (path[:, None] * top.values.cpu()).flatten()  # (F·k,)
            keep = child.topk(min(width, len(child))).indices  # the best children across the frontier
            owner, rank = keep // top.indices.shape[1], keep % top.indices.shape[1]
            index = top.indices[owner.to(top.indices.device), rank.to(top.indices.device)]  # (F',) draft indices
            token = self.head.to_target_ids(index)
            first = len(tokens)
            tokens.extend(token.tolist())
            parents.extend(frontier[owner].tolist())
            depths.extend([d + 1] * len(keep))
            probs.extend(child[keep].tolist())
            if self.tables is not None and d + 1 < base.shape[0]:
                states = self._step_gru(states[owner.to(states.device)], index, token)
            path, frontier = child[keep], torch.arange(first, first + len(keep))
        order = sorted(range(len(tokens)), key=lambda i: (-probs[i], depths[i]))
        return reindexed(tokens, parents, depths, probs, order)

    # ------------------------------------------------------------------------------------------ spans and stops
    def find_spans(self, sequence, room: int, better) -> tuple[Span, ...]:
        """The spans for a row whose tokens are `sequence` (1, L): each source's, cut at `room` tokens and at a
        stop criterion; best first by `better(*spans)` (the policy's pick, `SourceChooser.better_span`)."""
        spans = []
        for name, source in self.span_sources:
            tokens, match = source(sequence)
            tokens = self.cut_at_stop(sequence, tokens[: max(room, 0)])
            if len(tokens):
                spans.append(Span(tokens.tolist(), match, name))
        best = better(*spans)
        return tuple(sorted(spans, key=lambda span: span is not best))

    def span_proposal(self, tokens, source: str, with_logits: bool) -> Proposal:
        """A span (k,) as a one-row proposal; its q, when asked for, is one-hot (fixed given the context)."""
        ids = torch.as_tensor(tokens, dtype=torch.long)[None]  # (1, k)
        return Proposal(ids, self.span_logits(ids) if with_logits else None, None, source)

    def span_logits(self, ids):
        """(b, k) ids -> (b, k, V) logits that are 0 at each id and −inf elsewhere: a span's q."""
        logits = torch.full((*ids.shape, self.head.vocab_size), float("-inf"), device=ids.device)
        return logits.scatter_(2, ids[..., None], 0.0)

    def stops(self, sequence) -> bool:
        """Whether a criterion fires on a proposed `sequence` (1, L). Each criterion is asked through a copy
        (`probe_copy`): a stateful one (lm-eval's stop sequences remember a row once it stopped) must not remember
        a proposal the target may reject. A criterion may answer a tensor or a plain bool."""
        return any(bool(torch.as_tensor(probe_copy(c)(sequence, None)).any()) for c in self.stopping)

    def cut_at_stop(self, sequence, span):
        """`span` (S,) up to a stop criterion: never propose past a stop, the target's own token must stop
        generation."""
        if self.stopping:
            for j in range(len(span)):
                if self.stops(torch.cat([sequence, span[None, : j + 1].to(sequence.device)], dim=1)):
                    return span[:j]
        return span
